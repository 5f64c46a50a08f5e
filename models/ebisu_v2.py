"""Ebisu v2 (0 parameters): upstream's `Ebisu-v2` row (spec/models.md §7), the `ebisu` package's v2 algorithm
(`updateRecall` with the default rebalance, `predictRecall(..., exact=True)`) re-implemented in a numba kernel.

Model: (α, β, T) — recall probability T days after the last review is Beta(α, β). Every card starts from
`ebisu.defaultModel(512, 0.2, 0.2)` = (0.2, 0.2, 512). Each PREVIOUS review (t_k, G_k) of the card is applied as a
binary quiz `updateRecall(model, successes=int(G > 1), total=1, tnow=max(t_k, 0.001))`:
- [QUIRK] the card's first review has t = 0 and is applied too, as a quiz at tnow = 0.001 days (upstream's
  `max(delta_t, 0.001)`); a first "Again" therefore already shortens the halflife a lot;
- with δ = tnow/T and B the Beta function, the posterior moments at elapsed time e·tnow are
  success: M_N(e) = B(α+δ+Nδe, β) / B(α+δ, β);
  failure: M_N(e) = [B(α+Nδe, β) − B(α+δ+Nδe, β)] / [B(α, β) − B(α+δ, β)];
- rebalance: e solves M_1(e) = 0.5 (bracket grown ×2 from e = 1/δ, then Brent's method with scipy's brentq
  tolerances xtol 2e-12, rtol 4·eps); the new T is e·tnow;
- Beta fit by moments: μ = M_1, var = M_2 − μ², α' = μ(μ(1−μ)/var − 1), β' = (1−μ)(μ(1−μ)/var − 1).
The package's control flow is mirrored: the moments are computed with plain Beta functions first, and the update is
redone in the log domain (log-sum-exp of betaln) when α > 400 and β > 400, when no bracket is found, or when the fit
gives a non-finite or non-positive α'/β'; if the log domain fails too, the package raises (upstream then loses the
user) and so do we.
Prediction: [QUIRK] `exact=True`, i.e. the probability itself, p = B(α + t/T, β)/B(α, β) (the package's default
exact=False returns its log, which would not be a probability).

Speed: each review of a card is applied ONCE. States are stored per position of the user's review sequences (which
every fold's ReviewData shares), so all targets of a card read their state from one pass, and later folds continue a
card where an earlier fold stopped instead of replaying it (a per-process cache of the last user's states). The
kernel calls scipy's own `beta`/`betaln` (the functions the package uses) and a Brent root finder that follows
scipy's brentq step by step; the tests check the updates against the package to 1e-9 (measured: identical).

Upstream evaluates this model through the same cards/decks join as SM2 (see models/sm2.py, `restrict_targets`).
"""

from __future__ import annotations

import math
from pathlib import Path

import llvmlite.binding as llvm
import numpy as np
from numba import njit, types
from numba.extending import get_cython_function_address
from scipy.special import betaln

from config import ACCEPTS_SECS
from models.base import Model, ReviewData
from models.sm2 import card_extents, restrict_to_joined_cards

PRIOR = (0.2, 0.2, 512.0)  # ebisu.defaultModel(512, 0.2, 0.2)
T_FIRST = 0.001  # tnow of a quiz with t = 0 (the card's first review)
_XTOL = 2e-12  # scipy.optimize.brentq defaults (root_scalar with a bracket uses brentq)
_RTOL = 4 * np.finfo(float).eps
_MAXITER = 100
_LOG_HALF = math.log(0.5)


# scipy's own Beta functions (scipy.special.cython_special, the functions the package calls), bound by symbol
# name so the compiled kernels stay cacheable. With them the kernel follows the package's arithmetic (bit-identical
# in the tests) even where the update is ill-conditioned: the first-review failure (δ ≈ 2e-6, B(α,β) − B(α+δ,β)
# cancels) and the variance of a concentrated Beta, where an lgamma-based betaln landed 1e-9..1e-8 away.
for _name in ("betaln", "beta"):
    llvm.add_symbol(f"srs_bench_scipy_{_name}", get_cython_function_address("scipy.special.cython_special", _name))
_betaln = types.ExternalFunction("srs_bench_scipy_betaln", types.float64(types.float64, types.float64))
_beta = types.ExternalFunction("srs_bench_scipy_beta", types.float64(types.float64, types.float64))


@njit(cache=True)
def _moment(n, et, a, b, dt, c, d, den, uselog):
    """M_n(et) (uselog: its log), as the package's `moment` / `logMoment` closures compute it."""
    x = a + dt + n * dt * et
    if not uselog:
        num = c * _beta(x, b)
        if d != 0.0:
            num += d * _beta(a + n * dt * et, b)
        return num / den
    if d != 0.0:  # failure: log(B(a + n dt et, b) − B(x, b)) with the larger term factored out
        hi = _betaln(a + n * dt * et, b)
        lo = _betaln(x, b)
        return hi + math.log1p(-math.exp(lo - hi)) - den
    return _betaln(x, b) - den  # success: log(c) = 0


