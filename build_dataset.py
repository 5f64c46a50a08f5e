#!/usr/bin/env python3
"""Convert Anki collections into the anki-revlogs-10k layout (one user per collection).

    python build_dataset.py PATH... --out DIR [--first-user-id N]

writes, for the i-th PATH (user id N+i, default N = 1):

    DIR/revlogs/user_id=N/data.parquet   card_id, day_offset, rating, state, duration, elapsed_days, elapsed_seconds
    DIR/cards/user_id=N/data.parquet     card_id, note_id, deck_id
    DIR/decks/user_id=N/data.parquet     deck_id, parent_id, preset_id

Inputs: `.colpkg` / `.apkg` packages (zip; `collection.anki21b` (zstd SQLite) is preferred over `collection.anki21`,
which is preferred over `collection.anki2`: in modern packages the last one is only a stub), bare SQLite collections
(`collection.anki2`, `.anki21`) and bare zstd-compressed `.anki21b` files. Only ids, times and ratings are read;
card text, note fields, media and deck names (except for working out the deck hierarchy) never leave this module.

The rules follow the dataset's own conversion (spec/pipeline.md section 1.3):

1. keep revlog entries with a button (ease 1-4); entries without one (ease 0: "set due date", "forget", other
   manual/rescheduling entries, revlog type 4/5) are dropped; so are entries of any type other than 0-3;
2. drop filtered-deck reviews (type 3) that did not reschedule the card (factor == 0);
3. per card, keep the history from the last "learn start" onward (a learning entry (type 0) whose previous entry is
   not a learning entry, or the card's first entry) and drop cards whose remaining history does not begin with a
   learning entry (incomplete history);
4. state = type + 1 (1 learning, 2 review, 3 relearning, 4 filtered-deck review), except the learn-start row: 0.
   State 4 is rare (Anki 2.0 cram reviews, v2 early reviews in filtered decks) but the published dataset has it too;
5. day_offset: the review's day under the collection's own day boundary, counted like Anki's backend does it
   (whole days relative to the next rollover after the last review, truncated towards zero), minus the user's
   minimum. The boundary ("next day starts at"):
     - collections on the old v1 scheduler without a rollover setting: `col.crt` + k days (Anki 2.0/2.1 v1 rule);
     - otherwise the rollover hour (`rollover`, default 4) in the user's time zone: `localOffset`, else
       `creationOffset` (minutes west of UTC; read from `col.conf` JSON in schema 11, from the `config` table in
       schema 15+);
     - v2 scheduler with no stored offset: `col.crt` (created at 4 am local time) shifted by rollover - 4 hours;
6. elapsed_days / elapsed_seconds: difference of day_offset / of the review time (review ids are ms timestamps;
   the ms difference floored to whole seconds) to the card's previous kept entry; -1 on state-0 rows;
7. duration = the revlog `time` (ms) clipped to [0, 60000]: Anki itself caps answer times at 60 s by default and the
   dataset card documents the 0-60000 range, so clipping only affects odd collections with a larger cap;
8. ids are factorised per user: card ids 0..K-1 in order of first appearance in the time-ordered kept revlog, then
   the cards that have no kept review in card-creation (raw id) order; note ids in order of first appearance in the
   cards table; deck ids in order of first appearance in the cards table, then decks without cards in raw-id order;
   preset ids in order of first appearance in the decks table. -1 where there is none (filtered decks have no preset,
   top-level decks no parent). A card's deck is its current deck (`cards.did`; a card sitting in a filtered deck is
   listed there), as in the published dataset. Reviews of cards deleted since are kept in `revlogs` (the published
   dataset keeps them too); they have no `cards` row, so deck/preset partitions give them -1;
9. rows are sorted by review time (revlog id), so a collection whose revlog rows are stored in any order converts
   identically.

Anki 2.0-era collections (still on the v1 scheduler) had three buttons while a card was in (re)learning: ease 2 meant
Good and 3 meant Easy. When a collection has no `schedVer` >= 2 and no (re)learning entry with ease 4, the (re)learning
entries (types 0 and 2) are remapped 2 -> 3 and 3 -> 4, exactly what Anki does to the revlog when a collection is
upgraded to the v2 scheduler, and a note says so.

Errors (not a collection, corrupt package, unsupported schema, no usable reviews) are reported as one line
`error: <file>: <problem>` on stderr; the other files still convert, and the exit code is 1. Output files are written
to temporary names and renamed into place, so no half-written parquet is ever left behind. Output is deterministic:
the same collection always gives byte-identical parquet files.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import sys
import tempfile
import time
import zipfile
import zlib
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

REVLOG_COLUMNS = ["card_id", "day_offset", "rating", "state", "duration", "elapsed_days", "elapsed_seconds"]
CARD_COLUMNS = ["card_id", "note_id", "deck_id"]
DECK_COLUMNS = ["deck_id", "parent_id", "preset_id"]
MAX_DURATION_MS = 60_000
DAY_SECS = 86_400
SQLITE_MAGIC = b"SQLite format 3\x00"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
ZIP_MAGIC = b"PK\x03\x04"
PACKAGE_MEMBERS = ("collection.anki21b", "collection.anki21", "collection.anki2")  # most preferred first
MIN_SCHEMA, MAX_SCHEMA = 11, 18
_UMASK = os.umask(0o022)
os.umask(_UMASK)


class ConversionError(Exception):
    """The file cannot be converted; the message says why (without the file name)."""


# ---------------------------------------------------------------------------------------------------------------
# Opening collections


def _decompress_zstd(src, dst) -> None:
    import zstandard

    try:
        zstandard.ZstdDecompressor().copy_stream(src, dst)
    except zstandard.ZstdError as exc:
        raise ConversionError(f"corrupt zstd-compressed collection ({exc})") from None


@contextmanager
def open_collection(path: str | os.PathLike):
    """Yield a read-only sqlite3 connection to the collection in `path` (package, SQLite or zstd file)."""
    path = Path(path)
    if not path.exists():
        raise ConversionError("file not found")
    if path.is_dir():
        raise ConversionError("is a directory, not an Anki collection")
    with open(path, "rb") as fh:
        head = fh.read(16)
    tmpdir = None
    try:
        if head.startswith(ZIP_MAGIC) or zipfile.is_zipfile(path):
            tmpdir = tempfile.mkdtemp(prefix="srs-build-")
            db_path = _extract_package(path, Path(tmpdir))
        elif head.startswith(ZSTD_MAGIC):
            tmpdir = tempfile.mkdtemp(prefix="srs-build-")
            db_path = Path(tmpdir) / "collection.sqlite"
            with open(path, "rb") as src, open(db_path, "wb") as dst:
                _decompress_zstd(src, dst)
        elif head.startswith(SQLITE_MAGIC):
            # Copy so that a collection with a stale journal/WAL is never touched and sqlite can open it read-only.
            tmpdir = tempfile.mkdtemp(prefix="srs-build-")
            db_path = Path(tmpdir) / "collection.sqlite"
            shutil.copyfile(path, db_path)
        else:
            raise ConversionError("not an Anki collection (neither a .colpkg/.apkg zip package, nor SQLite, "
                                  "nor a zstd-compressed .anki21b)")
        _check_sqlite_header(db_path)
        conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
        try:
            try:
                conn.execute("select count(*) from sqlite_master").fetchone()
            except sqlite3.DatabaseError as exc:
                raise ConversionError(f"corrupt SQLite database ({exc})") from None
            yield conn
        finally:
            conn.close()
    finally:
        if tmpdir is not None:
            shutil.rmtree(tmpdir, ignore_errors=True)


def _check_sqlite_header(db_path: Path) -> None:
    with open(db_path, "rb") as fh:
        if not fh.read(16).startswith(SQLITE_MAGIC):
            raise ConversionError("the collection inside is not an SQLite database")


def _extract_package(path: Path, tmpdir: Path) -> Path:
    try:
        with zipfile.ZipFile(path) as zf:
            names = set(zf.namelist())
            member = next((m for m in PACKAGE_MEMBERS if m in names), None)
            if member is None:
                raise ConversionError("zip file holds no collection.anki21b / collection.anki21 / collection.anki2 "
                                      "(not an Anki package)")
            out = tmpdir / "collection.sqlite"
            with zf.open(member) as src, open(out, "wb") as dst:
                if member.endswith("b"):
                    _decompress_zstd(src, dst)
                else:
                    shutil.copyfileobj(src, dst)
            return out
    except (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, EOFError, OSError) as exc:
        if isinstance(exc, ConversionError):
            raise
        raise ConversionError(f"corrupt package (zip: {exc})") from None


# ---------------------------------------------------------------------------------------------------------------
# Reading the tables we need (ids, times, ratings only)


def _tables(conn) -> set[str]:
    return {r[0] for r in conn.execute("select name from sqlite_master where type = 'table'")}


def _columns(conn, table: str) -> set[str]:
    return {r[1] for r in conn.execute(f"pragma table_info({table})")}


def _read_settings(conn, tables: set[str]) -> dict:
    """crt, schema version, and the scheduling config (rollover, offsets, schedVer) from col.conf or `config`."""
    if "col" not in tables or "revlog" not in tables:
        raise ConversionError("SQLite file is not an Anki collection (no col/revlog table)")
    row = conn.execute("select ver, crt from col").fetchone()
    if row is None:
        raise ConversionError("collection has an empty col table")
    ver, crt = int(row[0]), int(row[1])
    if not MIN_SCHEMA <= ver <= MAX_SCHEMA:
        raise ConversionError(f"unsupported collection schema version {ver} (supported: {MIN_SCHEMA}-{MAX_SCHEMA})")
    conf: dict = {}
    if "config" in tables:
        for key, val in conn.execute("select key, val from config"):
            if key in ("rollover", "localOffset", "creationOffset", "schedVer"):
                try:
                    conf[key] = json.loads(bytes(val).decode("utf-8") if isinstance(val, (bytes, memoryview))
                                           else val)
                except (ValueError, UnicodeDecodeError):
                    pass
    if "conf" in _columns(conn, "col"):
        raw = conn.execute("select conf from col").fetchone()[0]
        if raw:
            try:
                old = json.loads(raw)
            except ValueError:
                old = {}
            if isinstance(old, dict):
                for key in ("rollover", "localOffset", "creationOffset", "schedVer"):
                    if key in old and key not in conf:
                        conf[key] = old[key]
    return {"ver": ver, "crt": crt, "conf": conf}


def _read_revlog(conn) -> pd.DataFrame:
    cols = _columns(conn, "revlog")
    need = {"id", "cid", "ease", "factor", "time", "type"}
    if not need <= cols:
        raise ConversionError(f"revlog table lacks column(s) {', '.join(sorted(need - cols))}")
    rows = conn.execute("select id, cid, ease, ivl, factor, time, type from revlog").fetchall()
    df = pd.DataFrame(rows, columns=["id", "cid", "ease", "ivl", "factor", "time", "type"])
    for c in df.columns:
        df[c] = pd.to_numeric(df[c], errors="coerce").fillna(0).astype(np.int64)
    return df.sort_values(["id", "cid"], kind="mergesort").reset_index(drop=True)


def _read_cards(conn) -> pd.DataFrame:
    rows = conn.execute("select id, nid, did, odid from cards").fetchall() if "odid" in _columns(conn, "cards") \
        else [(a, b, c, 0) for a, b, c in conn.execute("select id, nid, did from cards")]
    df = pd.DataFrame(rows, columns=["id", "nid", "did", "odid"]).astype(np.int64)
    # The card's current deck (`did`), as the published dataset has it: a card sitting in a filtered deck is listed
    # under that filtered deck (preset -1), not under its home deck (`odid`).
    df["home"] = df["did"]
    return df.sort_values("id", kind="mergesort").reset_index(drop=True)


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def _proto_fields(buf: bytes):
    """Minimal protobuf reader: yield (field number, wire type, value) of the top-level fields."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            val, pos = _varint(buf, pos)
        elif wire == 1:
            val, pos = buf[pos:pos + 8], pos + 8
        elif wire == 2:
            n, pos = _varint(buf, pos)
            val, pos = buf[pos:pos + n], pos + n
        elif wire == 5:
            val, pos = buf[pos:pos + 4], pos + 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
        yield field, wire, val


