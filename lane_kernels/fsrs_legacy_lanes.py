"""FSRS v1, v2 and v3's loss and gradient with LANES cards side by side: the engine's trainer runs their mini-batches
and objective passes here (issue #19; each plug-in's LANE_KERNELS names its entry point: lanes_loss_grad_v1 / _v2 /
_v3); predictions and loss_and_grad stay card by card on the scalar plug-ins (models/fsrs_v1.py, fsrs_v2.py,
fsrs_v3.py). Named after their shared model class, fsrs_v3.FSRSLegacy.

Why: the scalar steps call libm one value at a time, 3-4 times a review (exp for R, pow or exp for the branch's
powers, exp(w·(1 − R))). Here, as in lane_kernels/fsrs_v4_lanes.py (the layout, packing and work items are
engine/lanes.py's), every per-review quantity is an array [position, field, lane] with the lane innermost, each
position one loop over the lanes that LLVM vectorises, exp and log as engine/vec_math's arithmetic and the two
branches merged as selects: every version's recall and lapse stability are a product of powers of S and of a
difficulty term times e^{w(1−R)}, so one log of S, one log of the difficulty term (v1: D' + 0.1, v2 and v3: D'),
ONE exp of the branch's exponent (the lane's own branch, selected before the exp) and one exp of w_branch·(1 − R)
serve both branches; their reverse passes are taken with zero weights where they do not apply. No second loop for
the lapses (as v4's has): v1's lapse e^{w6·L} and v2 / v3's D'^{w}·S^{w} are the same one exp.

One kernel, the version a constant of each entry point (as fsrs_v4_lanes'); each version's quirks as in its
module: the NEW difficulty is computed first and used by the stability update (all three); v1's D' = max(0,
D + R − 0.25·2^{G−1} + 0.1) (no clamp, relu's gradient only where its input is positive) and its lapse count L (a
state whose adjoint never reaches a weight: init_vjp ignores it, so the lanes do not carry it); v2's reversion to
w2·(1 − w3); v3's (11 − D') and e^{w6} (one libm exp a call, the scalar step's value); S clamped to [0.01, 36500]
at every review, D to [1, 10] in v2 and v3 (first review included); the first review is position 0 (the
engine's init). The loss keeps torch's BCE as kernel_math.bce does (logs floored at −100, the gradient's p(1 − p)
floored at 1e−12: R = 0.9^{t/S} reaches both, e.g. t = 300 days at S = 1, or a same-day target); a recalled
target's −ln R is −x = −ln0.9·t/S itself (no log).

Results differ from the scalar kernel's by rounding only: exp1 / log1 / log1p1 within 1 ulp of libm, pow as
exp(p·ln x) and a product of powers as one exp of the summed exponents (v1: e^{w2}(D'+0.1)^{w3}S^{w4}; v2:
e^{w6}D'^{w7}S^{w8}), dR/dS as −R·x/S, sums in another order, fused multiply-adds (fastmath "contract").
Against a 100-bit reference (mpmath, the equations written out plainly, targets off torch's floors) the lanes
are within 1e−14 (loss) and 1e−12 (gradient); against torch autograd of the modules' torch steps (floors
reached) within ~1e−9, torch's own float64 error there (the scalar kernel's the same); against the scalar
kernel within ~1e−15. Tests: tests/test_fsrs_legacy_lanes.py (also the clamps reached, central differences, the
engine's binding, the fit, the loops' vector code without libm calls, the refusal of a batch off the layout).

The driver (_loss_grad) repeats fsrs_v4_lanes' ~15 lines around its own group functions: numba caches no
function that takes another as an argument (engine/lanes.py's docstring); what both use generically (the
packing, work items, grade select) is engine/lanes.py's.

Measured (bench/bench_fsrs6_lanes.py --model M [--fit] on the 45k-review simulated user /tmp/big45, paired in one
process against the scalar plug-in, which is main's code, CPU time, medians of 5 pairs; the 2-core machine
shared): loss+gradient per training state of one epoch's batches: FSRS v3 115.6 -> 61.0 ns (1.93x; pairs 1.78-2.17),
v2 114.1 -> 54.8 ns (2.25x; 1.98-2.57), v1 144.6 -> 48.4 ns (2.95x; 2.84-2.99); lane slots 1.46x the states
(padding of the shorter cards). The 5-fold fit (Adam and its objective passes): v3 53.6 -> 28.4 ms (1.96x), v2
67.3 -> 31.5 ms (2.13x), v1 71.1 -> 29.2 ms (2.45x); fitted weights within 1.8e-15 of the scalar fit's. Result
lines (sizes, metrics, parameters) of FSRSv1, v2, v3 identical to main's on data/embedded (3 users) and sim36
users 1-6. Whole users (bench/bench_executors.py project --rows FSRSv1,FSRSv2,FSRSv3, main's tree and this one
back to back, three times; CPU-hours for 10,000 users): FSRSv3 0.49 -> 0.22, 0.39 -> 0.22, 0.35 -> 0.22, FSRSv2
0.40 -> 0.21, 0.39 -> 0.22, 0.36 -> 0.27, FSRSv1 0.54 -> 0.24, 0.43 -> 0.25, 0.39 -> 0.23; the three rows 1.4 ->
0.7, 1.2 -> 0.7, 1.1 -> 0.7. AVX2 only
(NUMBA_CPU_NAME=haswell, NUMBA_CPU_FEATURES the host's without avx512*, a fresh cache: ymm code, no zmm): the
same result lines and tests/test_fsrs_legacy_lanes.py passing.

Not tried, by estimate: v3's ln D' (its lapse's alone) in a second loop at the positions where a lane lapses, as
fsrs_v4_lanes does: it would save one vectorised log a position but cost a log and an exp at every position where
any of the 8 lanes lapses (most of them at a 10-15% lapse rate), so no gain is expected.

WHY HAND-WRITTEN (issue #39): the tracer (engine/traced.py) generates a plug-in and its lane kernel from
models/fsrs_v2.py's and fsrs_v3.py's torch_init / torch_step / torch_curve, and those lane kernels are now as fast as
this one: generated / hand 0.97x (FSRS v2), 0.99x (FSRS v3), kernel alone on one batch of 20,000 random cards, loss
and gradient, 21 pairs back to back in one process (python bench/bench_generated_lanes.py, 29 Nov 2026; 1.34x and
2.22x the day before, until the generator computed one exp / log / pow for a where's two sides, counted its refused
reviews in an integer and sorted the work items by counting). What still keeps this kernel is the plug-ins it
belongs to: their scalar steps clamp S at a run-time option, s_min (day mode 0.01, upstream's --secs 1e-4), which the
torch equations do not take. tests/test_fsrs_legacy_lanes.py holds it to the generated ones. FSRS v1's torch
equations do not trace yet: torch.relu, which the tracer has no rule for, and a lapse count that torch keeps as an
integer (float32 in upstream's trainer) in the state, where the tracer accepts float64 values only.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from models.fsrs_v3 import LN09, S_MAX
from engine.jit import inlined
from engine.kernel_math import BCE_GRAD_EPS, BCE_LOG_FLOOR, stable_argsort_small
from engine.lanes import I_DT, I_G, I_W, LANES, grade_pick, pack_group
from engine.vec_math import exp1, log1, log1p1

V1, V2, V3 = 1, 2, 3  # the entry points' version constants
# Row k of the work array X[k, field, lane] (rows 0..3: engine/lanes.py's inputs), the state after position k
# and what its reverse pass reads
F_S = 4
F_D = 5
F_L = 6  # v1's lapse count (v1 only)
F_X = 7  # ln0.9·t/S_prev = ln R
F_R = 8  # R(t, S_prev)
F_LNS = 9  # ln S_prev
F_LND = 10  # ln(D' + 0.1) (v1), ln D' (v2, v3)
F_C = 11  # e^{the branch's exponent} (recall | lapse): v1 e^{w2}(D'+0.1)^{w3}S^{w4} | e^{w6 L};
#           v2 e^{w6}D'^{w7}S^{w8} | D'^{w11}S^{w12}; v3 S^{w7} | D'^{w10}S^{w11}
F_E = 12  # e^{w·(1 − R)}: v1 w5; v2 w9 | w13; v3 w8 | w12 (recall | lapse)
N_ROW = 13
# The lanes' sums A[j, lane]: the gradient of w_j (j < 14; each version uses its own first n_w), the loss, the
# carried adjoints of S and D
N_W = 14
J_LOSS = N_W
J_GS = N_W + 1
J_GD = N_W + 2
N_SUMS = N_W + 3


@inlined(error_model="numpy")
def _target_adjoint(X, k, lane):
    """The adjoint of S_prev from the target at position k (0 if none): kernel_math.bce's d/dR times
    dR/dS = −R·x/S."""
    wts = X[k, I_W, lane]
    r = X[k, F_R, lane]
    y = 1.0 if wts > 0.0 else 0.0
    gp = abs(wts) * (r - y) / max(r * (1.0 - r), BCE_GRAD_EPS)
    return gp * (-r * X[k, F_X, lane] / X[k - 1, F_S, lane]) if wts != 0.0 else 0.0


@inlined(error_model="numpy")
def group_forward(w, X, n_pos, nl, ver, e6):
    """States of the group's positions 0..n_pos−1 and what their reverse pass and loss read."""
    w0, w1, w2, w3, w4, w5, w6 = w[0], w[1], w[2], w[3], w[4], w[5], w[6]
    w7 = w[7] if ver != V1 else 0.0
    w8 = w[8] if ver != V1 else 0.0
    w9 = w[9] if ver != V1 else 0.0
    w10 = w[10] if ver != V1 else 0.0
    w11 = w[11] if ver != V1 else 0.0
    w12 = w[12] if ver != V1 else 0.0
    w13 = w[13] if ver == V2 else 0.0
    s_min = w[7] if ver == V1 else (w[14] if ver == V2 else w[13])  # wc[C_SMIN] of the version (its precompute)
    for lane in range(nl):
        g = X[0, I_G, lane]
        if ver == V1:
            X[0, F_S, lane] = min(max(w0 * grade_pick(g, 0.25, 0.5, 1.0, 2.0), s_min), S_MAX)
            X[0, F_D, lane] = w1 - g + 3.0
            X[0, F_L, lane] = 1.0 if g < 1.5 else 0.0
        elif ver == V2:
            X[0, F_S, lane] = min(max(w0 * (w1 * (g - 1.0) + 1.0), s_min), S_MAX)
            X[0, F_D, lane] = min(max(w2 * (w3 * (g - 4.0) + 1.0), 1.0), 10.0)
        else:
            X[0, F_S, lane] = min(max(w0 + w1 * (g - 1.0), s_min), S_MAX)
            X[0, F_D, lane] = min(max(w2 + w3 * (g - 3.0), 1.0), 10.0)
    for k in range(1, n_pos):
        for lane in range(nl):
            s = X[k - 1, F_S, lane]
            dd = X[k - 1, F_D, lane]
            lc = X[k - 1, F_L, lane] if ver == V1 else 0.0
            t = X[k, I_DT, lane]
            g = X[k, I_G, lane]
            recall = g > 1.5
            x = LN09 * t / s
            r = exp1(x)
            if ver == V1:
                nd = max(dd + r - grade_pick(g, 0.25, 0.5, 1.0, 2.0) + 0.1, 0.0)
                lnd = log1(nd + 0.1)
            elif ver == V2:
                nd = min(max(w5 * (w2 * (1.0 - w3)) + (1.0 - w5) * (dd + w4 * (g - 3.0)), 1.0), 10.0)
                lnd = log1(nd)
            else:
                nd = min(max(w5 * w2 + (1.0 - w5) * (dd + w4 * (g - 3.0)), 1.0), 10.0)
                lnd = log1(nd)
            lns = log1(s)
            if ver == V1:
                c = exp1(w2 + w3 * lnd + w4 * lns if recall else w6 * lc)
                e = exp1(w5 * (1.0 - r))
                ns = s * (1.0 + c * (e - 1.0)) if recall else w0 * c
            elif ver == V2:
                c = exp1(w6 + w7 * lnd + w8 * lns if recall else w11 * lnd + w12 * lns)
                e = exp1((w9 if recall else w13) * (1.0 - r))
                ns = s * (1.0 + c * (e - 1.0)) if recall else w10 * c * (e - 1.0)
            else:
                c = exp1(w7 * lns if recall else w10 * lnd + w11 * lns)
                e = exp1((w8 if recall else w12) * (1.0 - r))
                ns = s * (1.0 + e6 * (11.0 - nd) * c * (e - 1.0)) if recall else w9 * c * e
            X[k, F_S, lane] = min(max(ns, s_min), S_MAX)
            X[k, F_D, lane] = nd
            if ver == V1:
                X[k, F_L, lane] = lc + (0.0 if recall else 1.0)
            X[k, F_X, lane] = x
            X[k, F_R, lane] = r
            X[k, F_LNS, lane] = lns
            X[k, F_LND, lane] = lnd
            X[k, F_C, lane] = c
            X[k, F_E, lane] = e