@njit(cache=True)
def _rootfn(et, a, b, dt, c, d, den, uselog):
    if uselog:
        return _moment(1.0, et, a, b, dt, c, d, den, True) - _LOG_HALF
    return _moment(1.0, et, a, b, dt, c, d, den, False) - 0.5


@njit(cache=True)
def _brentq(xa, xb, fa, fb, a, b, dt, c, d, den, uselog):
    """Brent's root finder on a sign-changing bracket, step for step like scipy's brentq (same tolerances)."""
    xpre, xcur, fpre, fcur = xa, xb, fa, fb
    xblk, fblk, spre, scur = 0.0, 0.0, 0.0, 0.0
    if fpre == 0.0:
        return xpre
    if fcur == 0.0:
        return xcur
    for _ in range(_MAXITER):
        if fpre != 0.0 and fcur != 0.0 and (fpre < 0.0) != (fcur < 0.0):
            xblk = xpre
            fblk = fpre
            spre = xcur - xpre
            scur = spre
        if abs(fblk) < abs(fcur):
            xpre = xcur
            xcur = xblk
            xblk = xpre
            fpre = fcur
            fcur = fblk
            fblk = fpre
        delta = (_XTOL + _RTOL * abs(xcur)) / 2.0
        sbis = (xblk - xcur) / 2.0
        if fcur == 0.0 or abs(sbis) < delta:
            return xcur
        if abs(spre) > delta and abs(fcur) < abs(fpre):
            if xpre == xblk:  # secant
                stry = -fcur * (xcur - xpre) / (fcur - fpre)
            else:  # inverse quadratic interpolation
                dpre = (fpre - fcur) / (xpre - xcur)
                dblk = (fblk - fcur) / (xblk - xcur)
                stry = -fcur * (fblk * dblk - fpre * dpre) / (dblk * dpre * (fblk - fpre))
            if 2.0 * abs(stry) < min(abs(spre), 3.0 * abs(sbis) - delta):
                spre = scur
                scur = stry
            else:
                spre = sbis
                scur = sbis
        else:
            spre = sbis
            scur = sbis
        xpre = xcur
        fpre = fcur
        if abs(scur) > delta:
            xcur += scur
        else:
            xcur += delta if sbis > 0 else -delta
        fcur = _rootfn(xcur, a, b, dt, c, d, den, uselog)
    return xcur


@njit(cache=True)
def _update_domain(a, b, t, success, tnow, uselog):
    """One binary quiz in one domain; ok is False where the package would retry in the log domain / raise."""
    dt = tnow / t
    if success:
        c, d = 1.0, 0.0
    else:
        c, d = -1.0, 1.0
    if uselog:
        if success:
            den = _betaln(a + dt, b)
        else:
            hi = _betaln(a, b)
            den = hi + math.log1p(-math.exp(_betaln(a + dt, b) - hi))
    else:
        den = c * _beta(a + dt, b) + (d * _beta(a, b) if d != 0.0 else 0.0)
    # bracket: start at [init/2, 2 init] with init = 1/dt, move it up or down by factors of 2
    init = 1.0 / dt
    blow = 0.5 * init
    bhigh = 2.0 * init
    flow = _rootfn(blow, a, b, dt, c, d, den, uselog)
    fhigh = _rootfn(bhigh, a, b, dt, c, d, den, uselog)
    while flow > 0 and fhigh > 0:
        blow = bhigh
        flow = fhigh
        bhigh *= 2.0
        fhigh = _rootfn(bhigh, a, b, dt, c, d, den, uselog)
    while flow < 0 and fhigh < 0:
        bhigh = blow
        fhigh = flow
        blow *= 0.5
        flow = _rootfn(blow, a, b, dt, c, d, den, uselog)
    if not (flow > 0 and fhigh < 0):
        return a, b, t, False
    et = _brentq(blow, bhigh, flow, fhigh, a, b, dt, c, d, den, uselog)
    tback = et * tnow
    if uselog:
        mean = math.exp(_moment(1.0, et, a, b, dt, c, d, den, True))
        m2 = math.exp(_moment(2.0, et, a, b, dt, c, d, den, True))
    else:
        mean = _moment(1.0, et, a, b, dt, c, d, den, False)
        m2 = _moment(2.0, et, a, b, dt, c, d, den, False)
    var = m2 - mean * mean
    tmp = mean * (1 - mean) / var - 1
    na = mean * tmp
    nb = (1 - mean) * tmp
    ok = na > 0 and nb > 0 and math.isfinite(na) and math.isfinite(nb)
    return na, nb, tback, ok


