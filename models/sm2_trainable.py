"""SM-2 with trainable constants (6 parameters; spec models.md §6.2), row `SM2-trainable`.

Upstream: models/sm2_trainable.py@0e0b0dc9 (the same class sits in other.py of January 2025). The state is
(ivl, EF, reps), starting at (0, w2, 0) BEFORE the card's first review, and every review, the first included, goes
through the same step with q = G + 1:
    reps' = reps + 1 if G > 1 else 1
    ivl'  = w0 if reps' == 1, w1 if reps' == 2, else ivl·EF        (the OLD EF; a lapse and a first success give w0)
    EF'   = EF − w3·(q − w4)² + w5                                    (defaults reproduce SM-2's EF rule)
    ivl' clamped to [s_min, 36500] = [0.01, 36500], EF' to [1.3, 10]; no rounding.
p = 0.9^(t/ivl). init [1, 6, 2.5, 0.02, 7, 0.18].
Clipper after every step: w0, w1 ∈ [s_min, init_s_max] = [0.01, 100] [VERSION: other.py of Jan 2025 used
[0.01, 36500]; unreachable with lr 4e-2 over 5 epochs from 1 and 6], w2 ∈ [1.3, 10], w3 ≥ 0, w4 ≥ 5, w5 free.
Upstream's trained weights are `state_dict()`, which rounds every weight to 4 decimals, and those rounded weights
predict the test split: `SM2Trainable.fit` rounds the same way.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from models.fsrs_v3 import curve, curve_vjp, torch_curve  # noqa: F401 (the same 0.9^(t/S) prediction)
from engine.seq_model import SeqModel

N_STATE = 3
S_MIN = 0.01
S_MAX = 36500.0
EF_MIN = 1.3
EF_MAX = 10.0


# ---------------------------------------------------------------------------------------- numba kernels

@njit(cache=True)
def _step(w, ivl, ef, reps, g, out):
    new_reps = reps + 1.0 if g > 1 else 1.0
    if new_reps == 1.0:
        ni = w[0]
    elif new_reps == 2.0:
        ni = w[1]
    else:
        ni = ivl * ef
    q = g + 1.0
    ne = ef - w[3] * (q - w[4]) ** 2 + w[5]
    out[0] = min(max(ni, S_MIN), S_MAX)
    out[1] = min(max(ne, EF_MIN), EF_MAX)
    out[2] = new_reps


@njit(cache=True)
def _step_vjp(w, ivl, ef, reps, g, gnew, gprev, gw):
    """gprev[:] = adjoint of (ivl, ef, reps) (overwritten); gw += parameter adjoint. Clamps pass the gradient
    when lo <= x <= hi (torch.clamp)."""
    gprev[0] = 0.0
    gprev[1] = 0.0
    gprev[2] = 0.0  # reps only enters through == tests: no gradient
    new_reps = reps + 1.0 if g > 1 else 1.0
    if new_reps == 1.0:
        ni = w[0]
    elif new_reps == 2.0:
        ni = w[1]
    else:
        ni = ivl * ef
    if S_MIN <= ni <= S_MAX:
        gi = gnew[0]
        if new_reps == 1.0:
            gw[0] += gi
        elif new_reps == 2.0:
            gw[1] += gi
        else:
            gprev[0] += gi * ef
            gprev[1] += gi * ivl
    q = g + 1.0
    d = q - w[4]
    ne = ef - w[3] * d ** 2 + w[5]
    if EF_MIN <= ne <= EF_MAX:
        ge = gnew[1]
        gprev[1] += ge
        gw[3] -= ge * d * d
        gw[4] += ge * 2.0 * w[3] * d
        gw[5] += ge


@njit(cache=True)
def init(w, g, t, out):
    _step(w, 0.0, w[2], 0.0, g, out)


@njit(cache=True)
def init_vjp(w, g, t, state, gstate, gw):
    # the first review is a step from (ivl 0, EF w2, reps 0): its EF adjoint is w2's
    g_start = np.zeros(3)
    _step_vjp(w, 0.0, w[2], 0.0, g, gstate, g_start, gw)
    gw[2] += g_start[1]


@njit(cache=True)
def step(w, prev, t, g, out):
    _step(w, prev[0], prev[1], prev[2], g, out)


@njit(cache=True)
def step_vjp(w, prev, t, g, new, gnew, gprev, gw):
    _step_vjp(w, prev[0], prev[1], prev[2], g, gnew, gprev, gw)


# ---------------------------------------------------------------------------------------- torch (upstream trainer)

def torch_step(w, state, t, g):
    import torch  # the upstream-style trainer only: a default run does not import torch

    ivl, ef, reps = state
    new_reps = torch.where(g > 1, reps + 1, torch.ones_like(reps))
    new_ivl = torch.where(new_reps == 1, w[0] * torch.ones_like(ivl),
                          torch.where(new_reps == 2, w[1] * torch.ones_like(ivl), ivl * ef))
    q = g + 1
    new_ef = ef - w[3] * (q - w[4]) ** 2 + w[5]
    return new_ivl.clamp(S_MIN, S_MAX), new_ef.clamp(EF_MIN, EF_MAX), new_reps


def torch_init(w, g, t):
    import torch  # the upstream-style trainer only: a default run does not import torch

    zeros = torch.zeros_like(g, dtype=w.dtype)
    return torch_step(w, (zeros, w[2] * torch.ones_like(zeros), zeros), t, g)


# ---------------------------------------------------------------------------------------- the model

class SM2Trainable(SeqModel):
    name = "SM2-trainable"
    kernels = "models.sm2_trainable"
    default_w = [1.0, 6.0, 2.5, 0.02, 7.0, 0.18]
    lower = [S_MIN, S_MIN, 1.3, 0.0, 5.0, -math.inf]
    upper = [100.0, 100.0, 10.0, math.inf, math.inf, math.inf]

    def fit(self, train):
        super().fit(train)
        self.w = [round(float(x), 4) for x in self.w]  # upstream predicts with state_dict()'s 4-decimal weights
        return self