@inlined(error_model="numpy")
def group_loss(X, A, n_pos, nl):
    """Add each target's weight·BCE (kernel_math.bce's floors) to the lanes' loss sums (after group_forward):
    −max(ln R, −100) = −max(x, −100) if recalled, −max(ln(1 − R), −100) if forgotten."""
    for k in range(1, n_pos):
        for lane in range(nl):
            wts = X[k, I_W, lane]
            lg = max(log1p1(-X[k, F_R, lane]), BCE_LOG_FLOOR)
            A[J_LOSS, lane] += -wts * max(X[k, F_X, lane], BCE_LOG_FLOOR) if wts > 0.0 else (
                wts * lg if wts < 0.0 else 0.0)


@inlined(error_model="numpy")
def group_reverse(w, X, A, n_pos, nl, ver, e6):
    """The reverse pass over positions n_pos−1 .. 0, adding the gradient of the version's weights to A."""
    w0, w1, w2, w3, w4, w5 = w[0], w[1], w[2], w[3], w[4], w[5]
    w7 = w[7] if ver != V1 else 0.0
    w8 = w[8] if ver != V1 else 0.0
    w9 = w[9] if ver != V1 else 0.0
    w10 = w[10] if ver != V1 else 0.0
    w11 = w[11] if ver != V1 else 0.0
    w12 = w[12] if ver != V1 else 0.0
    w13 = w[13] if ver == V2 else 0.0
    s_min = w[7] if ver == V1 else (w[14] if ver == V2 else w[13])  # wc[C_SMIN] of the version (its precompute)
    for lane in range(nl):  # nothing reads the last position's state
        A[J_GS, lane] = _target_adjoint(X, n_pos - 1, lane)
        A[J_GD, lane] = 0.0
    for kk in range(n_pos - 2):  # k = n_pos − 2 .. 1 (as fsrs_v4_lanes: a step −1 range kept the loop scalar)
        k = n_pos - 2 - kk
        for lane in range(nl):
            gs = A[J_GS, lane]
            gnd = A[J_GD, lane]
            s = X[k - 1, F_S, lane]
            dd = X[k - 1, F_D, lane]
            g = X[k, I_G, lane]
            recall = g > 1.5
            x = X[k, F_X, lane]
            r = X[k, F_R, lane]
            lns = X[k, F_LNS, lane]
            lnd = X[k, F_LND, lane]
            c = X[k, F_C, lane]
            e = X[k, F_E, lane]
            nd = X[k, F_D, lane]
            dr_ds = -r * x / s
            # stability: each branch's adjoint (g2 recall, gl lapse), weighted 0 where it does not apply or the
            # clamp holds S'
            if ver == V1:
                a = c * (e - 1.0)
                ns_r = s * (1.0 + a)
                ns_l = w0 * c
                g2 = gs if (recall and ns_r >= s_min and ns_r <= S_MAX) else 0.0
                gl = gs if (not recall and ns_l >= s_min and ns_l <= S_MAX) else 0.0
                gs_old = g2 * (1.0 + (1.0 + w4) * a - s * c * e * w5 * dr_ds)
                gnd += g2 * s * w3 * a / (nd + 0.1)
                A[2, lane] += g2 * s * a
                A[3, lane] += g2 * s * a * lnd
                A[4, lane] += g2 * s * a * lns
                A[5, lane] += g2 * s * c * e * (1.0 - r)
                A[0, lane] += gl * c
                A[6, lane] += gl * ns_l * X[k - 1, F_L, lane]
                # difficulty: relu passes the adjoint where its input is positive
                pos = dd + r - grade_pick(g, 0.25, 0.5, 1.0, 2.0) + 0.1 > 0.0
                gd_old = gnd if pos else 0.0
                gs_old += gd_old * dr_ds
            elif ver == V2:
                a = c * (e - 1.0)
                ns_r = s * (1.0 + a)
                ns_l = w10 * c * (e - 1.0)
                g2 = gs if (recall and ns_r >= s_min and ns_r <= S_MAX) else 0.0
                gl = gs if (not recall and ns_l >= s_min and ns_l <= S_MAX) else 0.0
                gs_old = (g2 * (1.0 + (1.0 + w8) * a - s * c * e * w9 * dr_ds)
                          + gl * (w12 * ns_l / s - w10 * c * e * w13 * dr_ds))
                gnd += g2 * s * w7 * a / nd + gl * w11 * ns_l / nd
                A[6, lane] += g2 * s * a
                A[7, lane] += g2 * s * a * lnd
                A[8, lane] += g2 * s * a * lns
                A[9, lane] += g2 * s * c * e * (1.0 - r)
                A[10, lane] += gl * a
                A[11, lane] += gl * ns_l * lnd
                A[12, lane] += gl * ns_l * lns
                A[13, lane] += gl * w10 * c * e * (1.0 - r)
                dp = dd + w4 * (g - 3.0)
                target = w2 * (1.0 - w3)
                dm = w5 * target + (1.0 - w5) * dp
                gdm = gnd if (dm >= 1.0 and dm <= 10.0) else 0.0
                A[5, lane] += gdm * (target - dp)
                A[2, lane] += gdm * w5 * (1.0 - w3)
                A[3, lane] -= gdm * w5 * w2
                A[4, lane] += gdm * (1.0 - w5) * (g - 3.0)
                gd_old = gdm * (1.0 - w5)
            else:
                a = e6 * (11.0 - nd) * c * (e - 1.0)
                ns_r = s * (1.0 + a)
                ns_l = w9 * c * e
                g2 = gs if (recall and ns_r >= s_min and ns_r <= S_MAX) else 0.0
                gl = gs if (not recall and ns_l >= s_min and ns_l <= S_MAX) else 0.0
                ec = s * e6 * (11.0 - nd) * c * e  # the recall's dS'/d(w8·(1 − R))
                gs_old = (g2 * (1.0 + (1.0 + w7) * a - ec * w8 * dr_ds)
                          + gl * (w11 * ns_l / s - w12 * ns_l * dr_ds))
                gnd += g2 * (-s * e6 * c * (e - 1.0)) + gl * w10 * ns_l / nd
                A[6, lane] += g2 * s * a
                A[7, lane] += g2 * s * a * lns
                A[8, lane] += g2 * ec * (1.0 - r)
                A[9, lane] += gl * c * e
                A[10, lane] += gl * ns_l * lnd
                A[11, lane] += gl * ns_l * lns
                A[12, lane] += gl * ns_l * (1.0 - r)
                dp = dd + w4 * (g - 3.0)
                dm = w5 * w2 + (1.0 - w5) * dp
                gdm = gnd if (dm >= 1.0 and dm <= 10.0) else 0.0
                A[5, lane] += gdm * (w2 - dp)
                A[2, lane] += gdm * w5
                A[4, lane] += gdm * (1.0 - w5) * (g - 3.0)
                gd_old = gdm * (1.0 - w5)
            A[J_GS, lane] = gs_old + _target_adjoint(X, k, lane)
            A[J_GD, lane] = gd_old
    for lane in range(nl):  # the first review
        gs = A[J_GS, lane]
        gd = A[J_GD, lane]
        g = X[0, I_G, lane]
        if ver == V1:
            f = grade_pick(g, 0.25, 0.5, 1.0, 2.0)
            s0 = w0 * f
            A[0, lane] += gs * f if (s0 >= s_min and s0 <= S_MAX) else 0.0
            A[1, lane] += gd
        elif ver == V2:
            f = w1 * (g - 1.0) + 1.0
            s0 = w0 * f
            gs0 = gs if (s0 >= s_min and s0 <= S_MAX) else 0.0
            A[0, lane] += gs0 * f
            A[1, lane] += gs0 * w0 * (g - 1.0)
            h = w3 * (g - 4.0) + 1.0
            d0 = w2 * h
            gd0 = gd if (d0 >= 1.0 and d0 <= 10.0) else 0.0
            A[2, lane] += gd0 * h
            A[3, lane] += gd0 * w2 * (g - 4.0)
        else:
            s0 = w0 + w1 * (g - 1.0)
            gs0 = gs if (s0 >= s_min and s0 <= S_MAX) else 0.0
            A[0, lane] += gs0
            A[1, lane] += gs0 * (g - 1.0)
            d0 = w2 + w3 * (g - 3.0)
            gd0 = gd if (d0 >= 1.0 and d0 <= 10.0) else 0.0
            A[2, lane] += gd0
            A[3, lane] += gd0 * (g - 3.0)


