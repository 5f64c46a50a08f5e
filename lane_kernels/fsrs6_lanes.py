"""FSRS-6's loss and gradient with LANES cards side by side: the engine's trainer runs FSRS-6's mini-batches and
objective passes here (fsrs6_kernels.LANE_KERNELS; issue #19); predictions and loss_and_grad stay card by card.

Why: the scalar plug-in (models/fsrs6_kernels.py) walks one card at a time, and each review costs a handful of libm
calls (exp, log, log1p) that numba issues one value at a time. Here a mini-batch's cards are sorted by length and
taken LANES at a time; every per-review quantity is an array [position, field, lane] with the lane innermost, and
each position is one loop over the lanes that LLVM vectorises (AVX2: 4 doubles), with exp, log and log1p written as
arithmetic (engine/vec_math.exp1 / log1 / log1p1). Branches become selects: the same-day, recall and lapse updates
are all computed and blended, and their reverse passes are all taken with zero weights where they do not apply;
a lapse's ln(S+1) and (S+1)^{w13} only at the positions where some lane lapses (a second loop). A lane past its
card's end runs a padding review (t = 1, grade 3) whose state nothing reads, so its adjoints are exactly zero and
nothing is masked in the reverse pass. The loss is a separate loop (its log(1 − R)), left out of the trainer's
batches (Adam reads the gradient only); the targets' adjoints are taken in the reverse pass, so the objective
passes (forward and loss) skip them.

Layout of a group of LANES cards with at most N states: positions 0..N. Position 0 is the first review (init);
position k ≥ 1 is the step from state k−1 over elapsed time dt[k] with grade g[k], AND the target that reads state
k−1 at time dt[k] (its R and ln(1 + F·t/S) are the step's own). A card's last target reads its last state n−1 at
its own t_dt: position n carries that time (its step's output is never read). This needs every other target's
elapsed time to equal the next review's (the usual layout: a target's delta_t is the review it predicts);
`pack_group` reports a card that breaks this (NaN, nothing added), and the engine then runs the batch card by card.

Same equations and torch clamp semantics as fsrs6_kernels.step / step_vjp / target_loss_vjp (read them there).
Merged where the branches share a form: one log for ln S (recall, same-day) or ln D (lapse), one exp for the power
S^{−w19} / S^{−w9} / D^{−w12}, one exp for e^{w10(1−R)} / e^{w14(1−R)}. Results differ from the scalar kernel's
by rounding only: exp1 / log1 / log1p1 within 1 ulp of libm, sums in another order, and fused multiply-adds
(lanes_loss_grad is compiled with fastmath "contract": FMA on every x86-64 CPU since 2013; one without FMA runs
the same code unfused, so results there move in the last bits). Tests: tests/test_fsrs6_lanes.py (loss and
gradient within 1e-12 of the scalar kernel's, central differences, the loops' AVX2 code without libm calls).

What makes LLVM vectorise the lane loops (each found by its remarks, -pass-remarks-analysis=loop-vectorize; any
one of them left the loops scalar): the work arrays allocated inside lanes_loss_grad (constant inner strides, so
the accesses of two positions provably do not overlap; arrays passed in have run-time strides, "cannot identify
array bounds"); the lane sums in a second array (in the same one, at a run-time distance, every pair of accesses
needed its own overlap check: "too many memory checks"); a run-time lane count (for a constant 8 LLVM refuses a
loop that needs any overlap check); the reverse loop over positions as a forward range (range(n, 0, −1) kept the
lane loop scalar); the weights read into locals before the loops.

Measured (a 45k-review simulated user, /tmp/big45; its last fold's 3,900 training cards, 33,475 states, 49 batches
of one epoch; CPU time per state, the scalar kernel's states; paired in one process, medians; the 2-core machine
shared, so the scalar kernel itself read 120-230 ns a state from run to run): loss+gradient old/new 1.31 once the
loops vectorised, 1.46 with the loss out of the gradient pass and the lapse-only loop, 1.56-1.68 packing without
per-group allocations, 1.97 with FMA (68.5 ns against 145.7). LANES 4 ≈ 8 (1.56 both); 16: 1.32 (more padding:
lane slots 1.25x the states at 4, 1.43x at 8). Before FMA, per state: set-up 6, packing 17-23, forward 50-63,
reverse 21-24 ns; the forward is throughput-bound (the same ns per lane slot at 8 to 64 lanes), ~950 AVX2
instructions per 4 lanes with its register spills. The objective pass (fit_loss: forward + loss, no gradient)
gained only 1.15-1.18x while the targets' adjoints were computed in the forward pass, 1.35x since they are in the
reverse pass. The whole fit (5 folds, S0 not included): see fsrs6_kernels' docstring.

WHY HAND-WRITTEN (issue #39): FSRS-6's equations in the traced contract's spelling are
upstream/fsrs6_torch.TorchSteps (models.fsrs6.TORCH_EQUATIONS), and the lane kernel the tracer generates from them
is now about as fast as this one: generated / hand 1.07-1.08x, kernel alone, 20,000 random cards, loss and
gradient, 21 pairs back to back in one process (python bench/bench_generated_lanes.py --models FSRS-6, 29 Nov 2026;
3-4x before the generator's where-fusion, integer refusal count and counting sort); tests/test_fsrs6_lanes.py holds
this kernel to it at the default and the clamped weights. A whole plug-in generated from TorchSteps gave the FSRS-6
row's result lines unchanged on data/embedded and upstream-check (tried in-process). It is not switched because of
what a first run compiles. Tracing no longer costs a torch import (engine/torch_standin.py), so the experiment was
repeated as a switch would be: the equations in the contract's spelling in a torch-free models/ module, run-time
options for the floor grade and s_min, the generated plug-in in FSRS-6's engine. The FSRS-6 result lines on the
embedded data set were identical. But `python script.py` from an empty cache took 7.5 / 7.4 / 7.4 s against 5.9 /
6.0 / 5.9 s with these hand kernels (3 pairs, 2 processes, 29 Nov 2026; CPU 11.8 against 9.4 s). Per compile unit,
one process (generated against hand): the lane kernel's forward part 2.75 against 1.95 s, its reverse part 2.44
against 1.11 s, the kernel 2.27 against 1.79 s, the engine loops 3.7 against 3.1 s. The generated straight-line
code is longer (599 lines against 323 here), and numba's front end costs about in proportion. After the same day's
changes to the generator (each adjoint assigned once) and to vec_math (exp1 / log1 inlined by LLVM), the gap is
smaller: 5.56 / 5.65 / 5.65 s against 5.15 / 5.15 / 5.28 s, CPU 9.0 against 7.7 s (3 pairs). FSRS-6 is the model of
every first run (`script.py`, report.py), whose cold start the first-run issue measures. Next: generated code that
compiles as fast as this kernel; then FSRS-6's equations move beside its class.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types

from models.fsrs6_kernels import (C_D04, C_DF, C_E8, C_E35, C_EM, C_F, C_FLOOR, C_SINC, C_SMIN, N_PARAMS, S_MAX)
from engine.jit import inlined
from engine.kernel_math import stable_argsort_small
from engine.lanes import I_ANY, I_DT, I_G, I_W, LANES, grade_pick, pack_group
from engine.vec_math import _expm1_parts, exp1, log1, log1p1
from lane_kernels.fsrs_shared import difficulty_adjoint, first_review_adjoint

# Row k of the work array X[k, field, lane] holds position k's packed inputs, then the state after it, then what its
# reverse pass reads. X is allocated inside lanes_loss_grad (so LLVM sees its constant strides and can prove that the
# lane loops' accesses do not overlap: with arrays passed in it cannot, and leaves the loops scalar) and the lane
# loops run to a run-time count (for a constant 8 LLVM would not vectorise what needs an overlap check).
# Rows 0..3 (I_DT, I_G, I_W, I_ANY): the packed inputs (engine/lanes.py), then the states and what the reverse
# pass reads:
F_S = 4
F_D = 5
F_X = 6  # F·t/S_prev
F_L1X = 7  # ln(1 + x)
F_R = 8  # R(t, S_prev)
F_OMR = 9  # 1 − R, from expm1
F_PW = 10  # S^{−w19} (same-day), S^{−w9} (recall), D^{−w12} (lapse); at position 0: e^{w5(G−1)}
F_E = 11  # e^{w10(1−R)} (recall) or e^{w14(1−R)} (lapse)
F_LNB = 12  # ln S (recall, same-day) or ln D (lapse)
F_LSP = 13  # ln(S+1) (lapse)
F_SP = 14  # (S+1)^{w13} (lapse)
N_ROW = 15
# The lanes' sums, a second local array A[j, lane] (in X, at a run-time distance from the positions, every pair of
# accesses would need its own overlap check, too many for LLVM): the gradient of w_j (j < 21), the loss, the
# carried adjoints of S and D
J_LOSS = N_PARAMS
J_GS = N_PARAMS + 1
J_GD = N_PARAMS + 2
N_SUMS = N_PARAMS + 3


@inlined(error_model="numpy")
def _target_adjoint(X, A, k, lane, d, df):
    """The adjoint of S_prev from the target at position k (0 if none), its gradient for w20 added to A: on
    ln R = −w20·ln(1 + x) as fsrs6_kernels.target_loss_vjp (in the reverse pass, so that the objective passes,
    forward only, skip it)."""
    wts = X[k, I_W, lane]
    r = X[k, F_R, lane]
    x = X[k, F_X, lane]
    s = X[k - 1, F_S, lane]
    dl = -wts if wts > 0.0 else (-wts * r / X[k, F_OMR, lane] if wts < 0.0 else 0.0)  # d(weight·BCE)/d ln R
    A[20, lane] += dl * (-X[k, F_L1X, lane] - d / (1.0 + x) * X[k, I_DT, lane] / s * df)
    return dl * d * x / ((1.0 + x) * s)


@inlined(error_model="numpy")
def group_forward(w, X, A, n_pos, nl):
    """States of the group's positions 0..n_pos−1 and what their reverse pass and loss read."""
    f, d, e8, em, d04, floor, s_min = w[C_F], w[20], w[C_E8], w[C_EM], w[C_D04], w[C_FLOOR], w[C_SMIN]
    c1, c2, c3, c4 = w[C_SINC + 1], w[C_SINC + 2], w[C_SINC + 3], w[C_SINC + 4]
    w0, w1, w2, w3, w4, w5, w6, w7 = w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]
    w9, w10, w11, w12, w13, w14, w15, w16, w19 = w[9], w[10], w[11], w[12], w[13], w[14], w[15], w[16], w[19]
    for lane in range(nl):
        g = X[0, I_G, lane]
        e = exp1(w5 * (g - 1.0))
        X[0, F_S, lane] = min(max(grade_pick(g, w0, w1, w2, w3), s_min), S_MAX)
        X[0, F_D, lane] = min(max(w4 - e + 1.0, 1.0), 10.0)
        X[0, F_PW, lane] = e
    for k in range(1, n_pos):
        for lane in range(nl):
            s = X[k - 1, F_S, lane]
            dd = X[k - 1, F_D, lane]
            t = X[k, I_DT, lane]
            g = X[k, I_G, lane]
            # the curve at (t, S): the target's and the long-term step's
            x = f * t / s
            l1x = log1p1(x)
            q, sa, sb = _expm1_parts(-d * l1x)
            sc = sa * sb
            r = (1.0 + q) * sa * sb
            omr = -(q * sc + (sc - 1.0))  # 1 − R = −expm1(ln R)
            # the step (a lapse's S is finished by the loop below)
            same = t < 1.0
            recall = g > 1.5
            lnb = log1(s if (same or recall) else dd)
            pw = exp1(-(w19 if same else (w9 if recall else w12)) * lnb)
            e = exp1((w10 if recall else w14) * (1.0 - r))
            sinc = grade_pick(g, c1, c2, c3, c4) * pw
            ns_same = s * (1.0 if (g >= floor and sinc < 1.0) else sinc)
            hb = w15 if (g > 1.5 and g < 2.5) else (w16 if g > 3.5 else 1.0)
            ns_recall = s * (1.0 + e8 * (11.0 - dd) * pw * (e - 1.0) * hb)
            ns = ns_same if same else ns_recall
            ndp = dd - w6 * (g - 3.0) * (10.0 - dd) / 9.0
            nd = w7 * d04 + (1.0 - w7) * ndp
            X[k, F_S, lane] = min(max(ns, s_min), S_MAX)
            X[k, F_D, lane] = min(max(nd, 1.0), 10.0)
            X[k, F_X, lane] = x
            X[k, F_L1X, lane] = l1x
            X[k, F_R, lane] = r
            X[k, F_OMR, lane] = omr
            X[k, F_PW, lane] = pw
            X[k, F_E, lane] = e
            X[k, F_LNB, lane] = lnb
            X[k, F_LSP, lane] = 0.0  # (finite for the reverse pass's zero-weighted lapse terms; set below if used)
            X[k, F_SP, lane] = 0.0
        if X[k, I_ANY, 0] > 0.5:  # a lapse among the lanes: its (S+1)^{w13} and min(S_f, S·e^{−w17 w18})
            for lane in range(nl):
                s = X[k - 1, F_S, lane]
                lsp = log1(s + 1.0)
                sp = exp1(w13 * lsp)
                sf = w11 * X[k, F_PW, lane] * (sp - 1.0) * X[k, F_E, lane]
                sm = s * em
                lapse = X[k, I_DT, lane] >= 1.0 and X[k, I_G, lane] < 1.5
                X[k, F_S, lane] = min(max(sf if sf < sm else sm, s_min), S_MAX) if lapse else X[k, F_S, lane]
                X[k, F_LSP, lane] = lsp
                X[k, F_SP, lane] = sp


