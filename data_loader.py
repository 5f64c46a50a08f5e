"""Reading the anki-revlogs-10k layout: `revlogs/user_id=N/data.parquet` (+ `cards/`, `decks/` for partitions).

Everything that can be wrong with a user's file is detected here and raised as `DataError` with a message that
names the user and the problem, so the runner can report it in one line and go on with the other users.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from config import DEFAULT_DATA, EMBEDDED_DATA

REVLOG_COLUMNS = ["card_id", "day_offset", "rating", "state", "duration", "elapsed_days", "elapsed_seconds"]
REQUIRED_COLUMNS = ["card_id", "rating", "elapsed_days"]  # the rest is optional for day-mode models
_USER_DIR = re.compile(r"^user_id=(\d+)$")


class DataError(Exception):
    """A user's data cannot be used; the message says which user and why."""


# A data root is a local Path, or a string URL (s3://bucket/prefix, gs://..., any fsspec protocol) read through
# fsspec; "file://" URLs become local Paths. Everything below takes either.
DataRoot = Path | str


def is_url(data) -> bool:
    return isinstance(data, str) and "://" in data


def _fs(root: str):
    """(fsspec filesystem, path without protocol) of a URL root; credentials and endpoints come from the usual
    environment (AWS_ENDPOINT_URL, AWS_PROFILE, GOOGLE_APPLICATION_CREDENTIALS, ...)."""
    import fsspec

    fs, path = fsspec.core.url_to_fs(root)
    return fs, path.rstrip("/")


def partition_exists(root: DataRoot, table: str, user_id: int) -> bool:
    """Whether `<root>/<table>/user_id=N` exists (local folder or object-store prefix)."""
    if is_url(root):
        fs, path = _fs(root)
        return fs.exists(f"{path}/{table}/user_id={user_id}")
    return (Path(root) / table / f"user_id={user_id}").exists()


def resolve_data_root(data: DataRoot | None) -> tuple[DataRoot, str]:
    """The dataset folder (or URL) to use, and one line telling the user which one it is."""
    if isinstance(data, str) and data.startswith("file://"):
        data = Path(data.removeprefix("file://"))
    if is_url(data):
        root = data.rstrip("/")
        try:
            fs, path = _fs(root)
            ok = fs.isdir(f"{path}/revlogs")
        except ImportError as exc:
            raise DataError(f"cannot read {root}: {exc} (install the fsspec driver for this protocol, e.g. s3fs, "
                            f"gcsfs)") from None
        except Exception as exc:  # no credentials, no such bucket, endpoint down
            raise DataError(f"cannot read {root}: {type(exc).__name__}: {exc}") from None
        if not ok:
            raise DataError(f"{root} has no revlogs/ prefix (expected the anki-revlogs-10k layout: "
                            f"revlogs/user_id=N/data.parquet)")
        return root, f"data: {root}"
    if data is not None:
        root = Path(data)
        if not (root / "revlogs").is_dir():
            raise DataError(f"data folder {root} has no revlogs/ subfolder (expected the anki-revlogs-10k layout: "
                            f"revlogs/user_id=N/data.parquet); run download_data.py or build_dataset.py")
        return root, f"data: {root}"
    if (DEFAULT_DATA / "revlogs").is_dir():
        return DEFAULT_DATA, f"data: {DEFAULT_DATA} (anki-revlogs-10k)"
    if (EMBEDDED_DATA / "revlogs").is_dir():
        return EMBEDDED_DATA, (f"data: embedded data set {EMBEDDED_DATA.relative_to(EMBEDDED_DATA.parents[1])} "
                               f"(no --data given and {DEFAULT_DATA} not found; see data/embedded/README.md)")
    raise DataError(f"no data: {DEFAULT_DATA} does not exist and the embedded data set is missing; pass --data PATH")


def list_user_ids(root: DataRoot) -> list[int]:
    """User ids from the partition folder names, ascending."""
    ids = []
    if is_url(root):
        fs, path = _fs(root)
        for entry in fs.ls(f"{path}/revlogs", detail=True):
            m = _USER_DIR.match(entry["name"].rstrip("/").rsplit("/", 1)[-1])
            if m and entry["type"] == "directory":
                ids.append(int(m.group(1)))
        return sorted(ids)
    for entry in (Path(root) / "revlogs").iterdir():
        m = _USER_DIR.match(entry.name)
        if m and entry.is_dir():
            ids.append(int(m.group(1)))
    return sorted(ids)


@functools.lru_cache(maxsize=None)  # run_table.py asks once per row; the files do not change during a run
def _count_rows(root: DataRoot, user_id: int) -> int:
    """Reviews in a user's revlogs from the parquet footers alone (no data pages are read)."""
    if is_url(root):
        fs, path = _fs(root)
        files = sorted(f for f in fs.find(f"{path}/revlogs/user_id={user_id}")
                       if not f.rsplit("/", 1)[-1].startswith((".", "_")))
        total = 0
        for f in files:
            with fs.open(f, "rb") as fh:
                total += pq.ParquetFile(fh).metadata.num_rows
        return total
    folder = Path(root) / "revlogs" / f"user_id={user_id}"
    return sum(pq.ParquetFile(f).metadata.num_rows for f in sorted(folder.rglob("*"))
               if f.is_file() and not f.name.startswith((".", "_")))


