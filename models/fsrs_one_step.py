"""FSRS-6-one-step (21 parameters): FSRS-6 trained by one online SGD pass, spec models.md §9 and §12 pitfall 4;
SB models/fsrs_v6_one_step.py (model_processors.fsrs_one_step), read at 1d517ddc.

Per fold: the four initial stabilities come from the S0 fit on the fold's training rows (models/fsrs_init.py, the
FSRS-6 curve with the default decay), the other 17 weights start at FSRS-6's defaults. Then one pass over the
training rows in time order, skipping rows whose target interval t < 1 day: for each row the card's history is run
with the current weights through the one-step recurrence, and the weights take one SGD step (lr 1e-4, then FSRS-6's
box, w17–w19 unclipped as upstream leaves them) on the row's log loss. Predictions are FSRS-6's (models/fsrs6.py)
with the final weights.

The recurrence (training only) differs from FSRS-6's: a later review first updates D, and the stability formulas
read the NEW D (as FSRS v1–v3 do); t < 1 takes the short-term update; S ≥ 0.001 at every step, no upper clamp.

The gradient is upstream's hand-derived one, reproduced as is, with its quirks (so the numbers are upstream's):
- only the LAST transition of the history is differentiated: the state before it counts as a constant, and so does
  the retrievability R(t_last, S_last) inside it (no path from w20 through it);
- a history of one review: only the initial stability of its grade moves, its gradient ×100 (plus w20's);
- the last transition is differentiated with the long-term formulas (failure for Again, success otherwise, D's
  mean-reversion chain into w4–w7) even when it was a same-day step that used the short-term update; w17–w19
  therefore never move, and a clamp of D to [1, 10] is not seen by the gradient;
- dL/dR uses R clipped to [1e-9, 1 − 1e-9]; a row whose new S is at the floor 0.001 makes no step.
Torch autograd through the last step (previous state detached) gives the same update whenever that step is a
long-term one and no clamp is active (tests/test_fsrs_one_step.py checks it); it cannot reproduce the same-day
case, so the update stays hand-written here. The pass is compiled with numba (one call per fold): it is inherently
sequential, each row re-runs its history with the weights the previous row left.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from config import BUILTIN_FLAGS
from models.base import Model, ReviewData
from models.fsrs_init import initialize_s0

# FSRS-6's defaults (fsrs-optimizer DEFAULT_PARAMETER, as models/fsrs6.py) and the one-step box.
DEFAULT_W = [0.212, 1.2931, 2.3065, 8.2956, 6.4133, 0.8334, 3.0194, 0.001, 1.8722, 0.1666, 0.796, 1.4835, 0.0614,
             0.2629, 1.6483, 0.6014, 1.8729, 0.5425, 0.0912, 0.0658, 0.1542]
S_MIN = 0.001
LR = 1e-4
# clamp_weights of upstream: w17, w18, w19 are not clipped (their gradient is always 0)
CLIP_LO = np.array([S_MIN] * 4 + [1, 0.001, 0.001, 0.001, 0, 0, 0.001, 0.001, 0.001, 0.001, 0, 0, 1,
                                  -np.inf, -np.inf, -np.inf, 0.1])
CLIP_HI = np.array([100] * 4 + [10, 4, 4, 0.75, 4.5, 0.8, 3.5, 5, 0.25, 0.9, 4, 1, 6, np.inf, np.inf, np.inf, 0.8])


@njit(cache=True)
def _curve(w, t, s):
    decay = -w[20]
    factor = 0.9 ** (1.0 / decay) - 1.0
    return (1.0 + factor * t / s) ** decay


@njit(cache=True)
def _next_d(w, d, g):
    init_d4 = w[4] - math.exp(w[5] * 3.0) + 1.0
    d_mid = d + (-w[6] * (g - 3.0)) * (10.0 - d) / 9.0
    return min(10.0, max(1.0, w[7] * init_d4 + (1.0 - w[7]) * d_mid))


@njit(cache=True)
def _success(w, s, d, r, g):
    hard = w[15] if g == 2 else 1.0
    easy = w[16] if g == 4 else 1.0
    return max(S_MIN, s * (1.0 + math.exp(w[8]) * (11.0 - d) * s ** (-w[9]) * (math.exp((1.0 - r) * w[10]) - 1.0)
                           * hard * easy))


@njit(cache=True)
def _failure(w, s, d, r):
    return max(S_MIN, w[11] * d ** (-w[12]) * ((s + 1.0) ** w[13] - 1.0) * math.exp((1.0 - r) * w[14]))


@njit(cache=True)
def _short_term(w, s, g):
    if s <= 0:
        return S_MIN
    sinc = math.exp(w[17] * (g - 3.0 + w[18])) * s ** (-w[19])
    return max(S_MIN, s * (max(1.0, sinc) if g >= 3 else sinc))


@njit(cache=True)
def run_history(w, hist_t, hist_g):
    """(S, D) before and after the last review of a history (at least one review) under the one-step recurrence:
    a later review updates D first and its stability formula reads the new D."""
    n = len(hist_t)
    g0 = hist_g[0]
    s = max(S_MIN, w[g0 - 1])
    d = min(10.0, max(1.0, w[4] - math.exp(w[5] * (g0 - 1.0)) + 1.0))
    last_s = s
    last_d = d
    for k in range(1, n):
        last_s, last_d = s, d
        g = hist_g[k]
        new_d = _next_d(w, d, g)
        if hist_t[k] < 1:
            s = _short_term(w, s, g)
        else:
            r = _curve(w, hist_t[k], s)
            s = _failure(w, s, new_d, r) if g == 1 else _success(w, s, new_d, r, g)
        d = new_d
    return last_s, last_d, s, d


@njit(cache=True)
def one_step_grad(w, hist_t, hist_g, t, y):
    """(step?, upstream's gradient of the row's log loss) after running the history `hist_t`, `hist_g` (at least
    one review) through the one-step recurrence with weights `w`; no step when the new S is at its floor."""
    n = len(hist_t)
    last_s, last_d, new_s, new_d = run_history(w, hist_t, hist_g)
    grad = np.zeros(21)
    if new_s <= S_MIN:
        return False, grad
    g = hist_g[n - 1]
    decay = -w[20]
    factor = 0.9 ** (1.0 / decay) - 1.0
    r = _curve(w, t, new_s)
    r = min(max(r, 1e-9), 1.0 - 1e-9)
    dl_dr = (r - y) / (r * (1.0 - r))
    dr_ds = decay * (1.0 + factor * t / new_s) ** (decay - 1.0) * (-factor * t / new_s ** 2)
    c = dl_dr * dr_ds
    if n == 1:
        grad[g - 1] = c * 100.0
    else:
        last_r = _curve(w, hist_t[n - 1], last_s)
        s = last_s
        dd = new_d
        if g == 1:
            grad[11] = c * new_s / w[11]
            grad[12] = c * (-new_s * math.log(dd))
            grad[13] = c * (w[11] * dd ** (-w[12]) * (s + 1.0) ** w[13] * math.log(s + 1.0)
                            * math.exp((1.0 - last_r) * w[14]))
            grad[14] = c * new_s * (1.0 - last_r)
            ds_dd = new_s * (-w[12] / dd)
        else:
            hard = w[15] if g == 2 else 1.0
            easy = w[16] if g == 4 else 1.0
            e10 = math.exp((1.0 - last_r) * w[10])
            spow = s ** (-w[9])
            ds_dd = -s * math.exp(w[8]) * spow * (e10 - 1.0) * hard * easy
            common = s * math.exp(w[8]) * (11.0 - dd) * spow * (e10 - 1.0)
            grad[8] = c * common * hard * easy
            grad[9] = c * common * (-math.log(s)) * hard * easy
            grad[10] = c * s * math.exp(w[8]) * (11.0 - dd) * spow * e10 * (1.0 - last_r) * hard * easy
            if g == 2:
                grad[15] = c * common * easy
            if g == 4:
                grad[16] = c * common * hard
        init_d4 = w[4] - math.exp(w[5] * 3.0) + 1.0
        d_mid = last_d + (-w[6] * (g - 3.0) * (10.0 - last_d) / 9.0)
        grad[4] = c * ds_dd * w[7]
        grad[5] = c * ds_dd * w[7] * (-math.exp(w[5] * 3.0) * 3.0)
        grad[6] = c * ds_dd * (1.0 - w[7]) * (-(g - 3.0) * (10.0 - last_d) / 9.0)
        grad[7] = c * ds_dd * (init_d4 - d_mid)
    ft = factor * t / new_s
    dfactor_ddecay = 0.9 ** (1.0 / decay) * math.log(0.9) * (-1.0 / decay ** 2)
    dr_ddecay = r * (math.log(1.0 + ft) + decay * (t / new_s) * dfactor_ddecay / (1.0 + ft))
    grad[20] = dl_dr * (-dr_ddecay)
    return True, grad


@njit(cache=True)
def sgd_pass(w, seq_t, seq_g, starts, pos, t, y, lr, lo, hi):
    """One online pass over the rows (in the given order): each row with t >= 1 takes one clipped SGD step."""
    w = w.copy()
    for k in range(len(t)):
        if t[k] < 1 or pos[k] < 1:
            continue
        a = starts[k]
        step, grad = one_step_grad(w, seq_t[a:a + pos[k]], seq_g[a:a + pos[k]], t[k], y[k])
        if not step:
            continue  # new S at its floor: upstream returns before the update and the clamp
        for i in range(21):
            w[i] = min(hi[i], max(lo[i], w[i] - lr * grad[i]))
    return w


class FSRS6OneStep(Model):
    name = "FSRS-6-one-step"
    builtin_flags = BUILTIN_FLAGS[name]  # ("short",): same-day reviews in the histories, as FSRS-6 (ALWAYS_SHORT)

    def __init__(self, cfg=None):
        self.cfg = cfg
        self.n_params = 0 if cfg is not None and cfg.default else 21
        self.w = list(DEFAULT_W)

    def fit(self, train: ReviewData) -> "FSRS6OneStep":
        if self.cfg is not None and self.cfg.default:
            return self
        decay = DEFAULT_W[20]
        s0 = initialize_s0(train.rows, lambda t, s: (1 + (0.9 ** (-1 / decay) - 1) * t / s) ** (-decay),
                           DEFAULT_W[:4], S_MIN)
        rows = train.rows
        w = sgd_pass(np.array(list(s0) + DEFAULT_W[4:], dtype=np.float64),
                     np.ascontiguousarray(train.seq_delta_t, dtype=np.float64),
                     np.ascontiguousarray(train.seq_rating, dtype=np.int64),
                     rows["seq_start"].to_numpy(np.int64), rows["seq_pos"].to_numpy(np.int64),
                     rows["delta_t"].to_numpy(np.float64), rows["y"].to_numpy(np.float64), LR, CLIP_LO, CLIP_HI)
        self.w = [float(x) for x in w]
        return self

    def predict(self, test: ReviewData) -> np.ndarray:
        """FSRS-6's forward pass (pre-review D, its clamps) with the one-step weights."""
        from models.fsrs6 import FSRS6

        model = FSRS6(self.cfg)
        model.w = list(self.w)
        return model.predict(test)

    def parameters(self) -> list[float]:
        return [round(float(x), 6) for x in self.w]
