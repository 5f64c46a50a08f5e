"""build_dataset.py: Anki collections -> anki-revlogs-10k layout, on seven real collections (tests/fixtures/anki)."""

from __future__ import annotations

import shutil
import sqlite3
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import zstandard

import build_dataset as bd

from check_users import CHECK

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "anki"
MY_DECKS = FIXTURES / "kedarmhaswade-my-anki-decks.anki21"
KANJI = FIXTURES / "illdepence-kanjiplot.anki2"
SAT = FIXTURES / "kedarmhaswade-SAT-math-formulas.colpkg"
VOCAB = FIXTURES / "kedarmhaswade-english-vocab-2023.apkg"
DOTFILES = FIXTURES / "geovannewashington-dot-files.anki2"
FRENCH = FIXTURES / "mauriciopoppe-french-words-and-phrases.apkg"
MINING = FIXTURES / "mauriciopoppe-japanese-mining.apkg"
FIRST = [MY_DECKS, KANJI, SAT, VOCAB]
ADDED = [DOTFILES, FRENCH, MINING]  # added later: users 5, 6, 7 of data/embedded
ALL = FIRST + ADDED  # data/embedded's users 1..7, in this order

# Expected (reviews, cards) after conversion. Each is also recomputed below by an independent SQL query that applies
# the rules of spec/pipeline.md section 1.3 inside SQLite. The first two equal the published converter's row counts
# for these collections (tests/fixtures/upstream-check users 8 and 12).
EXPECTED = {
    MY_DECKS.name: (9248, 3005),
    KANJI.name: (6111, 1011),
    SAT.name: (224, 90),
    VOCAB.name: (94, 38),
    DOTFILES.name: (3779, 760),
    FRENCH.name: (3470, 461),
    MINING.name: (2238, 164),
}
# Rating counts 1..4 (kanjiplot after the 3-button remap of (re)learning entries).
EXPECTED_RATINGS = {
    MY_DECKS.name: [445, 283, 3341, 5179],
    KANJI.name: [313, 601, 4591, 606],
}

EXPECTED_SQL = """
WITH f AS (
    SELECT id, cid, type FROM revlog
    WHERE ease BETWEEN 1 AND 4 AND type BETWEEN 0 AND 3 AND NOT (type = 3 AND factor = 0)
), g AS (
    SELECT id, cid, type,
           LAG(type) OVER (PARTITION BY cid ORDER BY id) AS prev_type,
           ROW_NUMBER() OVER (PARTITION BY cid ORDER BY id) AS rn
    FROM f
), starts AS (
    SELECT cid, MAX(id) AS start_id FROM g
    WHERE rn = 1 OR (type = 0 AND prev_type <> 0)
    GROUP BY cid
), kept AS (
    SELECT g.cid, g.id FROM g JOIN starts s ON g.cid = s.cid AND g.id >= s.start_id
    WHERE s.cid IN (SELECT g2.cid FROM g g2 JOIN starts s2 ON g2.id = s2.start_id WHERE g2.type = 0)
)
SELECT COUNT(*), COUNT(DISTINCT cid) FROM kept
"""


def _sqlite_copy(path: Path, tmp_path: Path) -> Path:
    """The SQLite database inside `path`, extracted here without using build_dataset."""
    out = tmp_path / (path.stem + ".sqlite")
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as zf:
            names = zf.namelist()
            if "collection.anki21b" in names:
                with zf.open("collection.anki21b") as src, open(out, "wb") as dst:
                    zstandard.ZstdDecompressor().copy_stream(src, dst)
            else:
                out.write_bytes(zf.read("collection.anki21" if "collection.anki21" in names else "collection.anki2"))
    else:
        shutil.copyfile(path, out)
    return out


@pytest.fixture(scope="module")
def converted():
    return {p.name: bd.convert_collection(p) for p in ALL}


def test_fixtures_small_and_licensed():
    total = sum(p.stat().st_size for p in FIRST)
    assert total < 5_000_000
    assert (FIXTURES / "LICENSE-kedarmhaswade-my-anki-decks.txt").exists()
    assert (FIXTURES / "LICENSE-illdepence-kanjiplot.txt").exists()
    # the later ones: each under 3 MB (the Japanese-mining export carries its 347 media files), 3.65 MB together
    assert all(p.stat().st_size < 3_000_000 for p in ADDED)
    assert sum(p.stat().st_size for p in ADDED) < 4_000_000
    assert (FIXTURES / "LICENSE-geovannewashington-dot-files.txt").exists()
    assert (FIXTURES / "LICENSE-mauriciopoppe-anki-decks.txt").exists()