def _preset_from_kind(kind: bytes) -> int | None:
    """Deck kind protobuf: field 1 = normal deck (whose field 1 is config_id), field 2 = filtered deck."""
    try:
        for field, wire, val in _proto_fields(bytes(kind)):
            if field == 1 and wire == 2:
                config_id = 0
                for f2, w2, v2 in _proto_fields(val):
                    if f2 == 1 and w2 == 0:
                        config_id = v2
                return config_id
            if field == 2:
                return None
    except ValueError:
        pass
    return None


def _read_decks(conn, tables: set[str]) -> list[tuple[int, str, int | None]]:
    """(raw deck id, full name with '::' separators, raw preset id or None for filtered decks)."""
    decks: list[tuple[int, str, int | None]] = []
    if "decks" in tables and {"id", "name", "kind"} <= _columns(conn, "decks"):
        for did, name, kind in conn.execute("select id, name, kind from decks"):
            decks.append((int(did), str(name).replace("\x1f", "::"), _preset_from_kind(kind or b"")))
    if not decks and "decks" in _columns(conn, "col"):
        raw = conn.execute("select decks from col").fetchone()[0]
        try:
            data = json.loads(raw) if raw else {}
        except ValueError:
            data = {}
        if isinstance(data, dict):
            for key, deck in data.items():
                if not isinstance(deck, dict):
                    continue
                did = int(deck.get("id", key))
                preset = None if deck.get("dyn") else int(deck.get("conf", 1))
                decks.append((did, str(deck.get("name", "")), preset))
    decks.sort(key=lambda d: d[0])
    return decks


