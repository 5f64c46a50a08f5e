"""FSRS v1's loss and gradient with LANES cards side by side: the engine's trainer runs its mini-batches and
objective passes here (issue #19; models/fsrs_v1.py's LANE_KERNELS); predictions and loss_and_grad stay card by card
on the scalar plug-in (models/fsrs_v1.py).

Why: the scalar step calls libm one value at a time, 3-4 times a review (exp for R, pow or exp for the branch's
powers, exp(w5·(1 − R))). Here, as in lane_kernels/fsrs_v5_lanes.py (the layout, packing and work items are
engine/lanes.py's), every per-review quantity is an array [position, field, lane] with the lane innermost, each
position one loop over the lanes that LLVM vectorises, exp and log as engine/vec_math's arithmetic and the two
branches merged as selects: one log of S, one log of D' + 0.1, ONE exp of the branch's exponent (recall
e^{w2}(D'+0.1)^{w3}S^{w4}, lapse e^{w6·L}, selected before the exp) and one exp of w5·(1 − R); their reverse passes
are taken with zero weights where they do not apply.

v1's quirks as in its module: the NEW difficulty is computed first and used by the stability update; D' = max(0,
D + R − 0.25·2^{G−1} + 0.1) (no clamp, relu's gradient only where its input is positive); the lapse count L (a
state whose adjoint never reaches a weight: init_vjp ignores it, so the lanes do not carry it); S clamped to
[s_min, 36500] at every review; the first review is position 0 (the engine's init). The loss keeps torch's BCE as
kernel_math.bce does (logs floored at −100, the gradient's p(1 − p) floored at 1e−12: R = 0.9^{t/S} reaches both,
e.g. t = 300 days at S = 1, or a same-day target); a recalled target's −ln R is −x = −ln0.9·t/S itself (no log).

Results differ from the scalar kernel's by rounding only: exp1 / log1 / log1p1 within 1 ulp of libm, a product of
powers as one exp of the summed exponents, dR/dS as −R·x/S, sums in another order, fused multiply-adds (fastmath
"contract"). Against a 100-bit reference (mpmath, the equations written out plainly, targets off torch's floors)
the lanes are within 1e−14 (loss) and 1e−12 (gradient); against torch autograd of the module's torch steps within
~1e−9 (torch's own float64 error at the floors). Tests: tests/test_fsrs_v1_lanes.py.

Until 29 Nov 2026 this kernel served v2 and v3 too; they now run on the lane kernels engine/traced.py generates
from their torch equations (as fast: generated / hand 0.97x and 0.99x, bench/bench_generated_lanes.py), so their
equations are written once (models/fsrs_v3.py's docstring).

WHY HAND-WRITTEN (issue #39): FSRS v1's torch equations (models/fsrs_v1.py) do not trace yet: torch.relu, which the
tracer has no rule for, and a lapse count that torch keeps as an integer (float32 in upstream's trainer) in the
state, where the tracer accepts float64 values only; so there is no generated kernel to measure this one against.
Measured when it was written (bench/bench_fsrs6_lanes.py, the 45k-review simulated user, paired against the scalar
plug-in): loss+gradient per training state 144.6 -> 48.4 ns (2.95x), the 5-fold fit 71.1 -> 29.2 ms (2.45x).
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

# Row k of the work array X[k, field, lane] (rows 0..3: engine/lanes.py's inputs), the state after position k
# and what its reverse pass reads
F_S = 4
F_D = 5
F_L = 6  # the lapse count
F_X = 7  # ln0.9·t/S_prev = ln R
F_R = 8  # R(t, S_prev)
F_LNS = 9  # ln S_prev
F_LND = 10  # ln(D' + 0.1)
F_C = 11  # e^{the branch's exponent}: e^{w2}(D'+0.1)^{w3}S^{w4} (recall) | e^{w6 L} (lapse)
F_E = 12  # e^{w5·(1 − R)}
N_ROW = 13
# The lanes' sums A[j, lane]: the gradient of w_j (j < 7), the loss, the carried adjoints of S and D
N_W = 7
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
def group_forward(w, X, n_pos, nl):
    """States of the group's positions 0..n_pos−1 and what their reverse pass and loss read."""
    w0, w1, w2, w3, w4, w5, w6 = w[0], w[1], w[2], w[3], w[4], w[5], w[6]
    s_min = w[7]  # wc[C_SMIN] (the plug-in's precompute)
    for lane in range(nl):
        g = X[0, I_G, lane]
        X[0, F_S, lane] = min(max(w0 * grade_pick(g, 0.25, 0.5, 1.0, 2.0), s_min), S_MAX)
        X[0, F_D, lane] = w1 - g + 3.0
        X[0, F_L, lane] = 1.0 if g < 1.5 else 0.0
    for k in range(1, n_pos):
        for lane in range(nl):
            s = X[k - 1, F_S, lane]
            dd = X[k - 1, F_D, lane]
            lc = X[k - 1, F_L, lane]
            t = X[k, I_DT, lane]
            g = X[k, I_G, lane]
            recall = g > 1.5
            x = LN09 * t / s
            r = exp1(x)
            nd = max(dd + r - grade_pick(g, 0.25, 0.5, 1.0, 2.0) + 0.1, 0.0)
            lnd = log1(nd + 0.1)
            lns = log1(s)
            c = exp1(w2 + w3 * lnd + w4 * lns if recall else w6 * lc)
            e = exp1(w5 * (1.0 - r))
            ns = s * (1.0 + c * (e - 1.0)) if recall else w0 * c
            X[k, F_S, lane] = min(max(ns, s_min), S_MAX)
            X[k, F_D, lane] = nd
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
def group_reverse(w, X, A, n_pos, nl):
    """The reverse pass over positions n_pos−1 .. 0, adding the gradient of the weights to A."""
    w0, w3, w4, w5 = w[0], w[3], w[4], w[5]
    s_min = w[7]  # wc[C_SMIN] (the plug-in's precompute)
    for lane in range(nl):  # nothing reads the last position's state
        A[J_GS, lane] = _target_adjoint(X, n_pos - 1, lane)
        A[J_GD, lane] = 0.0
    for kk in range(n_pos - 2):  # k = n_pos − 2 .. 1 (as fsrs_v5_lanes: a step −1 range kept the loop scalar)
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
            A[J_GS, lane] = gs_old + _target_adjoint(X, k, lane)
            A[J_GD, lane] = gd_old
    for lane in range(nl):  # the first review
        gs = A[J_GS, lane]
        gd = A[J_GD, lane]
        g = X[0, I_G, lane]
        f = grade_pick(g, 0.25, 0.5, 1.0, 2.0)
        s0 = w0 * f
        A[0, lane] += gs * f if (s0 >= s_min and s0 <= S_MAX) else 0.0
        A[1, lane] += gd


