"""The evaluation split: scikit-learn's TimeSeriesSplit over a user's targets in time order.

Each fold trains on every row before its test block (an expanding window); the first block is never tested, so
5 folds evaluate 5 * floor(n / 6) rows. Written out here (TimeSeriesSplit's defaults: no gap, no training cap) so
that a run does not import scikit-learn (~1 s); tests/test_split_metrics.py checks it against TimeSeriesSplit.
"""

from __future__ import annotations

import numpy as np


def time_series_folds(n_rows: int, n_splits: int = 5) -> list[tuple[np.ndarray, np.ndarray]]:
    """(train indices, test indices) per fold, for rows already sorted by time; TimeSeriesSplit's error when the
    rows are fewer than the folds."""
    test_size = n_rows // (n_splits + 1)
    if n_splits + 1 > n_rows:
        raise ValueError(f"Cannot have number of folds={n_splits + 1} greater than the number of samples={n_rows}.")
    indices = np.arange(n_rows)
    return [(indices[:start], indices[start:start + test_size])
            for start in range(n_rows - n_splits * test_size, n_rows, test_size)]


def evaluated_size(n_rows: int, n_splits: int = 5) -> int:
    return n_splits * (n_rows // (n_splits + 1))
