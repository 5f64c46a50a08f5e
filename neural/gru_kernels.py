"""The compiled one-layer GRU of GRU and GRU-P (models/gru_p.py): nn.GRU's recurrence (gate order r, z, n) and its
reverse pass in numba, the cards of a group run side by side in lockstep.

Why compiled: these networks are tiny (2→8 and 2→2 units), so torch's per-operation cost, not arithmetic, decided
their speed: its CPU GRU records about ten autograd nodes per time step, and every optimizer step of torch's AdamW
and every parameter conversion costs tens of microseconds over ~12,000 steps per 100k reviews. Here:
- `gru_cards_loss`: predictions, Σ weight·BCE and the gradient of every parameter for a group of whole cards, from
  one forward and one reverse pass over the group; neural/card_fit.py runs the whole fine-tune with it in one call;
- neural/gru_torch.py wraps the same recurrence as a torch autograd Function (`GRUSeqs`), for the autograd paths
  (`predict_batch`, tests).
All are tested equal to torch's nn.GRU (1e-6 run upstream's way, one padded history per target; 1e-12 in float64
on single sequences, tests/test_gru_lockstep.py).

Why lockstep: one card at a time, every loop ran over the H = 8 (GRU: 2) hidden units, too short to vectorise, and
24 calls of the C library's exp / tanh per step (~6 and ~27 ns each) were most of the time. Now the cards of a
group are sorted longest first (`lockstep_plan`) and step k runs the A[k] cards still going, every quantity of the
step stored [unit][card] so that each loop is innermost over cards: contiguous, vectorised 4 doubles at a time
(AVX2). The gates' sigmoid and tanh are engine/vec_math.py's vectorisable exp (within 1–4 ulp of the C library), the
weight gradients are summed over all cells of the group at the end (`_weight_grads`, the one place allowed to
reassociate). A card's own arithmetic never mixes with its neighbours': its states are bit-identical whichever cards
share its group (tested), so only vec_math's last-ulp differences and the summation order of the gradient moved
results: predictions within 2.2e-16 and metrics within 7e-15 of the one-card kernel with libm (the embedded data and
8 simulated users, GRU-P, GRU-P-short and GRU).

Measured against the one-card kernel, paired on the shared 2-core machine (a 45,000-review simulated user, 5 folds,
CPU seconds in one process): GRU-P 1.54 → 0.81 s, GRU-P-short 1.84 → 0.82 s, GRU 0.25 → 0.18 s; GRU-P's loss and
gradient per card step (forward + reverse + head, fixed groups) 940 → 430 ns. Projected to 10,000 users
(bench/bench_executors.py project, two paired runs): GRU-P 6.2–6.8 → 3.3–3.4 CPU-hours, GRU-P-short 7.7–8.6 →
4.4–4.5, GRU 1.0–1.2 → 0.9–1.0 (H = 2: too few units per card to gain much; the fixed cost per step stays). Where
GRU-P's time goes now: the forward ~200 ns a card step (about half of it vec_math's 24 exp), the reverse ~185 ns,
setup and head ~55 ns. Groups hold ~80 cards of mean length ~6 and up to 64 steps, so most lockstep steps run few
cards and the fixed cost of ~100 short loops per step is a large share (packing several short cards into one lane
would not cut the number of steps, which the group's longest card sets). Numba's slice assignment (a[i:j] = b[k:l])
cost more than the arithmetic on such short slices: the copies here are explicit loops.

Issue #19 (the whole table ≤ 50 CPU-hours). Profile of a fine-tune on the 45,000-review simulated user (its 5th
fold, GRU-P: 49 groups an epoch × 16 epochs, each ~500 card steps over ~80 cards in ~24 lockstep steps, ≤ 4 cards
on 31% of the steps), CPU time per card step, min of 15 rounds: before, forward ~165 ns (its 24 sigmoid / tanh
alone ~100: vec_math's exp at ~3.8–5.1 ns a value), reverse ~145, targets, head and set-up ~75 (libm exp and log
per target). Width sweeps (cards of equal length, 30 steps): ~0.6 µs forward and ~0.3 µs reverse a lockstep step
plus ~110 and ~80 ns a card, narrow steps dearer (their loops run scalar); in real groups the per-card work was
most of the time. What changed, each measured, all kept:
- the forward sums each unit's three pre-activations over the 2 inputs and 8 (GRU: 2) previous states in
  registers, one loop per unit innermost over the cards (`_forward_units`), the unit's weights held as tuples
  (values, so no store in the loop can change them: read from arrays, LLVM needed more run-time overlap checks than
  it allows and did not vectorise); `_weight_grads` holds a gate row's 2 + F + H sums in registers in one pass over
  the cells; the reverse pass swaps its two dh buffers instead of copying and zeroing (from the unmerged branch
  `grup`, whose forward this was; the sizes are constants through the tuples' lengths (ZEROS_8, ZEROS_2), so only
  the GRU family's sizes compile, others are refused);
- fused multiply-adds (fastmath "contract") in the recurrence and in vec_math's sigmoid_vec / tanh_vec (their
  polynomial: 3.8 → 2.6 and 5.1 → 3.6 ns a value);
- the head runs over all of a group's targets at once (`_heads`: vec_math's exp_vec and log_vec, several targets
  per instruction, instead of libm one target at a time).
Per card step now (same groups, both kernels in one process, min of 15 rounds): forward 165 → 110 ns, reverse 145
→ 130, loss and gradient of a group 390 → 310, prediction only 230 → 155. Tried and not kept: d loss / d h_prev of
each unit summed over all units in registers in one loop (24 terms a cell; 130 → 190 ns a card step for the
reverse, slower than the 72 short loops it replaced, as the branch grup had found).
Equality: a card's states are still bit-identical whichever cards share its group (tested); against the previous
kernel, predictions within 2.2e-16 and gradients within 1e-15 (GRU-P) and 1.5e-14 (GRU) relative per group call,
fine-tuned weights within 1.5e-12 after the 16 epochs (45,000-review user). Whole fine-tunes (that user's 5 folds,
kernels alternating in one process, CPU time, median of 9 pairs): GRU-P 1.22×, GRU-P-short 1.20×, GRU 1.27×.
Projected to 10,000 users (bench/bench_executors.py project, the previous kernel's tree and this one back to back,
three pairs on the shared, overloaded machine (load 6–10 on 2 cores), CPU-hours): GRU-P 3.04 → 2.14, 2.92 → 2.63,
2.84 → 2.36; GRU-P-short 3.71 → 2.75, 4.17 → 3.63, 3.63 → 3.47; GRU 0.60 → 0.48, 0.74 → 0.54, 0.64 → 0.55 (the
second pair ran beside other jobs of this session). Result lines of GRU-P, GRU-P-short and GRU on the embedded data
(3 users) and sim36 users 1–6: sizes and every metric identical at their printed 6 decimals.
Not reached: the issue's 1.3× on the GRU-P rows (1.2× by the paired fine-tunes). What is left: the 24 sigmoid /
tanh (~65 ns of the forward's 110), the reverse pass's ~100 short loops a lockstep step, and the targets' set-up
(~20 ns a card step: gathering, sorting, the strided logits). Not tried for lack of time: float32 (8 lanes, as the
LSTM; it needs a --precision float64 reference and would likely move the result lines' last printed digits) and
cards packed back to back into lanes of constant width (a first-fit packing of real groups into 16 lanes was not
clearly faster in a cost-only mock-up on this noisy machine).

The card layout is card_net.CardSet.layout() (neural/card_fit.py describes it). Parameters are passed flat
(w_ih, w_hh, b_ih, b_hh, fc_w, fc_b concatenated; `unflatten` makes the views).

Why hand-written, not generated (issue #39): engine/traced.py generates a plug-in, its gradient and its lanes from a
recurrence of a few floats per card written in torch (init / step / curve, FSRS v1-v6, FSRS-7, SBD); a network's state
is a vector and its step matrix products (torch.stack, @, nn modules), which the tracer does not record (TraceError:
"torch op stack is not traced"), so there is nothing generated to compare. The network is written in torch once more
as the reference (neural/gru_torch.py), which tests/test_gru_lockstep.py holds this kernel equal to, and which the
`--trainer upstream` path runs; the speed this kernel buys over it is measured above (and docs/speed.md: GRU-P 32x
upstream's own code on 36 users).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit
from numba.cpython.unsafe.tuple import tuple_setitem

from engine.jit import inlined
from engine.kernel_math import BCE_GRAD_EPS, BCE_LOG_FLOOR, lockstep_plan, stable_argsort_small
from engine.vec_math import exp_vec, log_vec, sigmoid_vec, tanh_vec

HEAD_SIGMOID_CELL = 0  # GRU-P: one more GRU step with the target's own (delta_t, last rating), p = σ(fc(h))
HEAD_POWER_CURVE = 1  # GRU: S = exp(fc(h)), p = (1 + factor·t/S)^decay


@njit(cache=True)
def to_lockstep(padded, order, A, base):
    """Values padded[k, order[c], w] (time-major, zero-padded sequences) in lockstep_plan's layout."""
    W = padded.shape[2]
    out = np.empty(base[-1] * W)
    for k in range(len(A)):
        for w in range(W):
            for c in range(A[k]):
                out[base[k] * W + w * A[k] + c] = padded[k, order[c], w]
    return out


