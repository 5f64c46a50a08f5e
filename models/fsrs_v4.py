"""FSRS v4 (17 parameters) and the step functions it shares with FSRS-4.5 (spec models.md §1.6–1.7).

State (S, D). First review: S = w[G−1], D = clamp(w4 − w5·(G−3), 1, 10). Later review with R = R(t, S):
  D' = clamp(w7·w4 + (1−w7)·(D − w6·(G−3)), 1, 10)
  recall: S' = S·(1 + e^{w8}·(11−D)·S^{−w9}·(e^{w10(1−R)} − 1)·h·b)   (h = w15 for Hard, b = w16 for Easy)
  lapse:  S' = w11·D^{−w12}·((S+1)^{w13} − 1)·e^{w14(1−R)}           (FSRS-4.5: min(·, S))
  S' clamped to [0.01, 36500]; the stability formulas use the OLD D.
v4's curve is R = (1 + t/(9S))^{−1}; FSRS-4.5's is (1 + (19/81)·t/S)^{−0.5}: both are (1 + F·t/S)^{−d}.
Training (upstream): S0 fitted (§1.1) and then frozen, only rows with i > 2, no L2 prior.

This module is the engine plug-in for v4 (numba kernels; contract in engine/seq_model_stub.py) and the torch
step for the upstream-style trainer; `fsrs_v45.py` binds the same core with its own constants.

Speed without a changed bit: the step keeps R and the exp/pow values of its branch in the state after S and D
(N_ADJ = 2: only S and D carry adjoints), and the reverse step reads them instead of evaluating the same
expressions again; a target's loss and its adjoint share one R (core_target_loss_vjp). FSRS-5 and v1-v3 do the
same in their own modules; FSRS-6 (models/fsrs6_kernels.py) was written that way first.
Lanes: the trainer's batches and objective passes of v4, 4.5 and 5 run on lane_kernels/fsrs_v4_lanes.py (8 cards side
by side, one kernel for the three versions; LANE_KERNELS below and in fsrs_v45.py / fsrs_v5.py); this core still
serves predictions, loss_and_grad and any batch the lanes refuse.
"""

from __future__ import annotations

import math

from numba import njit

from models.fsrs_init import SECS_S_MIN, initialize_s0
from engine.jit import inlined
from engine.kernel_math import LEGACY_S_MIN, bce, weights_then_s_min, weights_then_s_min_vjp
from engine.seq_model import SeqModel

S_MIN = LEGACY_S_MIN  # 0.01; upstream's --secs: 1e-4 (the plug-in's run-time option)
S_MAX = 36500.0
# State: S, D, then what the step computed for its reverse pass (read by step_vjp alone, never by a later step or
# the curve; the engine carries adjoints for S and D only)
N_STATE = 7
N_ADJ = 2
X_R = 2  # R before the review
X_P = 3  # S^{−w9} (recall) or D^{−w12} (lapse)
X_E = 4  # e^{w10(1−R)} (recall) or e^{w14(1−R)} (lapse)
X_SP = 5  # (S+1)^{w13} (lapse)
X_E8 = 6  # e^{w8} (recall)

# The trainer's batches run with cards side by side (lane_kernels/fsrs_v4_lanes.py, one kernel for v4, 4.5 and 5)
LANE_KERNELS = "lane_kernels.fsrs_v4_lanes:lanes_loss_grad_v4"
# The precomputed vector wc (precompute): wc[:17] = w, then s_min, the lower clamp of S (opts[0]: S_MIN in day mode,
# upstream's --secs 1e-4), read by the steps as w[C_SMIN] (v4 and 4.5 alike)
N_W = 17
C_SMIN = 17
N_WC = 18

# v4 constants: R = (1 + F·t/S)^(−DECAY), lapse not capped at S
F_V4 = 1.0 / 9.0
DECAY_V4 = 1.0


# ---------------------------------------------------------------------------------------- shared core (numba)

# the engine contract's precompute: wc = w, then s_min (engine/kernel_math.py)
precompute, precompute_vjp = weights_then_s_min, weights_then_s_min_vjp


@inlined
def hard_easy(w, g):
    """Success-growth factor of the grade: the Hard penalty w15, the Easy bonus w16, else 1 (FSRS v4 to 6)."""
    if g == 2:
        return w[15]
    if g == 4:
        return w[16]
    return 1.0


