"""The Transformer's forward and reverse pass over one padded batch, compiled (numba, float64).

Why: the network (models/transformer.py) has 127 parameters (d_model 2, 2 heads of dim 1, ff 2), so in torch a
training step is ~100 tiny operations whose per-call overhead, plus the [B, heads, L, L] attention tensors written
and read back by every op, cost far more than the arithmetic. Here one call does the whole batch target by target
(every target's column is independent until the loss sum), keeping its L×L attention in cache.

What it computes, exactly as nn.Transformer(d_model=2, nhead=2, 1 + 1 layers, dim_feedforward=2) does with no
masks (post-norm layers, ReLU, the encoder's and decoder's final LayerNorms, eps 1e-5), + Linear(2→1), S = exp(·),
p = (1 + FACTOR·Δt/S)^DECAY, loss = Σ weight·BCE(p, y) with torch's clamps:
- padded positions are ordinary zero tokens: they attend and are attended to (upstream's no-mask quirk);
- head h uses component h of q, k, v (head_dim 1, so the 1/√head_dim scale is 1 and a score is q·k);
- dropout (training only) at all ten sites of the module, in the module's order: encoder self-attention weights
  [B, 2, L, L], after the self-attention [L, B, 2], inside the feed-forward [L, B, 2], after it [L, B, 2]; decoder
  self-attention weights [B, 2] (one target token), after it [B, 2], cross-attention weights [B, 2, L], after it,
  inside and after the feed-forward [B, 2]. The masks are 0/1 arrays drawn by torch or its emulation (models/transformer.py,
  `draw_masks`); a kept value is multiplied by 1/(1 − p) as F.dropout does;
- the decoder's target is one zero token, so its self-attention softmax is over one key (weight 1, zero gradient
  to q and k) and its in-projection sees only the bias.

The parameters are one flat float64 vector in the module's named_parameters() order (PARAMS; tests/ check it
against the module), the gradient likewise.

Why hand-written, not generated (issue #39): engine/traced.py generates a plug-in, its gradient and its lanes from a
recurrence of a few floats per card written in torch (init / step / curve, FSRS v1-v6, FSRS-7, SBD); a network's state
is a vector and its step matrix products (torch.stack, @, nn modules), which the tracer does not record (TraceError:
"torch op stack is not traced"), so there is nothing generated to compare. The network is written in torch once more
as the reference (neural/transformer_torch.py), which tests/test_transformer_compiled.py holds this kernel equal to,
and which the `--trainer upstream` path runs; the speed this kernel buys over it is measured above (and docs/speed.md:
22x upstream's own code on 36 users).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from models.gru_p import DECAY, FACTOR
from engine.jit import inlined
from engine.kernel_math import bce
from engine.vec_math import exp_nonpos

DROPOUT = 0.1
KEEP_SCALE = 1.0 / (1.0 - DROPOUT)  # F.dropout's scale of a kept value
LN_EPS = 1e-5  # nn.LayerNorm's default

_ENC, _DEC = "transformer.encoder.layers.0.", "transformer.decoder.layers.0."
PARAMS = [(n, s) for n, s in [
    (_ENC + "self_attn.in_proj_weight", (6, 2)), (_ENC + "self_attn.in_proj_bias", (6,)),
    (_ENC + "self_attn.out_proj.weight", (2, 2)), (_ENC + "self_attn.out_proj.bias", (2,)),
    (_ENC + "linear1.weight", (2, 2)), (_ENC + "linear1.bias", (2,)),
    (_ENC + "linear2.weight", (2, 2)), (_ENC + "linear2.bias", (2,)),
    (_ENC + "norm1.weight", (2,)), (_ENC + "norm1.bias", (2,)), (_ENC + "norm2.weight", (2,)),
    (_ENC + "norm2.bias", (2,)),
    ("transformer.encoder.norm.weight", (2,)), ("transformer.encoder.norm.bias", (2,)),
    (_DEC + "self_attn.in_proj_weight", (6, 2)), (_DEC + "self_attn.in_proj_bias", (6,)),
    (_DEC + "self_attn.out_proj.weight", (2, 2)), (_DEC + "self_attn.out_proj.bias", (2,)),
    (_DEC + "multihead_attn.in_proj_weight", (6, 2)), (_DEC + "multihead_attn.in_proj_bias", (6,)),
    (_DEC + "multihead_attn.out_proj.weight", (2, 2)), (_DEC + "multihead_attn.out_proj.bias", (2,)),
    (_DEC + "linear1.weight", (2, 2)), (_DEC + "linear1.bias", (2,)),
    (_DEC + "linear2.weight", (2, 2)), (_DEC + "linear2.bias", (2,)),
    (_DEC + "norm1.weight", (2,)), (_DEC + "norm1.bias", (2,)), (_DEC + "norm2.weight", (2,)),
    (_DEC + "norm2.bias", (2,)), (_DEC + "norm3.weight", (2,)), (_DEC + "norm3.bias", (2,)),
    ("transformer.decoder.norm.weight", (2,)), ("transformer.decoder.norm.bias", (2,)),
    ("fc.weight", (1, 2)), ("fc.bias", (1,)),
]]
_OFF, N_PARAMS = {}, 0
for _name, _shape in PARAMS:
    _OFF[_name] = N_PARAMS
    N_PARAMS += int(np.prod(_shape))

# offsets of the blocks the kernel reads (module-level ints: compile-time constants for numba)
E_IN, E_OUT, E_L1, E_L2 = (_OFF[_ENC + k] for k in ("self_attn.in_proj_weight", "self_attn.out_proj.weight",
                                                    "linear1.weight", "linear2.weight"))
E_N1, E_N2, E_NF = _OFF[_ENC + "norm1.weight"], _OFF[_ENC + "norm2.weight"], _OFF["transformer.encoder.norm.weight"]
D_SA, D_SOUT, D_CA, D_COUT, D_L1, D_L2 = (_OFF[_DEC + k] for k in (
    "self_attn.in_proj_weight", "self_attn.out_proj.weight", "multihead_attn.in_proj_weight",
    "multihead_attn.out_proj.weight", "linear1.weight", "linear2.weight"))
D_N1, D_N2, D_N3, D_NF = (_OFF[_DEC + "norm1.weight"], _OFF[_DEC + "norm2.weight"], _OFF[_DEC + "norm3.weight"],
                          _OFF["transformer.decoder.norm.weight"])
FC = _OFF["fc.weight"]
# a linear layer's weight [out, in] is followed by its bias, a LayerNorm's weight by its bias


@inlined
def _lin2(th, o, x0, x1, j):
    """Row j of W·x for a weight W [n, 2] stored row-major at th[o:] (callers add the bias, stored after W)."""
    return th[o + 2 * j] * x0 + th[o + 2 * j + 1] * x1


@inlined
def _lin2_back(th, o, grad, x0, x1, g0, g1):
    """Reverse of Linear(2→2) y = W·x + b (W row-major at th[o:], b after it) at input (x0, x1) for dL/dy = (g0, g1):
    adds dL/dW and dL/db into grad; returns dL/dx = Wᵀ·g."""
    grad[o] += g0 * x0
    grad[o + 1] += g0 * x1
    grad[o + 2] += g1 * x0
    grad[o + 3] += g1 * x1
    grad[o + 4] += g0
    grad[o + 5] += g1
    return th[o] * g0 + th[o + 2] * g1, th[o + 1] * g0 + th[o + 3] * g1


@inlined
def ln_norm(a0, a1):
    """LayerNorm(2)'s normalisation of (a0, a1): (x̂0, x̂1, 1/σ). Shared with the lane kernel
    (neural/transformer_lanes.py), inlined there into loops over targets."""
    mu = 0.5 * (a0 + a1)
    d0, d1 = a0 - mu, a1 - mu
    rstd = 1.0 / math.sqrt(0.5 * (d0 * d0 + d1 * d1) + LN_EPS)
    return d0 * rstd, d1 * rstd, rstd


@inlined
def _ln(th, o, a0, a1, out, k):
    """LayerNorm(2) of (a0, a1) with gamma th[o : o+2], beta th[o+2 : o+4]: writes out[k, 0:2] = y and
    out[k, 2:4] = x̂, returns 1/σ."""
    h0, h1, rstd = ln_norm(a0, a1)
    out[k, 0] = h0 * th[o] + th[o + 2]
    out[k, 1] = h1 * th[o + 1] + th[o + 3]
    out[k, 2] = h0
    out[k, 3] = h1
    return rstd


@inlined
def _ln_back(th, o, grad, xh, k, rstd, g0, g1):
    """Reverse of _ln: dL/d(output) = (g0, g1), x̂ = xh[k, 2:4]; adds dL/dγ, dL/dβ; returns dL/d(input)."""
    h0, h1 = xh[k, 2], xh[k, 3]
    grad[o] += g0 * h0
    grad[o + 1] += g1 * h1
    grad[o + 2] += g0
    grad[o + 3] += g1
    gh0, gh1 = g0 * th[o], g1 * th[o + 1]
    mg = 0.5 * (gh0 + gh1)
    mgh = 0.5 * (gh0 * h0 + gh1 * h1)
    return rstd * (gh0 - mg - h0 * mgh), rstd * (gh1 - mg - h1 * mgh)


@njit(cache=True, fastmath={"reassoc", "contract", "nsz"})  # vectorised sums: rounding-level changes only
def batch_loss(theta, t, g, lengths, dt, y, w, masks, train, grad, p_out):
    """Σ weight·BCE of one batch; t, g [L, B] (time-major, zero-padded histories), lengths (real history lengths),
    dt, y, w [B]. Writes every
    target's P(recall) to p_out; with `grad` non-empty (len N_PARAMS) ADDS the gradient to it. `masks` are the ten
    0/1 dropout masks (module docstring; shapes [B,2,L,L], [L,B,2] ×3, [B,2] ×2, [B,2,L], [B,2] ×3), read only
    when `train`."""
    th = theta
    want = len(grad) > 0
    collapse = not train and not want
    ma, me1, mef, me2, mds, md1, mdc, md2, mdf, md3 = masks
    L, B = t.shape
    # per-target scratch, reused: qkv [L, 6], attention weights [2, L, L], head outputs [L, 2], the LayerNorm
    # outputs and x̂ (ln1, ln2, mem: [L, 4]) and 1/σ ([L, 3]), the feed-forward's pre-activations [L, 2]
    qkv = np.empty((L, 6))
    att = np.empty((2, L, L))  # the encoder's attention exps (unnormalised) and their 1 / Σ
    rinv = np.empty((2, L))
    kh, vh, gkh, gvh = np.empty((2, L)), np.empty((2, L)), np.empty((2, L)), np.empty((2, L))
    row = np.empty(L)  # one query's scores, then their exps
    oh = np.empty((L, 2))
    ln1 = np.empty((L, 4))
    ln2 = np.empty((L, 4))
    mem = np.empty((L, 4))
    rs = np.empty((L, 3))
    hpre = np.empty((L, 2))
    kv = np.empty((L, 4))  # the cross-attention's keys and values of mem
    ca_all = np.empty((2, L))
    gx1 = np.empty((L, 2))
    gq = np.empty((L, 6))
    dec = np.empty((4, 4))  # the decoder's LayerNorm outputs and x̂
    co = np.empty(2)  # the cross-attention's head outputs
    total = 0.0
    mult = np.ones(L)  # how many identical positions each processed position stands for (see `collapse`)
    for b in range(B):
        # Without dropout and gradient, a target's padded positions are identical zero tokens: as keys they add the
        # same term, as queries they produce the same row. So they are processed once, weighted by their count
        # (O(n²) instead of O(L²) for a history of n in a batch padded to L; upstream's prediction chunks pad every
        # target to the chunk's longest history). With dropout each padded position has its own masks: all kept.
        P = L
        if collapse and lengths[b] < L:
            P = lengths[b] + 1
            mult[P - 1] = L - lengths[b]
        # ------------------------------------------------------------------ encoder
        for l in range(P):
            x0, x1 = t[l, b], g[l, b]
            for j in range(6):
                qkv[l, j] = _lin2(th, E_IN, x0, x1, j) + th[E_IN + 12 + j]
        for h in range(2):
            # (indexed, not sliced: a view of an array per query cost a reference count increment and decrement)
            kmax, kmin = -np.inf, np.inf
            for m in range(P):
                kh[h, m] = qkv[m, 2 + h]
                vh[h, m] = qkv[m, 4 + h]
                kmax = max(kmax, kh[h, m])
                kmin = min(kmin, kh[h, m])
            for l in range(P):
                # softmax over the keys: the largest score q·k is q·max k or q·min k by q's sign; the exps first
                # (a vectorised loop), then the sums
                q = qkv[l, h]
                mx = q * kmax if q >= 0.0 else q * kmin
                for m in range(P):
                    row[m] = q * kh[h, m] - mx
                exp_nonpos(row, row, P)
                tot = 0.0
                o = 0.0
                if collapse:
                    for m in range(P):
                        tot += row[m] * mult[m]
                        o += row[m] * mult[m] * vh[h, m]
                elif train:
                    for m in range(P):
                        e = row[m]
                        att[h, l, m] = e
                        tot += e
                        o += e * ma[b, h, l, m] * vh[h, m]
                    o *= KEEP_SCALE
                else:
                    for m in range(P):
                        e = row[m]
                        att[h, l, m] = e
                        tot += e
                        o += e * vh[h, m]
                inv = 1.0 / tot  # att keeps the exps; the reverse pass scales by inv (saves a pass over L²)
                rinv[h, l] = inv
                oh[l, h] = o * inv
        for l in range(P):
            s0 = _lin2(th, E_OUT, oh[l, 0], oh[l, 1], 0) + th[E_OUT + 4]
            s1 = _lin2(th, E_OUT, oh[l, 0], oh[l, 1], 1) + th[E_OUT + 5]
            if train:
                s0 *= me1[l, b, 0] * KEEP_SCALE
                s1 *= me1[l, b, 1] * KEEP_SCALE
            rs[l, 0] = _ln(th, E_N1, t[l, b] + s0, g[l, b] + s1, ln1, l)
            a0, a1 = ln1[l, 0], ln1[l, 1]
            hpre[l, 0] = _lin2(th, E_L1, a0, a1, 0) + th[E_L1 + 4]
            hpre[l, 1] = _lin2(th, E_L1, a0, a1, 1) + th[E_L1 + 5]
            r0, r1 = max(hpre[l, 0], 0.0), max(hpre[l, 1], 0.0)
            if train:
                r0 *= mef[l, b, 0] * KEEP_SCALE
                r1 *= mef[l, b, 1] * KEEP_SCALE
            f0 = _lin2(th, E_L2, r0, r1, 0) + th[E_L2 + 4]
            f1 = _lin2(th, E_L2, r0, r1, 1) + th[E_L2 + 5]
            if train:
                f0 *= me2[l, b, 0] * KEEP_SCALE
                f1 *= me2[l, b, 1] * KEEP_SCALE
            rs[l, 1] = _ln(th, E_N2, a0 + f0, a1 + f1, ln2, l)
            rs[l, 2] = _ln(th, E_NF, ln2[l, 0], ln2[l, 1], mem, l)
        # ------------------------------------------------------------------ decoder (target: one zero token)
        # self-attention over the one token: weight 1 (dropped or kept), output = its value = the v bias
        sv0 = th[D_SA + 12 + 4] * (mds[b, 0] * KEEP_SCALE if train else 1.0)
        sv1 = th[D_SA + 12 + 5] * (mds[b, 1] * KEEP_SCALE if train else 1.0)
        u0 = _lin2(th, D_SOUT, sv0, sv1, 0) + th[D_SOUT + 4]
        u1 = _lin2(th, D_SOUT, sv0, sv1, 1) + th[D_SOUT + 5]
        if train:
            u0 *= md1[b, 0] * KEEP_SCALE
            u1 *= md1[b, 1] * KEEP_SCALE
        rd1 = _ln(th, D_N1, u0, u1, dec, 0)
        y0, y1 = dec[0, 0], dec[0, 1]
        # cross-attention to mem
        cq0 = _lin2(th, D_CA, y0, y1, 0) + th[D_CA + 12]
        cq1 = _lin2(th, D_CA, y0, y1, 1) + th[D_CA + 13]
        for m in range(P):
            for j in range(4):
                kv[m, j] = _lin2(th, D_CA, mem[m, 0], mem[m, 1], 2 + j) + th[D_CA + 14 + j]
        for h in range(2):
            q = cq0 if h == 0 else cq1
            mx = -np.inf
            for m in range(P):
                mx = max(mx, q * kv[m, h])
            tot = 0.0
            o = 0.0
            for m in range(P):
                e = math.exp(q * kv[m, h] - mx)
                ca_all[h, m] = e
                tot += e * mult[m]
                if train:
                    e = e * (mdc[b, h, m] * KEEP_SCALE)
                o += e * mult[m] * kv[m, 2 + h]
            inv = 1.0 / tot
            for m in range(P):
                ca_all[h, m] *= inv
            co[h] = o * inv
        c0 = _lin2(th, D_COUT, co[0], co[1], 0) + th[D_COUT + 4]
        c1 = _lin2(th, D_COUT, co[0], co[1], 1) + th[D_COUT + 5]
        if train:
            c0 *= md2[b, 0] * KEEP_SCALE
            c1 *= md2[b, 1] * KEEP_SCALE
        rd2 = _ln(th, D_N2, y0 + c0, y1 + c1, dec, 1)
        z0, z1 = dec[1, 0], dec[1, 1]
        hp0 = _lin2(th, D_L1, z0, z1, 0) + th[D_L1 + 4]
        hp1 = _lin2(th, D_L1, z0, z1, 1) + th[D_L1 + 5]
        r0, r1 = max(hp0, 0.0), max(hp1, 0.0)
        if train:
            r0 *= mdf[b, 0] * KEEP_SCALE
            r1 *= mdf[b, 1] * KEEP_SCALE
        f0 = _lin2(th, D_L2, r0, r1, 0) + th[D_L2 + 4]
        f1 = _lin2(th, D_L2, r0, r1, 1) + th[D_L2 + 5]
        if train:
            f0 *= md3[b, 0] * KEEP_SCALE
            f1 *= md3[b, 1] * KEEP_SCALE
        rd3 = _ln(th, D_N3, z0 + f0, z1 + f1, dec, 2)
        rdn = _ln(th, D_NF, dec[2, 0], dec[2, 1], dec, 3)
        out0, out1 = dec[3, 0], dec[3, 1]
        stab = math.exp(th[FC] * out0 + th[FC + 1] * out1 + th[FC + 2])
        base = 1.0 + FACTOR * dt[b] / stab
        p = base ** DECAY
        p_out[b] = p
        mult[P - 1] = 1.0
        loss, dp = bce(p, y[b], w[b])
        if p != p:
            loss = np.nan  # torch's BCE of a NaN p is NaN (upstream/training.py's "diverged" test relies on it)
        total += loss
        if not want:
            continue
        # ------------------------------------------------------------------ reverse: head
        gz = dp * DECAY * base ** (DECAY - 1.0) * (-FACTOR * dt[b] / stab)
        grad[FC] += gz * out0
        grad[FC + 1] += gz * out1
        grad[FC + 2] += gz
        g0, g1 = _ln_back(th, D_NF, grad, dec, 3, rdn, gz * th[FC], gz * th[FC + 1])
        # decoder feed-forward (residual: the gradient reaches z both directly and through the block)
        gr0, gr1 = _ln_back(th, D_N3, grad, dec, 2, rd3, g0, g1)
        gf0, gf1 = gr0, gr1
        if train:
            gf0 *= md3[b, 0] * KEEP_SCALE
            gf1 *= md3[b, 1] * KEEP_SCALE
        gr_0, gr_1 = _lin2_back(th, D_L2, grad, r0, r1, gf0, gf1)
        if train:
            gr_0 *= mdf[b, 0] * KEEP_SCALE
            gr_1 *= mdf[b, 1] * KEEP_SCALE
        gh0 = gr_0 if hp0 > 0.0 else 0.0
        gh1 = gr_1 if hp1 > 0.0 else 0.0
        gl0, gl1 = _lin2_back(th, D_L1, grad, z0, z1, gh0, gh1)
        gz0, gz1 = gr0 + gl0, gr1 + gl1
        # cross-attention
        gr0, gr1 = _ln_back(th, D_N2, grad, dec, 1, rd2, gz0, gz1)
        gc0, gc1 = gr0, gr1
        if train:
            gc0 *= md2[b, 0] * KEEP_SCALE
            gc1 *= md2[b, 1] * KEEP_SCALE
        gco = _lin2_back(th, D_COUT, grad, co[0], co[1], gc0, gc1)
        gq0 = 0.0
        gq1 = 0.0
        for m in range(L):
            for j in range(4):
                gq[m, j] = 0.0  # dL/d(k0, k1, v0, v1) of key m
        for h in range(2):
            go = gco[h]
            q = cq0 if h == 0 else cq1
            gqh = 0.0
            for m in range(L):
                a = ca_all[h, m]
                dm = mdc[b, h, m] * KEEP_SCALE if train else 1.0
                gq[m, 2 + h] += go * a * dm
                gs = a * go * (dm * kv[m, 2 + h] - co[h])
                gqh += gs * kv[m, h]
                gq[m, h] += gs * q
            if h == 0:
                gq0 = gqh
            else:
                gq1 = gqh
        grad[D_CA] += gq0 * y0
        grad[D_CA + 1] += gq0 * y1
        grad[D_CA + 2] += gq1 * y0
        grad[D_CA + 3] += gq1 * y1
        grad[D_CA + 12] += gq0
        grad[D_CA + 13] += gq1
        gy0 = gr0 + th[D_CA] * gq0 + th[D_CA + 2] * gq1
        gy1 = gr1 + th[D_CA + 1] * gq0 + th[D_CA + 3] * gq1
        for m in range(L):
            gm0, gm1 = 0.0, 0.0
            for j in range(4):
                gk = gq[m, j]
                grad[D_CA + 4 + 2 * j] += gk * mem[m, 0]
                grad[D_CA + 5 + 2 * j] += gk * mem[m, 1]
                grad[D_CA + 14 + j] += gk
                gm0 += th[D_CA + 4 + 2 * j] * gk
                gm1 += th[D_CA + 5 + 2 * j] * gk
            gx1[m, 0] = gm0
            gx1[m, 1] = gm1
        # decoder self-attention: only the v bias and the out-projection see a gradient
        gu0, gu1 = _ln_back(th, D_N1, grad, dec, 0, rd1, gy0, gy1)
        if train:
            gu0 *= md1[b, 0] * KEEP_SCALE
            gu1 *= md1[b, 1] * KEEP_SCALE
        gsv = _lin2_back(th, D_SOUT, grad, sv0, sv1, gu0, gu1)
        for h in range(2):
            grad[D_SA + 16 + h] += gsv[h] * (mds[b, h] * KEEP_SCALE if train else 1.0)
        # ------------------------------------------------------------------ reverse: encoder, position by position
        for l in range(L):
            gm0, gm1 = _ln_back(th, E_NF, grad, mem, l, rs[l, 2], gx1[l, 0], gx1[l, 1])
            gr0, gr1 = _ln_back(th, E_N2, grad, ln2, l, rs[l, 1], gm0, gm1)
            a0, a1 = ln1[l, 0], ln1[l, 1]
            gf0, gf1 = gr0, gr1
            if train:
                gf0 *= me2[l, b, 0] * KEEP_SCALE
                gf1 *= me2[l, b, 1] * KEEP_SCALE
            r0, r1 = max(hpre[l, 0], 0.0), max(hpre[l, 1], 0.0)
            if train:
                r0 *= mef[l, b, 0] * KEEP_SCALE
                r1 *= mef[l, b, 1] * KEEP_SCALE
            gr_0, gr_1 = _lin2_back(th, E_L2, grad, r0, r1, gf0, gf1)
            if train:
                gr_0 *= mef[l, b, 0] * KEEP_SCALE
                gr_1 *= mef[l, b, 1] * KEEP_SCALE
            gh0 = gr_0 if hpre[l, 0] > 0.0 else 0.0
            gh1 = gr_1 if hpre[l, 1] > 0.0 else 0.0
            gl0, gl1 = _lin2_back(th, E_L1, grad, a0, a1, gh0, gh1)
            ga0, ga1 = gr0 + gl0, gr1 + gl1
            gs0, gs1 = _ln_back(th, E_N1, grad, ln1, l, rs[l, 0], ga0, ga1)
            if train:
                gs0 *= me1[l, b, 0] * KEEP_SCALE
                gs1 *= me1[l, b, 1] * KEEP_SCALE
            gx1[l, 0], gx1[l, 1] = _lin2_back(th, E_OUT, grad, oh[l, 0], oh[l, 1], gs0, gs1)  # dL/d(head outputs)
        for h in range(2):
            for m in range(L):
                gkh[h, m] = 0.0
                gvh[h, m] = 0.0
            for l in range(L):
                go = gx1[l, h] * rinv[h, l]  # dL/d(head output) / Σ exps: the weights are att · rinv
                q = qkv[l, h]
                o = oh[l, h]
                gqh = 0.0
                if train:
                    for m in range(L):
                        a = att[h, l, m]
                        dm = ma[b, h, l, m] * KEEP_SCALE
                        gvh[h, m] += go * a * dm
                        gs = a * go * (dm * vh[h, m] - o)
                        gqh += gs * kh[h, m]
                        gkh[h, m] += gs * q
                else:
                    for m in range(L):
                        a = att[h, l, m]
                        gvh[h, m] += go * a
                        gs = a * go * (vh[h, m] - o)
                        gqh += gs * kh[h, m]
                        gkh[h, m] += gs * q
                gq[l, h] = gqh
            for m in range(L):
                gq[m, 2 + h] = gkh[h, m]
                gq[m, 4 + h] = gvh[h, m]
        for l in range(L):
            x0, x1 = t[l, b], g[l, b]
            for j in range(6):
                grad[E_IN + 2 * j] += gq[l, j] * x0
                grad[E_IN + 2 * j + 1] += gq[l, j] * x1
                grad[E_IN + 12 + j] += gq[l, j]
    return total