@njit(cache=True)
def from_lockstep(flat, order, A, base, n_l, n_c, W):
    """The inverse of to_lockstep: [n_l, n_c, W], zero beyond each sequence's length."""
    out = np.zeros((n_l, n_c, W))
    for k in range(len(A)):
        for w in range(W):
            for c in range(A[k]):
                out[k, order[c], w] = flat[base[k] * W + w * A[k] + c]
    return out


ZEROS_8 = (0.0,) * 8  # tuples of the sizes the GRU family uses (8 and 2 units, 2 inputs): a tuple's length is a
ZEROS_2 = (0.0,) * 2  # compile-time constant, so the loops over it unroll and values set in it stay in registers


def units_of(n_hidden: int) -> tuple:
    """The tuple that stands for a hidden size in gru_cards_loss's `model` (its length, a constant there): GRU-P's
    loss compiles for 8 units alone and GRU's for 2, rather than each for both (2.7 s of GRU-P's first run)."""
    if n_hidden not in (8, 2):
        raise ValueError("the compiled GRU has 8 or 2 hidden units")
    return ZEROS_8 if n_hidden == 8 else ZEROS_2


@inlined
def _row(zeros, w, r):
    """w[r, :len(zeros)] as a tuple (a value: nothing stored in memory can change it)."""
    out = zeros
    for i in range(len(zeros)):
        out = tuple_setitem(out, i, w[r, i])
    return out


