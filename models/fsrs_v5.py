"""FSRS-5 (19 parameters, spec models.md §1.5; variants §1.3): engine plug-in (numba kernels), torch step for the
upstream-style trainer, and the model.

State (S, D). First review: S = w[G−1], D = clamp(D0(G), 1, 10) with D0(G) = w4 − e^{w5(G−1)} + 1.
Later review (elapsed t, grade G), R = (1 + (19/81)·t/S)^(−0.5), stability from the OLD D:
  t < 1 (same day):  S' = S·e^{w17·(G−3+w18)}                  (no S^(−w19) factor, no floor at 1)
  recall (G > 1):    S' = S·(1 + e^{w8}·(11−D)·S^{−w9}·(e^{w10(1−R)} − 1)·h·b)   (h = w15 Hard, b = w16 Easy)
  lapse  (G = 1):    S' = min(w11·D^{−w12}·((S+1)^{w13} − 1)·e^{w14(1−R)}, S/e^{w17·w18})
  S' clamped to [0.01, 36500];
  D' = D − w6·(G−3)·(10−D)/9, D'' = clamp(w7·D0(4) + (1−w7)·D', 1, 10) with the UNCLAMPED D0(4).
This is upstream's models/fsrs_v5.py@139fa513 / @7bda268b and fsrs-optimizer 5.7.3's `FSRS` (the code behind
upstream-check's FSRS-5 numbers); both apply the short-term branch for t < 1 and clamp D0 only at the first review.

Training (fsrs-optimizer 5.7.3 `Trainer`, as upstream script.py runs it): S0 fitted with this curve (§1.1), then all
19 parameters trained with the L2 prior γ·Σ((w − w_init)/σ)², γ = 1, centred on the post-S0 vector; all rows.
The trainer returns its best weights rounded to 4 decimals (`Trainer.eval` rounds them), which is reproduced.
`--disable_short_term` (Trainer(enable_short_term=False)): w17 = w18 = 0 in the starting vector (and so in the prior
centre), and the gradients of w0..w3 and w17, w18 are zeroed; same-day reviews stay in the histories (they still
move D, and the lapse cap becomes min(S_f, S)).

The compiled engine runs the hand-written numba plug-in below (with lane_kernels/fsrs_v5_lanes.py for the trainer's
batches), not one generated from the torch equations at the end as FSRS v2-v4.5 do, because the generated one does
not give the same result lines (29 Nov 2026, data/embedded and upstream-check): it computes S^{−w9}, D^{−w12},
(S+1)^{w13} as exp(y·ln x) and R's power as 1/√x where this one calls pow, and those last-bit differences reorder
near-tied predictions (the AUC of 5 rows moved in the 5th-6th decimal). Tried: the generated scalar code with libm's
pow for every power gave every FSRS-5 row's metrics and every parameter but one, w7 of one small deck in
FSRS-5-deck (0.0046 -> 0.0021 on each data set: the fit of a few reviews magnifies last-bit differences of the
gradient), so the hand plug-in stays.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from models.fsrs_init import SECS_S_MIN, initialize_s0
from models.fsrs_v4 import torch_power_curve
from engine.jit import inlined
from engine.kernel_math import bce
from engine.seq_model import SeqModel

S_MIN = 0.01
S_MAX = 36500.0
FACTOR = 19.0 / 81.0
DECAY = 0.5

DEFAULT_W = [0.40255, 1.18385, 3.173, 15.69105, 7.1949, 0.5345, 1.4604, 0.0046, 1.54575, 0.1192, 1.01925, 1.9395,
             0.11, 0.29605, 2.2698, 0.2315, 2.9898, 0.51655, 0.6621]
SIGMA = [6.61, 9.52, 17.69, 27.74, 0.55, 0.28, 0.67, 0.12, 0.4, 0.18, 0.34, 0.27, 0.08, 0.14, 0.57, 0.25, 1.03, 0.27,
         0.39]
LOWER = [S_MIN] * 4 + [1, 0.001, 0.001, 0.001, 0, 0, 0.001, 0.001, 0.001, 0.001, 0, 0, 1, 0, 0]
UPPER = [100] * 4 + [10, 4, 4, 0.75, 4.5, 0.8, 3.5, 5, 0.25, 0.9, 4, 1, 6, 2, 2]
ROUND_DECIMALS = 4  # fsrs-optimizer's Trainer returns round(w, 4)


# ---------------------------------------------------------------------------------------- FSRS-5 kernels (numba)
# The engine plug-in (contract: engine/seq_model_stub.py), written for speed without changing one bit of the result:
# `precompute` hoists the weight-only terms out of the per-review loop (once per mini-batch), and the state keeps,
# after S and D, the transcendental values the step computed (R, the power and the exponential of its branch,
# (S+1)^{w13}), so the reverse pass reads them instead of computing them again. Every value is produced by the
# same expression as the plain formulas above (e.g. S / e^{w17 w18}, not S·e^{−w17 w18}), so the predictions,
# gradients and trained weights are those of the straightforward step bit for bit; only the repeated exp/pow
# calls are gone (the FSRS-5 rows trained about 2.7x slower than FSRS-6's plug-in before: its generic step, written
# for FSRS-5 and 6 with run-time switches, recomputed R, S^{−w9}, D^{−w12}, (S+1)^{w13}, e^{w8}, e^{3 w5} and
# e^{w17 w18} in the reverse pass, and R again for every target's adjoint).

LANE_KERNELS = "lane_kernels.fsrs_v5_lanes:lanes_loss_grad_v5"  # the trainer's batches: cards side by side
N_STATE = 6  # S, D, then what the step kept for step_vjp (never read by a later step or the curve)
N_ADJ = 2
# X_R, X_P, X_E, X_SP: FSRS v4's slots (R before a long-term review, then its branch's values), shared with its
# lapse_stability
N_W = 19
# Layout of the precomputed vector wc: wc[:19] = w, then
C_E3 = 19  # e^{3 w5}
C_D04 = 20  # D0(4) = w4 − e^{3 w5} + 1, unclamped (mean-reversion target)
C_E8 = 21  # e^{w8}
C_EM = 22  # e^{w17 w18}: post-lapse S is at most S / C_EM
C_SINC = 22  # C_SINC + g: e^{w17(g − 3 + w18)}, g = 1..4 (same-day growth)
C_SMIN = 27  # s_min, the lower clamp of S (opts[0]: S_MIN in day mode, upstream's --secs 1e-4)
N_WC = 28


# What a step keeps after S and D for its reverse pass (X_*), and the numba pieces of the step below (until 29 Nov
# 2026 shared with FSRS v4 and 4.5, which now run on the plug-ins generated from their torch equations)
X_R = 2  # R before the review
X_P = 3  # S^{−w9} (recall) or D^{−w12} (lapse)
X_E = 4  # e^{w10(1−R)} (recall) or e^{w14(1−R)} (lapse)
X_SP = 5  # (S+1)^{w13} (lapse)


@inlined
def hard_easy(w, g):
    """Success-growth factor of the grade: the Hard penalty w15, the Easy bonus w16, else 1 (FSRS v4 to 6)."""
    if g == 2:
        return w[15]
    if g == 4:
        return w[16]
    return 1.0


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


@njit(cache=True)
def precompute(w, opts):
    """wc = w followed by the weight-only constants (layout above) and s_min (opts[0], default S_MIN)."""
    wc = np.empty(N_WC)
    for j in range(N_W):
        wc[j] = w[j]
    wc[C_E3] = math.exp(3.0 * w[5])
    wc[C_D04] = w[4] - wc[C_E3] + 1.0
    wc[C_E8] = math.exp(w[8])
    wc[C_EM] = math.exp(w[17] * w[18])
    for g in range(1, 5):
        wc[C_SINC + g] = math.exp(w[17] * (g - 3 + w[18]))
    wc[C_SMIN] = opts[0] if len(opts) > 0 else S_MIN
    return wc


@njit(cache=True)
def precompute_vjp(w, opts, wc, gwc, gw):
    """The reverse functions apply the constants' partials where they are used and write into gwc[:19]: a copy."""
    for j in range(N_W):
        gw[j] += gwc[j]


