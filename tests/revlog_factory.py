"""Small hand-made revlogs in the anki-revlogs-10k layout, for tests."""

from __future__ import annotations

from pathlib import Path

import pandas as pd


def make_revlog(cards: list[list[tuple[int, int]]]) -> pd.DataFrame:
    """cards[k] = [(day, rating), ...] in time order; returns rows in time order (day, then card, then order)."""
    rows = []
    for cid, reviews in enumerate(cards):
        prev_day = None
        for k, (day, rating) in enumerate(reviews):
            rows.append({
                "card_id": cid, "day_offset": day, "rating": rating, "state": 0 if k == 0 else 2,
                "duration": 1000, "elapsed_days": -1 if prev_day is None else day - prev_day,
                "elapsed_seconds": -1 if prev_day is None else (day - prev_day) * 86400 + 60 * k,
                "_order": (day, k, cid),
            })
            prev_day = day
    df = pd.DataFrame(rows)
    df = df.iloc[sorted(range(len(df)), key=lambda j: (df["_order"].iat[j][0], df["_order"].iat[j][2],
                                                       df["_order"].iat[j][1]))]
    return df.drop(columns="_order").reset_index(drop=True)


def write_user(root: Path, user_id: int, revlog: pd.DataFrame, cards: pd.DataFrame | None = None,
               decks: pd.DataFrame | None = None) -> None:
    for table, frame in (("revlogs", revlog), ("cards", cards), ("decks", decks)):
        if frame is None:
            continue
        folder = Path(root) / table / f"user_id={user_id}"
        folder.mkdir(parents=True, exist_ok=True)
        frame.to_parquet(folder / "data.parquet", index=False)
