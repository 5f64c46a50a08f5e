"""The compiled one-layer GRU of GRU and GRU-P (models/gru_p.py): nn.GRU's recurrence (gate order r, z, n) and its
reverse pass in numba, the cards of a group run side by side in lockstep.

Why compiled: these networks are tiny (2→8 and 2→2 units), so torch's per-operation cost, not arithmetic, decided
their speed: its CPU GRU records about ten autograd nodes per time step, and every optimizer step of torch's AdamW
and every parameter conversion costs tens of microseconds over ~12,000 steps per 100k reviews. Here:
- `gru_cards_loss`: predictions, Σ weight·BCE and the gradient of every parameter for a group of whole cards, from
  one forward and one reverse pass over the group; models/card_fit.py runs the whole fine-tune with it in one call;
- models/gru_torch.py wraps the same recurrence as a torch autograd Function (`GRUSeqs`), for the autograd paths
  (`predict_batch`, tests).
All are tested equal to torch's nn.GRU (1e-6 run upstream's way, one padded history per target; 1e-12 in float64
on single sequences, tests/test_gru_lockstep.py).

Why lockstep: one card at a time, every loop ran over the H = 8 (GRU: 2) hidden units, too short to vectorise, and
24 calls of the C library's exp / tanh per step (~6 and ~27 ns each) were most of the time. Now the cards of a
group are sorted longest first (`lockstep_plan`) and step k runs the A[k] cards still going, every quantity of the
step stored [unit][card] so that each loop is innermost over cards: contiguous, vectorised 4 doubles at a time
(AVX2). The gates' sigmoid and tanh are models/vec_math.py's vectorisable exp (within 1–4 ulp of the C library), the
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

The card layout is card_net.CardSet.layout() (models/card_fit.py describes it). Parameters are passed flat
(w_ih, w_hh, b_ih, b_hh, fc_w, fc_b concatenated; `unflatten` makes the views).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from models.kernel_math import bce, lockstep_plan
from models.vec_math import sigmoid_vec, tanh_vec

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


@njit(cache=True, error_model="numpy")
def _gru_forward(xs, A, base, h0, w_ih, w_hh, b_ih, b_hh, hs, gates):
    """nn.GRU's recurrence over sequences in lockstep (lockstep_plan's layout): inputs xs[base[k]·F + f·A[k] + c],
    states hs[base[k]·H + j·A[k] + c] (after step k), from h0[j·A[0] + c]; gates[base[k]·4H + (g·H + j)·A[k] + c] =
    (r, z, n, W_hn·h + b_hn)[g] for the reverse pass. Every loop is innermost over the running sequences, on slices
    (contiguous, provably in range: vectorised); the sigmoids and tanh of a whole step are models/vec_math.py's."""
    n_f = w_ih.shape[1]
    H = w_hh.shape[1]
    C = A[0] if len(A) else 0
    pre = np.empty(3 * H * C)  # a step's pre-activations of r, z (then sigmoid into gates) and of W_in·x + b_in
    for k in range(len(A)):
        a = A[k]
        x_k = xs[base[k] * n_f:base[k + 1] * n_f]
        h_k = hs[base[k] * H:base[k + 1] * H]
        g_k = gates[base[k] * 4 * H:base[k + 1] * 4 * H]
        p_k = h0 if k == 0 else hs[base[k - 1] * H:base[k] * H]
        pa = C if k == 0 else A[k - 1]
        for j in range(H):
            ar = pre[j * a:(j + 1) * a]
            az = pre[(H + j) * a:(H + j + 1) * a]
            ai = pre[(2 * H + j) * a:(2 * H + j + 1) * a]
            ah = g_k[(3 * H + j) * a:(3 * H + j + 1) * a]
            br = b_ih[j] + b_hh[j]
            bz = b_ih[H + j] + b_hh[H + j]
            bi = b_ih[2 * H + j]
            bh = b_hh[2 * H + j]
            for c in range(a):
                ar[c] = br
                az[c] = bz
                ai[c] = bi
                ah[c] = bh
            for f in range(n_f):
                wr = w_ih[j, f]
                wz = w_ih[H + j, f]
                wi = w_ih[2 * H + j, f]
                xf = x_k[f * a:(f + 1) * a]
                for c in range(a):
                    ar[c] += wr * xf[c]
                    az[c] += wz * xf[c]
                    ai[c] += wi * xf[c]
            for i in range(H):
                ur = w_hh[j, i]
                uz = w_hh[H + j, i]
                un = w_hh[2 * H + j, i]
                hi = p_k[i * pa:i * pa + a]
                for c in range(a):
                    ar[c] += ur * hi[c]
                    az[c] += uz * hi[c]
                    ah[c] += un * hi[c]
        sigmoid_vec(pre[:2 * H * a], g_k[:2 * H * a])  # r and z of every unit (not in place: see vec_math)
        r_all = g_k[:H * a]
        ah_all = g_k[3 * H * a:4 * H * a]
        pre_n = pre[2 * H * a:3 * H * a]
        for c in range(H * a):
            pre_n[c] += r_all[c] * ah_all[c]
        tanh_vec(pre_n, g_k[2 * H * a:3 * H * a])
        for j in range(H):
            gz = g_k[(H + j) * a:(H + j + 1) * a]
            gn = g_k[(2 * H + j) * a:(2 * H + j + 1) * a]
            hj = h_k[j * a:(j + 1) * a]
            pj = p_k[j * pa:j * pa + a]
            for c in range(a):
                hj[c] = (1.0 - gz[c]) * gn[c] + gz[c] * pj[c]


