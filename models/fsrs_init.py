"""Initial-stability (S0) fit shared by the FSRS family (spec models.md §1.1).

Only the first long-term reviews (`i == 2`) carry direct information about the stability a card gets from its
first rating, so for every first rating g the recall of those reviews, grouped by interval, is fitted with the
model's own forgetting curve. Ratings without data are then filled in by a power-law interpolation between their
neighbours, so the four values stay ordered the way the ratings are.

The curve is a parameter: FSRS-6 passes its power curve with the default decay, FSRS-4.5/5 their fixed curves.

Speed: upstream fits each rating with `scipy.optimize.minimize` (L-BFGS-B, finite-difference gradient), whose
Python machinery (ScalarFunction, approx_derivative, bound conversions) and the pandas groupby cost ~10–20 ms per
fold, more than fsrs-rs's whole fit on a small collection. Here the groups are built with numpy and scipy's
compiled L-BFGS-B routine (`setulb`, what `minimize` drives) is driven directly, with `minimize`'s loop, settings
and forward-difference gradient rebuilt step for step on the same numpy loss: the same floating-point operations in
the same order, so the same S0 bit for bit (`reference=True` runs upstream's call itself; tests/test_fsrs_init.py
compares the two on real collections). A compiled objective was tried and rejected: numpy's vectorised log/power
differ from libm's by an ulp, the 1e-8 finite difference turns that into ~1e-6 of gradient, and on flat optima the
S0 moved by up to 7e-6 (relative).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from models.base import InadequateData, column

# Exponents of the interpolation model ln S2 = W1 ln S1 + (1-W1) ln S3 and ln S3 = (1-W2) ln S2 + W2 ln S4.
W1 = 0.41
W2 = 0.54
S0_MAX = 100.0
# s_min of upstream's --secs runs (config.py: 1e-4 for every model with --secs; its January-2025 code had 1e-6): the
# lower clamp of S after every step, of the S0 fit and of w0..w3, in place of the day-mode 0.01 (FSRS-6: 0.001)
SECS_S_MIN = 1e-4
# Monotonicity repair order: (smaller rating, bigger rating).
ORDER_PAIRS = ((1, 2), (2, 3), (3, 4), (1, 3), (2, 4), (1, 4))

Curve = Callable[[np.ndarray, np.ndarray], np.ndarray]  # R(t, S), numpy, broadcasting
# scipy.optimize.minimize's L-BFGS-B defaults, as upstream calls it
LBFGSB_M = 10
LBFGSB_FTOL = 2.2204460492503131e-09
LBFGSB_GTOL = 1e-5
LBFGSB_MAXLS = 20
FD_STEP = 1e-8  # minimize's absolute finite-difference step for L-BFGS-B
FACTR = LBFGSB_FTOL / np.finfo(float).eps  # setulb's form of ftol
EPS = float(np.finfo(float).eps)


def first_review_groups(rows: pd.DataFrame) -> pd.DataFrame:
    """(first_rating, delta_t) → mean recall and count over the first long-term reviews (i == 2)."""
    first = rows.loc[rows["i"] == 2, ["first_rating", "delta_t", "y"]]
    out = first.groupby(["first_rating", "delta_t"], sort=True)["y"].agg(["mean", "count"]).reset_index()
    return out


def _loss(delta_t, recall, count, curve: Curve, s_default: float, l1: bool):
    """The fitted objective of one rating as a function of S (a 1-element array, as minimize passes it)."""

    def loss(s):
        p = curve(delta_t, s)
        logloss = np.sum(-(recall * np.log(p) + (1 - recall) * np.log(1 - p)) * count)
        return logloss + (np.abs(s - s_default) / 16 if l1 else 0.0)

    return loss


def _loss_rows(delta_t, recall, count, curve: Curve, s_default: float, l1: bool):
    """`_loss` at several S at once: S of shape [k] → the k losses, from one [k, n] evaluation of the curve. Every
    element is the same floating-point operation as in `_loss`, and each row is summed by the same pairwise
    summation (a reduction along the contiguous last axis runs numpy's 1-D loop on each row), so every loss
    equals `_loss`'s bit for bit; what is saved is numpy's per-call overhead (~15 calls of a few µs each, the
    whole cost of the S0 fit on these tiny arrays)."""
    t = delta_t[None, :]
    miss = 1 - recall

    def loss(s):
        p = curve(t, s[:, None])
        logloss = np.sum(-(recall * np.log(p) + miss * np.log(1 - p)) * count, axis=1)
        return logloss + (np.abs(s - s_default) / 16 if l1 else 0.0)

    return loss


def fit_one_rating_scipy(delta_t: np.ndarray, recall: np.ndarray, count: np.ndarray, curve: Curve, s_default: float,
                         s_min: float, l1: bool = True, with_loss: bool = False):
    """argmin over S in [s_min, 100] of Σ count·BCE(recall, R(delta_t, S)) + |S − s_default|/16 (L-BFGS-B from the
    default, at most Σ count iterations, finite-difference gradient): upstream's call itself, the reference."""
    from scipy.optimize import minimize

    res = minimize(_loss(delta_t, recall, count, curve, s_default, l1), x0=s_default, bounds=((s_min, S0_MAX),),
                   options={"maxiter": int(np.sum(count))})
    x = float(np.asarray(res.x).ravel()[0])
    return (x, float(res.fun)) if with_loss else x


_LBFGSB = []


def _lbfgsb_module():
    """scipy's compiled L-BFGS-B (scipy.optimize._lbfgsb), loaded by itself: importing it the usual way first runs
    scipy.optimize's __init__ (~1 s: every solver, scipy.sparse, scipy.linalg), a fixed cost per process that
    Rust's path does not have. The extension only needs numpy; it is registered under its own name, so a later
    `import scipy.optimize` reuses it. Falls back to the ordinary import."""
    if not _LBFGSB:
        import importlib.machinery
        import importlib.util
        import sys

        name = "scipy.optimize._lbfgsb"
        module = sys.modules.get(name)
        if module is None:
            try:
                import scipy

                folder = Path(scipy.__file__).parent / "optimize"
                path = next(folder / f"_lbfgsb{suffix}" for suffix in importlib.machinery.EXTENSION_SUFFIXES
                            if (folder / f"_lbfgsb{suffix}").exists())
                spec = importlib.util.spec_from_file_location(name, path)
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
                sys.modules[name] = module
            except Exception:  # any layout surprise: the ordinary import
                from scipy.optimize import _lbfgsb as module
        _LBFGSB.append(module)
    return _LBFGSB[0]


class StepLbfgsb:
    """One S0 fit's L-BFGS-B run, stepped from outside: scipy's compiled routine (`setulb`, what `minimize` drives)
    driven as minimize drives it (same m, tolerances, maxls, maxiter counted on new iterates), its gradient rebuilt
    as approx_derivative's '2-point' with the absolute step 1e-8 (flipped where it would leave the bounds).
    `points()` runs the routine to its next request and returns the two S it needs the loss at ([S, S + h]), or
    None when it has finished; `supply(f0, f1)` hands the two losses back. Keeping the loop here, not around a loss
    call, lets fit_many step many fits together and evaluate all their losses in one numpy call.

    `batch(k, ...)` makes k runs whose work arrays are rows of shared blocks and whose bounds are shared (setulb
    only reads l, u and nbd): a search of 64 fits per fold spent ~1/4 of its time allocating the ~10 small arrays
    of each run one by one. setulb's arguments are bound once per run (x, g and the work arrays are updated in
    place, f is passed as the float it was given), so a step costs the call and a few Python operations."""

    __slots__ = ("lo", "hi", "maxiter", "x", "g", "task", "n_iterations", "step", "_head", "_tail", "f")

    def __init__(self, s_default: float, s_min: float, maxiter: int, _rows=None, _bounds=None):
        m = LBFGSB_M
        self.lo, self.hi, self.maxiter = float(s_min), S0_MAX, int(maxiter)
        if _rows is None:
            _rows = (np.zeros(1), np.zeros(1), np.zeros(2 * m + 5 + 11 * m * m + 8 * m), np.zeros(3, dtype=np.int32),
                     np.zeros(2, dtype=np.int32), np.zeros(2, dtype=np.int32), np.zeros(4, dtype=np.int32),
                     np.zeros(44, dtype=np.int32), np.zeros(29))
        if _bounds is None:
            _bounds = (np.array([self.lo]), np.array([self.hi]), np.array([2], dtype=np.int32))
        x, g, wa, iwa, task, ln_task, lsave, isave, dsave = _rows
        x[0] = min(max(float(s_default), self.lo), self.hi)  # np.clip of the start (a finite default)
        self.x, self.g, self.task = x, g, task
        self.f = 0.0
        self._head = (LBFGSB_M, x, *_bounds)
        self._tail = (g, FACTR, LBFGSB_GTOL, wa, iwa, task, lsave, isave, dsave, LBFGSB_MAXLS, ln_task)
        self.n_iterations = 0
        self.step = 0.0

    @classmethod
    def batch(cls, k: int, s_default: float, s_min: float, maxiter: int) -> list["StepLbfgsb"]:
        """k runs from the same start, their arrays rows of shared blocks (each row contiguous, as setulb needs)."""
        m = LBFGSB_M
        n_wa = 2 * m + 5 + 11 * m * m + 8 * m
        f8 = np.zeros((k, 2 + n_wa + 29))
        i4 = np.zeros((k, 3 + 2 + 2 + 4 + 44), dtype=np.int32)
        lo = float(s_min)
        bounds = (np.array([lo]), np.array([S0_MAX]), np.array([2], dtype=np.int32))
        runs = []
        for r in range(k):
            a, b = f8[r], i4[r]
            rows = (a[0:1], a[1:2], a[2:2 + n_wa], b[0:3], b[3:5], b[5:7], b[7:11], b[11:55], a[2 + n_wa:])
            runs.append(cls(s_default, s_min, maxiter, rows, bounds))
        return runs

    def next_point(self) -> float | None:
        """Run the routine to its next request: the S it wants the loss at (the finite-difference point is
        S + self.step), or None when it has finished."""
        setulb = _lbfgsb_module().setulb
        task = self.task
        while True:
            setulb(*self._head, self.f, *self._tail)
            if task[0] == 3:  # f and g wanted at x
                x0 = float(self.x[0])
                h = FD_STEP
                if (x0 + h) - x0 == 0:
                    h = np.sqrt(EPS) * max(1.0, abs(x0))
                if (x0 + h < self.lo or x0 + h > self.hi) and abs(h) <= max(x0 - self.lo, self.hi - x0):
                    h = -h
                self.step = (x0 + h) - x0
                return x0
            if task[0] == 1:  # a new iterate
                self.n_iterations += 1
                if self.n_iterations >= self.maxiter:
                    task[0], task[1] = 5, 504
            else:
                return None

    def points(self) -> np.ndarray | None:
        x0 = self.next_point()
        return None if x0 is None else np.array([x0, x0 + self.step])

    def supply(self, f0: float, f1: float) -> None:
        self.f = f0
        self.g[0] = (f1 - f0) / self.step

    def result(self) -> tuple[float, float]:
        """(S, minimize's `fun`): the loss of the last evaluation, which is not the loss at S when the line search
        fails (x is restored, fun is not), as minimize reports it (FSRS-7 ranks its curve candidates by it)."""
        return float(self.x[0]), float(self.f)


def fit_one_rating(delta_t: np.ndarray, recall: np.ndarray, count: np.ndarray, curve: Curve, s_default: float,
                   s_min: float, l1: bool = True, with_loss: bool = False):
    """fit_one_rating_scipy without minimize's overhead (StepLbfgsb on the same loss): the same S bit for bit.
    with_loss: (S, minimize's `fun`), see StepLbfgsb.result."""
    loss = _loss_rows(delta_t, recall, count, curve, s_default, l1)
    run = StepLbfgsb(s_default, s_min, int(np.sum(count)))
    while (s := run.points()) is not None:
        f0, f1 = loss(s).tolist()
        run.supply(f0, f1)
    return run.result() if with_loss else run.result()[0]


def fit_many(runs: Sequence[StepLbfgsb], batch_loss: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> None:
    """Step several fits together: each round, every unfinished fit's two points are evaluated by one call
    `batch_loss(which, s)` (fit indices [k], points [k, 2] → losses [k, 2]), so a search over many candidate
    curves costs a few numpy calls per round instead of a few per fit and point."""
    pending = []
    for j, run in enumerate(runs):
        x0 = run.next_point()
        if x0 is not None:
            pending.append((j, x0, x0 + run.step))
    while pending:
        which = np.array([p[0] for p in pending], dtype=np.int64)
        losses = batch_loss(which, np.array([p[1:] for p in pending]))
        nxt = []
        for (j, _, _), (f0, f1) in zip(pending, losses.tolist()):
            run = runs[j]
            run.supply(f0, f1)
            x0 = run.next_point()
            if x0 is not None:
                nxt.append((j, x0, x0 + run.step))
        pending = nxt


def _numpy_groups(rows: pd.DataFrame):
    """(first_rating, delta_t, y) of the training rows that first_review_groups groups, and the mean recall of all
    of them; y is 0/1, so every sum is an exact integer and the means equal pandas' to the bit."""
    i = column(rows, "i")
    dt = column(rows, "delta_t", np.float64)
    y = column(rows, "y", np.float64)
    keep = (i > 1) & (dt > 0)
    if not keep.any():
        raise InadequateData("no training rows")
    first = keep & (i == 2)
    return column(rows, "first_rating")[first], dt[first], y[first], float(y[keep].mean())


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
                  secs: bool = False, reference: bool = False) -> list[float]:
    """The four initial stabilities fitted on the training rows (columns i, first_rating, delta_t, y).

    `secs` drops the recall smoothing and the L1 pull, as upstream's float-interval mode does. `reference` runs
    upstream's pandas groupby and scipy.optimize.minimize instead of their fast equivalents (the tests' reference).
    Raises InadequateData when there are no training rows or no first long-term review.
    """
    stability: dict[int, float] = {}
    count: dict[int, float] = {}
    if reference:
        rows = rows[(rows["i"] > 1) & (rows["delta_t"] > 0)]
        if len(rows) == 0:
            raise InadequateData("no training rows")
        avg_recall = float(rows["y"].mean())
        groups = first_review_groups(rows)
        per_rating = [(g, grp["delta_t"].to_numpy(np.float64), grp["mean"].to_numpy(np.float64),
                       grp["count"].to_numpy(np.float64)) for g, grp in groups.groupby("first_rating", sort=True)]
        solve = fit_one_rating_scipy
    else:
        ratings, dts, ys, avg_recall = _numpy_groups(rows)
        per_rating = []
        for g in (1, 2, 3, 4):
            sel = ratings == g
            if sel.any():
                dt_g, inv = np.unique(dts[sel], return_inverse=True)  # sorted, as groupby(sort=True)
                n = np.bincount(inv).astype(np.float64)
                per_rating.append((g, dt_g, np.bincount(inv, weights=ys[sel]) / n, n))
        solve = fit_one_rating
    for g, delta_t, mean, n in per_rating:
        g = int(g)
        if g not in (1, 2, 3, 4):
            continue
        recall = mean if secs else (mean * n + avg_recall) / (n + 1)
        stability[g] = solve(delta_t, recall, n, curve, float(s0_default[g - 1]), s_min, l1=not secs)
        count[g] = float(n.sum())
    s0 = fill_missing(repair_order(stability, count), s0_default)
    return [max(float(min(S0_MAX, x)), float(s_min)) for x in s0]