@pytest.mark.parametrize("path", ALL, ids=lambda p: p.name)
def test_expected_counts_match_independent_sql(path, tmp_path):
    db = _sqlite_copy(path, tmp_path)
    with sqlite3.connect(db) as conn:
        rows, cards = conn.execute(EXPECTED_SQL).fetchone()
    assert (rows, cards) == EXPECTED[path.name]


@pytest.mark.parametrize("path", ALL, ids=lambda p: p.name)
def test_revlogs_shape_and_rules(path, converted):
    revlogs, cards, decks, _ = converted[path.name]
    assert list(revlogs.columns) == bd.REVLOG_COLUMNS
    assert list(cards.columns) == bd.CARD_COLUMNS
    assert list(decks.columns) == bd.DECK_COLUMNS
    for df in (revlogs, cards, decks):
        assert all(df[c].dtype == np.int64 for c in df.columns), "only int64 columns (no text)"
    assert (len(revlogs), revlogs["card_id"].nunique()) == EXPECTED[path.name]
    assert revlogs["rating"].between(1, 4).all()
    assert revlogs["state"].between(0, 4).all()
    assert revlogs["duration"].between(0, 60000).all()
    assert revlogs["day_offset"].min() == 0
    assert revlogs["day_offset"].is_monotonic_increasing  # rows are in review-time order
    # card ids 0..K-1 in order of first appearance
    first_seen = pd.unique(revlogs["card_id"])
    assert (first_seen == np.arange(len(first_seen))).all()

    by_card = revlogs.groupby("card_id", sort=False)
    first = by_card.cumcount() == 0
    assert (revlogs.loc[first, "state"] == 0).all()
    assert (revlogs.loc[first, "elapsed_days"] == -1).all()
    assert (revlogs.loc[first, "elapsed_seconds"] == -1).all()
    assert (revlogs.loc[~first, "state"] != 0).all()  # only the learn start is state 0
    prev_day = by_card["day_offset"].shift(1)
    assert (revlogs.loc[~first, "elapsed_days"] == revlogs.loc[~first, "day_offset"] - prev_day[~first]).all()
    assert (revlogs.loc[~first, "elapsed_seconds"] >= 0).all()
    # a later day always means at least some seconds passed, a same-day review less than a day
    later = ~first & (revlogs["elapsed_days"] > 0)
    assert (revlogs.loc[later, "elapsed_seconds"] > 0).all()
    assert (revlogs.loc[~first & (revlogs["elapsed_days"] == 0), "elapsed_seconds"] < 86400).all()

    # cards/decks are consistent with the revlogs and with each other
    assert cards["card_id"].is_unique
    assert set(revlogs["card_id"]) - set(cards["card_id"]) <= set(range(revlogs["card_id"].max() + 1))
    assert set(cards["deck_id"]) <= set(decks["deck_id"])
    assert set(decks["parent_id"]) - {-1} <= set(decks["deck_id"])
    assert sorted(decks["deck_id"]) == list(range(len(decks)))


def test_rating_distributions(converted):
    for name, expected in EXPECTED_RATINGS.items():
        counts = converted[name][0]["rating"].value_counts().reindex([1, 2, 3, 4], fill_value=0).tolist()
        assert counts == expected, name


def test_three_button_detection(converted):
    for path in ALL:
        notes = converted[path.name][3]
        detected = any("3-button" in n for n in notes)
        assert detected == (path == KANJI), path.name


def test_three_button_mapping_matches_raw_counts(tmp_path, converted):
    """Kanjiplot: (re)learning ease 3 (Easy) becomes 4, ease 2 (Good) becomes 3; reviews/filtered keep theirs."""
    db = _sqlite_copy(KANJI, tmp_path)
    with sqlite3.connect(db) as conn:
        raw_easy = conn.execute("SELECT COUNT(*) FROM revlog WHERE type IN (0, 2) AND ease = 3").fetchone()[0]
        raw_review_easy = conn.execute("SELECT COUNT(*) FROM revlog WHERE type = 1 AND ease = 4").fetchone()[0]
    revlogs = converted[KANJI.name][0]
    assert (revlogs["rating"] == 4).sum() == raw_easy + raw_review_easy
    learn = revlogs[revlogs["state"].isin([0, 1, 3])]
    assert (learn["rating"] == 4).any() and not (learn["rating"] == 2).any()


def test_kanjiplot_keeps_filtered_reviews_as_state_4(converted):
    revlogs = converted[KANJI.name][0]
    assert (revlogs["state"] == 4).sum() == 167