@njit(cache=True, fastmath={"reassoc"})
def _weight_grads(d, a, x_k, p_k, pa, gw_ih, gw_hh, gb_ih, gb_hh):
    """The weight gradients summed over cells: d[(g·H + j)·a + c] = (dr, dz, dn, dah)[g] of unit j at cell c, which
    started from the state p_k[i·pa + c] with inputs x_k[f·a + c]. Kept apart because it alone may reassociate (the
    sums over cells vectorise; their order moves only the last bits of the group's gradient), while the per-card
    arithmetic elsewhere keeps its order."""
    H = gw_hh.shape[1]
    n_f = gw_ih.shape[1]
    for g in range(3 * H):
        di = d[g * a:(g + 1) * a]  # rows dr, dz, dn: input weights and b_ih
        gh = g + H if g >= 2 * H else g
        dh = d[gh * a:(gh + 1) * a]  # rows dr, dz, dah: hidden weights and b_hh
        s = 0.0
        for c in range(a):
            s += di[c]
        gb_ih[g] += s
        s = 0.0
        for c in range(a):
            s += dh[c]
        gb_hh[g] += s
        for f in range(n_f):
            xf = x_k[f * a:(f + 1) * a]
            s = 0.0
            for c in range(a):
                s += di[c] * xf[c]
            gw_ih[g, f] += s
        for i in range(H):
            hi = p_k[i * pa:i * pa + a]
            s = 0.0
            for c in range(a):
                s += dh[c] * hi[c]
            gw_hh[g, i] += s


@njit(cache=True)
def _gru_backward(xs, A, base, h0, w_hh, hs, gates, gout, gw_ih, gw_hh, gb_ih, gb_hh, gh0):
    """Backpropagation through time of `_gru_forward` in the same lockstep layout: given d loss / d hs (gout, laid out
    as hs), ADDS the weight gradients and writes d loss / d h0 into gh0 (as h0; skipped when gh0 is empty). The
    carried d loss / d h of sequence c is dh[j·C + c] (C = A[0]): a sequence joins when the backward pass reaches its
    last step, its slot still zero. The gate gradients, the states they multiply and the inputs are gathered over
    all cells [W][S] as the pass goes, and the weight gradients summed once at the end, over long vectors."""
    n_f = gw_ih.shape[1]
    H = w_hh.shape[1]
    C = A[0] if len(A) else 0
    S = base[-1] if len(A) else 0
    dh = np.zeros(H * C)
    dprev = np.empty(H * C)
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
            for c in range(a):
                dhj[c] += oj[c]
        for j in range(H):
            dhj = dh[j * C:j * C + a]
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
                hpj[c] = pj[c]
                z = gz[c]
                n = gn[c]
                r = gr[c]
                dn[c] = dhj[c] * (1.0 - z) * (1.0 - n * n)
                dz[c] = dhj[c] * (pj[c] - n) * z * (1.0 - z)
                dr[c] = dn[c] * gh[c] * r * (1.0 - r)
                dah[c] = dn[c] * r
        for j in range(H):
            dpj = dprev[j * C:j * C + a]
            for c in range(a):
                dpj[c] = 0.0
        for j in range(H):
            dpj = dprev[j * C:j * C + a]
            dhj = dh[j * C:j * C + a]
            gz = g_k[(H + j) * a:(H + j + 1) * a]
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
                for c in range(a):
                    dpi[c] += ur * dr[c] + uz * dz[c] + un * dah[c]
        for j in range(H):
            dhj = dh[j * C:j * C + a]
            dpj = dprev[j * C:j * C + a]
            for c in range(a):
                dhj[c] = dpj[c]
    _weight_grads(d, S, xa, hp, S, gw_ih, gw_hh, gb_ih, gb_hh)
    if len(gh0):
        gh0[:] = dh