# ---------------------------------------------------------------------------------------------------------------
# Conversion rules


def day_boundary_seconds(settings: dict) -> tuple[int, str]:
    """Second of the UTC day at which the collection's day starts, and a description of the rule used."""
    conf, crt = settings["conf"], settings["crt"]
    sched_ver = conf.get("schedVer")
    rollover = conf.get("rollover")
    offset = conf.get("localOffset", conf.get("creationOffset"))
    if rollover is None and (sched_ver is None or int(sched_ver) < 2):
        return crt % DAY_SECS, "v1 scheduler: day starts at the collection's creation time of day (col.crt)"
    hour = int(rollover) if rollover is not None else 4
    if offset is not None:
        return (hour * 3600 + int(offset) * 60) % DAY_SECS, \
            f"day starts at {hour}:00 local time, UTC offset {-int(offset) / 60:+g} h"
    return (crt + (hour - 4) * 3600) % DAY_SECS, \
        f"day starts at {hour}:00, time zone taken from col.crt (created at 4:00 local time)"


def detect_three_button(settings: dict, revlog: pd.DataFrame) -> tuple[bool, str | None]:
    """Anki 2.0 / v1 scheduler: (re)learning cards had 3 buttons (2 = Good, 3 = Easy)."""
    sched_ver = settings["conf"].get("schedVer")
    learnish = revlog[revlog["type"].isin([0, 2]) & (revlog["ease"] >= 1)]
    if len(learnish) == 0:
        return False, None
    has_four = bool((learnish["ease"] == 4).any())
    v1 = sched_ver is None or int(sched_ver) < 2
    if v1 and not has_four:
        easy = learnish[learnish["ease"] == 3]["ivl"]
        good = learnish[learnish["ease"] == 2]["ivl"]
        pattern = ""
        if len(easy) and len(good):
            pattern = (f"; interval pattern agrees: median interval after ease 3 = {int(easy.median())} d, "
                       f"after ease 2 = {int(good.median())} (negative = seconds, still learning)")
        return True, ("3-button learning detected (v1 scheduler, schema "
                      f"{settings['ver']}, no (re)learning entry with ease 4): (re)learning ease 2 -> Good (3), "
                      f"3 -> Easy (4), as Anki does when upgrading to the v2 scheduler" + pattern)
    if v1 and has_four:
        return False, "v1 scheduler but (re)learning entries with ease 4 exist: ratings kept as stored"
    return False, None