@inlined
def init(w, g, t, out):
    out[0] = min(max(w[g - 1], w[C_SMIN]), S_MAX)
    out[1] = min(max(w[4] - math.exp(w[5] * (g - 1)) + 1.0, 1.0), 10.0)


@inlined
def init_vjp(w, g, t, state, gstate, gw):
    if w[C_SMIN] <= w[g - 1] <= S_MAX:
        gw[g - 1] += gstate[0]
    e = math.exp(w[5] * (g - 1))
    d0 = w[4] - e + 1.0
    if 1.0 <= d0 <= 10.0:
        gw[4] += gstate[1]
        gw[5] -= gstate[1] * (g - 1) * e


@inlined
def step(w, prev, t, g, out):
    s = prev[0]
    d = prev[1]
    if t < 1.0:
        ns = s * w[C_SINC + g]
    else:
        r = core_curve(s, t, FACTOR, DECAY)
        out[X_R] = r
        if g > 1:
            pw = s ** (-w[9])
            e10 = math.exp(w[10] * (1.0 - r))
            out[X_P] = pw
            out[X_E] = e10
            ns = s * (1.0 + w[C_E8] * (11.0 - d) * pw * (e10 - 1.0) * hard_easy(w, g))
        else:
            sf = lapse_stability(w, s, d, r, out)
            sm = s / w[C_EM]
            ns = sf if sf < sm else sm
    nd = w[7] * w[C_D04] + (1.0 - w[7]) * (d - w[6] * (g - 3) * (10.0 - d) / 9.0)
    out[0] = min(max(ns, w[C_SMIN]), S_MAX)
    out[1] = min(max(nd, 1.0), 10.0)


