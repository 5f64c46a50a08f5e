"""The evaluation split: scikit-learn's TimeSeriesSplit over a user's targets in time order.

Each fold trains on every row before its test block (an expanding window); the first block is never tested, so
5 folds evaluate 5 * floor(n / 6) rows.
"""

from __future__ import annotations

import numpy as np
from sklearn.model_selection import TimeSeriesSplit


def time_series_folds(n_rows: int, n_splits: int = 5) -> list[tuple[np.ndarray, np.ndarray]]:
    """(train indices, test indices) per fold, for rows already sorted by time."""
    return list(TimeSeriesSplit(n_splits=n_splits).split(np.arange(n_rows)))


def evaluated_size(n_rows: int, n_splits: int = 5) -> int:
    return n_splits * (n_rows // (n_splits + 1))
