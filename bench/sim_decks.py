"""Cards and decks tables for a simulated data folder, so that the `--partitions preset|deck` rows run on it.

    python bench/sim_decks.py --data /tmp/sim36 --out /tmp/sim36-decks

bench/simulate.py writes only revlogs; the preset and deck rows (FSRS-5-preset, FSRS-5-deck, ...) also read each
user's `cards` (card_id → deck_id) and `decks` (deck_id → preset_id) tables. This writes both, seeded per user, in
the anki-revlogs-10k layout (`cards/user_id=N/data.parquet`, `decks/user_id=N/data.parquet`), into a new folder
whose `revlogs` is a link to the original's (the reviews are not copied or changed):
- 2–8 decks per user, each card's deck drawn with uneven (Zipf-like) weights, as real collections have a few big
  decks and several small ones; 1–3 presets, every deck given one of them;
- 1 % of the cards left out of the cards table, so that both sides' "unknown card → partition -1" path is used.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd


def user_tables(card_ids: np.ndarray, seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(cards, decks) of one user whose reviewed cards are `card_ids`."""
    rng = np.random.default_rng(seed)
    n_decks = int(rng.integers(2, 9))
    weights = 1.0 / np.arange(1, n_decks + 1)
    deck_of_card = rng.choice(n_decks, size=len(card_ids), p=weights / weights.sum())
    kept = rng.random(len(card_ids)) >= 0.01
    cards = pd.DataFrame({"card_id": card_ids[kept], "note_id": card_ids[kept], "deck_id": deck_of_card[kept]})
    presets = rng.integers(0, int(rng.integers(1, 4)), size=n_decks)
    decks = pd.DataFrame({"deck_id": np.arange(n_decks), "parent_id": -1, "preset_id": presets})
    return cards, decks


def write_tables(root: Path, user: int, cards: pd.DataFrame, decks: pd.DataFrame) -> None:
    """A user's cards and decks tables in the anki-revlogs-10k layout: root/{cards,decks}/user_id=N/data.parquet."""
    for name, table in (("cards", cards), ("decks", decks)):
        folder = root / name / f"user_id={user}"
        folder.mkdir(parents=True, exist_ok=True)
        table.to_parquet(folder / "data.parquet", index=False)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, required=True, help="a folder with revlogs/user_id=N/ (bench/simulate.py)")
    ap.add_argument("--out", type=Path, required=True, help="the new folder (revlogs linked, cards and decks written)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    if not (a.out / "revlogs").exists():
        (a.out / "revlogs").symlink_to((a.data / "revlogs").resolve())
    for part in sorted((a.data / "revlogs").glob("user_id=*")):
        user = int(part.name.split("=")[1])
        card_ids = np.unique(pd.read_parquet(part, columns=["card_id"])["card_id"].to_numpy())
        write_tables(a.out, user, *user_tables(card_ids, a.seed * 1_000_003 + user))
    print(f"cards and decks for {len(list((a.out / 'cards').iterdir()))} users in {a.out}")


if __name__ == "__main__":
    main()
