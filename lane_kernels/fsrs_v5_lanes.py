"""FSRS-5's loss and gradient with LANES cards side by side: the engine's trainer runs its mini-batches and objective
passes here (issue #19; models/fsrs_v5.py's LANE_KERNELS); predictions and loss_and_grad stay card by card on the
scalar plug-in (models/fsrs_v5.py).

Why: the scalar step walks one card at a time, and each review costs a few libm calls (pow, exp) issued one value at a
time. Here, as in the lane kernels engine/traced_lanes.py generates (the layout, the packing, the work items and what
makes the loops vectorise are in engine/lanes.py), every per-review quantity is an array [position, field, lane] with
the lane innermost and each position one loop over the lanes that LLVM vectorises, with exp and log as arithmetic
(engine/vec_math.exp1 / log1 / log1p1) and the branches as selects: the recall, lapse and same-day updates are all
computed and blended, and their reverse passes taken with zero weights where they do not apply; a lapse's ln(S+1) and
(S+1)^{w13} only at the positions where some lane lapses (a second loop). The curve R = (1 + (19/81)·t/S)^(−0.5) is a
vectorised square root (no exp or log); the post-lapse cap min(S_f, S/e^{w17 w18}); the first difficulty w4 −
e^{w5(G−1)} + 1, mean reversion to the unclamped D0(4) with the (10 − D)/9 damping, and the same-day step
S·e^{w17(G−3+w18)} (t < 1: no lapse there), its four values precomputed. Merged: one log for ln S (recall) or ln D
(lapse), one exp for S^{−w9} / D^{−w12}, one exp for e^{w10(1−R)} / e^{w14(1−R)}. The gradient is the scalar core's
(clamps pass it where min ≤ x ≤ max, torch.minimum splits it on a tie); --disable_short_term zeroes w0..w3, w17, w18's
gradients through the trainer's grad_mask, and the S0 fit and the 4-decimal rounding of the weights happen outside the
trainer.

Results differ from the scalar kernel's by rounding only: exp1 / log1 / log1p1 within 1 ulp of libm, pow as
exp(p·ln x), R by a square root instead of pow, the loss's −ln R as 0.5·ln(1 + x) and 1 − R without cancellation
(_one_minus_curve), sums in another order, and fused multiply-adds (fastmath "contract", as FSRS-6's lanes). Against
a 100-bit reference (mpmath, the equations written out plainly) the lanes' loss is within ~1e-15 and their gradient
~1e-14 (random weights) to ~1e-13 (weights at the clamps). Tests: tests/test_fsrs_v4_v5_lanes.py (against the
scalar kernel within 1e-12 and against the reference, central differences, the clamps and caps reached, the
engine's binding, the fit, the loops' AVX2 code without libm calls).

Measured when it was written (bench/bench_fsrs6_lanes.py --model FSRS-5 [--fit]; the 45k-review simulated user,
paired in one process against the scalar plug-in, CPU time, medians): loss+gradient per training state 181 -> 82
ns (2.12x); the 5-fold fit 112 -> 52 ms (2.11x); result lines identical. Until 29 Nov 2026 this kernel served FSRS
v4 and 4.5 too; they now run on the lane kernels engine/traced.py generates from their torch equations.

WHY HAND-WRITTEN (issue #39): the lane kernel the tracer generates from models/fsrs_v5.py's torch equations is as
fast (generated / hand 1.01x, kernel alone, 20,000 random cards, python bench/bench_generated_lanes.py, 29 Nov
2026), and tests/test_fsrs_v4_v5_lanes.py holds this kernel to it; but FSRS-5's whole plug-in generated from
those equations moved result lines: its scalar steps compute S^{−w9}, D^{−w12}, (S+1)^{w13} as exp(y·ln x) where
the hand plug-in calls pow, and those last-bit differences reorder near-tied predictions, so the AUC of 5 FSRS-5
rows changed in its 5th-6th decimal (users 6, 7 of data/embedded, user 8 of upstream-check; Log Loss and RMSE
unchanged). FSRS-5 keeps its hand plug-in, and this kernel with it, until the generated scalar code can reproduce
the hand plug-in's pow calls where a model asks for them.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

import models.fsrs_v5 as v5
from models.fsrs_v5 import S_MAX
from engine.jit import inlined
from engine.kernel_math import stable_argsort_small
from engine.lanes import I_ANY, I_DT, I_G, I_W, LANES, grade_pick, pack_group
from engine.vec_math import exp1, log1, log1p1

# Row k of the work array X[k, field, lane] (allocated inside the kernel, as FSRS-6's, so that LLVM sees its
# constant strides): rows 0..3 the packed inputs (engine/lanes.py), then the state after position k and what its
# reverse pass reads.
F_S = 4
F_D = 5
F_X = 6  # F·t/S_prev
F_R = 7  # R(t, S_prev)
F_OMR = 8  # 1 − R without cancellation (_one_minus_curve)
F_PW = 9  # S^{−w9} (recall), D^{−w12} (lapse); at position 0: e^{w5(G−1)}
F_E = 10  # e^{w10(1−R)} (recall) or e^{w14(1−R)} (lapse)
F_LNB = 11  # ln S (recall) or ln D (lapse)
F_LSP = 12  # ln(S+1) (lapse)
F_SP = 13  # (S+1)^{w13} (lapse)
N_ROW = 14
# The lanes' sums A[j, lane]: the gradient of w_j (j < 19), the loss, the carried adjoints of S and D
N_W = 19
J_LOSS = N_W
J_GS = N_W + 1
J_GD = N_W + 2
N_SUMS = N_W + 3


@inlined(error_model="numpy")
def difficulty_adjoint(A, lane, gd, g, dd, w4, w6, w7, d04, e3):
    """The reverse of D' = clamp(w7·D0(4) + (1 − w7)·(D − w6(G − 3)(10 − D)/9), 1, 10) with the unclamped
    D0(4) = w4 − e^{3·w5} + 1 (e3 = e^{3·w5}): adds w4..w7's gradient into A's lane, returns the old D's adjoint."""
    ndp = dd - w6 * (g - 3.0) * (10.0 - dd) / 9.0
    nd = w7 * d04 + (1.0 - w7) * ndp
    gdm = gd if (nd >= 1.0 and nd <= 10.0) else 0.0
    gndp = gdm * (1.0 - w7)
    A[7, lane] += gdm * (d04 - ndp)
    A[4, lane] += gdm * w7
    A[5, lane] += gdm * w7 * (-3.0 * e3)
    A[6, lane] += gndp * (-(g - 3.0) * (10.0 - dd) / 9.0)
    return gndp * (1.0 + w6 * (g - 3.0) / 9.0)