@njit(cache=True)
def _gru_forward(xs, A, base, h0, w_ih, w_hh, b_ih, b_hh, hs, gates):
    """nn.GRU's recurrence over sequences in lockstep (lockstep_plan's layout): inputs xs[base[k]·F + f·A[k] + c],
    states hs[base[k]·H + j·A[k] + c] (after step k), from h0[j·A[0] + c]; gates[base[k]·4H + (g·H + j)·A[k] + c] =
    (r, z, n, W_hn·h + b_hn)[g] for the reverse pass. The work is `_forward_units`'s, compiled for each size the
    GRU family has (H = 8 or 2 units, F = 2 inputs) with the sizes as constants."""
    H = w_hh.shape[1]
    if w_ih.shape[1] != 2 or (H != 8 and H != 2):
        raise ValueError("the compiled GRU has 8 or 2 hidden units and 2 inputs")
    if H == 8:
        _forward_units(ZEROS_8, ZEROS_2, xs, A, base, h0, w_ih, w_hh, b_ih, b_hh, hs, gates)
    else:
        _forward_units(ZEROS_2, ZEROS_2, xs, A, base, h0, w_ih, w_hh, b_ih, b_hh, hs, gates)


@njit(cache=True, error_model="numpy", fastmath={"contract"})
def _forward_units(units, inputs, xs, A, base, h0, w_ih, w_hh, b_ih, b_hh, hs, gates):
    """_gru_forward with len(units) = H hidden units and len(inputs) = F inputs: one loop per unit and step,
    innermost over the running sequences, whose body holds the unit's whole cell (the 3 pre-activations summed
    over the F inputs and H previous states in nn.GRU's order, its sigmoids, tanh and new state) with the loops over
    inputs and units unrolled (their lengths are constants when `units` and `inputs` are tuples): the sums stay in
    registers and the loop vectorises over sequences. The sigmoids and tanh are engine/vec_math.py's."""
    H = len(units)
    n_f = len(inputs)
    C = A[0] if len(A) else 0
    pre = np.empty(3 * H * C)
    for k in range(len(A)):
        a = A[k]
        pa = C if k == 0 else A[k - 1]
        x2 = xs[base[k] * n_f:base[k + 1] * n_f].reshape((n_f, a))  # 2-D views: every index provably >= 0
        h2 = hs[base[k] * H:base[k + 1] * H].reshape((H, a))
        g2 = gates[base[k] * 4 * H:base[k + 1] * 4 * H].reshape((4 * H, a))
        p2 = h0.reshape((H, C)) if k == 0 else hs[base[k - 1] * H:base[k] * H].reshape((H, pa))
        pre2 = pre[:3 * H * a].reshape((3 * H, a))  # pre-activations of r, z and W_in·x + b_in
        for j in range(H):
            br = b_ih[j] + b_hh[j]
            bz = b_ih[H + j] + b_hh[H + j]
            bi = b_ih[2 * H + j]
            bh = b_hh[2 * H + j]
            # the unit's weights as tuples (values, not memory: no store in the loop can change them, so the loop
            # needs no run-time overlap checks, of which LLVM allows too few to vectorise it otherwise)
            vr = _row(inputs, w_ih, j)
            vz = _row(inputs, w_ih, H + j)
            vi = _row(inputs, w_ih, 2 * H + j)
            ur = _row(units, w_hh, j)
            uz = _row(units, w_hh, H + j)
            un = _row(units, w_hh, 2 * H + j)
            for c in range(a):
                sr = br
                sz = bz
                si = bi
                sh = bh
                for f in range(n_f):
                    x = x2[f, c]
                    sr += vr[f] * x
                    sz += vz[f] * x
                    si += vi[f] * x
                for i in range(H):
                    h = p2[i, c]
                    sr += ur[i] * h
                    sz += uz[i] * h
                    sh += un[i] * h
                pre2[j, c] = sr
                pre2[H + j, c] = sz
                pre2[2 * H + j, c] = si
                g2[3 * H + j, c] = sh
        # the nonlinearities over the whole step, each a loop of its own: exp's long chain of dependent operations
        # then overlaps across cells (inside the loop above it stalled it)
        g_k = gates[base[k] * 4 * H:base[k + 1] * 4 * H]
        pre_k = pre[:3 * H * a]
        sigmoid_vec(pre_k[:2 * H * a], g_k[:2 * H * a])  # r and z of every unit (not in place: see vec_math)
        r_all = g_k[:H * a]
        ah_all = g_k[3 * H * a:4 * H * a]
        pre_n = pre_k[2 * H * a:3 * H * a]
        for c in range(H * a):
            pre_n[c] += r_all[c] * ah_all[c]
        tanh_vec(pre_n, g_k[2 * H * a:3 * H * a])
        for j in range(H):
            for c in range(a):
                z = g2[H + j, c]
                h2[j, c] = (1.0 - z) * g2[2 * H + j, c] + z * p2[j, c]


