"""The Transformer's training pass with a batch's targets as the innermost axis (lanes), compiled (numba, float64).

Why: neural/transformer_kernels.py runs a batch target by target. For the short windows most training targets have
(upstream sorts batches by history length, so the targets of one batch share one window L; ~78% of training
targets have L < 8) a target is one long chain of dependent scalar steps (7 LayerNorms with a sqrt and a division
each, small 2×2 products, the softmax's exps), which no compiler vectorises. Here the same chain runs for a block of
LANES targets side by side: every per-target scratch value is an array whose last, contiguous axis is the target,
and each step is a loop over the lanes that LLVM vectorises (AVX2: 4 doubles, AVX-512: 8; exp_nonpos1 is the softmax's
vectorisable exp, the encoder's and the cross-attention's). What stays one call per target: exp and log of the head
and the loss (p = 1/√base, no pow).

Same operations per target in the same order as transformer_kernels.batch_loss (read its docstring for what is
computed: the module's ten dropout sites, the padded positions attending and attended to), so the predictions
equal it up to reassociated sums (1e-16 relative); each lane sums its own gradient, the lanes are summed at the
end (the gradient equals the per-target kernel's to ~6e-16 of its largest component; components that are zero
analytically, such as the key biases', are rounding noise in both). Training mode only (with the dropout masks,
every padded position has its own masks, so nothing collapses); prediction stays per target.

Measured (one synthetic batch of 512 targets, forward + reverse, old/new CPU time, paired, shared 2-core AMD EPYC):
L = 2: 2.9×, 4: 2.2×, 8: 2.1×, 16: 1.03×, 24: 0.99× (long windows are the L² attention loops, which the per-target
kernel vectorises over the keys too). On the real batches of a 45k-review simulated user (all five folds, kernel
time summed per window): 1.95-2.1× at L <= 7, 1.65-1.8× at 8-11, 1.45-1.7× at 12-15, 1.1-1.3× at 17-20, 0.98-1.09×
at 24-36; so models/transformer.py ran this kernel up to LANES_MAX_WINDOW = 20 (31 since: below). What made the
difference: error_model="numpy" (numba's default checks every division for a zero divisor and raises, which kept
each loop with a LayerNorm scalar: 1.5-2× at L 2-8 with it, the lanes' independent chains overlapping but not
vectorised).
Blocks of 32 and 64 lanes were within noise of each other at L <= 8, 32 slightly ahead at 16-24.

Issue #19, once rounding changes were allowed (models/transformer.py, the policy): the cross-attention's exps by
exp_nonpos1 across the lanes (they were math.exp, one call per target and key, kept for the predictions' rounding;
the lane kernel only trains) and the head's base ** DECAY and base ** (DECAY − 1) as 1/√base and p/base (two calls
to pow a target). On the recorded training batches of the last fold of a 45k-review user and sim36 users 1, 14, 20
(this kernel before/after alternated call by call, CPU time, 6 rounds; AMD Zen 4): 1.18-1.25x at L <= 7,
1.08-1.15x at 8-20, the whole set 1.10-1.19x a round (median ~1.14x); predictions 3e-16 relative, gradient 7e-15
of its largest component from before. Measured and not kept (same batches, paired against the previous version):
LANES 16 (1.04-1.13x, below 32's ~1.14x) and 64 (1.10-1.20x, within noise of 32): 32 stays; the decoder's
weights read into locals as the encoder's are (no change: 1.09-1.16x with and without); the head by vec_math's
exp1/log1/log1p1 in a helper without fastmath,
called per block: numba compiled that helper, first reached from this fastmath kernel, WITH the caller's
"reassoc" (exp1's t − 1.5·2^52 rounding trick folded away: S off by up to 40%; correct when compiled alone):
a trap for exp1 and its kin under "reassoc" (the FSRS lane kernels use "contract" only); its gain over
1/√base was within noise.
Then LANES_MAX_WINDOW 20 -> 31: the real training batches of windows 21-31 run faster here than in the per-target
kernel (this version, 8 alternated calls each: a 45k-review user's L 31 batch of 273 targets 1.35x, tiled to 546
1.31x; sim36 user 6's L 31 (334 targets) 1.30x, tiled 1.13x; user 14's L 24 1.20-1.23x), while synthetic
batches (exponential intervals, uniform ratings) cross over near 24-32 (B 273: 1.07x at 24, 0.83x at 32, 0.54x
at 64), so 31, the longest real window measured; whole users with such windows (sim36 6, 7, 11, 14; separate
processes alternated, 4 pairs) 1.04-1.24x, median 1.07x; the 45k user 1.02x (its one L 31 batch a fold).
Measured and not kept: the padded keys and values of the encoder's self-attention entering once with their count
when a whole block is padded there (key P-1 weighted by L-P+1, each query's value by how many of those keys its
mask keeps): 1.2-1.35x on small users' single heavily padded batches but 0.95-0.98x on short windows;
whole users 1.01x (45k user) and 1.02x (8 sim36 users), and small users getting faster tilts the
projection's per-review slope the wrong way; the same in the per-target kernel for windows over 20: 0.88-1.08x
on real batches; the eight small masks read in kernel_masks' layout (no transposes, saves eight numpy calls a
batch): 0.68-0.82x (strided byte reads in the lane loops instead).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from models.gru_p import DECAY, FACTOR
from engine.jit import inlined
from engine.kernel_math import bce
from neural.transformer_kernels import (D_CA, D_COUT, D_L1, D_L2, D_N1, D_N2, D_N3, D_NF, D_SA, D_SOUT, E_IN, E_L1,
                                        E_L2, E_N1, E_N2, E_NF, E_OUT, FC, ln_norm)
from engine.vec_math import exp_nonpos1

LANES = 32  # targets per block: the block's scratch stays in cache
LANES_MAX_WINDOW = 31  # longer windows: the per-target kernel (its loops over the L keys vectorise there; docstring)
assert DECAY == -0.5  # the head's p = base ** DECAY is computed as 1/√base (no call to pow)


def lane_masks(masks: tuple) -> tuple:
    """kernel_masks' arrays with the targets last: [2,L,L,B], [L,2,B] ×3, [2,B] ×2, [2,L,B], [2,B] ×3."""
    ma, me1, mef, me2, mds, md1, mdc, md2, mdf, md3 = masks
    c = np.ascontiguousarray
    return (c(ma.transpose(1, 2, 3, 0)), c(me1.transpose(0, 2, 1)), c(mef.transpose(0, 2, 1)),
            c(me2.transpose(0, 2, 1)), c(mds.T), c(md1.T), c(mdc.transpose(1, 2, 0)), c(md2.T), c(mdf.T), c(md3.T))


