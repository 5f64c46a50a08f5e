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


def causal_folds(rule, review_th: np.ndarray, n_splits: int = 5, *, boundary_review_th: np.ndarray | None = None,
                 filter_train: bool = True) -> list[tuple[np.ndarray, np.ndarray]]:
    """--causal: folds whose filters are computed from each fold's past alone (srs-bench's protocol, not upstream's;
    docs/causal.md).

    `rule` (features.OutlierInputs) covers the day-mode candidate targets: every target before the outlier filter
    and the continuity cut, whose set depends only on the review log's shape, never on outcomes. `review_th`: the
    rows the folds index (the user's ReviewData rows, time order). The fold boundaries are TimeSeriesSplit's over
    the candidates, in time order: over `review_th` itself, or in equalize mode over `boundary_review_th` (the
    day-mode candidates; the rows are then the secs rows). For fold k with test block starting at review_th t:

    - the rule is fixed from the past: rule.dropped_before(t) (which (first rating, delta_t) cells are dropped,
      from the first long-term reviews before t, and the continuity cut that follows);
    - test rows: the rows whose review_th is in the block and which that rule keeps (a test row whose card's cell
      was dropped by the past's rule is dropped; a cell the past has never seen is kept, see OutlierInputs);
    - training rows: every row with review_th < t, those the same rule drops removed (filter_train); in equalize
      mode (filter_train False) every row before t, as the secs pipeline, which has no outlier filter, trains.

    Folds whose test rows are all dropped are left out (nothing to predict). Rows of `review_th` absent from the
    rule (a model's restricted rows are a subset of the candidates; secs rows are a superset) are never dropped
    from training; test rows must be candidates (the equalized test rows are day-mode reviews)."""
    review_th = np.asarray(review_th)
    bounds = review_th if boundary_review_th is None else np.asarray(boundary_review_th)
    cand = np.asarray(rule.review_th)
    pos = np.searchsorted(cand, review_th)
    known = (pos < len(cand)) & (cand[np.minimum(pos, len(cand) - 1)] == review_th)
    folds = []
    for _, block in time_series_folds(len(bounds), n_splits):
        start, end = int(bounds[block[0]]), int(bounds[block[-1]])
        dropped = rule.dropped_before(start)
        drop_row = known & dropped[np.minimum(pos, len(cand) - 1)]
        before = review_th < start
        train = np.flatnonzero(before & ~drop_row) if filter_train else np.flatnonzero(before)
        in_block = (review_th >= start) & (review_th <= end)
        if boundary_review_th is not None:  # only the day-mode block's reviews are tested
            in_block &= np.isin(review_th, bounds[block])
        test = np.flatnonzero(in_block & ~drop_row)
        if len(test):
            folds.append((train, test))
    return folds