def review_counts(root: DataRoot, users: list[int]) -> dict[int, int]:
    """Reviews per user from the parquet metadata, to schedule the largest collections first; a user whose files
    cannot be read counts 0 here (the run reports the real error when it gets to that user)."""
    def count(user: int) -> int:
        try:
            return _count_rows(root, user)
        except Exception:
            return 0

    if is_url(root) and len(users) > 1:  # one round trip per file: overlap them
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=min(32, len(users))) as ex:
            return dict(zip(users, ex.map(count, users)))
    return {u: count(u) for u in users}


def _read_arrow(root: DataRoot, table: str, user_id: int, columns: list[str] | None = None) -> pa.Table:
    """`<root>/<table>/user_id=N` as one arrow table (all of its parquet files, in name order); with `columns`, only
    those of them that the files have."""
    tab = _read_arrow_all(root, table, user_id, columns)
    return tab if columns is None else tab.select([c for c in tab.column_names if c in columns])


def _read_arrow_all(root: DataRoot, table: str, user_id: int, columns: list[str] | None) -> pa.Table:
    if is_url(root):
        fs, path = _fs(root)
        folder = f"{path}/{table}/user_id={user_id}"
        where = f"{root}/{table}/user_id={user_id}"
        if not fs.exists(folder):
            raise DataError(f"user {user_id}: {where} does not exist")
        try:
            return pq.read_table(folder, filesystem=fs)
        except Exception as exc:  # corrupt or unreadable parquet, lost connection
            raise DataError(f"user {user_id}: cannot read {where}: {exc}") from None
    folder = Path(root) / table / f"user_id={user_id}"
    if not folder.exists():
        raise DataError(f"user {user_id}: {folder} does not exist")
    try:
        files = sorted(folder.glob("*.parquet"))
        if len(files) == 1:  # the usual layout: reading the file skips the dataset discovery (~1 ms per user)
            file = pq.ParquetFile(files[0])
            if columns is not None:  # only the columns asked for are decoded
                columns = [c for c in file.schema_arrow.names if c in columns]
            # one thread: a worker has one core, and arrow's pool cost more CPU than it saved (3.3 → 1.4 ms for the
            # four columns the features need of a 45k-review user, against all seven on the thread pool)
            return file.read(columns=columns, use_threads=False)
        return pq.read_table(folder)
    except Exception as exc:  # corrupt or unreadable parquet
        raise DataError(f"user {user_id}: cannot read {folder}: {exc}") from None


def _read_partition(root: DataRoot, table: str, user_id: int) -> pd.DataFrame:
    return _read_arrow(root, table, user_id).to_pandas()


def load_revlogs(root: DataRoot, user_id: int, columns: list[str] | None = None) -> pd.DataFrame:
    """One user's revlog in file (= time) order, validated; `columns`: only these (those the file has; the required
    ones are always read). The checks run on the arrow columns as numpy arrays (a few hundred microseconds; pandas'
    versions of them took ~8 ms per user)."""
    if columns is not None:
        columns = list(dict.fromkeys([*REQUIRED_COLUMNS, *columns]))
    tab = _read_arrow(root, "revlogs", user_id, columns)
    names = [c for c in tab.column_names if not (c.startswith("__index") or c == "user_id")]
    missing = [c for c in REQUIRED_COLUMNS if c not in names]
    if missing:
        raise DataError(f"user {user_id}: revlogs lack column(s) {', '.join(missing)} "
                        f"(found: {', '.join(map(str, names))})")
    if tab.num_rows == 0:
        raise DataError(f"user {user_id}: no reviews")
    cols = {}
    for name in names:
        col = tab.column(name)
        values = col.to_numpy(zero_copy_only=False)
        n_missing = int(np.isnan(values).sum()) if values.dtype.kind == "f" else col.null_count  # nulls → NaN
        if n_missing and name in ("card_id", "rating", "elapsed_days"):
            raise DataError(f"user {user_id}: {n_missing} missing (NaN) value(s) in {name}")
        if name == "elapsed_seconds" and (n_missing or (values < -1).any()):
            raise DataError(f"user {user_id}: elapsed_seconds has NaN or values below -1")
        if name in ("card_id", "rating", "elapsed_days") and values.dtype.kind not in "iu":
            if values.dtype.kind != "f" or not np.all(np.mod(values, 1) == 0):
                raise DataError(f"user {user_id}: column {name} holds non-integer values")
            values = values.astype(np.int64)
        cols[name] = values
    if (cols["elapsed_days"] < -1).any():
        bad = int((cols["elapsed_days"] < -1).sum())
        raise DataError(f"user {user_id}: {bad} negative elapsed_days below -1 (only a first review may have -1)")
    return pd.DataFrame(cols)


def load_partitions(root: DataRoot, user_id: int, kind: str, card_ids: pd.Series) -> np.ndarray:
    """Per-review partition (deck_id or preset_id); -1 where the card or deck is unknown, as upstream fills it."""
    if kind == "none":
        return np.zeros(len(card_ids), dtype=np.int64)
    cards = _read_partition(root, "cards", user_id)
    key = "deck_id" if kind == "deck" else "preset_id"
    if kind == "preset":
        decks = _read_partition(root, "decks", user_id)
        cards = cards.merge(decks[["deck_id", "preset_id"]], on="deck_id", how="left")
    mapping = pd.Series(cards[key].to_numpy(), index=cards["card_id"].to_numpy())
    mapping = mapping[~mapping.index.duplicated()]
    return card_ids.map(mapping).fillna(-1).astype(np.int64).to_numpy()