@inlined(error_model="numpy")
def group_loss(w, X, A, n_pos, nl):
    """Add each target's weight·BCE to the lanes' loss sums (after group_forward; the gradient needs none of it):
    on ln R = −w20·ln(1 + x), as fsrs6_kernels.target_loss."""
    d = w[20]
    for k in range(1, n_pos):
        for lane in range(nl):
            wts = X[k, I_W, lane]
            lg = log1(X[k, F_OMR, lane])
            A[J_LOSS, lane] += wts * (d * X[k, F_L1X, lane]) if wts > 0.0 else (wts * lg if wts < 0.0 else 0.0)


@inlined(error_model="numpy")
def group_reverse(w, X, A, n_pos, nl):
    """The reverse pass over positions n_pos−1 .. 0, adding the gradient of w0..w20 to the lanes' sums A."""
    d, df, e8, em, d04, e35, floor = w[20], w[C_DF], w[C_E8], w[C_EM], w[C_D04], w[C_E35], w[C_FLOOR]
    s_min = w[C_SMIN]
    c1, c2, c3, c4 = w[C_SINC + 1], w[C_SINC + 2], w[C_SINC + 3], w[C_SINC + 4]
    w0, w1, w2, w3, w4, w6, w7, w9 = w[0], w[1], w[2], w[3], w[4], w[6], w[7], w[9]
    w10, w11, w12, w13, w14, w15, w16 = w[10], w[11], w[12], w[13], w[14], w[15], w[16]
    w17, w18, w19 = w[17], w[18], w[19]
    for lane in range(nl):  # nothing reads the last position's state
        A[J_GS, lane] = _target_adjoint(X, A, n_pos - 1, lane, d, df)
        A[J_GD, lane] = 0.0
    for kk in range(n_pos - 2):  # k = n_pos − 2 .. 1 (a range with step −1 kept the lane loop scalar)
        k = n_pos - 2 - kk
        for lane in range(nl):
            gs = A[J_GS, lane]
            gd = A[J_GD, lane]
            s = X[k - 1, F_S, lane]
            dd = X[k - 1, F_D, lane]
            t = X[k, I_DT, lane]
            g = X[k, I_G, lane]
            gd_old = difficulty_adjoint(A, lane, gd, g, dd, w4, w6, w7, d04, e35)
            # stability: the three branches' adjoints, each weighted 0 where it does not apply
            same = t < 1.0
            recall = g > 1.5
            x = X[k, F_X, lane]
            l1x = X[k, F_L1X, lane]
            r = X[k, F_R, lane]
            pw = X[k, F_PW, lane]
            e = X[k, F_E, lane]
            lnb = X[k, F_LNB, lane]
            sp = X[k, F_SP, lane]  # a lapse's; stale (finite) in the other lanes, whose lapse weights are 0
            # same-day: S·max(SInc, 1) or S·SInc
            sinc = grade_pick(g, c1, c2, c3, c4) * pw
            floored = g >= floor and sinc < 1.0
            a = s * sinc
            g0 = gs if (same and floored and s >= s_min and s <= S_MAX) else 0.0
            g1 = gs if (same and not floored and a >= s_min and a <= S_MAX) else 0.0
            # recall
            dr_ds = r * d * x / ((1.0 + x) * s)
            dr_dd = r * (-l1x - d / (1.0 + x) * t / s * df)
            hb = w15 if (g > 1.5 and g < 2.5) else (w16 if g > 3.5 else 1.0)
            core = e8 * (11.0 - dd) * pw * (e - 1.0)
            inc = core * hb
            ns_r = s * (1.0 + inc)
            g2 = gs if (not same and recall and ns_r >= s_min and ns_r <= S_MAX) else 0.0
            dns_dr = -s * e8 * (11.0 - dd) * pw * hb * w10 * e
            # lapse: min(S_f, S·e^{−w17 w18})
            sf = w11 * pw * (sp - 1.0) * e
            sm = s * em
            ns_l = sf if sf < sm else sm
            gl = gs if (not same and not recall and ns_l >= s_min and ns_l <= S_MAX) else 0.0
            cf = 1.0 if sf < sm else (0.5 if sf == sm else 0.0)
            gf = gl * cf
            gm = gl * (1.0 - cf)
            dsf_dr = -sf * w14
            gs_old = (g0 + g1 * sinc * (1.0 - w19) + g2 * (1.0 + inc - w9 * inc + dns_dr * dr_ds)
                      + gf * (w11 * pw * w13 * sp / (s + 1.0) * e + dsf_dr * dr_ds) + gm * em)
            gd_old += g2 * (-s * e8 * pw * (e - 1.0) * hb) + gf * (-w12 * sf / dd)
            A[17, lane] += (g1 * a * (g - 3.0 + w18) + gm * (-w18 * sm))
            A[18, lane] += (g1 * a * w17 + gm * (-w17 * sm))
            A[19, lane] += (g1 * a * (-lnb))
            A[20, lane] += ((g2 * dns_dr + gf * dsf_dr) * dr_dd)
            A[8, lane] += (g2 * s * inc)
            A[9, lane] += (g2 * s * inc * (-lnb))
            A[10, lane] += (g2 * s * e8 * (11.0 - dd) * pw * hb * e * (1.0 - r))
            A[15, lane] += (g2 * s * core if g < 2.5 else 0.0)
            A[16, lane] += (g2 * s * core if g > 3.5 else 0.0)
            A[11, lane] += (gf * pw * (sp - 1.0) * e)
            A[12, lane] += (gf * sf * (-lnb))
            A[13, lane] += (gf * w11 * pw * sp * X[k, F_LSP, lane] * e)
            A[14, lane] += (gf * sf * (1.0 - r))
            A[J_GS, lane] = gs_old + _target_adjoint(X, A, k, lane, d, df)
            A[J_GD, lane] = gd_old
    for lane in range(nl):  # the first review
        first_review_adjoint(A, lane, A[J_GS, lane], A[J_GD, lane], X[0, I_G, lane], w0, w1, w2, w3, w4, s_min,
                             S_MAX, X[0, F_PW, lane])