def no_dropout(length: int, batch: int) -> tuple:
    """lane_masks' arrays all ones (every value kept; pass keep = 1.0): the lane kernel without dropout."""
    L, B = length, batch
    one = np.ones
    return (one((2, L, L, B), np.uint8), *(one((L, 2, B), np.uint8),) * 3, one((2, B), np.uint8),
            one((2, B), np.uint8), one((2, L, B), np.uint8), *(one((2, B), np.uint8),) * 3)


@inlined
def _lin2_back(th, o, G, i, x0, x1, g0, g1):
    """Lane i's reverse of Linear(2→2) (transformer_kernels._lin2_back): dL/dW, dL/db into G[:, i]; returns
    Wᵀ·g."""
    G[o, i] += g0 * x0
    G[o + 1, i] += g0 * x1
    G[o + 2, i] += g1 * x0
    G[o + 3, i] += g1 * x1
    G[o + 4, i] += g0
    G[o + 5, i] += g1
    return th[o] * g0 + th[o + 2] * g1, th[o + 1] * g0 + th[o + 3] * g1


@inlined
def _ln_back(th, o, G, i, h0, h1, rstd, g0, g1):
    """Lane i's reverse of LayerNorm(2) (transformer_kernels._ln_back) at x̂ = (h0, h1), 1/σ = rstd."""
    G[o, i] += g0 * h0
    G[o + 1, i] += g1 * h1
    G[o + 2, i] += g0
    G[o + 3, i] += g1
    gh0, gh1 = g0 * th[o], g1 * th[o + 1]
    mg = 0.5 * (gh0 + gh1)
    mgh = 0.5 * (gh0 * h0 + gh1 * h1)
    return rstd * (gh0 - mg - h0 * mgh), rstd * (gh1 - mg - h1 * mgh)


