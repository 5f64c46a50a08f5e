"""FSRS v1 (7 parameters, spec models.md §1.10) on the shared engine.

State (S, D, L), L the number of lapses. Curve R = 0.9^{t/S}. First review (grade G):
  S = w0·0.25·2^{G−1}   (Again w0/4, Hard w0/2, Good w0, Easy 2·w0)
  D = w1 − G + 3        (not clamped)
  L = max(0, 2 − G)     (1 after Again, else 0)
Later review (elapsed t, R = 0.9^{t/S}); the NEW difficulty is computed first and used by the stability update:
  D' = max(0, D + R − 0.25·2^{G−1} + 0.1)
  recall (G > 1): S' = S·(1 + e^{w2}·(D' + 0.1)^{w3}·S^{w4}·(e^{w5(1−R)} − 1))
  lapse  (G = 1): S' = w0·e^{w6·L}       (L before this review)
  L' = L + max(0, 2 − G)
S (at the first review too) is clamped to [0.01, 36500]; D has no clamp besides the max(0, ·).
Training as v3 (fsrs_v3.py): defaults as the start, every row, Adam 4e-2, 5 epochs, no prior, weights rounded to
4 decimals before prediction.

DEVIATION from the upstream run this benchmark reproduces: in srs-benchmark's January-2025 code (the monolithic
other.py, which also defined FSRS1 with exactly the equations above) FSRS v1 never produces a result. Its base
class `FSRS.iter` unpacks the final state as `stabilities, difficulties = outputs[seq_lens - 1, arange].
transpose(0, 1)`, which assumes a 2-component state; v1's state has 3 components (S, D, L), so every call raises
"ValueError: too many values to unpack (expected 2)". Training catches it (not an "inadequate data" error: it is
printed and the default weights are used), but prediction calls the same `iter` and the user fails, so no
FSRSv1 line is ever written (hence no FSRSv1 entry in data/upstream-check). Later upstream code (models/fsrs.py
@00c9de57: `stabilities, difficulties, *_ = ...`) reads S and D from the first two components, which is what this
implementation does: the model runs and is trained as upstream later intended.
"""

from __future__ import annotations

import math

from numba import njit

from models.fsrs_v3 import S_MAX, S_MIN, FSRSLegacy, exp_curve, exp_curve_ds, torch_exp_curve
from models.fsrs_v3 import curve, curve_vjp, target_loss, target_loss_vjp, torch_curve  # noqa: F401 (v3's curve)
from engine.jit import inlined
from engine.kernel_math import weights_then_s_min, weights_then_s_min_vjp

# The trainer's batches run with cards side by side (lane_kernels/fsrs_v1_lanes.py)
LANE_KERNELS = "lane_kernels.fsrs_v1_lanes:lanes_loss_grad_v1"
# State: S, D, lapses, then what the step computed for its reverse pass (read by step_vjp alone, never by a later
# step or the curve): R and, recall: e^{w2}(D'+0.1)^{w3}S^{w4} and e^{w5(1−R)}; lapse: e^{w6·lapses}.
N_STATE = 6
N_ADJ = 3
X_R = 3
X_C = 4
X_E = 5

# The precomputed vector wc (precompute): wc[:7] = w, then s_min, the lower clamp of S (opts[0]: S_MIN in day
# mode, upstream's --secs 1e-4), read by the steps as w[C_SMIN]
N_W = 7
C_SMIN = 7


# the engine contract's precompute: wc = w, then s_min (engine/kernel_math.py)
precompute, precompute_vjp = weights_then_s_min, weights_then_s_min_vjp



@njit(cache=True)
def init(w, g, t, out):
    out[0] = min(max(w[0] * 0.25 * 2.0 ** (g - 1), w[C_SMIN]), S_MAX)
    out[1] = w[1] - g + 3.0
    out[2] = 1.0 if g < 2 else 0.0


@njit(cache=True)
def init_vjp(w, g, t, state, gstate, gw):
    f = 0.25 * 2.0 ** (g - 1)
    if w[C_SMIN] <= w[0] * f <= S_MAX:
        gw[0] += gstate[0] * f
    gw[1] += gstate[1]


