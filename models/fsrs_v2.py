"""FSRS v2 (14 parameters, spec models.md §1.9) on the shared engine.

State (S, D). Curve R = 0.9^{t/S}. First review (grade G):
  S = w0·(w1·(G−1) + 1)             D = clamp(w2·(w3·(G−4) + 1), 1, 10)
Later review (elapsed t, R = 0.9^{t/S}); the NEW difficulty is computed first and used by the stability update:
  D' = clamp(w5·w2·(1 − w3) + (1−w5)·(D + w4·(G−3)), 1, 10)     (reversion towards D0 of a Good first review)
  recall (G > 1): S' = S·(1 + e^{w6}·D'^{w7}·S^{w8}·(e^{w9(1−R)} − 1))
  lapse  (G = 1): S' = w10·D'^{w11}·S^{w12}·(e^{w13(1−R)} − 1)
S (at the first review too) is clamped to [0.01, 36500].

Upstream: srs-benchmark models/fsrs_v2.py@0c5f44bd / @24ac3c3a and the monolithic other.py of January 2025 (the
code behind data/upstream-check): same first-review detection, clamps and training as FSRS v3 (see fsrs_v3.py),
including the 4-decimal rounding of the trained weights before prediction.
"""

from __future__ import annotations

import math

from numba import njit

from models.fsrs_v3 import S_MAX, S_MIN, FSRSLegacy, exp_curve, exp_curve_ds, torch_exp_curve
from models.fsrs_v3 import curve, curve_vjp, target_loss, target_loss_vjp, torch_curve  # noqa: F401 (v3's curve)
from engine.jit import inlined
from engine.kernel_math import weights_then_s_min, weights_then_s_min_vjp

# The trainer's batches run with cards side by side (lane_kernels/fsrs_legacy_lanes.py, one kernel for v1, v2 and v3)
LANE_KERNELS = "lane_kernels.fsrs_legacy_lanes:lanes_loss_grad_v2"
# State: S, D, then what the step computed for its reverse pass (read by step_vjp alone, never by a later step or
# the curve): R and, recall: e^{w6}, D'^{w7}, S^{w8}, e^{w9(1−R)}; lapse: D'^{w11}, S^{w12}, e^{w13(1−R)}.
N_STATE = 7
N_ADJ = 2
X_R = 2
X_A = 3
X_B = 4
X_C = 5
X_D = 6

# The precomputed vector wc (precompute): wc[:14] = w, then s_min, the lower clamp of S (opts[0]: S_MIN in day
# mode, upstream's --secs 1e-4), read by the steps as w[C_SMIN]
N_W = 14
C_SMIN = 14


# the engine contract's precompute: wc = w, then s_min (engine/kernel_math.py)
precompute, precompute_vjp = weights_then_s_min, weights_then_s_min_vjp



@njit(cache=True)
def init(w, g, t, out):
    out[0] = min(max(w[0] * (w[1] * (g - 1) + 1.0), w[C_SMIN]), S_MAX)
    out[1] = min(max(w[2] * (w[3] * (g - 4) + 1.0), 1.0), 10.0)


@njit(cache=True)
def init_vjp(w, g, t, state, gstate, gw):
    f = w[1] * (g - 1) + 1.0
    s0 = w[0] * f
    if w[C_SMIN] <= s0 <= S_MAX:
        gw[0] += gstate[0] * f
        gw[1] += gstate[0] * w[0] * (g - 1)
    h = w[3] * (g - 4) + 1.0
    d0 = w[2] * h
    if 1.0 <= d0 <= 10.0:
        gw[2] += gstate[1] * h
        gw[3] += gstate[1] * w[2] * (g - 4)


@inlined
def _new_d(w, d, g):
    """Unclamped D' before the clamp, the reversion target w2·(1−w3), and D + w4·(G−3)."""
    dp = d + w[4] * (g - 3)
    target = w[2] * (1.0 - w[3])
    return w[5] * target + (1.0 - w[5]) * dp, target, dp