@njit(cache=True)
def update_recall(a, b, t, success, tnow):
    """ebisu.updateRecall((a, b, t), int(success), 1, tnow) with rebalancing; ok False where the package raises."""
    uselog = a > 400 and b > 400  # large a and b: the log domain at once; else it only when the plain one fails
    while True:  # (one call site with a run-time flag: literal True / False compiled _update_domain twice)
        na, nb, nt, ok = _update_domain(a, b, t, success, tnow, uselog)
        if ok or uselog:
            return na, nb, nt, ok
        uselog = True


@njit(cache=True)
def _ebisu_pass(seq_dt, seq_r, starts, need, done, A, B, T):
    """Continue each card from the reviews already applied (done[start]) up to need[c]; states go to A/B/T[start+k]
    (the state after the card's first k reviews). Returns the sequence index of a failed update, else −1."""
    for c in range(len(starts)):
        s = starts[c]
        k0 = done[s]
        if k0 >= need[c]:
            continue
        if k0 == 0:
            A[s], B[s], T[s] = PRIOR[0], PRIOR[1], PRIOR[2]
        a, b, t = A[s + k0], B[s + k0], T[s + k0]
        for k in range(k0, need[c]):
            # [QUIRK] every previous review is a quiz, the first one (t = 0) included, at tnow = max(t, 0.001)
            a, b, t, ok = update_recall(a, b, t, seq_r[s + k] > 1, max(seq_dt[s + k], T_FIRST))
            if not ok:
                return s + k
            A[s + k + 1], B[s + k + 1], T[s + k + 1] = a, b, t
        done[s] = need[c]
    return -1


class _UserStates:
    """States along the sequences of one user (the ReviewData arrays all folds share)."""

    def __init__(self, seq_dt: np.ndarray, seq_r: np.ndarray):
        self.seq_dt, self.seq_r = seq_dt, seq_r  # strong references: their ids stay unique while cached
        n = len(seq_dt) + 1
        self.A, self.B, self.T = np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan)
        self.done = np.zeros(n, dtype=np.int64)

    def matches(self, data: ReviewData) -> bool:
        return self.seq_dt is data.seq_delta_t and self.seq_r is data.seq_rating


_LAST: list[_UserStates] = []  # one user per process at a time


def states_for(data: ReviewData) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(α, β, T) before each row of `data`, applying every review of the user at most once per process."""
    if not (_LAST and _LAST[0].matches(data)):
        _LAST[:] = [_UserStates(data.seq_delta_t, data.seq_rating)]
    st = _LAST[0]
    starts, need = card_extents(data.rows)
    bad = _ebisu_pass(np.ascontiguousarray(data.seq_delta_t, dtype=np.float64), data.seq_rating, starts, need,
                      st.done, st.A, st.B, st.T)
    if bad >= 0:
        raise AssertionError(f"Ebisu update failed in both domains at sequence index {bad} (the ebisu package "
                             f"raises here too)")
    idx = data.rows["seq_start"].to_numpy(np.int64) + data.rows["seq_pos"].to_numpy(np.int64)
    return st.A[idx], st.B[idx], st.T[idx]


def predict_recall(a, b, t, tnow):
    """ebisu.predictRecall((a, b, t), tnow, exact=True), vectorised. [QUIRK] exact=True: the probability itself,
    B(α + tnow/T, β)/B(α, β); the package's default (exact=False) returns its log."""
    return np.exp(betaln(a + tnow / t, b) - betaln(a, b))


class EbisuV2(Model):
    name = "Ebisu-v2"
    accepts_secs = name in ACCEPTS_SECS  # --short --secs: fractional tnow, same-day quizzes and targets
    n_params = 0
    UPSTREAM_CARD_JOIN = True  # reproduce upstream's cards/decks join + dropna (models/sm2.py), in day mode only

    def __init__(self, cfg=None):
        self.cfg = cfg

    @classmethod
    def restrict_targets(cls, data: ReviewData, root: Path, user_id: int, cfg=None) -> ReviewData:
        """Runner hook, called once per user before the split: the rows upstream evaluates for this model. The
        join is day mode's only: upstream's dropna that removes the missing cards runs inside create_features'
        day-mode (outlier filter) branch, so its --secs rows keep every card (as the newer upstream, which joins
        nothing, does always)."""
        if not cls.UPSTREAM_CARD_JOIN or getattr(cfg, "secs_mode", False):
            return data
        return restrict_to_joined_cards(data, root, user_id)

    def fit(self, train: ReviewData) -> "EbisuV2":
        return self  # nothing to train

    def predict(self, test: ReviewData) -> np.ndarray:
        a, b, t = states_for(test)
        return predict_recall(a, b, t, test.rows["delta_t"].to_numpy(np.float64))
