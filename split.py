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


def equalized_folds(secs_review_th: np.ndarray, day_review_th: np.ndarray,
                    n_splits: int = 5) -> list[tuple[np.ndarray, np.ndarray]]:
    """upstream's --equalize_test_with_non_secs (features/create_features.py): the folds of the day-mode rows
    carried over to the secs rows. Fold k tests on the secs rows whose review_th is in the day-mode fold's test
    block and trains on every secs row with a review_th below that block's first one (same-day targets and the
    cards the day-mode outlier filter removed included). Both inputs are sorted by review_th; every day-mode target
    must be a secs target too (upstream asserts it)."""
    secs_review_th = np.asarray(secs_review_th)
    day_review_th = np.asarray(day_review_th)
    at = np.searchsorted(secs_review_th, day_review_th)
    if (at >= len(secs_review_th)).any() or not np.array_equal(secs_review_th[np.minimum(at, len(secs_review_th) - 1)],
                                                               day_review_th):
        raise ValueError("--equalize_test_with_non_secs: a day-mode target is missing from the secs rows")
    folds = []
    for _, test in time_series_folds(len(day_review_th), n_splits):
        first = int(at[test[0]]) if len(test) else len(secs_review_th)
        folds.append((np.arange(first), at[test]))
    return folds


def protocol_folds(folds: list[tuple[np.ndarray, np.ndarray]], review_th: np.ndarray, elapsed_days: np.ndarray,
                   n_splits: int = 5, *, train_equals_test: bool = False, no_test_same_day: bool = False,
                   no_train_same_day: bool = False) -> list[tuple[np.ndarray, np.ndarray]]:
    """upstream's split flags (other.py `process`, applied after the fold's train and test sets are chosen):

    - --train_equals_test: one fold only; it trains on every row of the user and tests on every row whose
      review_th is at least the first review_th of TimeSeriesSplit's first test block (the plain split of these
      rows: it replaces the --equalize_test_with_non_secs folds too).
    - --no_test_same_day / --no_train_same_day: the fold's test / train rows keep only reviews with the
      revlog's elapsed_days > 0 (in day mode every target already has it; the flags matter with --secs --short,
      where same-day reviews are targets).

    `folds` are the ordinary folds (time_series_folds or equalized_folds); returned unchanged with no flag."""
    if train_equals_test:
        review_th = np.asarray(review_th)
        _, test = time_series_folds(len(review_th), n_splits)[0]
        first = review_th[test].min()
        folds = [(np.arange(len(review_th)), np.flatnonzero(review_th >= first))]
    if no_test_same_day or no_train_same_day:
        later_day = np.asarray(elapsed_days) > 0
        folds = [(tr[later_day[tr]] if no_train_same_day else tr, te[later_day[te]] if no_test_same_day else te)
                 for tr, te in folds]
    return folds
