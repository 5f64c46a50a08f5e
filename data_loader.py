"""Reading the anki-revlogs-10k layout: `revlogs/user_id=N/data.parquet` (+ `cards/`, `decks/` for partitions).

Everything that can be wrong with a user's file is detected here and raised as `DataError` with a message that
names the user and the problem, so the runner can report it in one line and go on with the other users.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from config import DEFAULT_DATA, EMBEDDED_DATA

REVLOG_COLUMNS = ["card_id", "day_offset", "rating", "state", "duration", "elapsed_days", "elapsed_seconds"]
REQUIRED_COLUMNS = ["card_id", "rating", "elapsed_days"]  # the rest is optional for day-mode models
_USER_DIR = re.compile(r"^user_id=(\d+)$")


class DataError(Exception):
    """A user's data cannot be used; the message says which user and why."""


def resolve_data_root(data: Path | None) -> tuple[Path, str]:
    """The dataset folder to use, and one line telling the user which one it is."""
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


def list_user_ids(root: Path) -> list[int]:
    """User ids from the partition folder names, ascending."""
    ids = []
    for entry in (Path(root) / "revlogs").iterdir():
        m = _USER_DIR.match(entry.name)
        if m and entry.is_dir():
            ids.append(int(m.group(1)))
    return sorted(ids)


def _read_partition(root: Path, table: str, user_id: int) -> pd.DataFrame:
    folder = Path(root) / table / f"user_id={user_id}"
    if not folder.exists():
        raise DataError(f"user {user_id}: {folder} does not exist")
    try:
        return pq.read_table(folder).to_pandas()
    except Exception as exc:  # corrupt or unreadable parquet
        raise DataError(f"user {user_id}: cannot read {folder}: {exc}") from None


def load_revlogs(root: Path, user_id: int) -> pd.DataFrame:
    """One user's revlog in file (= time) order, validated."""
    df = _read_partition(root, "revlogs", user_id)
    df = df.drop(columns=[c for c in df.columns if c.startswith("__index") or c == "user_id"])
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        raise DataError(f"user {user_id}: revlogs lack column(s) {', '.join(missing)} "
                        f"(found: {', '.join(map(str, df.columns))})")
    if len(df) == 0:
        raise DataError(f"user {user_id}: no reviews")
    for col in ("card_id", "rating", "elapsed_days"):
        if df[col].isna().any():
            raise DataError(f"user {user_id}: {int(df[col].isna().sum())} missing (NaN) value(s) in {col}")
    if (df["elapsed_days"] < -1).any():
        bad = int((df["elapsed_days"] < -1).sum())
        raise DataError(f"user {user_id}: {bad} negative elapsed_days below -1 (only a first review may have -1)")
    if "elapsed_seconds" in df.columns and (df["elapsed_seconds"].isna().any() or (df["elapsed_seconds"] < -1).any()):
        raise DataError(f"user {user_id}: elapsed_seconds has NaN or values below -1")
    for col in ("card_id", "rating", "elapsed_days"):
        values = df[col].to_numpy()
        if not np.issubdtype(values.dtype, np.integer):
            if not np.all(np.mod(values.astype(np.float64), 1) == 0):
                raise DataError(f"user {user_id}: column {col} holds non-integer values")
            df[col] = values.astype(np.int64)
    return df.reset_index(drop=True)


def load_partitions(root: Path, user_id: int, kind: str, card_ids: pd.Series) -> np.ndarray:
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
