"""FSRS v3 (13 parameters, spec models.md §1.8) on the shared engine, plus what v1–v3 share (`FSRSLegacy`).

State (S, D). Curve R = 0.9^{t/S}. First review (grade G):
  S = w0 + w1·(G−1)                 D = clamp(w2 + w3·(G−3), 1, 10)
Later review (elapsed t, R = 0.9^{t/S}); the NEW difficulty is computed first and used by the stability update:
  D' = clamp(w5·w2 + (1−w5)·(D + w4·(G−3)), 1, 10)
  recall (G > 1): S' = S·(1 + e^{w6}·(11 − D')·S^{w7}·(e^{w8(1−R)} − 1))
  lapse  (G = 1): S' = w9·D'^{w10}·S^{w11}·e^{w12(1−R)}
S (at the first review too) is clamped to [0.01, 36500].

Upstream (srs-benchmark models/fsrs_v3.py@24ac3c3a, and the monolithic other.py of January 2025 that produced
data/upstream-check): `FSRS3.step` treats an all-zero batch state as "first review" (always and only the first
step, since S ≥ 0.01 afterwards), clamps D inside both branches and S after them, with s_min = 0.01,
s_max = 36500. Training: no S0 initialisation, every row, Adam 4e-2 with cosine schedule, 5 epochs, batch 512,
no L2 prior (weight decay is ignored by plain Adam).

Lanes: the trainer's batches and objective passes of v1, v2 and v3 run on lane_kernels/fsrs_legacy_lanes.py (8 cards side
by side, one kernel for the three versions; LANE_KERNELS in each module; fits 2-2.5x, result lines unchanged);
these scalar kernels still serve predictions, loss_and_grad and any batch the lanes refuse.

Upstream quirk reproduced (all three versions): the trained weights are returned through the model's
`state_dict()`, which rounds every weight to 4 decimals, and the test predictions use those rounded weights
(`FSRSLegacy.ROUND_DIGITS`). The checkpoint is still chosen on the unrounded weights' training loss.
"""

from __future__ import annotations

import math

from numba import njit

from models.fsrs_init import SECS_S_MIN
from engine.jit import inlined
from engine.kernel_math import LEGACY_S_MIN, bce, weights_then_s_min, weights_then_s_min_vjp
from engine.seq_model import SeqModel

S_MIN = LEGACY_S_MIN  # 0.01; upstream's --secs: 1e-4 (the plug-in's run-time option)
S_MAX = 36500.0
LN09 = math.log(0.9)
# The trainer's batches run with cards side by side (lane_kernels/fsrs_legacy_lanes.py, one kernel for v1, v2 and v3)
LANE_KERNELS = "lane_kernels.fsrs_legacy_lanes:lanes_loss_grad_v3"
# State: S, D, then what the step computed for its reverse pass (read by step_vjp alone, never by a later step or
# the curve; the engine carries adjoints for S and D only). Recall: e^{w6}, S^{w7}, e^{w8(1−R)}; lapse: D'^{w10},
# S^{w11}, e^{w12(1−R)}. The reverse pass reads them instead of computing the same expressions again.
N_STATE = 6
N_ADJ = 2
X_R = 2
X_A = 3
X_B = 4
X_C = 5

# The precomputed vector wc (precompute): wc[:13] = w, then s_min, the lower clamp of S (opts[0]: S_MIN in day
# mode, upstream's --secs 1e-4), read by the steps as w[C_SMIN]
N_W = 13
C_SMIN = 13


# the engine contract's precompute: wc = w, then s_min (engine/kernel_math.py)
precompute, precompute_vjp = weights_then_s_min, weights_then_s_min_vjp


# ---------------------------------------------------------------------------------------- shared helpers (numba)

@inlined
def exp_curve(s, t):
    """R = 0.9^{t/S}."""
    return math.exp(LN09 * t / s)


@inlined
def exp_curve_ds(r, s, t):
    """dR/dS of 0.9^{t/S}."""
    return -r * LN09 * t / (s * s)