def test_day_boundaries(converted):
    notes = converted[MY_DECKS.name][3]
    assert any("4:00 local time" in n and "+5.5" in n for n in notes)
    assert any("col.crt" in n for n in converted[KANJI.name][3])
    assert any("-7 h" in n for n in converted[SAT.name][3])
    # their configs: creationOffset/localOffset 180 (minutes west of UTC), 240 in the two exports
    assert any("4:00 local time" in n and "-3 h" in n for n in converted[DOTFILES.name][3])
    assert any("4:00 local time" in n and "-4 h" in n for n in converted[FRENCH.name][3])
    assert any("4:00 local time" in n and "-4 h" in n for n in converted[MINING.name][3])


def test_decks_hierarchy(converted):
    decks = converted[MY_DECKS.name][2]
    assert len(decks) == 53
    assert (decks["parent_id"] == -1).sum() == 16
    assert set(decks["preset_id"]) == {-1, 0}  # one preset, and a filtered deck


@pytest.mark.parametrize("path,user", [(MY_DECKS, 8), (KANJI, 12)], ids=["my-anki-decks", "kanjiplot"])
def test_matches_published_conversion(path, user, converted):
    """Same rows as the dataset's own converter, row by row; card ids are equal up to a relabelling."""
    mine = converted[path.name][0]
    theirs = pd.read_parquet(CHECK / "revlogs" / f"user_id={user}" / "data.parquet")
    assert len(mine) == len(theirs)
    for col in ("day_offset", "rating", "state", "duration", "elapsed_days", "elapsed_seconds"):
        assert (mine[col].to_numpy() == theirs[col].to_numpy()).all(), col
    pairs = pd.DataFrame({"a": mine["card_id"].to_numpy(), "b": theirs["card_id"].to_numpy()}).drop_duplicates()
    assert pairs["a"].is_unique and pairs["b"].is_unique


def _write_all(paths, out: Path):
    for uid, p in enumerate(paths, start=1):
        r, c, d, _ = bd.convert_collection(p)
        bd.write_user(out, uid, r, c, d)