@inlined(error_model="numpy")
def first_review_adjoint(A, lane, gs, gd, g, w0, w1, w2, w3, w4, s_min, s_max, e):
    """The reverse of the first review: S0 = clamp(w[G − 1], s_min, s_max), D0 = clamp(w4 − e + 1, 1, 10) with
    e = e^{w5(G − 1)}: adds w0..w5's gradient into A's lane."""
    s0 = grade_pick(g, w0, w1, w2, w3)
    gs0 = gs if (s0 >= s_min and s0 <= s_max) else 0.0
    A[0, lane] += gs0 if g < 1.5 else 0.0
    A[1, lane] += gs0 if (g > 1.5 and g < 2.5) else 0.0
    A[2, lane] += gs0 if (g > 2.5 and g < 3.5) else 0.0
    A[3, lane] += gs0 if g > 3.5 else 0.0
    d0 = w4 - e + 1.0
    gd0 = gd if (d0 >= 1.0 and d0 <= 10.0) else 0.0
    A[4, lane] += gd0
    A[5, lane] += gd0 * (-(g - 1.0) * e)


@inlined(error_model="numpy")
def _curve(x):
    """R = (1 + x)^(−0.5) = 1/√(1 + x)."""
    return 1.0 / math.sqrt(1.0 + x)


