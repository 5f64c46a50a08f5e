"""SM-2 (0 parameters): upstream's `SM2` and `SM2-short` rows (spec/models.md §6.1).

The SM-2 scheduler is run over the card's previous ratings only (the intervals actually waited are ignored) and the
interval it would have scheduled is read as an FSRS-style stability: p = 0.9^(t / ivl), computed as
exp(ln 0.9 · t / ivl) like upstream. Per previous rating G, with q = G + 1 ∈ {2..5}:
- q > 2 (pass): reps 0 → ivl 1; reps 1 → ivl 6; else ivl · EF; reps += 1;
- q = 2 (Again): ivl 1, reps 0;
- EF = max(1.3, EF + 0.1 − (5−q)(0.08 + 0.02(5−q))) after every review, failures included;
- [QUIRK] ivl = min(max(1, round(ivl + 0.01)), 36500): the interval is rounded to whole days (round half to even,
  Python's `round`) after every review, so the next ivl · EF starts from the rounded value.
`SM2-short` (`--short`) is the same model with same-day reviews kept in the histories.

No training: every target of a card reads the interval after its prefix of the card's sequence, so one pass over
each card (all cards side by side in numpy, no compiled code) gives all of a card's predictions.

Upstream quirk reproduced here (`restrict_targets`, called by the runner before the split): upstream's January-2025
`other.py` evaluates SM2 and Ebisu-v2 in `process_untrainable`, which LEFT-JOINS the revlogs with the `cards` and
`decks` tables before feature engineering (filling only deck_id/preset_id with −1), and `create_features` later runs
`df.dropna()` (after the outlier filter, before the continuity cut). Every review of a card that is missing from
`cards` (NaN note_id), or whose deck is missing from `decks` (NaN parent_id), is therefore dropped: those cards are
never targets and the TimeSeriesSplit runs on the smaller set. No other model takes that path (AVG, trained models,
RMSE-BINS-EXPLOIT and MOVING-AVG read the revlogs alone), which is why upstream evaluates 3035 reviews for
upstream-check user 12 with SM2/Ebisu-v2 and 3055 with every other model. The newer upstream (`data_loader.py`,
joins only with `--partitions`) no longer does this; `UPSTREAM_CARD_JOIN = False` turns it off.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from models.base import Model, ReviewData

S_MAX = 36500.0
LN_09 = math.log(0.9)
MIN_ROWS = 6  # upstream skips a user with fewer rows (checked after the join/dropna)


# ------------------------------------------------------------------------------------- upstream's card join quirk

def upstream_card_join_mask(card_ids: np.ndarray, cards: pd.DataFrame, decks: pd.DataFrame) -> np.ndarray:
    """True for rows whose card survives upstream's revlogs⋈cards⋈decks join + `dropna` (see the module doc).

    A card survives when it is in `cards`, its own columns (other than deck_id) are not NaN, and the joined deck row
    has no NaN outside deck_id/preset_id (those two are filled with −1 upstream). A deck missing from `decks` leaves
    parent_id NaN, so its cards go too.
    """
    def clean(df: pd.DataFrame) -> pd.DataFrame:
        return df.drop(columns=[c for c in df.columns if str(c).startswith("__index") or c == "user_id"])

    cards, decks = clean(cards), clean(decks)
    joined = cards.drop_duplicates("card_id").merge(decks.drop_duplicates("deck_id"), on="deck_id", how="left")
    checked = joined.drop(columns=[c for c in ("deck_id", "preset_id") if c in joined.columns])
    ok = joined["card_id"].to_numpy()[~checked.isna().any(axis=1).to_numpy()]
    return np.isin(np.asarray(card_ids), ok)


def restrict_to_joined_cards(data: ReviewData, root: Path, user_id: int) -> ReviewData:
    """The targets upstream's SM2/Ebisu-v2 path evaluates (before its TimeSeriesSplit).

    Without a cards/ or decks/ table for the user (e.g. simulated data) upstream's path cannot run at all; here
    every target is kept then."""
    from data_loader import _read_partition
    from features import NotEnoughData

    from data_loader import partition_exists  # local folders and object-store URLs alike

    if not all(partition_exists(root, table, user_id) for table in ("cards", "decks")):
        return data
    mask = upstream_card_join_mask(data.rows["card_id"].to_numpy(), _read_partition(root, "cards", user_id),
                                   _read_partition(root, "decks", user_id))
    if mask.all():
        return data
    kept = data.subset(mask)
    if len(kept) < MIN_ROWS:
        raise NotEnoughData(f"only {len(kept)} evaluation reviews after upstream's cards/decks join (need {MIN_ROWS})")
    return kept


def card_extents(rows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(sequence start, longest history needed) of every card that has a row in `rows`."""
    start = rows["seq_start"].to_numpy(np.int64)
    pos = rows["seq_pos"].to_numpy(np.int64)
    order = np.argsort(start, kind="stable")
    s_sorted = start[order]
    first = np.ones(len(s_sorted), dtype=bool)
    first[1:] = s_sorted[1:] != s_sorted[:-1]
    starts = s_sorted[first]
    need = np.maximum.reduceat(pos[order], np.flatnonzero(first)) if len(order) else np.zeros(0, np.int64)
    return starts, need