@njit(cache=True, fastmath={"reassoc", "contract"})
def _weight_grads(units, inputs, d, S, xa, hp, gw_ih, gw_hh, gb_ih, gb_hh):
    """The weight gradients summed over the S cells of a reverse pass: d[(g·H + j)·S + c] = (dr, dz, dn, dah)[g] of
    unit j at cell c, which started from the state hp[i·S + c] with inputs xa[f·S + c] (len(units) = H units,
    len(inputs) = F inputs). One loop over the cells per gate row, holding that row's 2 + F + H sums in registers
    (the loops over inputs and units unroll). Kept apart because it alone may reassociate (the sums over cells
    vectorise; their order moves only the last bits of the group's gradient), while the per-card arithmetic
    elsewhere keeps its order."""
    H = len(units)
    n_f = len(inputs)
    d2 = d.reshape((4 * H, S))
    x2 = xa.reshape((n_f, S))
    h2 = hp.reshape((H, S))
    for g in range(3 * H):
        gh = g + H if g >= 2 * H else g  # rows dr, dz, dn: input weights and b_ih; rows dr, dz, dah: hidden, b_hh
        si = 0.0
        sh = 0.0
        sx = inputs
        su = units
        for c in range(S):
            di = d2[g, c]
            dh = d2[gh, c]
            si += di
            sh += dh
            for f in range(n_f):
                sx = tuple_setitem(sx, f, sx[f] + di * x2[f, c])
            for i in range(H):
                su = tuple_setitem(su, i, su[i] + dh * h2[i, c])
        gb_ih[g] += si
        gb_hh[g] += sh
        for f in range(n_f):
            gw_ih[g, f] += sx[f]
        for i in range(H):
            gw_hh[g, i] += su[i]