@inlined(error_model="numpy")
def _loss_grad(w, seq_dt, seq_g, c_start, t_pos, t_dt, t_y, t_wt, items, batch, max_n, gw, want_loss, want_grad,
               ver, n_w):
    """The entry points' body for version `ver` (its n_w parameters)."""
    n_items = len(batch)
    by_length = batch[stable_argsort_small(items[batch, 3], False)]
    X = np.empty((max_n + 1, N_ROW, LANES))  # every entry is written before it is read
    A = np.zeros((N_SUMS, LANES))
    e6 = math.exp(w[6]) if ver == V3 else 0.0  # v3's e^{w6}: the scalar step's value, once
    for g0 in range(0, n_items, LANES):
        nl = min(LANES, n_items - g0)
        n_pos = pack_group(seq_dt, seq_g, c_start, t_pos, t_dt, t_y, t_wt, items, by_length, g0, nl, X, math.inf)
        if n_pos < 0:
            return np.nan
        group_forward(w, X, n_pos, nl, ver, e6)
        if want_grad:
            group_reverse(w, X, A, n_pos, nl, ver, e6)
        if want_loss:
            group_loss(X, A, n_pos, nl)
    if want_grad:
        for j in range(n_w):
            gw[j] += A[j].sum()
    return A[J_LOSS].sum()


