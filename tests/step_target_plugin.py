"""A small hand-written engine plug-in that fuses a target with the step (step_target / step_target_vjp), for
tests/test_step_target.py: one stability S, R = e^{−t/S};
    init:  S = w[g − 1]
    step:  S' = S·(w4 + w5·(1 − R)) after a success (g > 1), S' = w6·S + 1 after a lapse (g = 1), R = e^{−t/S}
The step keeps R in state[1] for its reverse pass (N_ADJ = 1), so the target read at the step's own elapsed time
costs only its BCE. Its engine copy carries a digest of this file (seq_engine._source_digest), so an edit here
compiles the engine afresh."""

import math

from numba import njit

from engine.kernel_math import bce

N_STATE = 2
N_ADJ = 1


@njit(cache=True)
def init(w, g, t, out):
    out[0] = w[g - 1]


@njit(cache=True)
def init_vjp(w, g, t, state, gstate, gw):
    gw[g - 1] += gstate[0]


@njit(cache=True)
def step(w, prev, t, g, out):
    s = prev[0]
    r = math.exp(-t / s)
    out[0] = s * (w[4] + w[5] * (1.0 - r)) if g > 1 else w[6] * s + 1.0
    out[1] = r


@njit(cache=True)
def step_vjp(w, prev, t, g, new, gnew, gprev, gw):
    s = prev[0]
    r = new[1]
    dr_ds = r * t / (s * s)
    gs = gnew[0]
    if g > 1:
        gprev[0] = gs * (w[4] + w[5] * (1.0 - r) - s * w[5] * dr_ds)
        gw[4] += gs * s
        gw[5] += gs * s * (1.0 - r)
    else:
        gprev[0] = gs * w[6]
        gw[6] += gs * s


@njit(cache=True)
def curve(w, state, t):
    return math.exp(-t / state[0])


@njit(cache=True)
def curve_vjp(w, state, t, gp, gstate, gw):
    s = state[0]
    gstate[0] += gp * math.exp(-t / s) * t / (s * s)


@njit(cache=True)
def step_target(w, prev, t, g, y, wt, out):
    step(w, prev, t, g, out)
    return bce(out[1], y, wt)[0]


@njit(cache=True)
def step_target_vjp(w, prev, t, g, y, wt, new, gnew, gprev, gw):
    step_vjp(w, prev, t, g, new, gnew, gprev, gw)
    s = prev[0]
    r = new[1]
    gp = bce(r, y, wt)[1]
    gprev[0] += gp * r * t / (s * s)