def _files(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*.parquet"))}


def test_byte_identical_double_conversion(tmp_path):
    paths = [KANJI, SAT, VOCAB]
    _write_all(paths, tmp_path / "a")
    _write_all(paths, tmp_path / "b")
    a, b = _files(tmp_path / "a"), _files(tmp_path / "b")
    assert len(a) == 9 and a == b
    assert not list((tmp_path / "a").rglob(".tmp-*"))


def test_written_files_read_back(tmp_path, converted):
    r, c, d, _ = converted[VOCAB.name]
    bd.write_user(tmp_path, 7, r, c, d)
    back = pd.read_parquet(tmp_path / "revlogs" / "user_id=7" / "data.parquet")
    assert list(back.columns) == bd.REVLOG_COLUMNS  # no pandas index column
    pd.testing.assert_frame_equal(back, r)
    import pyarrow.parquet as pq

    meta = pq.read_metadata(tmp_path / "revlogs" / "user_id=7" / "data.parquet")
    assert meta.row_group(0).column(0).compression.lower() == "zstd"
    assert not (meta.metadata or {}).get(b"pandas")


def test_shuffled_revlog_converts_identically(tmp_path, converted):
    shuffled = tmp_path / "shuffled.anki2"
    shutil.copyfile(KANJI, shuffled)
    with sqlite3.connect(shuffled) as conn:
        # `id` is the rowid of the real table, so rebuild it without a primary key to store rows out of order
        conn.execute("CREATE TABLE revlog2 AS SELECT * FROM revlog WHERE 0")
        conn.execute("INSERT INTO revlog2 SELECT * FROM revlog ORDER BY (id * 7919) % 10007, cid DESC")
        conn.execute("DROP TABLE revlog")
        conn.execute("ALTER TABLE revlog2 RENAME TO revlog")
        first_ids = [r[0] for r in conn.execute("SELECT id FROM revlog LIMIT 5")]
    assert first_ids != sorted(first_ids)
    r, c, d, _ = bd.convert_collection(shuffled)
    r0, c0, d0, _ = converted[KANJI.name]
    pd.testing.assert_frame_equal(r, r0)
    pd.testing.assert_frame_equal(c, c0)
    pd.testing.assert_frame_equal(d, d0)
    bd.write_user(tmp_path / "x", 1, r, c, d)
    bd.write_user(tmp_path / "y", 1, r0, c0, d0)
    assert _files(tmp_path / "x") == _files(tmp_path / "y")


def test_bare_anki21b_and_anki21(tmp_path, converted):
    with zipfile.ZipFile(SAT) as zf:
        (tmp_path / "collection.anki21b").write_bytes(zf.read("collection.anki21b"))
    r, *_ = bd.convert_collection(tmp_path / "collection.anki21b")
    pd.testing.assert_frame_equal(r, converted[SAT.name][0])
    with zipfile.ZipFile(VOCAB) as zf:
        (tmp_path / "collection.anki21").write_bytes(zf.read("collection.anki21"))
    r, *_ = bd.convert_collection(tmp_path / "collection.anki21")
    pd.testing.assert_frame_equal(r, converted[VOCAB.name][0])


def _bad_inputs(tmp: Path) -> dict[str, Path]:
    bad = {}
    p = tmp / "notes.txt"
    p.write_text("hello, this is not a collection\n")
    bad["not a collection"] = p
    p = tmp / "corrupt.colpkg"
    p.write_bytes(SAT.read_bytes()[:20000])  # truncated zip
    bad["corrupt zip"] = p
    p = tmp / "nocollection.apkg"
    with zipfile.ZipFile(p, "w") as zf:
        zf.writestr("media", "{}")
    bad["zip without collection"] = p
    p = tmp / "badmember.apkg"  # intact zip directory, damaged compressed collection
    buf = bytearray()
    with zipfile.ZipFile(p, "w", zipfile.ZIP_DEFLATED) as zf:
        with zipfile.ZipFile(VOCAB) as src:
            zf.writestr("collection.anki21", src.read("collection.anki21"))
    buf = bytearray(p.read_bytes())
    buf[200:260] = b"\x00" * 60
    p.write_bytes(bytes(buf))
    bad["corrupt member"] = p
    p = tmp / "badzstd.anki21b"
    p.write_bytes(b"\x28\xb5\x2f\xfd" + b"\x00garbage" * 10)
    bad["corrupt zstd"] = p
    p = tmp / "empty.anki2"
    shutil.copyfile(KANJI, p)
    with sqlite3.connect(p) as conn:
        conn.execute("DELETE FROM revlog")
    bad["no reviews"] = p
    p = tmp / "manualonly.anki2"
    shutil.copyfile(KANJI, p)
    with sqlite3.connect(p) as conn:
        conn.execute("UPDATE revlog SET ease = 0, type = 4")
    bad["only manual entries"] = p
    p = tmp / "future.anki2"
    shutil.copyfile(KANJI, p)
    with sqlite3.connect(p) as conn:
        conn.execute("UPDATE col SET ver = 99")
    bad["unsupported schema"] = p
    p = tmp / "other.sqlite"
    with sqlite3.connect(p) as conn:
        conn.execute("CREATE TABLE t (x)")
    bad["sqlite but not anki"] = p
    p = tmp / "garbled.anki2"
    p.write_bytes(b"SQLite format 3\x00" + b"\xff" * 4000)
    bad["corrupt sqlite"] = p
    return bad


def test_bad_inputs_report_and_others_convert(tmp_path, capsys):
    bad = _bad_inputs(tmp_path)
    for what, p in bad.items():
        with pytest.raises(bd.ConversionError):
            bd.convert_collection(p)
    paths = [str(VOCAB)] + [str(p) for p in bad.values()] + [str(tmp_path / "missing.colpkg"), str(SAT)]
    out = tmp_path / "out"
    rc = bd.main(paths + ["--out", str(out), "--first-user-id", "10"])
    captured = capsys.readouterr()
    assert rc == 1
    err_lines = [line for line in captured.err.splitlines() if line.startswith("error: ")]
    assert len(err_lines) == len(bad) + 1
    for p in list(bad.values()) + [tmp_path / "missing.colpkg"]:
        assert any(line.startswith(f"error: {p}: ") for line in err_lines), p
    # the good files still converted, with their positional user ids; nothing written for the bad ones
    users = sorted(d.name for d in (out / "revlogs").iterdir())
    assert users == ["user_id=10", f"user_id={10 + len(bad) + 2}"]
    for table in ("revlogs", "cards", "decks"):
        assert sorted(d.name for d in (out / table).iterdir()) == users
    assert not [p for p in out.rglob("*") if p.is_file() and p.name != "data.parquet"]


def test_cli_success_exit_code(tmp_path, capsys):
    rc = bd.main([str(KANJI), str(VOCAB), "--out", str(tmp_path)])
    captured = capsys.readouterr()
    assert rc == 0 and captured.err == ""
    assert "user 1:" in captured.out and "user 2:" in captured.out and "3-button" in captured.out
    assert (tmp_path / "decks" / "user_id=2" / "data.parquet").exists()


def test_no_text_in_output(tmp_path, converted):
    """Only integers leave the converter: no field/deck-name text in any parquet file."""
    r, c, d, _ = converted[VOCAB.name]
    bd.write_user(tmp_path, 1, r, c, d)
    db = _sqlite_copy(VOCAB, tmp_path)
    with sqlite3.connect(db) as conn:
        words = [w for (flds,) in conn.execute("SELECT flds FROM notes") for w in flds.split("\x1f") if len(w) > 6]
    assert words
    blob = b"".join(_files(tmp_path).values())
    assert not [w for w in words[:50] if w.encode() in blob]


def test_embedded_data_is_reproducible(tmp_path, converted):
    """data/embedded holds exactly what build_dataset.py makes of the seven fixtures (users 1..7 in README order),
    and nothing else."""
    root = Path(__file__).resolve().parents[1] / "data" / "embedded"
    for uid, path in enumerate(ALL, start=1):
        for table, df in zip(("revlogs", "cards", "decks"), converted[path.name][:3]):
            stored = pd.read_parquet(root / table / f"user_id={uid}" / "data.parquet")
            pd.testing.assert_frame_equal(stored, df, obj=f"{table} user {uid}")
    for table in ("revlogs", "cards", "decks"):
        assert sorted(p.name for p in (root / table).iterdir()) == [f"user_id={u}" for u in range(1, len(ALL) + 1)]
    assert (root / "README.md").exists()
    assert sorted(p.name for p in root.glob("LICENSE-*.txt")) == [
        f"LICENSE-{name}.txt" for name in ("geovannewashington-dot-files", "illdepence-kanjiplot",
                                           "kedarmhaswade-my-anki-decks", "mauriciopoppe-anki-decks")]


def test_v1_collection_with_four_learning_buttons_is_not_remapped(tmp_path):
    """Evidence against 3 buttons (a (re)learning entry with ease 4) wins over the v1 scheduler setting."""
    p = tmp_path / "v1-with-ease4.anki2"
    shutil.copyfile(KANJI, p)
    with sqlite3.connect(p) as conn:
        conn.execute("UPDATE revlog SET ease = 4 WHERE id = (SELECT MIN(id) FROM revlog WHERE type = 0 AND ease = 3)")
    revlogs, _, _, notes = bd.convert_collection(p)
    assert not any("3-button" in n for n in notes)
    assert any("ratings kept as stored" in n for n in notes)
    assert (revlogs["rating"] == 2).sum() > 1000  # learning "Good" (stored as 2) is no longer moved to 3


def test_conversion_counts_what_each_rule_dropped(converted):
    """Kept reviews plus the drops per rule are the collection's whole revlog table (counted by SQL here), with the
    counts data/embedded/README.md gives: kanjiplot 15 cram + 32 before a reset; SAT 3,770 manual entries, 12 before
    a reset, 234 of cards whose history does not start with learning; geovannewashington 1 manual entry; Japanese
    mining 30 manual, 14 cram, 6 before a reset. The manual and cram counts are counted by SQL here too."""
    expect = {MY_DECKS.name: {}, KANJI.name: {"cram": 15, "reset": 32},
              SAT.name: {"manual": 3770, "reset": 12, "incomplete": 234}, VOCAB.name: {},
              DOTFILES.name: {"manual": 1}, FRENCH.name: {}, MINING.name: {"manual": 30, "cram": 14, "reset": 6}}
    for path in ALL:
        revlogs, _, _, notes = converted[path.name]
        assert {k: v for k, v in notes.dropped.items() if v} == expect[path.name]
        with bd.open_collection(path) as conn:
            (total,) = conn.execute("SELECT COUNT(*) FROM revlog").fetchone()
            (manual,) = conn.execute("SELECT COUNT(*) FROM revlog "
                                     "WHERE NOT (ease BETWEEN 1 AND 4 AND type BETWEEN 0 AND 3)").fetchone()
            (cram,) = conn.execute("SELECT COUNT(*) FROM revlog "
                                   "WHERE ease BETWEEN 1 AND 4 AND type = 3 AND factor = 0").fetchone()
        assert len(revlogs) + sum(notes.dropped.values()) == total
        assert (notes.dropped["manual"], notes.dropped["cram"]) == (manual, cram)
        assert len(notes.dates) == 2 and notes.dates[0] <= notes.dates[1]