@inlined
def step_vjp(w, prev, t, g, new, gnew, gprev, gw):
    s = prev[0]
    d = prev[1]
    gprev[0] = 0.0
    gprev[1] = 0.0
    # difficulty: nd = w7·D0(4) + (1 − w7)·(d − w6(g−3)(10−d)/9), clamped
    e3 = w[C_E3]
    d04 = w[C_D04]
    ndp = d - w[6] * (g - 3) * (10.0 - d) / 9.0
    nd = w[7] * d04 + (1.0 - w[7]) * ndp
    if 1.0 <= nd <= 10.0:
        gd = gnew[1]
        gw[7] += gd * (d04 - ndp)
        gw[4] += gd * w[7]
        gw[5] -= gd * w[7] * 3.0 * e3
        gdp = gd * (1.0 - w[7])
        gw[6] -= gdp * (g - 3) * (10.0 - d) / 9.0
        gprev[1] += gdp * (1.0 + w[6] * (g - 3) / 9.0)
    gs = gnew[0]
    if t < 1.0:
        sinc = w[C_SINC + g]
        ns = s * sinc
        if w[C_SMIN] <= ns <= S_MAX:
            gprev[0] += gs * sinc
            gw[17] += gs * ns * (g - 3 + w[18])
            gw[18] += gs * ns * w[17]
        return
    r = new[X_R]
    dr_ds = core_curve_ds(r, s, t, FACTOR, DECAY)
    if g > 1:
        recall_stability_vjp(w, s, d, r, g, gs, dr_ds, gprev, gw, w[C_SMIN], w[C_E8], new[X_P], new[X_E])
        return
    sf = w[11] * new[X_P] * (new[X_SP] - 1.0) * new[X_E]
    em = w[C_EM]
    sm = s / em
    ns = sf if sf < sm else sm
    if not (w[C_SMIN] <= ns <= S_MAX):
        return
    cf = 1.0 if sf < sm else (0.5 if sf == sm else 0.0)  # torch.minimum splits the gradient on a tie
    if cf > 0.0:
        lapse_stability_vjp(w, s, d, r, sf, gs * cf, dr_ds, new, gprev, gw)
    if cf < 1.0:
        gm = gs * (1.0 - cf)
        gprev[0] += gm / em
        gw[17] -= gm * sm * w[18]
        gw[18] -= gm * sm * w[17]


@inlined
def curve(w, state, t):
    return core_curve(state[0], t, FACTOR, DECAY)


@inlined
def curve_vjp(w, state, t, gp, gstate, gw):
    r = core_curve(state[0], t, FACTOR, DECAY)
    gstate[0] += gp * core_curve_ds(r, state[0], t, FACTOR, DECAY)


@inlined
def target_loss(w, state, t, y, wt):
    return core_target_loss(state, t, y, wt, FACTOR, DECAY)