@njit(cache=True, error_model="numpy", fastmath={"contract"})
def lanes_loss_grad(wc, seq_dt, seq_g, c_start, t_pos, t_dt, t_y, t_wt, items, batch, max_n, gwc, want_loss,
                    want_grad):
    """Σ weight·BCE over the work items `batch` (rows of items: card, first target, end target, states; at most
    max_n states each), its gradient added into gwc[:21] (want_grad); the items sorted by their number of states
    and taken LANES at a time. Returns the loss (want_loss; else 0: Adam reads the gradient only), or NaN, having
    added nothing, when a card does not fit the lane layout (pack_group)."""
    n_items = len(batch)
    by_length = batch[stable_argsort_small(items[batch, 3], False)]
    # every entry is written before it is read (np.zeros of max_n + 1 rows per batch was ~10% of a fit)
    X = np.empty((max_n + 1, N_ROW, LANES))
    A = np.zeros((N_SUMS, LANES))
    for g0 in range(0, n_items, LANES):
        nl = min(LANES, n_items - g0)
        n_pos = pack_group(seq_dt, seq_g, c_start, t_pos, t_dt, t_y, t_wt, items, by_length, g0, nl, X, 1.0)
        if n_pos < 0:
            return np.nan
        group_forward(wc, X, A, n_pos, nl)  # a run-time lane count: see X's comment
        if want_grad:
            group_reverse(wc, X, A, n_pos, nl)
        if want_loss:
            group_loss(wc, X, A, n_pos, nl)
    if want_grad:
        for j in range(N_PARAMS):
            gwc[j] += A[j].sum()
    return A[J_LOSS].sum()


# The kernel's two large parts, as lanes_loss_grad calls them (work arrays allocated there; lane counts int64): a
# first run compiles each on a worker of its own beside the engine's loops, and then the kernel, which loads them from
# the cache (seq_engine.lane_units; FSRS-6's first run: ~2.1 s, ~1.5 s and ~2.2 s instead of one ~5.8 s unit).
_WORK = (types.float64[::1], types.float64[:, :, ::1], types.float64[:, ::1], types.int64, types.int64)
PARTS = ((group_forward, _WORK), (group_reverse, _WORK))