# ---------------------------------------------------------------------------------------- v3 kernels (numba)

@njit(cache=True)
def init(w, g, t, out):
    out[0] = min(max(w[0] + w[1] * (g - 1), w[C_SMIN]), S_MAX)
    out[1] = min(max(w[2] + w[3] * (g - 3), 1.0), 10.0)


@njit(cache=True)
def init_vjp(w, g, t, state, gstate, gw):
    s0 = w[0] + w[1] * (g - 1)
    if w[C_SMIN] <= s0 <= S_MAX:
        gw[0] += gstate[0]
        gw[1] += gstate[0] * (g - 1)
    d0 = w[2] + w[3] * (g - 3)
    if 1.0 <= d0 <= 10.0:
        gw[2] += gstate[1]
        gw[3] += gstate[1] * (g - 3)


@inlined
def _new_d(w, d, g):
    """Unclamped w5·w2 + (1−w5)·(D + w4·(G−3)) and the same before mean reversion."""
    dp = d + w[4] * (g - 3)
    return w[5] * w[2] + (1.0 - w[5]) * dp, dp


@inlined
def step(w, prev, t, g, out):
    """One review; keeps R and the exponentials/powers of its branch in out[X_R:] for step_vjp."""
    s = prev[0]
    dm, _ = _new_d(w, prev[1], g)
    nd = min(max(dm, 1.0), 10.0)
    r = exp_curve(s, t)
    out[X_R] = r
    if g > 1:
        e6 = math.exp(w[6])
        pw = s ** w[7]
        e8 = math.exp(w[8] * (1.0 - r))
        out[X_A] = e6
        out[X_B] = pw
        out[X_C] = e8
        ns = s * (1.0 + e6 * (11.0 - nd) * pw * (e8 - 1.0))
    else:
        dpw = nd ** w[10]
        spw = s ** w[11]
        e12 = math.exp(w[12] * (1.0 - r))
        out[X_A] = dpw
        out[X_B] = spw
        out[X_C] = e12
        ns = w[9] * dpw * spw * e12
    out[0] = min(max(ns, w[C_SMIN]), S_MAX)
    out[1] = nd


@inlined
def step_vjp(w, prev, t, g, new, gnew, gprev, gw):
    """Reverse of `step`, reading the values it kept in `new`."""
    s = prev[0]
    dm, dp = _new_d(w, prev[1], g)
    nd = min(max(dm, 1.0), 10.0)
    r = new[X_R]
    gs_prev = 0.0
    gnd = gnew[1]
    if g > 1:
        e6 = new[X_A]
        pw = new[X_B]
        e8 = new[X_C]
        a = e6 * (11.0 - nd) * pw * (e8 - 1.0)
        ns = s * (1.0 + a)
        if w[C_SMIN] <= ns <= S_MAX:
            gs = gnew[0]
            dns_dr = -s * e6 * (11.0 - nd) * pw * e8 * w[8]
            gs_prev += gs * (1.0 + (1.0 + w[7]) * a + dns_dr * exp_curve_ds(r, s, t))
            gnd += gs * (-s * e6 * pw * (e8 - 1.0))
            gw[6] += gs * s * a
            gw[7] += gs * s * a * math.log(s)
            gw[8] += gs * s * e6 * (11.0 - nd) * pw * e8 * (1.0 - r)
    else:
        base = new[X_A] * new[X_B] * new[X_C]
        ns = w[9] * base
        if w[C_SMIN] <= ns <= S_MAX:
            gs = gnew[0]
            gs_prev += gs * (w[11] * ns / s - w[12] * ns * exp_curve_ds(r, s, t))
            gnd += gs * w[10] * ns / nd
            gw[9] += gs * base
            gw[10] += gs * ns * math.log(nd)
            gw[11] += gs * ns * math.log(s)
            gw[12] += gs * ns * (1.0 - r)
    gd_prev = 0.0
    if 1.0 <= dm <= 10.0:
        gw[5] += gnd * (w[2] - dp)
        gw[2] += gnd * w[5]
        gw[4] += gnd * (1.0 - w[5]) * (g - 3)
        gd_prev = gnd * (1.0 - w[5])
    gprev[0] = gs_prev
    gprev[1] = gd_prev