# The entry points (the engine's contract, engine/seq_model_stub.py; w is the plug-ins' precompute: the weights, then s_min)

@njit(cache=True, error_model="numpy", fastmath={"contract"})
def lanes_loss_grad_v1(w, seq_dt, seq_g, c_start, t_pos, t_dt, t_y, t_wt, items, batch, max_n, gw, want_loss,
                       want_grad):
    """FSRS v1 (7 weights; state S, D, lapses)."""
    return _loss_grad(w, seq_dt, seq_g, c_start, t_pos, t_dt, t_y, t_wt, items, batch, max_n, gw, want_loss,
                      want_grad, V1, 7)


@njit(cache=True, error_model="numpy", fastmath={"contract"})
def lanes_loss_grad_v2(w, seq_dt, seq_g, c_start, t_pos, t_dt, t_y, t_wt, items, batch, max_n, gw, want_loss,
                       want_grad):
    """FSRS v2 (14 weights)."""
    return _loss_grad(w, seq_dt, seq_g, c_start, t_pos, t_dt, t_y, t_wt, items, batch, max_n, gw, want_loss,
                      want_grad, V2, 14)


@njit(cache=True, error_model="numpy", fastmath={"contract"})
def lanes_loss_grad_v3(w, seq_dt, seq_g, c_start, t_pos, t_dt, t_y, t_wt, items, batch, max_n, gw, want_loss,
                       want_grad):
    """FSRS v3 (13 weights)."""
    return _loss_grad(w, seq_dt, seq_g, c_start, t_pos, t_dt, t_y, t_wt, items, batch, max_n, gw, want_loss,
                      want_grad, V3, 13)