@inlined(error_model="numpy")
def _one_minus_curve(x, r):
    """1 − R from R = _curve(x): (√(1+x) − 1)/√(1+x) = x·R²/(1 + R); within a few ulp where 1.0 − R would keep only
    the digits of R's rounding error (R near 1, a long-stable card)."""
    return x * r * r / (1.0 + r)


@inlined(error_model="numpy")
def _target_adjoint(X, k, lane, decay):
    """The adjoint of S_prev from the target at position k (0 if none): d(weight·BCE)/d ln R times
    d ln R/dS = decay·x/((1 + x)·S), as core_target_loss_vjp (in the reverse pass, so the objective passes skip it)."""
    wts = X[k, I_W, lane]
    r = X[k, F_R, lane]
    x = X[k, F_X, lane]
    dl = -wts if wts > 0.0 else (-wts * r / X[k, F_OMR, lane] if wts < 0.0 else 0.0)
    return dl * decay * x / ((1.0 + x) * X[k - 1, F_S, lane])


@inlined(error_model="numpy")
def group_forward(w, X, n_pos, nl, f, e8):
    """States of the group's positions 0..n_pos−1 and what their reverse pass and loss read."""
    w0, w1, w2, w3, w4, w5, w6, w7 = w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]
    w9, w10, w11, w12, w13, w14, w15, w16 = w[9], w[10], w[11], w[12], w[13], w[14], w[15], w[16]
    s_min = w[v5.C_SMIN]  # the run's lower clamp of S (precompute's opts[0])
    d04 = w[v5.C_D04]
    em = w[v5.C_EM]
    c1 = w[v5.C_SINC + 1]
    c2 = w[v5.C_SINC + 2]
    c3 = w[v5.C_SINC + 3]
    c4 = w[v5.C_SINC + 4]
    for lane in range(nl):
        g = X[0, I_G, lane]
        X[0, F_S, lane] = min(max(grade_pick(g, w0, w1, w2, w3), s_min), S_MAX)
        e = exp1(w5 * (g - 1.0))
        X[0, F_D, lane] = min(max(w4 - e + 1.0, 1.0), 10.0)
        X[0, F_PW, lane] = e
    for k in range(1, n_pos):
        for lane in range(nl):
            s = X[k - 1, F_S, lane]
            dd = X[k - 1, F_D, lane]
            t = X[k, I_DT, lane]
            g = X[k, I_G, lane]
            x = f * t / s
            r = _curve(x)
            recall = g > 1.5
            lnb = log1(s if recall else dd)
            pw = exp1(-(w9 if recall else w12) * lnb)
            e = exp1((w10 if recall else w14) * (1.0 - r))
            hb = w15 if (g > 1.5 and g < 2.5) else (w16 if g > 3.5 else 1.0)
            ns = s * (1.0 + e8 * (11.0 - dd) * pw * (e - 1.0) * hb)  # recall (a lapse's: the loop below)
            ns = s * grade_pick(g, c1, c2, c3, c4) if t < 1.0 else ns
            nd = w7 * d04 + (1.0 - w7) * (dd - w6 * (g - 3.0) * (10.0 - dd) / 9.0)
            X[k, F_S, lane] = min(max(ns, s_min), S_MAX)
            X[k, F_D, lane] = min(max(nd, 1.0), 10.0)
            X[k, F_X, lane] = x
            X[k, F_R, lane] = r
            X[k, F_OMR, lane] = _one_minus_curve(x, r)
            X[k, F_PW, lane] = pw
            X[k, F_E, lane] = e
            X[k, F_LNB, lane] = lnb
            X[k, F_LSP, lane] = 0.0  # (finite for the reverse pass's zero-weighted lapse terms; set below if used)
            X[k, F_SP, lane] = 0.0
        if X[k, I_ANY, 0] > 0.5:  # a lapse among the lanes: its (S+1)^{w13}, S_f and its cap
            for lane in range(nl):
                s = X[k - 1, F_S, lane]
                lsp = log1(s + 1.0)
                sp = exp1(w13 * lsp)
                sf = w11 * X[k, F_PW, lane] * (sp - 1.0) * X[k, F_E, lane]
                sm = s / em
                sf = sf if sf < sm else sm
                lapse = X[k, I_G, lane] < 1.5 and X[k, I_DT, lane] >= 1.0
                X[k, F_S, lane] = min(max(sf, s_min), S_MAX) if lapse else X[k, F_S, lane]
                X[k, F_LSP, lane] = lsp
                X[k, F_SP, lane] = sp