@njit(cache=True)
def core_init(w, g, out):
    out[0] = min(max(w[g - 1], w[C_SMIN]), S_MAX)
    out[1] = min(max(w[4] - w[5] * (g - 3), 1.0), 10.0)


@njit(cache=True)
def core_init_vjp(w, g, gstate, gw):
    if w[C_SMIN] <= w[g - 1] <= S_MAX:
        gw[g - 1] += gstate[0]
    d0 = w[4] - w[5] * (g - 3)
    if 1.0 <= d0 <= 10.0:
        gw[4] += gstate[1]
        gw[5] -= (g - 3) * gstate[1]


@njit(cache=True)
def core_curve(s, t, factor, decay):
    return (1.0 + factor * t / s) ** (-decay)


@njit(cache=True)
def core_curve_ds(r, s, t, factor, decay):
    """dR/dS."""
    x = factor * t / s
    return r * decay * x / ((1.0 + x) * s)


@inlined
def recall_stability_vjp(w, s, d, r, g, gs, dr_ds, gprev, gw, s_min, e8, pw, e10):
    """Adjoint of the success stability S' = S·(1 + e8·(11−D)·pw·(e10 − 1)·h·b) clamped to [s_min, S_MAX] (FSRS v4
    to 6 alike), given the forward's e8 = e^{w8}, pw = S^{−w9} and e10 = e^{w10(1−R)} (kept by the step or
    precomputed, so not computed again): adds gs·∂S'/∂(S, D) (S also through R, via dr_ds) into gprev and
    gs·∂S'/∂(w8, w9, w10, w15, w16) into gw; returns ∂S'/∂R (0 where the clamp holds S') for a curve whose own
    parameters move R."""
    hb = hard_easy(w, g)
    core = e8 * (11.0 - d) * pw * (e10 - 1.0)
    inc = core * hb
    ns = s * (1.0 + inc)
    if not (s_min <= ns <= S_MAX):
        return 0.0
    dns_dr = -s * e8 * (11.0 - d) * pw * hb * w[10] * e10
    gprev[0] += gs * (1.0 + (1.0 - w[9]) * inc + dns_dr * dr_ds)
    gprev[1] += gs * (-s * e8 * pw * (e10 - 1.0) * hb)
    gw[8] += gs * s * inc
    gw[9] -= gs * s * inc * math.log(s)
    gw[10] += gs * s * e8 * (11.0 - d) * pw * hb * e10 * (1.0 - r)
    if g == 2:
        gw[15] += gs * s * core
    elif g == 4:
        gw[16] += gs * s * core
    return dns_dr


@inlined
def lapse_stability(w, s, d, r, out):
    """The post-lapse stability w11·D^{−w12}·((S+1)^{w13} − 1)·e^{w14(1−R)} (FSRS v4 and 5 alike, before their
    caps), keeping D^{−w12}, e^{w14(1−R)} and (S+1)^{w13} in out[X_P], out[X_E], out[X_SP] for the reverse pass."""
    dpw = d ** (-w[12])
    sp = (s + 1.0) ** w[13]
    e14 = math.exp(w[14] * (1.0 - r))
    out[X_P] = dpw
    out[X_E] = e14
    out[X_SP] = sp
    return w[11] * dpw * (sp - 1.0) * e14


@inlined
def lapse_stability_vjp(w, s, d, r, sf, gf, dr_ds, kept, gprev, gw):
    """Adjoint of lapse_stability's sf (gf = the gradient reaching sf past the caller's cap and clamp), from the
    values it kept in `kept`: adds gf·∂sf/∂(S, D) (S also through R, via dr_ds) into gprev and gf·∂sf/∂(w11..w14)
    into gw."""
    dpw = kept[X_P]
    sp = kept[X_SP]
    e14 = kept[X_E]
    gprev[0] += gf * (w[11] * dpw * w[13] * sp / (s + 1.0) * e14 - w[14] * sf * dr_ds)
    gprev[1] -= gf * w[12] * sf / d
    gw[11] += gf * dpw * (sp - 1.0) * e14
    gw[12] -= gf * sf * math.log(d)
    gw[13] += gf * w[11] * dpw * sp * math.log(s + 1.0) * e14
    gw[14] += gf * sf * (1.0 - r)