@inlined
def step(w, prev, t, g, out):
    """One review; keeps R and the exponentials/powers of its branch in out[X_R:] for step_vjp."""
    s = prev[0]
    lapses = prev[2]
    r = exp_curve(s, t)
    out[X_R] = r
    nd = max(prev[1] + r - 0.25 * 2.0 ** (g - 1) + 0.1, 0.0)
    if g > 1:
        c = math.exp(w[2]) * (nd + 0.1) ** w[3] * s ** w[4]
        e5 = math.exp(w[5] * (1.0 - r))
        out[X_C] = c
        out[X_E] = e5
        ns = s * (1.0 + c * (e5 - 1.0))
    else:
        e6 = math.exp(w[6] * lapses)
        out[X_E] = e6
        ns = w[0] * e6
    out[0] = min(max(ns, w[C_SMIN]), S_MAX)
    out[1] = nd
    out[2] = lapses + (1.0 if g < 2 else 0.0)


@inlined
def step_vjp(w, prev, t, g, new, gnew, gprev, gw):
    """Reverse of `step`, reading the values it kept in `new`."""
    s = prev[0]
    lapses = prev[2]
    r = new[X_R]
    dr_ds = exp_curve_ds(r, s, t)
    dr = prev[1] + r - 0.25 * 2.0 ** (g - 1) + 0.1
    nd = max(dr, 0.0)
    gs_prev = 0.0
    gl_prev = gnew[2]
    gnd = gnew[1]
    if g > 1:
        c = new[X_C]
        e5 = new[X_E]
        a = c * (e5 - 1.0)
        ns = s * (1.0 + a)
        if w[C_SMIN] <= ns <= S_MAX:
            gs = gnew[0]
            gs_prev += gs * (1.0 + (1.0 + w[4]) * a - s * c * e5 * w[5] * dr_ds)
            gnd += gs * s * w[3] * a / (nd + 0.1)
            gw[2] += gs * s * a
            gw[3] += gs * s * a * math.log(nd + 0.1)
            gw[4] += gs * s * a * math.log(s)
            gw[5] += gs * s * c * e5 * (1.0 - r)
    else:
        e6 = new[X_E]
        ns = w[0] * e6
        if w[C_SMIN] <= ns <= S_MAX:
            gs = gnew[0]
            gw[0] += gs * e6
            gw[6] += gs * ns * lapses
            gl_prev += gs * ns * w[6]
    gd_prev = 0.0
    if dr > 0.0:  # relu passes the gradient only where its input is positive (as torch's)
        gd_prev = gnd
        gs_prev += gnd * dr_ds
    gprev[0] = gs_prev
    gprev[1] = gd_prev
    gprev[2] = gl_prev


# ---------------------------------------------------------------------------------------- torch (upstream trainer)

def torch_init(w, g, t):
    import torch  # the upstream-style trainer only: a default run does not import torch

    s = (w[0] * 0.25 * torch.pow(2, g - 1)).clamp(S_MIN, S_MAX)
    d = w[1] - g + 3
    lapses = torch.relu(2 - g)
    return s, d, lapses


def torch_step(w, state, t, g):
    import torch  # the upstream-style trainer only: a default run does not import torch

    s, d, lapses = state
    r = torch_exp_curve(t, s)
    nd = torch.relu(d + r - 0.25 * torch.pow(2, g - 1) + 0.1)
    s_recall = s * (1 + torch.exp(w[2]) * (nd + 0.1).pow(w[3]) * s.pow(w[4]) * (torch.exp((1 - r) * w[5]) - 1))
    s_lapse = w[0] * torch.exp(w[6] * lapses)
    ns = torch.where(g > 1, s_recall, s_lapse).clamp(S_MIN, S_MAX)
    return ns, nd, lapses + torch.relu(2 - g)


class FSRSv1(FSRSLegacy):
    name = "FSRSv1"
    kernels = "models.fsrs_v1"
    default_w = [2, 5, 3, -0.7, -0.2, 1, -0.3]
    lower = [0.1, 1, 0.01, -1, -1, 0.01, -1]
    upper = [10, 10, 10, -0.01, -0.01, 10, -0.01]