@njit(cache=True)
def _gru_backward(xs, A, base, h0, w_hh, hs, gates, gout, gw_ih, gw_hh, gb_ih, gb_hh, gh0):
    """Backpropagation through time of `_gru_forward` in the same lockstep layout: given d loss / d hs (gout, laid out
    as hs), ADDS the weight gradients and writes d loss / d h0 into gh0 (as h0; skipped when gh0 is empty). The
    work is `_backward_units`'s, compiled for each size the GRU family has (as `_gru_forward`)."""
    H = w_hh.shape[1]
    if gw_ih.shape[1] != 2 or (H != 8 and H != 2):
        raise ValueError("the compiled GRU has 8 or 2 hidden units and 2 inputs")
    if H == 8:
        _backward_units(ZEROS_8, xs, A, base, h0, w_hh, hs, gates, gout, gw_ih, gw_hh, gb_ih, gb_hh, gh0)
    else:
        _backward_units(ZEROS_2, xs, A, base, h0, w_hh, hs, gates, gout, gw_ih, gw_hh, gb_ih, gb_hh, gh0)


@njit(cache=True, error_model="numpy", fastmath={"contract"})
def _backward_units(units, xs, A, base, h0, w_hh, hs, gates, gout, gw_ih, gw_hh, gb_ih, gb_hh, gh0):
    """_gru_backward with len(units) = H hidden units. The carried d loss / d h of sequence c is dh[j·C + c]
    (C = A[0]): a sequence joins when the backward pass reaches its last step, its slot still zero. Per step: the
    gate gradients of each unit (one loop over the running sequences, gout added on the way), then d loss / d h of
    the previous state (its sums in the one-card kernel's order, the first term stored instead of added to a zeroed
    buffer), which becomes the carried dh by swapping the two buffers, not by copying. The gate gradients, the
    states they multiply and the inputs are gathered over all cells [W][S] as the pass goes, and the weight
    gradients summed once at the end (`_weight_grads`)."""
    n_f = gw_ih.shape[1]
    H = len(units)
    C = A[0] if len(A) else 0
    S = base[-1] if len(A) else 0
    dh = np.zeros(H * C)
    dprev = np.zeros(H * C)
    d = np.empty(4 * H * S)  # (dr, dz, dn, dah)[g] of unit j at cell (k, c): d[(g·H + j)·S + base[k] + c]
    hp = np.empty(H * S)  # the state each cell starts from
    xa = np.empty(n_f * S)
    for k in range(len(A) - 1, -1, -1):
        a = A[k]
        b = base[k]
        x_k = xs[b * n_f:base[k + 1] * n_f]
        g_k = gates[b * 4 * H:base[k + 1] * 4 * H]
        o_k = gout[b * H:base[k + 1] * H]
        p_k = h0 if k == 0 else hs[base[k - 1] * H:b * H]
        pa = C if k == 0 else A[k - 1]
        for f in range(n_f):  # (explicit loops: numba's slice assignment costs far more on short slices)
            xa_f = xa[f * S + b:f * S + b + a]
            x_f = x_k[f * a:(f + 1) * a]
            for c in range(a):
                xa_f[c] = x_f[c]
        for j in range(H):
            dhj = dh[j * C:j * C + a]
            oj = o_k[j * a:(j + 1) * a]
            pj = p_k[j * pa:j * pa + a]
            hpj = hp[j * S + b:j * S + b + a]
            gr = g_k[j * a:(j + 1) * a]
            gz = g_k[(H + j) * a:(H + j + 1) * a]
            gn = g_k[(2 * H + j) * a:(2 * H + j + 1) * a]
            gh = g_k[(3 * H + j) * a:(3 * H + j + 1) * a]
            dr = d[j * S + b:j * S + b + a]
            dz = d[(H + j) * S + b:(H + j) * S + b + a]
            dn = d[(2 * H + j) * S + b:(2 * H + j) * S + b + a]
            dah = d[(3 * H + j) * S + b:(3 * H + j) * S + b + a]
            for c in range(a):
                dhc = dhj[c] + oj[c]
                dhj[c] = dhc
                hpj[c] = pj[c]
                z = gz[c]
                n = gn[c]
                r = gr[c]
                dn[c] = dhc * (1.0 - z) * (1.0 - n * n)
                dz[c] = dhc * (pj[c] - n) * z * (1.0 - z)
                dr[c] = dn[c] * gh[c] * r * (1.0 - r)
                dah[c] = dn[c] * r
        for j in range(H):
            dpj = dprev[j * C:j * C + a]
            dhj = dh[j * C:j * C + a]
            gz = g_k[(H + j) * a:(H + j + 1) * a]
            if j == 0:
                for c in range(a):
                    dpj[c] = dhj[c] * gz[c]
            else:
                for c in range(a):
                    dpj[c] += dhj[c] * gz[c]
            dr = d[j * S + b:j * S + b + a]
            dz = d[(H + j) * S + b:(H + j) * S + b + a]
            dah = d[(3 * H + j) * S + b:(3 * H + j) * S + b + a]
            for i in range(H):
                ur = w_hh[j, i]
                uz = w_hh[H + j, i]
                un = w_hh[2 * H + j, i]
                dpi = dprev[i * C:i * C + a]
                if j == 0 and i > 0:  # the first term of a sum that starts at zero (0 + t = t)
                    for c in range(a):
                        dpi[c] = ur * dr[c] + uz * dz[c] + un * dah[c]
                else:
                    for c in range(a):
                        dpi[c] += ur * dr[c] + uz * dz[c] + un * dah[c]
        dh, dprev = dprev, dh  # (slots not yet running stay zero in both)
    _weight_grads(units, ZEROS_2, d, S, xa, hp, gw_ih, gw_hh, gb_ih, gb_hh)
    if len(gh0):
        for i in range(len(gh0)):  # a loop: a slice assignment's shape check compiles numba's error message (~3 s)
            gh0[i] = dh[i]