@inlined
def core_step(w, prev, t, g, out, factor, decay, cap_lapse):
    """One review; besides S and D, keeps R and the powers/exponentials of its branch in out[X_R:] for
    core_step_vjp (which would otherwise compute them again from the same expressions)."""
    s = prev[0]
    d = prev[1]
    r = core_curve(s, t, factor, decay)
    out[X_R] = r
    if g > 1:
        e8 = math.exp(w[8])
        pw = s ** (-w[9])
        e10 = math.exp(w[10] * (1.0 - r))
        out[X_E8] = e8
        out[X_P] = pw
        out[X_E] = e10
        ns = s * (1.0 + e8 * (11.0 - d) * pw * (e10 - 1.0) * hard_easy(w, g))
    else:
        ns = lapse_stability(w, s, d, r, out)
        if cap_lapse and s < ns:
            ns = s
    out[0] = min(max(ns, w[C_SMIN]), S_MAX)
    out[1] = min(max(w[7] * w[4] + (1.0 - w[7]) * (d - w[6] * (g - 3)), 1.0), 10.0)


@inlined
def core_step_vjp(w, prev, t, g, new, gnew, gprev, gw, factor, decay, cap_lapse):
    """Reverse of core_step, reading the values it kept in `new`."""
    s = prev[0]
    d = prev[1]
    gprev[0] = 0.0
    gprev[1] = 0.0
    # difficulty
    dp = d - w[6] * (g - 3)
    dm = w[7] * w[4] + (1.0 - w[7]) * dp
    if 1.0 <= dm <= 10.0:
        gdm = gnew[1]
        gw[7] += gdm * (w[4] - dp)
        gw[4] += gdm * w[7]
        gdp = gdm * (1.0 - w[7])
        gw[6] -= gdp * (g - 3)
        gprev[1] += gdp
    # stability
    r = new[X_R]
    dr_ds = core_curve_ds(r, s, t, factor, decay)
    if g > 1:
        recall_stability_vjp(w, s, d, r, g, gnew[0], dr_ds, gprev, gw, w[C_SMIN], new[X_E8], new[X_P], new[X_E])
    else:
        sf = w[11] * new[X_P] * (new[X_SP] - 1.0) * new[X_E]
        ns = sf
        cf = 1.0
        if cap_lapse:
            if s < sf:
                ns, cf = s, 0.0
            elif s == sf:
                cf = 0.5  # torch.minimum splits the gradient on a tie
        if w[C_SMIN] <= ns <= S_MAX:
            gs = gnew[0]
            gprev[0] += gs * (1.0 - cf)
            gf = gs * cf
            if gf != 0.0:
                lapse_stability_vjp(w, s, d, r, sf, gf, dr_ds, new, gprev, gw)


@inlined
def core_target_loss(state, t, y, wt, factor, decay):
    """weight·BCE of one target on the curve (1 + F·t/S)^(−decay): the engine's default target_loss."""
    return bce(core_curve(state[0], t, factor, decay), y, wt)[0]


@inlined
def core_target_loss_vjp(state, t, y, wt, gstate, factor, decay):
    """The engine's default curve → BCE → curve_vjp with R computed once (the same R, so the same adjoint)."""
    r = core_curve(state[0], t, factor, decay)
    lo, gp = bce(r, y, wt)
    gstate[0] += gp * core_curve_ds(r, state[0], t, factor, decay)
    return lo


# ---------------------------------------------------------------------------------------- v4 kernels (numba)

@njit(cache=True)
def init(w, g, t, out):
    core_init(w, g, out)


@njit(cache=True)
def init_vjp(w, g, t, state, gstate, gw):
    core_init_vjp(w, g, gstate, gw)


@njit(cache=True)
def step(w, prev, t, g, out):
    core_step(w, prev, t, g, out, F_V4, DECAY_V4, False)


@njit(cache=True)
def step_vjp(w, prev, t, g, new, gnew, gprev, gw):
    core_step_vjp(w, prev, t, g, new, gnew, gprev, gw, F_V4, DECAY_V4, False)


@njit(cache=True)
def curve(w, state, t):
    return core_curve(state[0], t, F_V4, DECAY_V4)


@njit(cache=True)
def curve_vjp(w, state, t, gp, gstate, gw):
    r = core_curve(state[0], t, F_V4, DECAY_V4)
    gstate[0] += gp * core_curve_ds(r, state[0], t, F_V4, DECAY_V4)


@njit(cache=True)
def target_loss(w, state, t, y, wt):
    return core_target_loss(state, t, y, wt, F_V4, DECAY_V4)