@njit(cache=True)
def curve(w, state, t):
    return exp_curve(state[0], t)


@njit(cache=True)
def curve_vjp(w, state, t, gp, gstate, gw):
    gstate[0] += gp * exp_curve_ds(exp_curve(state[0], t), state[0], t)


@njit(cache=True)
def target_loss(w, state, t, y, wt):
    """weight·BCE of one target (the engine's default, written here because target_loss_vjp is)."""
    return bce(exp_curve(state[0], t), y, wt)[0]


@njit(cache=True)
def target_loss_vjp(w, state, t, y, wt, gstate, gw):
    """The engine's default curve → BCE → curve_vjp with R computed once (the same R, so the same adjoint)."""
    r = exp_curve(state[0], t)
    lo, gp = bce(r, y, wt)
    gstate[0] += gp * exp_curve_ds(r, state[0], t)
    return lo


# ---------------------------------------------------------------------------------------- torch (upstream trainer)

def torch_exp_curve(t, s):
    return 0.9 ** (t / s)


def torch_init(w, g, t):
    s = (w[0] + w[1] * (g - 1)).clamp(S_MIN, S_MAX)
    d = (w[2] + w[3] * (g - 3)).clamp(1, 10)
    return s, d


def torch_step(w, state, t, g):
    import torch  # the upstream-style trainer only: a default run does not import torch

    s, d = state
    r = torch_exp_curve(t, s)
    nd = (w[5] * w[2] + (1 - w[5]) * (d + w[4] * (g - 3))).clamp(1, 10)
    s_recall = s * (1 + torch.exp(w[6]) * (11 - nd) * s.pow(w[7]) * (torch.exp((1 - r) * w[8]) - 1))
    s_lapse = w[9] * nd.pow(w[10]) * s.pow(w[11]) * torch.exp((1 - r) * w[12])
    return torch.where(g > 1, s_recall, s_lapse).clamp(S_MIN, S_MAX), nd


def torch_curve(w, state, t):
    return torch_exp_curve(t, state[0])


# ---------------------------------------------------------------------------------------- the models

class FSRSLegacy(SeqModel):
    """FSRS v1–v3: defaults as the starting point, every training row, no prior, no frozen parameters; the trained
    weights are rounded to ROUND_DIGITS decimals as upstream's state_dict() does before they predict."""

    ROUND_DIGITS = 4  # --secs too: upstream's FSRS1/FSRS3 state_dict() override rounds to 4 in either mode
    accepts_secs = True  # config.ACCEPTS_SECS: upstream's --secs, S clamped at s_min = 1e-4 (w0's box is 0.1 up)

    def __init__(self, cfg=None):
        self.secs = bool(getattr(cfg, "secs_mode", False))
        self.s_min = SECS_S_MIN if self.secs else S_MIN
        super().__init__(cfg)

    def engine_opts(self) -> tuple:
        return (self.s_min,)

    def fit(self, train):
        super().fit(train)
        if not self.cfg.default:
            self.w = [round(x, self.ROUND_DIGITS) for x in self.w]
        return self


class FSRSv3(FSRSLegacy):
    name = "FSRSv3"
    kernels = "models.fsrs_v3"
    default_w = [0.9605, 1.7234, 4.8527, -1.1917, -1.2956, 0.0573, 1.7352, -0.1673, 1.065, 1.8907, -0.3832, 0.5867,
                 1.0721]
    lower = [0.1, 0.1, 1, -5, -5, 0.05, 0, -0.8, 0.01, 0.5, -2, 0.01, 0.01]
    upper = [10, 5, 10, -0.1, -0.1, 0.5, 2, -0.15, 1.5, 5, -0.01, 0.9, 2]