# The entry point (the engine's contract, engine/seq_model_stub.py; w is the plug-in's precompute: the weights, then
# s_min)

@njit(cache=True, error_model="numpy", fastmath={"contract"})
def lanes_loss_grad_v1(w, seq_dt, seq_g, c_start, t_pos, t_dt, t_y, t_wt, items, batch, max_n, gw, want_loss,
                       want_grad):
    """FSRS v1 (7 weights; state S, D, lapses)."""
    n_items = len(batch)
    by_length = batch[stable_argsort_small(items[batch, 3], False)]
    X = np.empty((max_n + 1, N_ROW, LANES))  # every entry is written before it is read
    A = np.zeros((N_SUMS, LANES))
    for g0 in range(0, n_items, LANES):
        nl = min(LANES, n_items - g0)
        n_pos = pack_group(seq_dt, seq_g, c_start, t_pos, t_dt, t_y, t_wt, items, by_length, g0, nl, X, math.inf)
        if n_pos < 0:
            return np.nan
        group_forward(w, X, n_pos, nl)
        if want_grad:
            group_reverse(w, X, A, n_pos, nl)
        if want_loss:
            group_loss(X, A, n_pos, nl)
    if want_grad:
        for j in range(N_W):
            gw[j] += A[j].sum()
    return A[J_LOSS].sum()