@njit(cache=True)
def unflatten(theta, H, F):
    """Views (w_ih [3H, F], w_hh [3H, H], b_ih [3H], b_hh [3H], fc_w [1, H], fc_b [1]) of a flat parameter vector."""
    a = 3 * H * F
    b = a + 3 * H * H
    return (theta[:a].reshape((3 * H, F)), theta[a:b].reshape((3 * H, H)), theta[b:b + 3 * H],
            theta[b + 3 * H:b + 6 * H], theta[b + 6 * H:b + 7 * H].reshape((1, H)), theta[b + 7 * H:b + 7 * H + 1])


@njit(cache=True, error_model="numpy")
def _heads(head, factor, decay, zt, t_idx, t_dt, t_y, t_w, p_out):
    """P(recall) of every target from its logit zt[q] (target t_idx[q]) into p_out, Σ weight·BCE (summed in q's
    order) returned, and d loss / d logit written over zt. Each kind of transcendental runs over all the group's
    targets in one loop of vec_math's vectorisable exp / log (several targets per instruction, within 1 ulp of the C
    library's) instead of the C library's, one target at a time; the cheap arithmetic between them in plain loops.
    GRU-P: p = 1 / (1 + e^−z); GRU: S = e^z, p = (1 + factor·t/S)^decay (decay −0.5: 1/√u, else libm's pow).
    The BCE's logarithm is ln p or ln(1 − p) (1 − p is exact for p ≥ ½, so this is libm's log1p(−p) to ~1e−16)
    with kernel_math.bce's clamps."""
    n_t = len(zt)
    a = np.empty(n_t)
    e = np.empty(n_t)
    pr = np.empty(n_t)
    if head == HEAD_SIGMOID_CELL:
        for q in range(n_t):
            a[q] = -zt[q]
        exp_vec(a, e)
        for q in range(n_t):
            p = 1.0 / (1.0 + e[q])
            pr[q] = p
            zt[q] = p * (1.0 - p)  # dp/dz for now
    else:  # S = exp(z), power forgetting curve
        exp_vec(zt, e)
        for q in range(n_t):
            a[q] = t_dt[t_idx[q]]
        for q in range(n_t):
            u = 1.0 + factor * a[q] / e[q]
            p = 1.0 / math.sqrt(u) if decay == -0.5 else u ** decay
            pr[q] = p
            zt[q] = decay * p / u * (-factor * a[q] / e[q])
    for q in range(n_t):
        j = t_idx[q]
        p_out[j] = pr[q]
        a[q] = pr[q] if t_y[j] > 0.5 else 1.0 - pr[q]
    log_vec(a, e)
    loss = 0.0
    for q in range(n_t):
        j = t_idx[q]
        p = pr[q]
        wt = t_w[j]
        loss += -wt * max(e[q], BCE_LOG_FLOOR) if a[q] > 0.0 else -wt * BCE_LOG_FLOOR
        zt[q] *= wt * (p - t_y[j]) / max(p * (1.0 - p), BCE_GRAD_EPS)
    return loss