@inlined
def target_loss_vjp(w, state, t, y, wt, gstate, gw):
    return core_target_loss_vjp(state, t, y, wt, gstate, FACTOR, DECAY)


# ---------------------------------------------------------------------------------------- torch (upstream trainer)

def torch_init(w, g, t):
    import torch  # the upstream-style trainer only: a default run does not import torch

    s = w[:4][(g.long() - 1).clamp(0, 3)].clamp(S_MIN, S_MAX)
    d = (w[4] - torch.exp(w[5] * (g - 1)) + 1).clamp(1, 10)
    return s, d


def torch_step(w, state, t, g):
    import torch  # the upstream-style trainer only: a default run does not import torch

    s, d = state
    r = torch_power_curve(t, s, FACTOR, DECAY)
    hb = torch.where(g == 2, w[15], 1.0) * torch.where(g == 4, w[16], 1.0)
    s_recall = s * (1 + torch.exp(w[8]) * (11 - d) * s.pow(-w[9]) * (torch.exp((1 - r) * w[10]) - 1) * hb)
    s_lapse = w[11] * d.pow(-w[12]) * ((s + 1).pow(w[13]) - 1) * torch.exp((1 - r) * w[14])
    s_lapse = torch.minimum(s_lapse, s / torch.exp(w[17] * w[18]))
    s_short = s * torch.exp(w[17] * (g - 3 + w[18]))
    ns = torch.where(t < 1, s_short, torch.where(g > 1, s_recall, s_lapse)).clamp(S_MIN, S_MAX)
    d04 = w[4] - torch.exp(w[5] * 3) + 1
    nd = (w[7] * d04 + (1 - w[7]) * (d - w[6] * (g - 3) * (10 - d) / 9)).clamp(1, 10)
    return ns, nd


def torch_curve(w, state, t):
    return torch_power_curve(t, state[0], FACTOR, DECAY)


# ---------------------------------------------------------------------------------------- the model

def forgetting_curve(t, s):
    """R(t, S) of FSRS-5 on numpy arrays (the S0 fit's curve)."""
    return (1 + FACTOR * t / s) ** (-DECAY)


class FSRS5(SeqModel):
    """FSRS-5 and its rows: -default (0 params), -S0 (4), -binary (15), -disable_short_term (17), else 19."""

    name = "FSRS-5"
    kernels = "models.fsrs_v5"
    default_w = DEFAULT_W
    lower = LOWER
    upper = UPPER
    sigma = SIGMA

    accepts_secs = True  # config.ACCEPTS_SECS: upstream's --secs, s_min 1e-4 (S, the S0 fit, w0..w3's clip)

    def __init__(self, cfg=None):
        self.secs = bool(getattr(cfg, "secs_mode", False))
        self.s_min = SECS_S_MIN if self.secs else S_MIN
        if self.secs:  # an instance box, read by SeqModel.__init__
            self.lower = [self.s_min] * 4 + LOWER[4:]
        super().__init__(cfg)
        cfg = self.cfg
        self.disable_short_term = bool(getattr(cfg, "disable_short_term", False))
        if cfg.default:
            self.n_params = 0
        elif cfg.S0:
            self.n_params = 4
        else:
            self.n_params = 19 - (4 if cfg.two_buttons else 0) - (2 if self.disable_short_term else 0)
        if self.disable_short_term:
            self.frozen = (0, 1, 2, 3, 17, 18)

    def engine_opts(self) -> tuple:
        return (self.s_min,)

    def s0_weights(self, train) -> list[float]:
        """Defaults with w0..w3 from the S0 fit (§1.1, FSRS-5's curve, s_min 0.01; --secs: 1e-4, no smoothing, no
        L1 pull)."""
        s0 = initialize_s0(train.rows, forgetting_curve, DEFAULT_W[:4], self.s_min, secs=self.secs)
        return list(s0) + list(DEFAULT_W[4:])

    def initial_weights(self, train):
        w = self.s0_weights(train)
        if self.disable_short_term:
            w[17] = w[18] = 0.0
        return w

    def fit(self, train):
        if self.cfg.default:
            return self
        if self.cfg.S0:
            self.w = self.s0_weights(train)
            return self
        super().fit(train)
        self.w = [round(x, ROUND_DECIMALS) for x in self.w]
        return self
