"""What every model sees and provides.

`ReviewData` holds the target rows of one user (or a train/test subset of them) together with the card review
sequences their histories point into. A target row's history is `seq_*[seq_start : seq_start + seq_pos]` and the
row itself is the review at `seq_start + seq_pos`. Every target of a card is therefore a prefix of one sequence,
so a model can compute all of a card's predictions in a single pass over it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd


class InadequateData(Exception):
    """Training is impossible on this data (empty set, no first reviews, ...): the runner falls back to defaults."""


@dataclass
class ReviewData:
    rows: pd.DataFrame  # target rows in time order; columns documented in features.py
    seq_delta_t: np.ndarray  # float64: interval (days) before each review in card-sequence order, 0 for a first review
    seq_rating: np.ndarray  # int8: rating 1-4 of each review in card-sequence order

    def __len__(self) -> int:
        return len(self.rows)

    def subset(self, selector) -> "ReviewData":
        """Rows chosen by a boolean mask or positional indices; the sequences are shared, not copied. The runner's
        selections are nearly always one block of rows (a fold's train or test rows; a partition's mask that keeps
        every row), which a slice takes ~3× faster than pandas' take (20 subsets per user)."""
        if isinstance(selector, pd.Series) and selector.dtype == bool:
            rows = self.rows[selector]  # aligned on the index
        else:
            index = np.asarray(selector)
            if index.dtype == bool:
                index = np.flatnonzero(index)
            if len(index) and index[-1] - index[0] == len(index) - 1 and (np.diff(index) == 1).all():
                rows = self.rows.iloc[int(index[0]):int(index[-1]) + 1]
            else:
                rows = self.rows.iloc[index]
        rows.index = pd.RangeIndex(len(rows))  # a fresh 0..n−1 index on the new frame (reset_index copies: 2.5× slower)
        return ReviewData(rows, self.seq_delta_t, self.seq_rating)

    def history(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(intervals, ratings) of the reviews before target row k."""
        start = int(self.rows["seq_start"].iat[k])
        pos = int(self.rows["seq_pos"].iat[k])
        return self.seq_delta_t[start:start + pos], self.seq_rating[start:start + pos]


def column(rows: pd.DataFrame, name: str, dtype=None) -> np.ndarray:
    """rows[name].to_numpy(dtype), read-only, without building a Series: ~2 µs instead of ~30 µs in pandas 3, and
    the per-fold, per-partition code reads a few hundred columns per user (the -deck rows ~450). Falls back to the
    public path where pandas' internals differ (or the name is not one column)."""
    try:
        values = rows._get_column_array(rows.columns.get_loc(name)).view()
        values.flags.writeable = False
    except (AttributeError, TypeError, ValueError):
        values = rows[name].to_numpy()
    return values if dtype is None else values.astype(dtype, copy=False)


def recency_weights(n: int) -> np.ndarray:
    """0.25 + 0.75·x³ with x = linspace(0, 1, n): the oldest row weighs 0.25, the newest 1 (upstream's --recency).
    Here, not in upstream/training.py, so that the compiled trainers use it without importing torch."""
    x = np.linspace(0, 1, n)
    return 0.25 + 0.75 * np.power(x, 3)


class Model:
    """fit/predict in the spirit of scikit-learn. One instance per (user, fold, partition)."""

    name: str = ""
    n_params: int = 0
    # About how long a first run's toy run of this model takes to compile (warmup.py: a model without compile_units),
    # so that a long one starts first instead of being the last on one worker while the others wait
    first_run_seconds: float = 3.0

    def fit(self, train: ReviewData) -> "Model":
        return self

    def predict(self, test: ReviewData) -> np.ndarray:
        """P(recall) for every row of `test`, in row order, strictly inside (0, 1) where possible."""
        raise NotImplementedError

    def parameters(self) -> list[float] | None:
        """What goes into the result line's `parameters` (None for models without a parameter list)."""
        return None

    def compile_units(self) -> list:
        """The compiled code this model's fits and predictions need, as independent units (engine/jit_cache.Unit) that a
        first run compiles side by side before its users (warmup.py): by default its engine's (`self.engine`, when
        it has compile_units); [] for none, and then a first run warms it by running it on a small user."""
        units = getattr(getattr(self, "engine", None), "compile_units", None)
        trains = self.n_params > 0 and getattr(getattr(self, "cfg", None), "trainer", "fast") == "fast"
        return units(train=trains) if units else []