# ---------------------------------------------------------------------------------------------------- the model

def _sm2_intervals(seq_rating, starts, need, out):
    """out[start + k] = SM-2 interval after the card's first k reviews, for k = 1..need.

    All cards step side by side in numpy, longest first so that the cards still running are a prefix (at most 128
    steps: upstream keeps a card's first 2 · max_seq_len reviews). Numpy rather than a numba loop: the row then needs
    no compiled code, and a process skips numba's import and runtime set-up (~1 s of CPU, more than all 36
    simulated users' SM-2 passes take here)."""
    order = np.argsort(-need, kind="stable")
    starts, need = starts[order], need[order]
    neg_need = -need  # ascending: the cards with need > k are the first searchsorted(neg_need, -k) ones
    ivl = np.zeros(len(starts))
    ef = np.full(len(starts), 2.5)
    reps = np.zeros(len(starts), dtype=np.int64)
    for k in range(int(need[0]) if len(need) else 0):
        m = int(np.searchsorted(neg_need, -k, side="left"))
        pos = starts[:m] + k
        q = seq_rating[pos].astype(np.int64) + 1
        passed = q > 2
        r = reps[:m]
        grown = np.where(r == 0, 1.0, np.where(r == 1, 6.0, ivl[:m] * ef[:m]))
        new_ivl = np.where(passed, grown, 1.0)
        reps[:m] = np.where(passed, r + 1, 0)
        # same operation order as upstream, so the float EF is bit-identical
        d = 5 - q
        ef[:m] = np.maximum(1.3, ef[:m] + (0.1 - d * (0.08 + d * 0.02)))
        # [QUIRK] whole days, round half to even (Python's round), at least 1, at most 36500
        ivl[:m] = np.minimum(np.maximum(1.0, np.rint(new_ivl + 0.01)), S_MAX)
        out[pos + 1] = ivl[:m]


def sm2_intervals(data: ReviewData) -> np.ndarray:
    """The SM-2 interval each row of `data` reads (after the card's reviews before it)."""
    starts, need = card_extents(data.rows)
    out = np.full(len(data.seq_rating) + 1, np.nan)
    _sm2_intervals(data.seq_rating, starts, need, out)
    return out[data.rows["seq_start"].to_numpy(np.int64) + data.rows["seq_pos"].to_numpy(np.int64)]


class SM2(Model):
    name = "SM2"
    n_params = 0
    UPSTREAM_CARD_JOIN = True  # reproduce upstream's cards/decks join + dropna (module doc)

    def __init__(self, cfg=None):
        self.cfg = cfg

    @classmethod
    def restrict_targets(cls, data: ReviewData, root: Path, user_id: int, cfg=None) -> ReviewData:
        """Runner hook, called once per user before the split: the rows upstream evaluates for this model."""
        return restrict_to_joined_cards(data, root, user_id) if cls.UPSTREAM_CARD_JOIN else data

    def fit(self, train: ReviewData) -> "SM2":
        return self  # nothing to train

    def predict(self, test: ReviewData) -> np.ndarray:
        ivl = sm2_intervals(test)
        if np.isnan(ivl).any():  # a target without history: upstream's sm2("") raises as well
            raise ValueError("SM2 needs at least one earlier review of the card for every target")
        return np.exp(LN_09 * test.rows["delta_t"].to_numpy(np.float64) / ivl)