@inlined
def step(w, prev, t, g, out):
    """One review; keeps R and the exponentials/powers of its branch in out[X_R:] for step_vjp."""
    s = prev[0]
    dm, _, _ = _new_d(w, prev[1], g)
    nd = min(max(dm, 1.0), 10.0)
    r = exp_curve(s, t)
    out[X_R] = r
    if g > 1:
        e6 = math.exp(w[6])
        dpw = nd ** w[7]
        spw = s ** w[8]
        e9 = math.exp(w[9] * (1.0 - r))
        out[X_A] = e6
        out[X_B] = dpw
        out[X_C] = spw
        out[X_D] = e9
        ns = s * (1.0 + e6 * dpw * spw * (e9 - 1.0))
    else:
        dpw = nd ** w[11]
        spw = s ** w[12]
        e13 = math.exp(w[13] * (1.0 - r))
        out[X_B] = dpw
        out[X_C] = spw
        out[X_D] = e13
        ns = w[10] * dpw * spw * (e13 - 1.0)
    out[0] = min(max(ns, w[C_SMIN]), S_MAX)
    out[1] = nd


@inlined
def step_vjp(w, prev, t, g, new, gnew, gprev, gw):
    """Reverse of `step`, reading the values it kept in `new` (grouped as the plain formulas group them: the clamp
    test sees w10·(D'^{w11}·S^{w12})·(e − 1), which may differ from the forward's S' in the last bit, as before)."""
    s = prev[0]
    dm, target, dp = _new_d(w, prev[1], g)
    nd = min(max(dm, 1.0), 10.0)
    r = new[X_R]
    gs_prev = 0.0
    gnd = gnew[1]
    if g > 1:
        c = new[X_A] * new[X_B] * new[X_C]
        e9 = new[X_D]
        a = c * (e9 - 1.0)
        ns = s * (1.0 + a)
        if w[C_SMIN] <= ns <= S_MAX:
            gs = gnew[0]
            gs_prev += gs * (1.0 + (1.0 + w[8]) * a - s * c * e9 * w[9] * exp_curve_ds(r, s, t))
            gnd += gs * s * w[7] * a / nd
            gw[6] += gs * s * a
            gw[7] += gs * s * a * math.log(nd)
            gw[8] += gs * s * a * math.log(s)
            gw[9] += gs * s * c * e9 * (1.0 - r)
    else:
        c = new[X_B] * new[X_C]
        e13 = new[X_D]
        ns = w[10] * c * (e13 - 1.0)
        if w[C_SMIN] <= ns <= S_MAX:
            gs = gnew[0]
            gs_prev += gs * (w[12] * ns / s - w[10] * c * e13 * w[13] * exp_curve_ds(r, s, t))
            gnd += gs * w[11] * ns / nd
            gw[10] += gs * c * (e13 - 1.0)
            gw[11] += gs * ns * math.log(nd)
            gw[12] += gs * ns * math.log(s)
            gw[13] += gs * w[10] * c * e13 * (1.0 - r)
    gd_prev = 0.0
    if 1.0 <= dm <= 10.0:
        gw[5] += gnd * (target - dp)
        gw[2] += gnd * w[5] * (1.0 - w[3])
        gw[3] -= gnd * w[5] * w[2]
        gw[4] += gnd * (1.0 - w[5]) * (g - 3)
        gd_prev = gnd * (1.0 - w[5])
    gprev[0] = gs_prev
    gprev[1] = gd_prev


# ---------------------------------------------------------------------------------------- torch (upstream trainer)

def torch_init(w, g, t):
    s = (w[0] * (w[1] * (g - 1) + 1)).clamp(S_MIN, S_MAX)
    d = (w[2] * (w[3] * (g - 4) + 1)).clamp(1, 10)
    return s, d


def torch_step(w, state, t, g):
    import torch  # the upstream-style trainer only: a default run does not import torch

    s, d = state
    r = torch_exp_curve(t, s)
    nd = (w[5] * (w[2] * (1 - w[3])) + (1 - w[5]) * (d + w[4] * (g - 3))).clamp(1, 10)
    s_recall = s * (1 + torch.exp(w[6]) * nd.pow(w[7]) * s.pow(w[8]) * (torch.exp((1 - r) * w[9]) - 1))
    s_lapse = w[10] * nd.pow(w[11]) * s.pow(w[12]) * (torch.exp((1 - r) * w[13]) - 1)
    return torch.where(g > 1, s_recall, s_lapse).clamp(S_MIN, S_MAX), nd


class FSRSv2(FSRSLegacy):
    name = "FSRSv2"
    kernels = "models.fsrs_v2"
    default_w = [1, 1, 1, -1, -1, 0.2, 3, -0.8, -0.2, 1.3, 2.6, -0.2, 0.6, 1.5]
    lower = [0.1, 0.01, 1, -10, -10, 0, 0, -2, -2, 0.01, 0, -2, 0.01, 0.01]
    upper = [10, 10, 10, -0.01, -0.01, 1, 5, -0.01, -0.01, 2, 5, -0.01, 1, 2]