@njit(cache=True)
def unflatten(theta, H, F):
    """Views (w_ih [3H, F], w_hh [3H, H], b_ih [3H], b_hh [3H], fc_w [1, H], fc_b [1]) of a flat parameter vector."""
    a = 3 * H * F
    b = a + 3 * H * H
    return (theta[:a].reshape((3 * H, F)), theta[a:b].reshape((3 * H, H)), theta[b:b + 3 * H],
            theta[b + 3 * H:b + 6 * H], theta[b + 6 * H:b + 7 * H].reshape((1, H)), theta[b + 7 * H:b + 7 * H + 1])


@njit(cache=True)
def gru_cards_loss(model, layout, cards, theta, want, grad, p_out):
    """models/card_fit.py's card_loss for the GRU family, model = (head kind, hidden size, factor, decay): Σ weight·BCE
    over every target of `cards`, each target's P(recall) written to p_out[its index]; with `want`, the loss's
    gradient is ADDED into grad (flat, like theta), from one forward and one reverse pass over the cards in lockstep
    (longest first, lockstep_plan's layout)."""
    head, H, factor, decay = model
    feats, c_start, c_steps, c_tfirst, c_count, t_pos, t_dt, t_g, t_y, t_w = layout
    n_f = feats.shape[1]
    w_ih, w_hh, b_ih, b_hh, fc_w, fc_b = unflatten(theta, H, n_f)
    n_c = len(cards)
    lengths = np.empty(n_c, dtype=np.int64)
    for k in range(n_c):
        lengths[k] = c_steps[cards[k]]
    slot_card = cards[np.argsort(-lengths, kind="mergesort")]  # slot c runs card slot_card[c], longest first
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
    _gru_forward(xs, A, base, np.zeros(H * n_c), w_ih, w_hh, b_ih, b_hh, hs, gates)
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
    _gru_forward(xt, A_t, base_t, ht, w_ih, w_hh, b_ih, b_hh, hs_t, gates_t)
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
    # ... P(recall), the loss and d loss / d logit ...
    loss = 0.0
    for q in range(n_t):
        j = t_idx[q]
        z = zt[q]
        if head == HEAD_SIGMOID_CELL:
            p = 1.0 / (1.0 + math.exp(-z))
            dp_dz = p * (1.0 - p)
        else:  # S = exp(z), power forgetting curve
            s = math.exp(z)
            u = 1.0 + factor * t_dt[j] / s
            p = u ** decay
            dp_dz = decay * p / u * (-factor * t_dt[j] / s)
        p_out[j] = p
        lo, gp = bce(p, t_y[j], t_w[j])
        loss += lo
        zt[q] = gp * dp_dz
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
        _gru_backward(xt, A_t, base_t, ht, w_hh, hs_t, gates_t, gout_t, g_ih, g_hh, g_bih, g_bhh, gh)
        for r in range(n_own):
            if t_prev[r] >= 0:
                for i in range(H):
                    gout[t_prev[r] + i * t_pstride[r]] += gh[i * n_own + r]
    if want:
        _gru_backward(xs, A, base, np.zeros(H * n_c), w_hh, hs, gates, gout, g_ih, g_hh, g_bih, g_bhh, np.empty(0))
    return loss