@njit(cache=True)
def gru_cards_loss(model, layout, cards, theta, want, grad, p_out):
    """neural/card_fit.py's card_loss for the GRU family, model = (head kind, units_of(hidden size), factor, decay):
    Σ weight·BCE over every target of `cards`, each target's P(recall) written to p_out[its index]; with `want`, the
    loss's gradient is ADDED into grad (flat, like theta), from one forward and one reverse pass over the cards in
    lockstep (longest first, lockstep_plan's layout)."""
    head, units, factor, decay = model
    H = len(units)  # a constant: this loss compiles for one hidden size (units_of)
    feats, c_start, c_steps, c_tfirst, c_count, t_pos, t_dt, t_g, t_y, t_w = layout
    n_f = feats.shape[1]
    if n_f != 2:
        raise ValueError("the compiled GRU has 2 inputs")
    w_ih, w_hh, b_ih, b_hh, fc_w, fc_b = unflatten(theta, H, n_f)
    n_c = len(cards)
    lengths = np.empty(n_c, dtype=np.int64)
    for k in range(n_c):
        lengths[k] = c_steps[cards[k]]
    slot_card = cards[stable_argsort_small(lengths, True)]  # slot c runs card slot_card[c], longest first
    n_t = 0
    for c in range(n_c):
        lengths[c] = c_steps[slot_card[c]]
        n_t += c_count[slot_card[c]]
    A, base = lockstep_plan(lengths)
    n_s = base[-1]
    xs = np.empty(n_s * n_f)
    for c in range(n_c):
        x0 = c_start[slot_card[c]]
        for k in range(lengths[c]):
            for f in range(n_f):
                xs[base[k] * n_f + f * A[k] + c] = feats[x0 + k, f]
    hs = np.empty(n_s * H)
    gates = np.empty(n_s * 4 * H)
    _forward_units(units, ZEROS_2, xs, A, base, np.zeros(H * n_c), w_ih, w_hh, b_ih, b_hh, hs, gates)
    gout = np.zeros(n_s * H if want else 0)
    t_idx = np.empty(n_t, dtype=np.int64)  # the group's targets, slot by slot
    t_at = np.empty(n_t, dtype=np.int64)  # where its final state starts in hs (−1: a step of its own, see below)
    t_stride = np.empty(n_t, dtype=np.int64)  # ... and the stride between its H values
    t_prev = np.empty(n_t, dtype=np.int64)  # own-step targets: the cell of the state it starts from (−1: zero)
    t_pstride = np.empty(n_t, dtype=np.int64)
    n_own = 0
    q = 0
    for c in range(n_c):
        card = slot_card[c]
        for j in range(c_tfirst[card], c_tfirst[card] + c_count[card]):
            t_idx[q] = j
            step = t_pos[j] - 1  # the card step that ends the target's history
            if step < lengths[c]:
                t_at[q] = base[step] * H + c
                t_stride[q] = A[step]
            if head == HEAD_SIGMOID_CELL:
                # GRU-P's last step is (the target's delta_t, its last rating): the card's own step `step` when
                # those are the inputs there (always, for targets built by features.py), else a step of its own.
                xr = c_start[card] + step
                if step >= lengths[c] or feats[xr, 0] != t_dt[j] or feats[xr, 1] != t_g[j]:
                    t_at[q] = -1
                    t_prev[n_own] = base[step - 1] * H + c if step >= 1 else -1
                    t_pstride[n_own] = A[step - 1] if step >= 1 else 0
                    n_own += 1
            q += 1
    g_ih, g_hh, g_bih, g_bhh, g_fcw, g_fcb = unflatten(grad if want else np.zeros(len(theta)), H, n_f)
    # targets whose last step is not on their card's sequence: one GRU step each, all in lockstep
    A_t = np.full(1 if n_own else 0, n_own)
    base_t = np.array([0, n_own])
    xt = np.empty(n_f * n_own)
    ht = np.zeros(H * n_own)
    r = 0
    for q in range(n_t):
        if t_at[q] < 0:
            xt[r] = t_dt[t_idx[q]]
            xt[n_own + r] = t_g[t_idx[q]]
            if t_prev[r] >= 0:
                for i in range(H):
                    ht[i * n_own + r] = hs[t_prev[r] + i * t_pstride[r]]
            r += 1
    hs_t = np.empty(H * n_own)
    gates_t = np.empty(4 * H * n_own)
    _forward_units(units, ZEROS_2, xt, A_t, base_t, ht, w_ih, w_hh, b_ih, b_hh, hs_t, gates_t)
    gout_t = np.zeros(H * n_own)
    # the head, in three passes so that no loop picks between arrays per target: each target's logit fc(h) ...
    zt = np.empty(n_t)
    r = 0
    for q in range(n_t):
        if t_at[q] >= 0:
            z = fc_b[0]
            for i in range(H):
                z += fc_w[0, i] * hs[t_at[q] + i * t_stride[q]]
        else:
            z = fc_b[0]
            for i in range(H):
                z += fc_w[0, i] * hs_t[r + i * n_own]
            r += 1
        zt[q] = z
    # ... P(recall), the loss and d loss / d logit, over all the targets at once (`_heads`)
    loss = _heads(head, factor, decay, zt, t_idx, t_dt, t_y, t_w, p_out)
    # ... and its gradient into fc and into the final states
    if want:
        r = 0
        for q in range(n_t):
            gz = zt[q]
            g_fcb[0] += gz
            if t_at[q] >= 0:
                at = t_at[q]
                st = t_stride[q]
                for i in range(H):
                    g_fcw[0, i] += gz * hs[at + i * st]
                    gout[at + i * st] += gz * fc_w[0, i]
            else:
                for i in range(H):
                    g_fcw[0, i] += gz * hs_t[r + i * n_own]
                    gout_t[r + i * n_own] += gz * fc_w[0, i]
                r += 1
    if want and n_own:
        gh = np.empty(H * n_own)
        _backward_units(units, xt, A_t, base_t, ht, w_hh, hs_t, gates_t, gout_t, g_ih, g_hh, g_bih, g_bhh, gh)
        for r in range(n_own):
            if t_prev[r] >= 0:
                for i in range(H):
                    gout[t_prev[r] + i * t_pstride[r]] += gh[i * n_own + r]
    if want:
        _backward_units(units, xs, A, base, np.zeros(H * n_c), w_hh, hs, gates, gout, g_ih, g_hh, g_bih, g_bhh,
                        np.empty(0))
    return loss
