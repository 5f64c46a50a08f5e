"""The compiled one-layer GRU of GRU and GRU-P (models/gru_p.py): nn.GRU's exact recurrence (gate order r, z, n)
and its reverse pass in numba, over card sequences read in place (no padding, no copies).

Why compiled: these networks are tiny (2→8 and 2→2 units), so torch's per-operation cost, not arithmetic, decided
their speed: its CPU GRU records about ten autograd nodes per time step, and every optimizer step of torch's AdamW
and every parameter conversion costs tens of microseconds over ~12,000 steps per 100k reviews. Here:
- `gru_cards_loss`: predictions, Σ weight·BCE and the gradient of every parameter for a group of whole cards, from
  one forward and one reverse pass per card; models/card_fit.py runs the whole fine-tune with it in one call;
- models/gru_torch.py wraps the same recurrence as a torch autograd Function (`GRUSeqs`), for the autograd paths
  (`predict_batch`, tests).
All are tested equal (1e-6) to torch's nn.GRU run upstream's way, one padded history per target.

The card layout is card_net.CardSet.layout() (models/card_fit.py describes it). Parameters are passed flat
(w_ih, w_hh, b_ih, b_hh, fc_w, fc_b concatenated; `unflatten` makes the views).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from models.kernel_math import bce

HEAD_SIGMOID_CELL = 0  # GRU-P: one more GRU step with the target's own (delta_t, last rating), p = σ(fc(h))
HEAD_POWER_CURVE = 1  # GRU: S = exp(fc(h)), p = (1 + factor·t/S)^decay


@njit(cache=True)
def _gru_forward(x, x_start, off, h0, w_ih, w_hh, b_ih, b_hh, out, gates):
    """Sequence c reads inputs x[x_start[c] + k] and writes out[off[c] + k] = h after its step k, from h0[c];
    gates[off[c] + k] = (r, z, n, W_hn·h + b_hn) for the reverse pass."""
    n_f = x.shape[1]
    H = w_hh.shape[1]
    h = np.zeros(H)
    for c in range(len(off) - 1):
        for j in range(H):
            h[j] = h0[c, j]
        for row in range(off[c], off[c + 1]):
            xr = x_start[c] + row - off[c]
            for j in range(H):
                ar = b_ih[j] + b_hh[j]
                az = b_ih[H + j] + b_hh[H + j]
                ai = b_ih[2 * H + j]
                ah = b_hh[2 * H + j]
                for f in range(n_f):
                    xf = x[xr, f]
                    ar += w_ih[j, f] * xf
                    az += w_ih[H + j, f] * xf
                    ai += w_ih[2 * H + j, f] * xf
                for i in range(H):
                    hi = h[i]
                    ar += w_hh[j, i] * hi
                    az += w_hh[H + j, i] * hi
                    ah += w_hh[2 * H + j, i] * hi
                r = 1.0 / (1.0 + math.exp(-ar))
                z = 1.0 / (1.0 + math.exp(-az))
                n = math.tanh(ai + r * ah)
                gates[row, j] = r
                gates[row, H + j] = z
                gates[row, 2 * H + j] = n
                gates[row, 3 * H + j] = ah
                out[row, j] = (1.0 - z) * n + z * h[j]
            for j in range(H):
                h[j] = out[row, j]


@njit(cache=True)
def _gru_backward(x, x_start, off, h0, w_hh, out, gates, gout, gw_ih, gw_hh, gb_ih, gb_hh, gh0):
    """Backpropagation through time of `_gru_forward`: accumulates the weight gradients and writes d loss / d h0,
    given d loss / d out."""
    n_f = x.shape[1]
    H = w_hh.shape[1]
    dh = np.zeros(H)
    dprev = np.zeros(H)
    hp = np.zeros(H)
    for c in range(len(off) - 1):
        dh[:] = 0.0
        for row in range(off[c + 1] - 1, off[c] - 1, -1):
            xr = x_start[c] + row - off[c]
            for j in range(H):
                dh[j] += gout[row, j]
                hp[j] = out[row - 1, j] if row > off[c] else h0[c, j]
                dprev[j] = 0.0
            for j in range(H):
                r = gates[row, j]
                z = gates[row, H + j]
                n = gates[row, 2 * H + j]
                ah = gates[row, 3 * H + j]
                dn = dh[j] * (1.0 - z) * (1.0 - n * n)
                dz = dh[j] * (hp[j] - n) * z * (1.0 - z)
                dr = dn * ah * r * (1.0 - r)
                dah = dn * r
                dprev[j] += dh[j] * z
                gb_ih[j] += dr
                gb_ih[H + j] += dz
                gb_ih[2 * H + j] += dn
                gb_hh[j] += dr
                gb_hh[H + j] += dz
                gb_hh[2 * H + j] += dah
                for f in range(n_f):
                    xf = x[xr, f]
                    gw_ih[j, f] += dr * xf
                    gw_ih[H + j, f] += dz * xf
                    gw_ih[2 * H + j, f] += dn * xf
                for i in range(H):
                    gw_hh[j, i] += dr * hp[i]
                    gw_hh[H + j, i] += dz * hp[i]
                    gw_hh[2 * H + j, i] += dah * hp[i]
                    dprev[i] += w_hh[j, i] * dr + w_hh[H + j, i] * dz + w_hh[2 * H + j, i] * dah
            for j in range(H):
                dh[j] = dprev[j]
        for j in range(H):
            gh0[c, j] = dh[j]


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
    gradient is ADDED into grad (flat, like theta), from one forward and one reverse pass over every card."""
    head, H, factor, decay = model
    feats, c_start, c_steps, c_tfirst, c_count, t_pos, t_dt, t_g, t_y, t_w = layout
    w_ih, w_hh, b_ih, b_hh, fc_w, fc_b = unflatten(theta, H, feats.shape[1])
    n_c = len(cards)
    off = np.zeros(n_c + 1, dtype=np.int64)
    x_start = np.empty(n_c, dtype=np.int64)
    n_t = 0
    for k in range(n_c):
        x_start[k] = c_start[cards[k]]
        off[k + 1] = off[k] + c_steps[cards[k]]
        n_t += c_count[cards[k]]
    n_s = off[n_c]
    out = np.empty((n_s, H))
    gates = np.empty((n_s, 4 * H))
    h0 = np.zeros((n_c, H))
    _gru_forward(feats, x_start, off, h0, w_ih, w_hh, b_ih, b_hh, out, gates)
    gout = np.zeros((n_s if want else 0, H))
    t_idx = np.empty(n_t, dtype=np.int64)  # the group's targets, card by card
    t_row = np.empty(n_t, dtype=np.int64)  # the row of `out` holding each target's final state (−1: see below)
    t_prev = np.empty(n_t, dtype=np.int64)  # own-step targets: the row of the state it starts from (−1: zero)
    n_own = 0
    q = 0
    for k in range(n_c):
        c = cards[k]
        for j in range(c_tfirst[c], c_tfirst[c] + c_count[c]):
            t_idx[q] = j
            step = t_pos[j] - 1  # the card step that ends the target's history
            t_row[q] = off[k] + step
            if head == HEAD_SIGMOID_CELL:
                # GRU-P's last step is (the target's delta_t, its last rating): the card's own step `step` when
                # those are the inputs there (always, for targets built by features.py), else a step of its own.
                xr = x_start[k] + step
                if step >= c_steps[c] or feats[xr, 0] != t_dt[j] or feats[xr, 1] != t_g[j]:
                    t_row[q] = -1
                    t_prev[n_own] = off[k] + step - 1 if step >= 1 else -1
                    n_own += 1
            q += 1
    g_ih, g_hh, g_bih, g_bhh, g_fcw, g_fcb = unflatten(grad if want else np.zeros(len(theta)), H, feats.shape[1])
    # targets whose last step is not on their card's sequence: one batched GRU step each
    xt = np.empty((n_own, 2))
    ht = np.zeros((n_own, H))
    r = 0
    for q in range(n_t):
        if t_row[q] < 0:
            xt[r, 0] = t_dt[t_idx[q]]
            xt[r, 1] = t_g[t_idx[q]]
            if t_prev[r] >= 0:
                for i in range(H):
                    ht[r, i] = out[t_prev[r], i]
            r += 1
    off_t = np.arange(n_own + 1)
    out_t = np.empty((n_own, H))
    gates_t = np.empty((n_own, 4 * H))
    _gru_forward(xt, off_t[:-1], off_t, ht, w_ih, w_hh, b_ih, b_hh, out_t, gates_t)
    gout_t = np.zeros((n_own, H))
    loss = 0.0
    r = 0
    for q in range(n_t):
        j = t_idx[q]
        own = t_row[q] < 0
        h = out_t[r] if own else out[t_row[q]]
        z = fc_b[0]
        for i in range(H):
            z += fc_w[0, i] * h[i]
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
        if want:
            gz = gp * dp_dz
            g_fcb[0] += gz
            for i in range(H):
                g_fcw[0, i] += gz * h[i]
                if own:
                    gout_t[r, i] = gz * fc_w[0, i]
                else:
                    gout[t_row[q], i] += gz * fc_w[0, i]
        if own:
            r += 1
    if want and n_own:
        gh = np.zeros((n_own, H))
        _gru_backward(xt, off_t[:-1], off_t, ht, w_hh, out_t, gates_t, gout_t, g_ih, g_hh, g_bih, g_bhh, gh)
        for r in range(n_own):
            if t_prev[r] >= 0:
                for i in range(H):
                    gout[t_prev[r], i] += gh[r, i]
    if want:
        _gru_backward(feats, x_start, off, h0, w_hh, out, gates, gout, g_ih, g_hh, g_bih, g_bhh, np.zeros((n_c, H)))
    return loss
