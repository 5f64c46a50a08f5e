"""Initial-stability (S0) fit shared by the FSRS family (spec models.md §1.1).

Only the first long-term reviews (`i == 2`) carry direct information about the stability a card gets from its
first rating, so for every first rating g the recall of those reviews, grouped by interval, is fitted with the
model's own forgetting curve. Ratings without data are then filled in by a power-law interpolation between their
neighbours, so the four values stay ordered the way the ratings are.

The curve is a parameter: FSRS-6 passes its power curve with the default decay, FSRS-4.5/5 their fixed curves.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import numpy as np
import pandas as pd
from scipy.optimize import minimize

from models.base import InadequateData

# Exponents of the interpolation model ln S2 = W1 ln S1 + (1-W1) ln S3 and ln S3 = (1-W2) ln S2 + W2 ln S4.
W1 = 0.41
W2 = 0.54
S0_MAX = 100.0
# Monotonicity repair order: (smaller rating, bigger rating).
ORDER_PAIRS = ((1, 2), (2, 3), (3, 4), (1, 3), (2, 4), (1, 4))

Curve = Callable[[np.ndarray, np.ndarray], np.ndarray]  # R(t, S), numpy, broadcasting


def first_review_groups(rows: pd.DataFrame) -> pd.DataFrame:
    """(first_rating, delta_t) → mean recall and count over the first long-term reviews (i == 2)."""
    first = rows.loc[rows["i"] == 2, ["first_rating", "delta_t", "y"]]
    out = first.groupby(["first_rating", "delta_t"], sort=True)["y"].agg(["mean", "count"]).reset_index()
    return out


def fit_one_rating(delta_t: np.ndarray, recall: np.ndarray, count: np.ndarray, curve: Curve, s_default: float,
                   s_min: float, l1: bool = True) -> float:
    """argmin over S in [s_min, 100] of Σ count·BCE(recall, R(delta_t, S)) + |S − s_default|/16 (L-BFGS-B from the
    default, at most Σ count iterations, finite-difference gradient: the same call upstream makes)."""

    def loss(s):
        p = curve(delta_t, s)
        logloss = np.sum(-(recall * np.log(p) + (1 - recall) * np.log(1 - p)) * count)
        return logloss + (np.abs(s - s_default) / 16 if l1 else 0.0)

    res = minimize(loss, x0=s_default, bounds=((s_min, S0_MAX),), options={"maxiter": int(np.sum(count))})
    return float(np.asarray(res.x).ravel()[0])


def repair_order(stability: dict[int, float], count: Mapping[int, float]) -> dict[int, float]:
    """A lower rating must not have a higher S0: when it does, the side with fewer reviews takes the other's value."""
    s = dict(stability)
    for small, big in ORDER_PAIRS:
        if small in s and big in s and s[small] > s[big]:
            if count[small] > count[big]:
                s[big] = s[small]
            else:
                s[small] = s[big]
    return s


def fill_missing(stability: Mapping[int, float], s0_default: Sequence[float]) -> list[float]:
    """All four S0 from the known ones (spec §1.1 step 5). Raises InadequateData when none is known."""
    s = {int(k): float(v) for k, v in stability.items()}
    known = set(s)
    if not known:
        raise InadequateData("no first long-term reviews to initialise S0")
    if len(known) == 1:
        (g,) = known
        factor = s[g] / s0_default[g - 1]
        return [x * factor for x in s0_default]

    def s1_from_s2_s3():
        return s[2] ** (1 / W1) * s[3] ** (1 - 1 / W1)

    def s2_from_s1_s3():
        return s[1] ** W1 * s[3] ** (1 - W1)

    def s3_from_s2_s4():
        return s[2] ** (1 - W2) * s[4] ** W2

    def s4_from_s2_s3():
        return s[2] ** (1 - 1 / W2) * s[3] ** (1 / W2)

    if len(known) == 2:
        if known == {3, 4}:
            s[2] = s[3] ** (1 / (1 - W2)) * s[4] ** (1 - 1 / (1 - W2))
            s[1] = s1_from_s2_s3()
        elif known == {2, 4}:
            s[3] = s3_from_s2_s4()
            s[1] = s1_from_s2_s3()
        elif known == {2, 3}:
            s[4] = s4_from_s2_s3()
            s[1] = s1_from_s2_s3()
        elif known == {1, 4}:
            c = W1 + W2 - W1 * W2
            s[2] = s[1] ** (W1 / c) * s[4] ** (1 - W1 / c)
            s[3] = s[1] ** (1 - W2 / c) * s[4] ** (W2 / c)
        elif known == {1, 3}:
            s[2] = s2_from_s1_s3()
            s[4] = s4_from_s2_s3()
        elif known == {1, 2}:
            s[3] = s[1] ** (1 - 1 / (1 - W1)) * s[2] ** (1 / (1 - W1))
            s[4] = s4_from_s2_s3()
    elif len(known) == 3:
        missing = ({1, 2, 3, 4} - known).pop()
        s[missing] = {1: s1_from_s2_s3, 2: s2_from_s1_s3, 3: s3_from_s2_s4, 4: s4_from_s2_s3}[missing]()
    return [s[g] for g in (1, 2, 3, 4)]


def initialize_s0(rows: pd.DataFrame, curve: Curve, s0_default: Sequence[float], s_min: float,
                  secs: bool = False) -> list[float]:
    """The four initial stabilities fitted on the training rows (columns i, first_rating, delta_t, y).

    `secs` drops the recall smoothing and the L1 pull, as upstream's float-interval mode does.
    Raises InadequateData when there are no training rows or no first long-term review.
    """
    rows = rows[(rows["i"] > 1) & (rows["delta_t"] > 0)]
    if len(rows) == 0:
        raise InadequateData("no training rows")
    avg_recall = float(rows["y"].mean())
    groups = first_review_groups(rows)
    stability: dict[int, float] = {}
    count: dict[int, float] = {}
    for g in (1, 2, 3, 4):
        grp = groups[groups["first_rating"] == g]
        if grp.empty:
            continue
        n = grp["count"].to_numpy(np.float64)
        mean = grp["mean"].to_numpy(np.float64)
        recall = mean if secs else (mean * n + avg_recall) / (n + 1)
        stability[g] = fit_one_rating(grp["delta_t"].to_numpy(np.float64), recall, n, curve, float(s0_default[g - 1]),
                                      s_min, l1=not secs)
        count[g] = float(n.sum())
    s0 = fill_missing(repair_order(stability, count), s0_default)
    return [max(float(min(S0_MAX, x)), float(s_min)) for x in s0]