# error_model "numpy": a division is not checked for a zero divisor (the check and its exception kept every loop
# with a LayerNorm scalar); the one divisor that can be 0, S = exp(·) underflowing, is checked as the per-target
# kernel does (ZeroDivisionError)
@njit(cache=True, fastmath={"reassoc", "contract", "nsz"}, error_model="numpy")
def batch_loss_lanes(theta, t, g, dt, y, w, masks, keep, grad, p_out):
    """Σ weight·BCE of one batch: t, g [L, B], dt, y, w [B], `masks` as lane_masks returns them, `keep` the scale of
    a kept value (KEEP_SCALE: transformer_kernels.batch_loss with train=True; 1.0 with masks of ones: without
    dropout, every padded position processed as a real one, unlike that kernel's collapsed evaluation). Writes
    every target's P(recall) to p_out; with `grad` non-empty (len N_PARAMS) ADDS the gradient to it."""
    th = theta
    ma, me1, mef, me2, mds, md1, mdc, md2, mdf, md3 = masks
    L, B = t.shape
    W = LANES
    qkv = np.empty((L, 6, W))
    att = np.empty((2, L, L, W))
    rinv = np.empty((2, L, W))
    oh = np.empty((L, 2, W))
    st = np.empty((L, 21, W))  # ln1 (y, x̂), ln2 (y, x̂), mem (y, x̂), 1/σ ×3, hpre ×2, cross-attention k, v
    acc = np.empty((6, W))  # kmax, kmin, mx, tot, o per lane
    ca = np.empty((2, L, W))
    dec = np.empty((48, W))
    want = len(grad) > 0
    G = np.zeros((len(grad) if want else 1, W))  # each lane's gradient, summed into grad at the end
    gq = np.empty((L, 6, W))  # dL/d(q, k, v) of the cross-attention's keys (k, v), then of the encoder's qkv
    gmem = np.empty((L, 2, W))  # dL/d(encoder output)
    goh = np.empty((L, 2, W))  # dL/d(encoder head outputs)
    # the weights the encoder's per-position loop reads, as locals: read from th inside a loop that stores, they
    # would be loaded again every iteration and add to the overlap checks LLVM makes before it runs the vector loop
    e_out_0 = th[E_OUT]
    e_out_1 = th[E_OUT + 1]
    e_out_4 = th[E_OUT + 4]
    e_out_2 = th[E_OUT + 2]
    e_out_3 = th[E_OUT + 3]
    e_out_5 = th[E_OUT + 5]
    e_n1_0 = th[E_N1]
    e_n1_2 = th[E_N1 + 2]
    e_n1_1 = th[E_N1 + 1]
    e_n1_3 = th[E_N1 + 3]
    e_l1_0 = th[E_L1]
    e_l1_1 = th[E_L1 + 1]
    e_l1_4 = th[E_L1 + 4]
    e_l1_2 = th[E_L1 + 2]
    e_l1_3 = th[E_L1 + 3]
    e_l1_5 = th[E_L1 + 5]
    e_l2_0 = th[E_L2]
    e_l2_1 = th[E_L2 + 1]
    e_l2_4 = th[E_L2 + 4]
    e_l2_2 = th[E_L2 + 2]
    e_l2_3 = th[E_L2 + 3]
    e_l2_5 = th[E_L2 + 5]
    e_n2_0 = th[E_N2]
    e_n2_2 = th[E_N2 + 2]
    e_n2_1 = th[E_N2 + 1]
    e_n2_3 = th[E_N2 + 3]
    e_nf_0 = th[E_NF]
    e_nf_2 = th[E_NF + 2]
    e_nf_1 = th[E_NF + 1]
    e_nf_3 = th[E_NF + 3]
    d_ca_4 = th[D_CA + 4]
    d_ca_5 = th[D_CA + 5]
    d_ca_14 = th[D_CA + 14]
    d_ca_6 = th[D_CA + 6]
    d_ca_7 = th[D_CA + 7]
    d_ca_15 = th[D_CA + 15]
    d_ca_8 = th[D_CA + 8]
    d_ca_9 = th[D_CA + 9]
    d_ca_16 = th[D_CA + 16]
    d_ca_10 = th[D_CA + 10]
    d_ca_11 = th[D_CA + 11]
    d_ca_17 = th[D_CA + 17]
    total = 0.0
    for b0 in range(0, B, W):
        nb = min(W, B - b0)
        # ------------------------------------------------------------------ encoder
        for l in range(L):
            for j in range(6):
                wa, wb, bias = th[E_IN + 2 * j], th[E_IN + 2 * j + 1], th[E_IN + 12 + j]
                for i in range(nb):
                    qkv[l, j, i] = wa * t[l, b0 + i] + wb * g[l, b0 + i] + bias
        for h in range(2):
            for i in range(nb):
                acc[0, i] = -np.inf
                acc[1, i] = np.inf
            for m in range(L):
                for i in range(nb):
                    acc[0, i] = max(acc[0, i], qkv[m, 2 + h, i])
                    acc[1, i] = min(acc[1, i], qkv[m, 2 + h, i])
            for l in range(L):
                for i in range(nb):
                    q = qkv[l, h, i]
                    acc[2, i] = q * acc[0, i] if q >= 0.0 else q * acc[1, i]
                    acc[3, i] = 0.0
                    acc[4, i] = 0.0
                for m in range(L):
                    for i in range(nb):
                        e = exp_nonpos1(qkv[l, h, i] * qkv[m, 2 + h, i] - acc[2, i])
                        att[h, l, m, i] = e
                        acc[3, i] += e
                        acc[4, i] += e * ma[h, l, m, b0 + i] * qkv[m, 4 + h, i]
                for i in range(nb):
                    inv = 1.0 / acc[3, i]
                    rinv[h, l, i] = inv
                    oh[l, h, i] = acc[4, i] * keep * inv
        for l in range(L):
            for i in range(nb):
                b = b0 + i
                o0, o1 = oh[l, 0, i], oh[l, 1, i]
                s0 = (e_out_0 * o0 + e_out_1 * o1 + e_out_4) * (me1[l, 0, b] * keep)
                s1 = (e_out_2 * o0 + e_out_3 * o1 + e_out_5) * (me1[l, 1, b] * keep)
                a0, a1 = t[l, b] + s0, g[l, b] + s1
                h0, h1, rstd = ln_norm(a0, a1)
                a0 = h0 * e_n1_0 + e_n1_2
                a1 = h1 * e_n1_1 + e_n1_3
                st[l, 0, i], st[l, 1, i], st[l, 2, i], st[l, 3, i], st[l, 12, i] = a0, a1, h0, h1, rstd
                hp0 = e_l1_0 * a0 + e_l1_1 * a1 + e_l1_4
                hp1 = e_l1_2 * a0 + e_l1_3 * a1 + e_l1_5
                st[l, 15, i], st[l, 16, i] = hp0, hp1
                r0 = max(hp0, 0.0) * (mef[l, 0, b] * keep)
                r1 = max(hp1, 0.0) * (mef[l, 1, b] * keep)
                f0 = (e_l2_0 * r0 + e_l2_1 * r1 + e_l2_4) * (me2[l, 0, b] * keep)
                f1 = (e_l2_2 * r0 + e_l2_3 * r1 + e_l2_5) * (me2[l, 1, b] * keep)
                a0, a1 = a0 + f0, a1 + f1
                h0, h1, rstd = ln_norm(a0, a1)
                a0 = h0 * e_n2_0 + e_n2_2
                a1 = h1 * e_n2_1 + e_n2_3
                st[l, 4, i], st[l, 5, i], st[l, 6, i], st[l, 7, i], st[l, 13, i] = a0, a1, h0, h1, rstd
                h0, h1, rstd = ln_norm(a0, a1)
                a0 = h0 * e_nf_0 + e_nf_2
                a1 = h1 * e_nf_1 + e_nf_3
                st[l, 8, i], st[l, 9, i], st[l, 10, i], st[l, 11, i], st[l, 14, i] = a0, a1, h0, h1, rstd
                st[l, 17, i] = (d_ca_4 * a0 + d_ca_5 * a1) + d_ca_14
                st[l, 18, i] = (d_ca_6 * a0 + d_ca_7 * a1) + d_ca_15
                st[l, 19, i] = (d_ca_8 * a0 + d_ca_9 * a1) + d_ca_16
                st[l, 20, i] = (d_ca_10 * a0 + d_ca_11 * a1) + d_ca_17
        # ------------------------------------------------------------------ decoder (target: one zero token)
        for i in range(nb):
            b = b0 + i
            sv0 = th[D_SA + 12 + 4] * (mds[0, b] * keep)
            sv1 = th[D_SA + 12 + 5] * (mds[1, b] * keep)
            u0 = (th[D_SOUT] * sv0 + th[D_SOUT + 1] * sv1 + th[D_SOUT + 4]) * (md1[0, b] * keep)
            u1 = (th[D_SOUT + 2] * sv0 + th[D_SOUT + 3] * sv1 + th[D_SOUT + 5]) * (md1[1, b] * keep)
            h0, h1, rstd = ln_norm(u0, u1)
            y0 = h0 * th[D_N1] + th[D_N1 + 2]
            y1 = h1 * th[D_N1 + 1] + th[D_N1 + 3]
            dec[0, i], dec[1, i], dec[2, i], dec[3, i], dec[4, i] = y0, y1, h0, h1, rstd
            dec[5, i], dec[6, i] = sv0, sv1
            dec[7, i] = th[D_CA] * y0 + th[D_CA + 1] * y1 + th[D_CA + 12]
            dec[8, i] = th[D_CA + 2] * y0 + th[D_CA + 3] * y1 + th[D_CA + 13]
        for h in range(2):
            for i in range(nb):
                acc[2, i] = -np.inf
            for m in range(L):
                for i in range(nb):
                    acc[2, i] = max(acc[2, i], dec[7 + h, i] * st[m, 17 + h, i])
            for i in range(nb):
                acc[3, i] = 0.0
                acc[4, i] = 0.0
            for m in range(L):
                for i in range(nb):
                    e = exp_nonpos1(dec[7 + h, i] * st[m, 17 + h, i] - acc[2, i])
                    ca[h, m, i] = e
                    acc[3, i] += e
                    acc[4, i] += e * (mdc[h, m, b0 + i] * keep) * st[m, 17 + 2 + h, i]
            for i in range(nb):
                acc[3, i] = 1.0 / acc[3, i]
                dec[9 + h, i] = acc[4, i] * acc[3, i]
            for m in range(L):
                for i in range(nb):
                    ca[h, m, i] *= acc[3, i]
        for i in range(nb):
            b = b0 + i
            co0, co1 = dec[9, i], dec[10, i]
            y0, y1 = dec[0, i], dec[1, i]
            c0 = (th[D_COUT] * co0 + th[D_COUT + 1] * co1 + th[D_COUT + 4]) * (md2[0, b] * keep)
            c1 = (th[D_COUT + 2] * co0 + th[D_COUT + 3] * co1 + th[D_COUT + 5]) * (md2[1, b] * keep)
            a0, a1 = y0 + c0, y1 + c1
            h0, h1, rstd = ln_norm(a0, a1)
            z0 = h0 * th[D_N2] + th[D_N2 + 2]
            z1 = h1 * th[D_N2 + 1] + th[D_N2 + 3]
            dec[11, i], dec[12, i], dec[13, i], dec[14, i], dec[15, i] = z0, z1, h0, h1, rstd
            hp0 = th[D_L1] * z0 + th[D_L1 + 1] * z1 + th[D_L1 + 4]
            hp1 = th[D_L1 + 2] * z0 + th[D_L1 + 3] * z1 + th[D_L1 + 5]
            dec[16, i], dec[17, i] = hp0, hp1
            r0 = max(hp0, 0.0) * (mdf[0, b] * keep)
            r1 = max(hp1, 0.0) * (mdf[1, b] * keep)
            dec[18, i], dec[19, i] = r0, r1
            f0 = (th[D_L2] * r0 + th[D_L2 + 1] * r1 + th[D_L2 + 4]) * (md3[0, b] * keep)
            f1 = (th[D_L2 + 2] * r0 + th[D_L2 + 3] * r1 + th[D_L2 + 5]) * (md3[1, b] * keep)
            a0, a1 = z0 + f0, z1 + f1
            h0, h1, rstd = ln_norm(a0, a1)
            a0 = h0 * th[D_N3] + th[D_N3 + 2]
            a1 = h1 * th[D_N3 + 1] + th[D_N3 + 3]
            dec[20, i], dec[21, i], dec[22, i], dec[23, i], dec[24, i] = a0, a1, h0, h1, rstd
            h0, h1, rstd = ln_norm(a0, a1)
            a0 = h0 * th[D_NF] + th[D_NF + 2]
            a1 = h1 * th[D_NF + 1] + th[D_NF + 3]
            dec[25, i], dec[26, i], dec[27, i], dec[28, i], dec[29, i] = a0, a1, h0, h1, rstd
            dec[30, i] = th[FC] * a0 + th[FC + 1] * a1 + th[FC + 2]
        for i in range(nb):
            b = b0 + i
            stab = math.exp(dec[30, i])
            if stab == 0.0:
                raise ZeroDivisionError("division by zero")
            base = 1.0 + FACTOR * dt[b] / stab
            p = 1.0 / math.sqrt(base)  # base ** DECAY (DECAY = -0.5), without a call to pow
            p_out[b] = p
            loss, dp = bce(p, y[b], w[b])
            if p != p:
                loss = np.nan
            total += loss
            dec[31, i], dec[32, i], dec[33, i] = stab, base, dp

        if not want:
            continue
        # ------------------------------------------------------------------ reverse: head, decoder feed-forward
        for i in range(nb):
            b = b0 + i
            stab, base, dp = dec[31, i], dec[32, i], dec[33, i]
            dec[34, i] = dp * DECAY * (p_out[b] / base) * (-FACTOR * dt[b] / stab)  # p / base = base ** (DECAY - 1)
        for i in range(nb):
            b = b0 + i
            gz = dec[34, i]
            G[FC, i] += gz * dec[25, i]
            G[FC + 1, i] += gz * dec[26, i]
            G[FC + 2, i] += gz
            g0, g1 = _ln_back(th, D_NF, G, i, dec[27, i], dec[28, i], dec[29, i], gz * th[FC], gz * th[FC + 1])
            gr0, gr1 = _ln_back(th, D_N3, G, i, dec[22, i], dec[23, i], dec[24, i], g0, g1)
            gf0 = gr0 * (md3[0, b] * keep)
            gf1 = gr1 * (md3[1, b] * keep)
            gr_0, gr_1 = _lin2_back(th, D_L2, G, i, dec[18, i], dec[19, i], gf0, gf1)
            gr_0 *= mdf[0, b] * keep
            gr_1 *= mdf[1, b] * keep
            gh0 = gr_0 if dec[16, i] > 0.0 else 0.0
            gh1 = gr_1 if dec[17, i] > 0.0 else 0.0
            gl0, gl1 = _lin2_back(th, D_L1, G, i, dec[11, i], dec[12, i], gh0, gh1)
            gz0, gz1 = gr0 + gl0, gr1 + gl1
            # cross-attention
            gr0, gr1 = _ln_back(th, D_N2, G, i, dec[13, i], dec[14, i], dec[15, i], gz0, gz1)
            dec[35, i], dec[36, i] = gr0, gr1
            gc0 = gr0 * (md2[0, b] * keep)
            gc1 = gr1 * (md2[1, b] * keep)
            dec[37, i], dec[38, i] = _lin2_back(th, D_COUT, G, i, dec[9, i], dec[10, i], gc0, gc1)
        for h in range(2):
            for i in range(nb):
                acc[0, i] = 0.0
            for m in range(L):
                for i in range(nb):
                    go, q, o = dec[37 + h, i], dec[7 + h, i], dec[9 + h, i]
                    a = ca[h, m, i]
                    dm = mdc[h, m, b0 + i] * keep
                    gq[m, 2 + h, i] = go * a * dm
                    gs = a * go * (dm * st[m, 17 + 2 + h, i] - o)
                    acc[0, i] += gs * st[m, 17 + h, i]
                    gq[m, h, i] = gs * q
            for i in range(nb):
                dec[39 + h, i] = acc[0, i]
        for i in range(nb):
            b = b0 + i
            gq0, gq1 = dec[39, i], dec[40, i]
            y0, y1 = dec[0, i], dec[1, i]
            G[D_CA, i] += gq0 * y0
            G[D_CA + 1, i] += gq0 * y1
            G[D_CA + 2, i] += gq1 * y0
            G[D_CA + 3, i] += gq1 * y1
            G[D_CA + 12, i] += gq0
            G[D_CA + 13, i] += gq1
            gy0 = dec[35, i] + th[D_CA] * gq0 + th[D_CA + 2] * gq1
            gy1 = dec[36, i] + th[D_CA + 1] * gq0 + th[D_CA + 3] * gq1
            # decoder self-attention: only the v bias and the out-projection see a gradient
            gu0, gu1 = _ln_back(th, D_N1, G, i, dec[2, i], dec[3, i], dec[4, i], gy0, gy1)
            gu0 *= md1[0, b] * keep
            gu1 *= md1[1, b] * keep
            gsv0, gsv1 = _lin2_back(th, D_SOUT, G, i, dec[5, i], dec[6, i], gu0, gu1)
            G[D_SA + 16, i] += gsv0 * (mds[0, b] * keep)
            G[D_SA + 17, i] += gsv1 * (mds[1, b] * keep)
        for m in range(L):
            for i in range(nb):
                gm0, gm1 = 0.0, 0.0
                for j in range(4):
                    gk = gq[m, j, i]
                    G[D_CA + 4 + 2 * j, i] += gk * st[m, 8, i]
                    G[D_CA + 5 + 2 * j, i] += gk * st[m, 9, i]
                    G[D_CA + 14 + j, i] += gk
                    gm0 += th[D_CA + 4 + 2 * j] * gk
                    gm1 += th[D_CA + 5 + 2 * j] * gk
                gmem[m, 0, i] = gm0
                gmem[m, 1, i] = gm1
        # ------------------------------------------------------------------ reverse: encoder, position by position
        for l in range(L):
            for i in range(nb):
                b = b0 + i
                gm0, gm1 = _ln_back(th, E_NF, G, i, st[l, 10, i], st[l, 11, i], st[l, 14, i], gmem[l, 0, i],
                                    gmem[l, 1, i])
                gr0, gr1 = _ln_back(th, E_N2, G, i, st[l, 6, i], st[l, 7, i], st[l, 13, i], gm0, gm1)
                gf0 = gr0 * (me2[l, 0, b] * keep)
                gf1 = gr1 * (me2[l, 1, b] * keep)
                hp0, hp1 = st[l, 15, i], st[l, 16, i]
                r0 = max(hp0, 0.0) * (mef[l, 0, b] * keep)
                r1 = max(hp1, 0.0) * (mef[l, 1, b] * keep)
                gr_0, gr_1 = _lin2_back(th, E_L2, G, i, r0, r1, gf0, gf1)
                gr_0 *= mef[l, 0, b] * keep
                gr_1 *= mef[l, 1, b] * keep
                gh0 = gr_0 if hp0 > 0.0 else 0.0
                gh1 = gr_1 if hp1 > 0.0 else 0.0
                gl0, gl1 = _lin2_back(th, E_L1, G, i, st[l, 0, i], st[l, 1, i], gh0, gh1)
                ga0, ga1 = gr0 + gl0, gr1 + gl1
                gs0, gs1 = _ln_back(th, E_N1, G, i, st[l, 2, i], st[l, 3, i], st[l, 12, i], ga0, ga1)
                gs0 *= me1[l, 0, b] * keep
                gs1 *= me1[l, 1, b] * keep
                goh[l, 0, i], goh[l, 1, i] = _lin2_back(th, E_OUT, G, i, oh[l, 0, i], oh[l, 1, i], gs0, gs1)
        for h in range(2):
            for m in range(L):
                for i in range(nb):
                    gq[m, 2 + h, i] = 0.0
                    gq[m, 4 + h, i] = 0.0
            for l in range(L):
                for i in range(nb):
                    acc[0, i] = goh[l, h, i] * rinv[h, l, i]  # dL/d(head output) / Σ exps
                    acc[1, i] = 0.0
                for m in range(L):
                    for i in range(nb):
                        go, q, o = acc[0, i], qkv[l, h, i], oh[l, h, i]
                        a = att[h, l, m, i]
                        dm = ma[h, l, m, b0 + i] * keep
                        gq[m, 4 + h, i] += go * a * dm
                        gs = a * go * (dm * qkv[m, 4 + h, i] - o)
                        acc[1, i] += gs * qkv[m, 2 + h, i]
                        gq[m, 2 + h, i] += gs * q
                for i in range(nb):
                    gq[l, h, i] = acc[1, i]
        for l in range(L):
            for j in range(6):
                for i in range(nb):
                    b = b0 + i
                    G[E_IN + 2 * j, i] += gq[l, j, i] * t[l, b]
                    G[E_IN + 2 * j + 1, i] += gq[l, j, i] * g[l, b]
                    G[E_IN + 12 + j, i] += gq[l, j, i]
    if want:
        for k in range(len(grad)):
            s = 0.0
            for i in range(W):
                s += G[k, i]
            grad[k] += s
    return total