@njit(cache=True)
def target_loss_vjp(w, state, t, y, wt, gstate, gw):
    return core_target_loss_vjp(state, t, y, wt, gstate, F_V4, DECAY_V4)


# ---------------------------------------------------------------------------------------- torch (upstream trainer)

def torch_power_curve(t, s, factor: float, decay: float):
    return (1 + factor * t / s) ** (-decay)


def torch_init(w, g, t):
    s = w[:4][(g.long() - 1).clamp(0, 3)].clamp(S_MIN, S_MAX)
    d = (w[4] - w[5] * (g - 3)).clamp(1, 10)
    return s, d


def torch_core_step(w, state, t, g, factor: float, decay: float, cap_lapse: bool):
    import torch  # the upstream-style trainer only: a default run does not import torch

    s, d = state
    r = torch_power_curve(t, s, factor, decay)
    hb = torch.where(g == 2, w[15], 1.0) * torch.where(g == 4, w[16], 1.0)
    s_recall = s * (1 + torch.exp(w[8]) * (11 - d) * s.pow(-w[9]) * (torch.exp((1 - r) * w[10]) - 1) * hb)
    s_lapse = w[11] * d.pow(-w[12]) * ((s + 1).pow(w[13]) - 1) * torch.exp((1 - r) * w[14])
    if cap_lapse:
        s_lapse = torch.minimum(s_lapse, s)
    ns = torch.where(g > 1, s_recall, s_lapse).clamp(S_MIN, S_MAX)
    nd = (w[7] * w[4] + (1 - w[7]) * (d - w[6] * (g - 3))).clamp(1, 10)
    return ns, nd


def torch_step(w, state, t, g):
    return torch_core_step(w, state, t, g, F_V4, DECAY_V4, False)


def torch_curve(w, state, t):
    return torch_power_curve(t, state[0], F_V4, DECAY_V4)


# ---------------------------------------------------------------------------------------- the model

class FSRSv4Family(SeqModel):
    """v4 and 4.5: S0 fitted with the version's curve and frozen; trained on rows with i > 2.

    --secs (upstream's config.s_min with use_secs_intervals): s_min 1e-4 for S after every step, for the S0 fit's
    bounds and for w0..w3's clip; the S0 fit without recall smoothing or L1 pull; FSRS-4.5 with its secs-mode
    defaults (secs_default_w)."""

    factor: float = F_V4
    decay: float = DECAY_V4
    frozen = (0, 1, 2, 3)
    secs_default_w: list[float] | None = None  # the defaults of a --secs run, when the version has its own
    accepts_secs = True  # config.ACCEPTS_SECS

    def __init__(self, cfg=None):
        self.secs = bool(getattr(cfg, "secs_mode", False))
        self.s_min = SECS_S_MIN if self.secs else S_MIN
        if self.secs:  # instance values, read by SeqModel.__init__ (the engine's box, the starting weights)
            self.lower = [self.s_min] * 4 + list(type(self).lower[4:])
            if self.secs_default_w is not None:
                self.default_w = list(self.secs_default_w)
        super().__init__(cfg)

    def engine_opts(self) -> tuple:
        return (self.s_min,)

    def initial_weights(self, train):
        f, d = self.factor, self.decay
        s0 = initialize_s0(train.rows, lambda t, s: (1 + f * t / s) ** (-d), self.default_w[:4], self.s_min,
                           secs=self.secs)
        return list(s0) + list(self.default_w[4:])

    def training_rows(self, train):
        return train.rows["i"].to_numpy() > 2

    def fit(self, train):
        if self.cfg.S0 and not self.cfg.default:
            self.w = self.initial_weights(train)
            return self
        return super().fit(train)


class FSRSv4(FSRSv4Family):
    name = "FSRSv4"
    kernels = "models.fsrs_v4"
    default_w = [0.4, 0.9, 2.3, 10.9, 4.93, 0.94, 0.86, 0.01, 1.49, 0.14, 0.94, 2.18, 0.05, 0.34, 1.26, 0.29, 2.61]
    lower = [S_MIN] * 4 + [1, 0.1, 0.1, 0, 0, 0.1, 0.01, 0.5, 0.01, 0.01, 0.01, 0, 1]
    upper = [100] * 4 + [10, 5, 5, 0.5, 3, 0.8, 2.5, 5, 0.2, 0.9, 2, 1, 4]

