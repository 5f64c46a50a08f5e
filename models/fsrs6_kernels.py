"""FSRS-6's published constants and its plug-in for the general engine (contract: engine/seq_model_stub.py).

No torch here: the compiled trainer, fsrs_rs.py and the workers import this module alone. The torch model, the
model class and the functional API (fit / predict / loss_and_grad through the engine) are in models/fsrs6.py.

Equations (spec models.md §1.2, fsrs-optimizer `FSRS.step`), state (S, D):
- first review: S = w[G−1], D = clamp(w4 − e^{w5(G−1)} + 1, 1, 10);
- later review, using the OLD D for stability: same-day (t < 1) SInc = e^{w17(G−3+w18)}·S^{−w19},
  S' = S·max(SInc, 1) if G ≥ floor grade (3 in the published benchmark run; 2 in fsrs-rs ≥ 0.9 and newer
  fsrs-optimizer) else S·SInc; recall S' = S(1 + e^{w8}(11−D)S^{−w9}(e^{w10(1−R)}−1)·h·b); lapse
  S' = min(w11·D^{−w12}((S+1)^{w13}−1)e^{w14(1−R)}, S/e^{w17 w18}); S clamped to [0.001, 36500];
  D' = D − w6(G−3)(10−D)/9, D'' = w7·D0(4) + (1−w7)·D' with the UNCLAMPED D0(4) = w4 − e^{3 w5} + 1, in [1, 10];
- R(t, S) = (1 + F·t/S)^{−w20}, F = 0.9^{−1/w20} − 1.
Gradients follow torch: a clamp passes the gradient where min ≤ x ≤ max and zero outside; max(SInc, 1) sends it to
SInc when SInc ≥ 1; min(S_f, S_m) to the smaller one (half to each on an exact tie, like torch.minimum).

Why it is fast: `precompute` hoists every weight-only term (F, dF/dw20, D0(4), e^{w8}, e^{−w17 w18}, e^{3 w5}, the
four same-day grade factors) out of the per-review loop, once per mini-batch; and the state carries, besides S and
D, the transcendental values of its update (R, ln(1 + F·t/S), the powers, exponentials and logs), so the reverse
pass (`step_vjp` gets the step's output) is only products. Powers are written exp(p·ln x) so that the log is kept
for the reverse pass. The extra state entries are never read by a later step or the curve (N_ADJ = 2).
Where the time goes (a 45k-review user, 5 folds, CPU time): the Adam fit ~110 ms (5 epochs of one forward and one
reverse pass, ~110 ns per training state, plus 2 forward passes of the best-checkpoint rule, ~70 ns per state:
~19% of the fit), the S0 fit ~8 ms (scipy's L-BFGS-B on the same numpy loss, 4 ratings × ~8 iterations per fold;
a fixed cost per user), the Cards and batches ~4 ms, predictions ~9 ms. Not faster, so not used (interleaved
pairs in one process, same data): a fused step and target (step_target, taking the target's ln(1 + F·t/S) and R
from the step) ran loss and gradient at 0.92× (the fused loop's second copy of the inlined step and its record
cost more than the log1p saved); copying each epoch's cards in visit order before training (no cache miss per
array and card) 0.96–1.01×.
Lanes (issue #19): the trainer's batches and its objective passes run on lane_kernels/fsrs6_lanes.py (LANE_KERNELS below:
8 cards side by side, exp / log / log1p as vectorised arithmetic, branches as selects); the functions here still
serve predictions, loss_and_grad, the tree and every batch the lanes refuse. Measured (paired, same process, CPU
time; read that module's docstring for the kernel alone): the 45k user's 5-fold fit (Adam and its two objective
passes, S0 not included) 108 -> 66 ms (1.69x, nine pairs; recency 91 -> 57 ms, 1.56x), its loss and gradient
alone ~1.8-2x, the objective passes 1.35x. Whole users (runner.evaluate_user on bench/bench_executors.py project's six users, three
pairs, a + b·reviews fitted as that script does; two runs): FSRS-6 b 2.90 -> 1.85 and 2.62 -> 1.66 ms per 1k
reviews, projected 0.64 -> 0.43 and 0.60 -> 0.41 CPU-hours; FSRS-6-recency 2.71 -> 1.85 and 2.31 -> 1.69, 0.60 ->
0.43 and 0.54 -> 0.42 (whole users 1.05x the smallest .. 1.3-1.57x the largest: S0, features and predictions are
unchanged). The script itself, one tree after the other, read 0.57 / 0.75 (old) and
0.68 / 0.48 (new) for FSRS-6 in two runs each: its six-user fit is noisier than the change. Results: the result
lines of the embedded users and sim36 users 1-6 (FSRS-6 and FSRS-6-recency) identical to the scalar fit's (sizes,
metrics, parameters; a build with the targets' adjoints in the forward pass moved one AUC by 7e-6, sim36 user 5's
590 test rows: near-ties reorder); fitted weights within 3e-15 of the scalar fit's (45k user).
FSRS v4, 4.5 and 5 joined with one lane kernel for their shared core (lane_kernels/fsrs_v4_lanes.py, now fsrs_v5_lanes.py, FSRS-5's alone; the packing and
work items shared in engine/lanes.py). FSRS-7 and SBD run code that engine/traced.py generates from the model
file; that generator would emit a lane form of the same straight-line code (it already computes both sides of every
torch where, which maps onto selects) with vec_math's exp1 / log1 / log1p1 for the libm calls, plus the fused
step_target the scalar engine uses. The engine's side (LANE_KERNELS, the LANE-BATCH section) is ready for both.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from engine.jit import inlined

# Defaults: per-parameter medians of per-user fits (fsrs-optimizer since 2025-06, fsrs-rs DEFAULT_PARAMETERS).
DEFAULT_W = [0.212, 1.2931, 2.3065, 8.2956, 6.4133, 0.8334, 3.0194, 0.001, 1.8722, 0.1666, 0.796, 1.4835, 0.0614,
             0.2629, 1.6483, 0.6014, 1.8729, 0.5425, 0.0912, 0.0658, 0.1542]
# Prior widths of the L2 pull towards the post-S0 weights.
SIGMA = [6.43, 9.66, 17.58, 27.85, 0.57, 0.28, 0.6, 0.12, 0.39, 0.18, 0.33, 0.3, 0.09, 0.16, 0.57, 0.25, 1.03, 0.31,
         0.32, 0.14, 0.27]
S_MIN = 0.001
S_MAX = 36500.0
# Box constraints applied after every optimizer step (published run: w19 lower bound 0).
CLIP_LO = [S_MIN] * 4 + [1, 0.001, 0.001, 0.001, 0, 0, 0.001, 0.001, 0.001, 0.001, 0, 0, 1, 0, 0, 0, 0.1]
CLIP_HI = [100] * 4 + [10, 4, 4, 0.75, 4.5, 0.8, 3.5, 5, 0.25, 0.9, 4, 1, 6, 2, 2, 0.8, 0.8]
LR = 4e-2  # Adam learning rate of both trainers
FLOOR_GRADE = 3  # same-day growth floored at 1 from this grade up (published run); the engine's opts[0]

N_PARAMS = 21
# The trainer's batches run with cards side by side (lane_kernels/fsrs6_lanes.py; the engine's LANE-BATCH section)
LANE_KERNELS = "lane_kernels.fsrs6_lanes"
# State: S, D, then what the step computed for its reverse pass (read by step_vjp alone, never by a later step)
N_STATE = 9
N_ADJ = 2  # only S and D carry adjoints
X_R = 2  # R before the review (long-term), or the same-day SInc before its floor
X_P = 3  # S^{−w9} (recall) or D^{−w12} (lapse)
X_E = 4  # e^{w10(1−R)} (recall) or e^{w14(1−R)} (lapse)
X_L1X = 5  # ln(1 + F·t/S)
X_LN = 6  # ln S (recall, same-day) or ln D (lapse)
X_SP = 7  # (S+1)^{w13} (lapse)
X_LSP = 8  # ln(S+1) (lapse)
LN09 = math.log(0.9)
# Layout of the precomputed vector wc: wc[:21] = w, then
C_F = 21  # curve factor F = 0.9^(−1/w20) − 1
C_DF = 22  # dF/dw20
C_D04 = 23  # D0(4) = w4 − e^{3 w5} + 1, unclamped (mean-reversion target)
C_E8 = 24  # e^{w8}
C_EM = 25  # e^{−w17 w18}: post-lapse S is at most S·C_EM
C_E35 = 26  # e^{3 w5}
C_SINC = 26  # C_SINC + g: e^{w17(g − 3 + w18)}, g = 1..4 (same-day growth without S^{−w19})
C_FLOOR = 31  # floor grade
C_SMIN = 32  # s_min: the lower clamp of S (S_MIN; upstream's --secs 1e-4), opts[1]
N_WC = 33


def forgetting_curve(t, s, decay):
    """R(t, S) = (1 + F·t/S)^(−d), F = 0.9^(−1/d) − 1, so that R(S, S) = 0.9. Works on tensors and arrays (the S0 fit
    of models/fsrs6.py, the torch model of upstream/fsrs6_torch.py; `curve` below is the plug-in's)."""
    factor = 0.9 ** (-1.0 / decay) - 1.0
    return (1.0 + factor * t / s) ** (-decay)


@njit(cache=True)
def precompute(w, opts):
    """wc = w followed by the weight-only constants (layout above); opts[0] = floor grade (default 3), opts[1] =
    s_min (default S_MIN; upstream's --secs runs 1e-4)."""
    wc = np.empty(N_WC)
    for j in range(N_PARAMS):
        wc[j] = w[j]
    d = w[20]
    ef = math.exp(-LN09 / d)
    wc[C_F] = ef - 1.0
    wc[C_DF] = ef * LN09 / (d * d)
    wc[C_E35] = math.exp(3.0 * w[5])
    wc[C_D04] = w[4] - wc[C_E35] + 1.0
    wc[C_E8] = math.exp(w[8])
    wc[C_EM] = math.exp(-w[17] * w[18])
    for g in range(1, 5):
        wc[C_SINC + g] = math.exp(w[17] * (g - 3 + w[18]))
    wc[C_FLOOR] = opts[0] if len(opts) > 0 else FLOOR_GRADE
    wc[C_SMIN] = opts[1] if len(opts) > 1 else S_MIN
    return wc


@njit(cache=True)
def precompute_vjp(w, opts, wc, gwc, gw):
    """The reverse functions below write every weight's adjoint into gwc[:21] directly (the constants' partials
    are applied where they are used), so the fold is a copy."""
    for j in range(N_PARAMS):
        gw[j] += gwc[j]


@inlined
def _hard_easy(w, g):
    """Success-growth factor of the grade: the Hard penalty w15, the Easy bonus w16, else 1."""
    if g == 2:
        return w[15]
    if g == 4:
        return w[16]
    return 1.0


@inlined
def init(w, g, t, out):
    out[0] = min(max(w[g - 1], w[C_SMIN]), S_MAX)
    out[1] = min(max(w[4] - math.exp(w[5] * (g - 1)) + 1.0, 1.0), 10.0)


@inlined
def init_vjp(w, g, t, state, gstate, gw):
    s0 = w[g - 1]
    if s0 >= w[C_SMIN] and s0 <= S_MAX:
        gw[g - 1] += gstate[0]
    e = math.exp(w[5] * (g - 1))
    d0 = w[4] - e + 1.0
    if d0 >= 1.0 and d0 <= 10.0:
        gw[4] += gstate[1]
        gw[5] += gstate[1] * (-(g - 1) * e)


@inlined
def step(w, prev, t, g, out):
    s = prev[0]
    dd = prev[1]
    if t < 1.0:
        ls = math.log(s)
        sinc = w[C_SINC + g] * math.exp(-w[19] * ls)  # e^{w17(g−3+w18)}·S^{−w19}
        out[X_R] = sinc
        out[X_LN] = ls
        if g >= w[C_FLOOR] and sinc < 1.0:
            sinc = 1.0
        ns = s * sinc
    else:
        l1x = math.log1p(w[C_F] * t / s)
        r = math.exp(-w[20] * l1x)
        out[X_R] = r
        out[X_L1X] = l1x
        if g > 1:
            ls = math.log(s)
            pw = math.exp(-w[9] * ls)  # S^{−w9}
            e10 = math.exp(w[10] * (1.0 - r))
            out[X_P] = pw
            out[X_E] = e10
            out[X_LN] = ls
            ns = s * (1.0 + w[C_E8] * (11.0 - dd) * pw * (e10 - 1.0) * _hard_easy(w, g))
        else:
            ld = math.log(dd)
            dpw = math.exp(-w[12] * ld)  # D^{−w12}
            e14 = math.exp(w[14] * (1.0 - r))
            lsp = math.log(s + 1.0)
            sp = math.exp(w[13] * lsp)  # (S+1)^{w13}
            out[X_P] = dpw
            out[X_E] = e14
            out[X_LN] = ld
            out[X_SP] = sp
            out[X_LSP] = lsp
            sf = w[11] * dpw * (sp - 1.0) * e14
            sm = s * w[C_EM]
            ns = sf if sf < sm else sm
    ndp = dd - w[6] * (g - 3) * (10.0 - dd) / 9.0
    nd = w[7] * w[C_D04] + (1.0 - w[7]) * ndp
    out[0] = min(max(ns, w[C_SMIN]), S_MAX)
    out[1] = min(max(nd, 1.0), 10.0)


@inlined
def step_vjp(w, prev, t, g, new, gnew, gprev, gw):
    s = prev[0]
    dd = prev[1]
    gs = gnew[0]
    gd = gnew[1]
    d = w[20]
    s_min = w[C_SMIN]
    # ---- difficulty: D' = clamp(w7·D0(4) + (1−w7)·(D − w6(g−3)(10−D)/9), 1, 10)
    ndp = dd - w[6] * (g - 3) * (10.0 - dd) / 9.0
    nd = w[7] * w[C_D04] + (1.0 - w[7]) * ndp
    gd_old = 0.0
    if gd != 0.0 and nd >= 1.0 and nd <= 10.0:
        gndp = gd * (1.0 - w[7])
        gw[7] += gd * (w[C_D04] - ndp)
        gw[4] += gd * w[7]
        gw[5] += gd * w[7] * (-3.0 * w[C_E35])
        gw[6] += gndp * (-(g - 3) * (10.0 - dd) / 9.0)
        gd_old = gndp * (1.0 + w[6] * (g - 3) / 9.0)
    # ---- stability
    gs_old = 0.0
    if gs != 0.0:
        if t < 1.0:
            sinc = new[X_R]
            if g >= w[C_FLOOR] and sinc < 1.0:
                if s >= s_min and s <= S_MAX:
                    gs_old = gs
            else:
                a = s * sinc
                if a >= s_min and a <= S_MAX:
                    gs_old = gs * sinc * (1.0 - w[19])
                    gw[17] += gs * a * (g - 3 + w[18])
                    gw[18] += gs * a * w[17]
                    gw[19] += gs * a * (-new[X_LN])
        else:
            x = w[C_F] * t / s
            r = new[X_R]
            dr_ds = r * d * x / ((1.0 + x) * s)
            dr_dd = r * (-new[X_L1X] - d / (1.0 + x) * t / s * w[C_DF])
            if g > 1:
                hb = _hard_easy(w, g)
                pw = new[X_P]
                e10 = new[X_E]
                e8 = w[C_E8]
                core = e8 * (11.0 - dd) * pw * (e10 - 1.0)  # inc / hb
                inc = core * hb
                ns = s * (1.0 + inc)
                if ns >= s_min and ns <= S_MAX:
                    dns_dr = -s * e8 * (11.0 - dd) * pw * hb * w[10] * e10
                    gs_old = gs * (1.0 + inc - w[9] * inc + dns_dr * dr_ds)
                    gw[20] += gs * dns_dr * dr_dd
                    gd_old += gs * (-s * e8 * pw * (e10 - 1.0) * hb)
                    gw[8] += gs * s * inc
                    gw[9] += gs * s * inc * (-new[X_LN])
                    gw[10] += gs * s * e8 * (11.0 - dd) * pw * hb * e10 * (1.0 - r)
                    if g == 2:
                        gw[15] += gs * s * core
                    elif g == 4:
                        gw[16] += gs * s * core
            else:
                dpw = new[X_P]
                e14 = new[X_E]
                sp = new[X_SP]
                sf = w[11] * dpw * (sp - 1.0) * e14
                em = w[C_EM]
                sm = s * em
                ns = sf if sf < sm else sm
                if ns >= s_min and ns <= S_MAX:
                    cf = 1.0 if sf < sm else (0.5 if sf == sm else 0.0)
                    cm = 1.0 - cf
                    if cf > 0.0:
                        gf = gs * cf
                        dsf_dr = -sf * w[14]
                        gs_old += gf * (w[11] * dpw * w[13] * sp / (s + 1.0) * e14 + dsf_dr * dr_ds)
                        gw[20] += gf * dsf_dr * dr_dd
                        gd_old += gf * (-w[12] * sf / dd)
                        gw[11] += gf * dpw * (sp - 1.0) * e14
                        gw[12] += gf * sf * (-new[X_LN])
                        gw[13] += gf * w[11] * dpw * sp * new[X_LSP] * e14
                        gw[14] += gf * sf * (1.0 - r)
                    if cm > 0.0:
                        gm = gs * cm
                        gs_old += gm * em
                        gw[17] += gm * (-w[18] * sm)
                        gw[18] += gm * (-w[17] * sm)
    gprev[0] = gs_old  # gprev[N_ADJ:] is never read
    gprev[1] = gd_old


@inlined
def curve(w, state, t):
    return math.exp(-w[20] * math.log1p(w[C_F] * t / state[0]))


@inlined
def curve_vjp(w, state, t, gp, gstate, gw):
    s = state[0]
    d = w[20]
    x = w[C_F] * t / s
    l1x = math.log1p(x)
    r = math.exp(-d * l1x)
    gstate[0] += gp * r * d * x / ((1.0 + x) * s)
    gw[20] += gp * r * (-l1x - d / (1.0 + x) * t / s * w[C_DF])


@inlined
def target_loss_vjp(w, state, t, y, wt, gstate, gw):
    """weight·BCE of one target on ln R = −w20·ln(1 + F·t/S): one log1p (and for a lapse one expm1 and log)
    instead of the generic curve → log → curve_vjp. torch's log floor of −100 is never reached here: with
    S ≤ 36500, t ≥ 1 (targets are never same-day) and w20 ∈ [0.1, 0.8], 1 − R > 1e-6 and R > e^{−20}."""
    s = state[0]
    d = w[20]
    x = w[C_F] * t / s
    l1x = math.log1p(x)
    lnr = -d * l1x
    if y > 0.5:
        loss = -wt * lnr
        dl_dlnr = -wt
    else:
        r = math.exp(lnr)
        loss = -wt * math.log(-math.expm1(lnr))
        dl_dlnr = wt * r / (1.0 - r)
    gstate[0] += dl_dlnr * d * x / ((1.0 + x) * s)
    gw[20] += dl_dlnr * (-l1x - d / (1.0 + x) * t / s * w[C_DF])
    return loss


@inlined
def target_loss(w, state, t, y, wt):
    """weight·BCE of one target on ln R (see target_loss_vjp)."""
    lnr = -w[20] * math.log1p(w[C_F] * t / state[0])
    if y > 0.5:
        return -wt * lnr
    return -wt * math.log(-math.expm1(lnr))