@inlined(error_model="numpy")
def group_loss(X, A, n_pos, nl, decay):
    """Add each target's weight·BCE to the lanes' loss sums (after group_forward): −ln R = decay·ln(1 + x) if
    recalled, −ln(1 − R) if forgotten."""
    for k in range(1, n_pos):
        for lane in range(nl):
            wts = X[k, I_W, lane]
            l1x = log1p1(X[k, F_X, lane])
            lg = log1(X[k, F_OMR, lane])
            A[J_LOSS, lane] += wts * (decay * l1x) if wts > 0.0 else (wts * lg if wts < 0.0 else 0.0)


@inlined(error_model="numpy")
def group_reverse(w, X, A, n_pos, nl, decay, e8):
    """The reverse pass over positions n_pos−1 .. 0, adding the gradient of w0..w18 to the lanes' sums A."""
    w0, w1, w2, w3, w4, w6, w7, w9 = w[0], w[1], w[2], w[3], w[4], w[6], w[7], w[9]
    w10, w11, w12, w13, w14, w15, w16 = w[10], w[11], w[12], w[13], w[14], w[15], w[16]
    s_min = w[v5.C_SMIN]
    w17 = w[17]
    w18 = w[18]
    e3 = w[v5.C_E3]
    d04 = w[v5.C_D04]
    em = w[v5.C_EM]
    c1 = w[v5.C_SINC + 1]
    c2 = w[v5.C_SINC + 2]
    c3 = w[v5.C_SINC + 3]
    c4 = w[v5.C_SINC + 4]
    for lane in range(nl):  # nothing reads the last position's state
        A[J_GS, lane] = _target_adjoint(X, n_pos - 1, lane, decay)
        A[J_GD, lane] = 0.0
    for kk in range(n_pos - 2):  # k = n_pos − 2 .. 1 (a range with step −1 kept FSRS-6's lane loop scalar)
        k = n_pos - 2 - kk
        for lane in range(nl):
            gs = A[J_GS, lane]
            gd = A[J_GD, lane]
            s = X[k - 1, F_S, lane]
            dd = X[k - 1, F_D, lane]
            t = X[k, I_DT, lane]
            g = X[k, I_G, lane]
            gd_old = difficulty_adjoint(A, lane, gd, g, dd, w4, w6, w7, d04, e3)
            # stability: each branch's adjoint, weighted 0 where it does not apply
            same = t < 1.0
            recall = g > 1.5
            x = X[k, F_X, lane]
            r = X[k, F_R, lane]
            pw = X[k, F_PW, lane]
            e = X[k, F_E, lane]
            lnb = X[k, F_LNB, lane]
            sp = X[k, F_SP, lane]  # a lapse's; stale (finite) in the other lanes, whose lapse weights are 0
            dr_ds = r * decay * x / ((1.0 + x) * s)
            # recall
            hb = w15 if (g > 1.5 and g < 2.5) else (w16 if g > 3.5 else 1.0)
            core = e8 * (11.0 - dd) * pw * (e - 1.0)
            inc = core * hb
            ns_r = s * (1.0 + inc)
            g2 = gs if (not same and recall and ns_r >= s_min and ns_r <= S_MAX) else 0.0
            dns_dr = -s * e8 * (11.0 - dd) * pw * hb * w10 * e
            # lapse: S_f, capped at S/e^{w17 w18} (cf: the share of the gradient that reaches S_f)
            sf = w11 * pw * (sp - 1.0) * e
            sm = s / em
            ns_l = sf if sf < sm else sm
            cf = 1.0 if sf < sm else (0.5 if sf == sm else 0.0)
            gl = gs if (not same and not recall and ns_l >= s_min and ns_l <= S_MAX) else 0.0
            gf = gl * cf
            gm = gl * (1.0 - cf)
            gs_old = (g2 * (1.0 + (1.0 - w9) * inc + dns_dr * dr_ds)
                      + gf * (w11 * pw * w13 * sp / (s + 1.0) * e - w14 * sf * dr_ds))
            gd_old += g2 * (-s * e8 * pw * (e - 1.0) * hb) - gf * w12 * sf / dd
            A[8, lane] += g2 * s * inc
            A[9, lane] -= g2 * s * inc * lnb
            A[10, lane] += g2 * s * e8 * (11.0 - dd) * pw * hb * e * (1.0 - r)
            A[15, lane] += g2 * s * core if g < 2.5 else 0.0
            A[16, lane] += g2 * s * core if g > 3.5 else 0.0
            A[11, lane] += gf * pw * (sp - 1.0) * e
            A[12, lane] -= gf * sf * lnb
            A[13, lane] += gf * w11 * pw * sp * X[k, F_LSP, lane] * e
            A[14, lane] += gf * sf * (1.0 - r)
            # the cap S/e^{w17 w18} and the same-day step S·e^{w17(G−3+w18)}
            sinc = grade_pick(g, c1, c2, c3, c4)
            a = s * sinc
            g0 = gs if (same and a >= s_min and a <= S_MAX) else 0.0
            gs_old += gm / em + g0 * sinc
            A[17, lane] += g0 * a * (g - 3.0 + w18) - gm * sm * w18
            A[18, lane] += g0 * a * w17 - gm * sm * w17
            A[J_GS, lane] = gs_old + _target_adjoint(X, k, lane, decay)
            A[J_GD, lane] = gd_old
    for lane in range(nl):  # the first review
        first_review_adjoint(A, lane, A[J_GS, lane], A[J_GD, lane], X[0, I_G, lane], w0, w1, w2, w3, w4, s_min,
                             S_MAX, X[0, F_PW, lane])