def _factorize(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Codes 0..K-1 in order of first appearance, and the uniques in that order."""
    codes, uniques = pd.factorize(values, sort=False)
    return codes.astype(np.int64), np.asarray(uniques)


def convert_collection(path: str | os.PathLike) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, list[str]]:
    """Convert one collection: (revlogs, cards, decks, notes). Raises ConversionError on bad input."""
    try:
        with open_collection(path) as conn:
            try:
                tables = _tables(conn)
                settings = _read_settings(conn, tables)
                revlog = _read_revlog(conn)
                cards = _read_cards(conn) if "cards" in tables else pd.DataFrame(
                    columns=["id", "nid", "did", "odid", "home"], dtype=np.int64)
                decks = _read_decks(conn, tables)
            except sqlite3.DatabaseError as exc:
                raise ConversionError(f"cannot read collection ({exc})") from None
    except sqlite3.DatabaseError as exc:
        raise ConversionError(f"cannot open SQLite database ({exc})") from None
    return _convert(settings, revlog, cards, decks)


class Notes(list):
    """The conversion's notes (lines of text), and in `dropped` how many revlog entries each rule removed (keys and
    wording: DROPPED) and in `dates` the span of the kept reviews, for a report that explains where a collection's
    reviews went."""

    def __init__(self):
        super().__init__()
        self.dropped: dict[str, int] = {}
        self.dates: list[str] | None = None  # first and last review kept, UTC


DROPPED = {
    "manual": "manual entry (set due date, reschedule, forget: no answer button)",
    "cram": "filtered-deck review that did not reschedule",
    "reset": "before the card's last reset (its history restarts)",
    "incomplete": "card whose history does not start with learning",
}


def _convert(settings, revlog, cards, decks):
    notes = Notes()
    if len(revlog) == 0:
        raise ConversionError("no reviews (the revlog table is empty)")
    three, note = detect_three_button(settings, revlog)
    if note:
        notes.append(note)

    df = revlog[(revlog["ease"] >= 1) & (revlog["ease"] <= 4) & revlog["type"].between(0, 3)]
    if len(df) == 0:
        raise ConversionError(f"no reviews: all {len(revlog)} revlog entries are manual/rescheduling entries "
                              "without an answer button")
    notes.dropped["manual"] = len(revlog) - len(df)
    cram = ((df["type"] == 3) & (df["factor"] == 0)).to_numpy()
    notes.dropped["cram"] = int(cram.sum())
    df = df[~cram].copy()
    if three:
        learn = df["type"].isin([0, 2]) & df["ease"].isin([2, 3])
        df.loc[learn, "ease"] = df.loc[learn, "ease"] + 1

    # per card, in time order
    df = df.sort_values(["cid", "id"], kind="mergesort").reset_index(drop=True)
    cid = df["cid"].to_numpy()
    is_learn = (df["type"] == 0).to_numpy()
    first = np.ones(len(df), dtype=bool)
    first[1:] = cid[1:] != cid[:-1]
    prev_learn = np.zeros(len(df), dtype=bool)
    prev_learn[1:] = is_learn[:-1]
    start = (is_learn & (first | ~prev_learn)) | first
    # index of the last start within each card, broadcast back to rows
    start_pos = np.where(start, np.arange(len(df)), -1)
    last_start = pd.Series(start_pos).groupby(cid).transform("max").to_numpy()
    keep = np.arange(len(df)) >= last_start
    notes.dropped["reset"] = int((~keep).sum())
    df = df[keep].reset_index(drop=True)
    cid = df["cid"].to_numpy()
    first = np.ones(len(df), dtype=bool)
    first[1:] = cid[1:] != cid[:-1]
    good_cards = df.loc[first & (df["type"] == 0).to_numpy(), "cid"]
    before = len(df)
    df = df[df["cid"].isin(good_cards)].reset_index(drop=True)
    notes.dropped["incomplete"] = before - len(df)
    if len(df) == 0:
        raise ConversionError("no usable reviews (no card has a review history that starts with learning)")
    cid = df["cid"].to_numpy()
    first = np.ones(len(df), dtype=bool)
    first[1:] = cid[1:] != cid[:-1]

    boundary, rule = day_boundary_seconds(settings)
    notes.append(rule)
    secs = df["id"].to_numpy() // 1000
    notes.dates = [time.strftime("%Y-%m-%d", time.gmtime(int(x))) for x in (secs.min(), secs.max())]
    # next rollover strictly after the last review, then whole days towards zero (Anki backend arithmetic)
    last = int(secs.max())
    next_day_at = last - ((last - boundary) % DAY_SECS) + DAY_SECS
    day = -((next_day_at - secs) // DAY_SECS)
    day = day - day.min()

    state = (df["type"].to_numpy() + 1).astype(np.int64)
    state[first] = 0
    elapsed_days = np.empty(len(df), dtype=np.int64)
    elapsed_secs = np.empty(len(df), dtype=np.int64)
    elapsed_days[1:] = day[1:] - day[:-1]
    ms = df["id"].to_numpy()
    elapsed_secs[1:] = (ms[1:] - ms[:-1]) // 1000
    elapsed_days[first] = -1
    elapsed_secs[first] = -1

    out = pd.DataFrame({
        "id": df["id"].to_numpy(), "cid": cid, "day_offset": day.astype(np.int64),
        "rating": df["ease"].to_numpy().astype(np.int64), "state": state,
        "duration": np.clip(df["time"].to_numpy(), 0, MAX_DURATION_MS).astype(np.int64),
        "elapsed_days": elapsed_days, "elapsed_seconds": elapsed_secs,
    })
    out = out.sort_values(["id", "cid"], kind="mergesort").reset_index(drop=True)
    card_codes, card_uniques = _factorize(out["cid"].to_numpy())
    out["card_id"] = card_codes
    revlogs = out[REVLOG_COLUMNS].reset_index(drop=True)

    # cards: reviewed cards first (their revlog ids), then the rest by raw id
    card_index = {int(c): i for i, c in enumerate(card_uniques)}
    rest = [int(c) for c in cards["id"].to_numpy() if int(c) not in card_index]
    for c in rest:
        card_index[c] = len(card_index)
    cards = cards.assign(card_id=cards["id"].map(card_index).astype(np.int64))
    cards = cards.sort_values("card_id", kind="mergesort").reset_index(drop=True)
    note_codes, _ = _factorize(cards["nid"].to_numpy())
    deck_order = list(dict.fromkeys(int(d) for d in cards["home"].to_numpy()))
    known = {d[0] for d in decks}
    deck_order += [d[0] for d in decks if d[0] not in set(deck_order)]
    deck_index = {d: i for i, d in enumerate(deck_order)}
    cards_df = pd.DataFrame({"card_id": cards["card_id"].to_numpy(), "note_id": note_codes,
                             "deck_id": cards["home"].map(deck_index).to_numpy().astype(np.int64)})

    by_name = {name: did for did, name, _ in decks}
    info = {did: (name, preset) for did, name, preset in decks}
    preset_index: dict[int, int] = {}
    rows = []
    for raw_did in deck_order:
        name, preset = info.get(raw_did, (None, None))
        parent = -1
        if name and "::" in name:
            parent_raw = by_name.get(name.rsplit("::", 1)[0])
            if parent_raw is not None:
                parent = deck_index[parent_raw]
        if preset is not None:
            preset = preset_index.setdefault(int(preset), len(preset_index))
        else:
            preset = -1
        rows.append((deck_index[raw_did], parent, preset))
    decks_df = pd.DataFrame(rows, columns=DECK_COLUMNS, dtype=np.int64)
    missing = [d for d in deck_order if d not in known]
    if missing:
        notes.append(f"{len(missing)} deck id(s) used by cards are not in the deck list (parent/preset -1)")
    return revlogs, cards_df, decks_df, notes


# ---------------------------------------------------------------------------------------------------------------
# Writing


def _table(df: pd.DataFrame, columns: list[str]) -> pa.Table:
    arrays = [pa.array(df[c].to_numpy(dtype=np.int64), type=pa.int64()) for c in columns]
    return pa.Table.from_arrays(arrays, schema=pa.schema([pa.field(c, pa.int64(), nullable=False) for c in columns]))


def _write_parquet(table: pa.Table, path: Path) -> Path:
    """Write to a temporary file next to `path`; return the temporary path (renamed by the caller)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".parquet", dir=path.parent)
    os.close(fd)
    try:
        pq.write_table(table, tmp, compression="zstd", compression_level=3, use_dictionary=False,
                       write_statistics=True, version="2.6", data_page_version="1.0", row_group_size=1 << 20,
                       store_schema=False)
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp creates 0600; give the files the usual permissions
    except BaseException:
        os.unlink(tmp)
        raise
    return Path(tmp)


