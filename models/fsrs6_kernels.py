"""FSRS-6 as an engine plug-in (contract: models/seq_model_stub.py): the FSRS-5/6 core of `fsrs_v5.py` with the
trainable decay w20 (R = (1 + F·t/S)^(−w20), F = 0.9^(−1/w20) − 1), the short-term factor S^(−w19) floored at 1
for G ≥ 3 (the published benchmark run; fsrs-rs ≥ 0.9 and newer fsrs-optimizer floor from G ≥ 2: see
fsrs6_kernels_g2.py) and s_min 0.001. Equations: models/fsrs6.py (the torch model) and spec models.md §1.2."""

from __future__ import annotations

import math

from numba import njit

from models import fsrs_v5 as core
from models.fsrs6_params import S_MIN

N_STATE = 2
FLOOR_GRADE = 3
LN09 = math.log(0.9)


@njit(cache=True, inline="always")
def _curve_consts(w):
    """(F, d, dF/dd) of the power curve with decay d = w20."""
    d = w[20]
    ef = math.exp(-LN09 / d)
    return ef - 1.0, d, ef * LN09 / (d * d)


@njit(cache=True)
def init(w, g, t, out):
    core.core_init(w, g, out, S_MIN)


@njit(cache=True)
def init_vjp(w, g, t, state, gstate, gw):
    core.core_init_vjp(w, g, gstate, gw, S_MIN)


@njit(cache=True)
def step(w, prev, t, g, out):
    f, d, _ = _curve_consts(w)
    core.core_step(w, prev, t, g, out, f, d, S_MIN, True, FLOOR_GRADE)


@njit(cache=True)
def step_vjp(w, prev, t, g, new, gnew, gprev, gw):
    f, d, df = _curve_consts(w)
    core.core_step_vjp(w, prev, t, g, gnew, gprev, gw, f, d, S_MIN, True, FLOOR_GRADE, df)


@njit(cache=True)
def curve(w, state, t):
    f, d, _ = _curve_consts(w)
    return core.core_curve(state[0], t, f, d)


@njit(cache=True)
def curve_vjp(w, state, t, gp, gstate, gw):
    f, d, df = _curve_consts(w)
    s = state[0]
    r = core.core_curve(s, t, f, d)
    x = f * t / s
    gstate[0] += gp * core.core_curve_ds(r, s, t, f, d)
    gw[20] += gp * r * (-math.log1p(x) - d / (1.0 + x) * t / s * df)