# The entry point (the engine's contract, engine/seq_model_stub.py: Σ weight·BCE over the work items `batch`, its
# gradient added into gwc (want_grad); the loss if want_loss, else 0; NaN, having added nothing, for a batch the
# lanes cannot lay out).

@njit(cache=True, error_model="numpy", fastmath={"contract"})
def lanes_loss_grad_v5(wc, seq_dt, seq_g, c_start, t_pos, t_dt, t_y, t_wt, items, batch, max_n, gwc, want_loss,
                       want_grad):
    """FSRS-5 (wc: fsrs_v5.precompute's): R = (1 + (19/81)·t/S)^(−0.5), the same-day step, the lapse capped at
    S/e^{w17 w18}."""
    f, decay = v5.FACTOR, v5.DECAY
    n_items = len(batch)
    by_length = batch[stable_argsort_small(items[batch, 3], False)]
    X = np.empty((max_n + 1, N_ROW, LANES))  # every entry is written before it is read
    A = np.zeros((N_SUMS, LANES))
    e8 = wc[v5.C_E8]
    lapse_min_dt = 1.0  # a same-day Again is no lapse
    for g0 in range(0, n_items, LANES):
        nl = min(LANES, n_items - g0)
        n_pos = pack_group(seq_dt, seq_g, c_start, t_pos, t_dt, t_y, t_wt, items, by_length, g0, nl, X,
                           lapse_min_dt)
        if n_pos < 0:
            return np.nan
        group_forward(wc, X, n_pos, nl, f, e8)  # a run-time lane count (engine/lanes.py: what vectorises)
        if want_grad:
            group_reverse(wc, X, A, n_pos, nl, decay, e8)
        if want_loss:
            group_loss(X, A, n_pos, nl, decay)
    if want_grad:
        for j in range(N_W):
            gwc[j] += A[j].sum()
    return A[J_LOSS].sum()