def write_user(out_dir: str | os.PathLike, user_id: int, revlogs: pd.DataFrame, cards: pd.DataFrame,
               decks: pd.DataFrame) -> list[Path]:
    """Write one user's three parquet files (all to temporary names first, then renamed into place)."""
    out_dir = Path(out_dir)
    jobs = [(revlogs, REVLOG_COLUMNS, "revlogs"), (cards, CARD_COLUMNS, "cards"), (decks, DECK_COLUMNS, "decks")]
    written: list[tuple[Path, Path]] = []
    try:
        for df, cols, name in jobs:
            final = out_dir / name / f"user_id={user_id}" / "data.parquet"
            written.append((_write_parquet(_table(df, cols), final), final))
    except BaseException:
        for tmp, _ in written:
            tmp.unlink(missing_ok=True)
        raise
    for tmp, final in written:
        os.replace(tmp, final)
    return [final for _, final in written]


def summarize(revlogs: pd.DataFrame) -> str:
    ratings = revlogs["rating"].value_counts().reindex([1, 2, 3, 4], fill_value=0).tolist()
    return (f"{len(revlogs)} reviews, {revlogs['card_id'].nunique()} cards, "
            f"{int(revlogs['day_offset'].max()) + 1} days, ratings 1-4: {ratings}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Convert Anki collections (.colpkg, .apkg, collection.anki2/.anki21, .anki21b) into the "
                    "anki-revlogs-10k layout: DIR/{revlogs,cards,decks}/user_id=N/data.parquet, one user per file.")
    parser.add_argument("paths", nargs="+", metavar="PATH", help="Anki collection or package files")
    parser.add_argument("--out", required=True, type=Path, help="output dataset folder")
    parser.add_argument("--first-user-id", type=int, default=1,
                        help="user id of the first PATH; the next ones count up in the order given (default 1). "
                             "A file that fails keeps its id unused.")
    args = parser.parse_args(argv)
    if args.first_user_id < 0:
        parser.error("--first-user-id must be >= 0")
    failed = 0
    for offset, path in enumerate(args.paths):
        user_id = args.first_user_id + offset
        try:
            revlogs, cards, decks, notes = convert_collection(path)
            write_user(args.out, user_id, revlogs, cards, decks)
        except ConversionError as exc:
            print(f"error: {path}: {exc}", file=sys.stderr)
            failed += 1
            continue
        except OSError as exc:
            print(f"error: {path}: {exc.strerror or exc}", file=sys.stderr)
            failed += 1
            continue
        except Exception as exc:  # anything unforeseen in one file must not stop the others
            print(f"error: {path}: unexpected problem while converting ({type(exc).__name__}: {exc})",
                  file=sys.stderr)
            failed += 1
            continue
        print(f"user {user_id}: {path}: {summarize(revlogs)}")
        for note in notes:
            print(f"  note: {note}")
    if failed:
        print(f"{failed} of {len(args.paths)} file(s) failed", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
