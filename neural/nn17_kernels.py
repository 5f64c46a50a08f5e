"""NN-17's recurrence (models/nn17.py, spec models.md §2.5) and its reverse pass in numba, over card sequences read
in place: `nn17_cards_loss` is neural/card_fit.py's card_loss for NN-17.

Why compiled: a step is ~20 tiny torch operations on vectors of one number per card, so torch's per-operation cost
(and autograd's nodes) decided NN-17's speed whatever the number of cards, and a group of cards cost as many steps as
its longest card. Here one forward pass per card stores what the reverse pass needs (`rec`), every target's
prediction is read off the state after its history, and one reverse pass per card accumulates the gradient.

Every operation follows torch's forward and backward: nn.Softplus's threshold 20, Mish = x·tanh(softplus(x)),
clamp passing the gradient where min ≤ x ≤ max (inclusive, zero outside), torch.where sending the gradient only to
the branch it took (so an Again step skips the S_r·best branch altogether, and a success step the PLS one).
Tested equal to the torch path (NN17Net.forward_batch under autograd) in tests/test_nn17_compiled.py.

Parameters are flat in NN17Net.parameters() order: S0[4], D0[4], sinc_w[3], then the five MLPs
Linear(n→1) → Mish → Linear(1→1), each stored as (w1[n], b1, w2, b2): rw (n = 3), next_d (3), pls (2), sinc (3),
best_sinc (2) — 39 numbers.

Why hand-written, not generated (issue #39): NN-17's state is a few floats per card and its MLPs have one unit, so
engine/traced.py could trace its step written as a torch init / step / curve; but it is trained as the networks are
(neural/card_fit.py, neural_seq.fit_cards' recipe: groups of whole cards of about 512 targets in a torch.randperm
order each epoch, Adam at a cosine rate, the clip box after every step, the final weights), whose batches the generated
plug-in's trainer does not make (engine/seq_engine.py's adam_fit: its own card batches and order), and its torch module
(neural/nn17_torch.py, the `--trainer upstream` path and the reference tests/test_nn17_compiled.py holds this kernel
equal to) is written with nn.Linear layers. Generating card_fit's card_loss from one definition is left.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from engine.jit import inlined
from engine.kernel_math import SOFTPLUS_THRESHOLD, bce, sigmoid

S_MIN = 0.01  # s_min in day mode
S_MAX = 36500.0
R_MIN = 0.0001  # ExpActivation's and R_t's clamp
R_MAX = 0.9999
LOG_09 = math.log(0.9)

# offsets into the flat parameter vector
S0, D0, SINC_W = 0, 4, 8
RW, NEXT_D, PLS, SINC, BEST_SINC = 11, 17, 23, 28, 34
N_PARAMS = 39

# columns of a step's record (what the reverse pass reads): pre-Mish `A_*` and pre-activation `Z_*` values of the
# MLPs, and the unclamped values whose clamps decide where the gradient passes; then what the forward pass computed
# on the way and the reverse pass would otherwise compute again (the same numbers): each MLP's tanh(softplus(A))
# and σ(A) (`T_*`, `G_*`: Mish's factor and its derivative's sigmoid, see mish_parts), the softplus of the PLS and
# best_sinc outputs, and sinc_t's product A·B·C·E and A·C·E (an exp, a pow and an exp). Training kernel on a
# 45k-review simulated user (5 folds): 0.37 CPU s before, 0.31 keeping the values (bit-identical), 0.19 with
# mish_parts' one exp per MLP, 0.17 with softplus_parts' one exp per softplus (final weights within 2e-12 relative),
# ~0.15 with a target reading its rw values from the card's next step (nn17_cards_loss; bit-identical).
(R_T, A_RW, Z_RW, E_RW, SR_RAW, A_ND, A_PLS, Z_PLS, A_SINC, Z_SINC, SINC_T, SINC_NN, A_BEST, Z_BEST, NS_RAW,
 T_RW, T_ND, T_PLS, T_SINC, T_BEST, SP_PLS, SP_BEST, PROD, ACE, G_RW, G_ND, G_PLS, G_SINC, G_BEST,
 SG_RW, SG_SINC, SG_PLS, SG_BEST) = range(33)
N_REC = 33
MISH_TANH_ONE = 20.0  # tanh(softplus(a)) rounds to 1 from here on (torch's softplus threshold too)


@inlined
def mish_parts(a):
    """(tanh(softplus(a)), σ(a)) from one exp: with e = e^a, tanh(ln(1 + e)) = n / (n + 2), n = e·(e + 2), and
    σ(a) = e / (1 + e) — Mish's factor and the sigmoid its derivative needs (kernel_math.mish_and_grad), instead of
    exp, log1p and tanh for the first and another exp for the second. Equal to those to a few ulp."""
    if a > MISH_TANH_ONE:
        return 1.0, 1.0 / (1.0 + math.exp(-a))
    e = math.exp(a)
    n = e * (e + 2.0)
    return n / (n + 2.0), e / (1.0 + e)


@inlined
def softplus_parts(z):
    """(softplus(z), its derivative, e^{−softplus(z)}) as torch's Softplus (threshold 20) from one exp: with e = e^z,
    ln(1 + e), e / (1 + e) and 1 / (1 + e) (kernel_math's softplus, softplus_grad, and exp(−softplus) for the rw
    output, which took an exp, a log1p and another exp). Equal to those to a few ulp (softplus itself exactly)."""
    if z > SOFTPLUS_THRESHOLD:
        return z, 1.0, math.exp(-z)
    e = math.exp(z)
    return math.log1p(e), e / (1.0 + e), 1.0 / (1.0 + e)


@inlined
def clamp(x, lo, hi):
    return min(max(x, lo), hi)


@inlined
def inside(x, lo, hi):
    """Where torch's clamp passes the gradient."""
    return lo <= x <= hi


@inlined
def mlp(th, o, n_in, x0, x1, x2):
    """Linear(n_in→1) → Mish → Linear(1→1) with weights th[o:o + n_in + 3] (x2 unused when n_in = 2):
    (the pre-Mish value a, tanh(softplus(a)) and σ(a) for `mlp_back`, the output z)."""
    a = th[o + n_in] + th[o] * x0 + th[o + 1] * x1
    if n_in == 3:
        a += th[o + 2] * x2
    tsp, sig = mish_parts(a)
    return a, tsp, sig, th[o + n_in + 2] + th[o + n_in + 1] * (a * tsp)  # a·tsp = mish(a)


@inlined
def mlp_back(th, gr, o, n_in, x0, x1, x2, a, tsp, sig, gz):
    """Reverse of `mlp` given dL/dz and its tsp = tanh(softplus(a)), sig = σ(a): adds dL/dθ into gr, returns
    dL/d(x0, x1, x2). Mish and its derivative as kernel_math.mish_and_grad, from the forward pass's values."""
    m, dm = a * tsp, tsp + a * sig * (1.0 - tsp * tsp)
    gr[o + n_in + 2] += gz
    gr[o + n_in + 1] += gz * m
    ga = gz * th[o + n_in + 1] * dm
    gr[o + n_in] += ga
    gr[o] += ga * x0
    gr[o + 1] += ga * x1
    if n_in == 3:
        gr[o + 2] += ga * x2
        return ga * th[o], ga * th[o + 1], ga * th[o + 2]
    return ga * th[o], ga * th[o + 1], 0.0


@inlined
def sinc_t_factors(th, nd, sr, rw):
    """sinc_t = 1 + A·B·C·E with A = e^{w0}, B = 5(1 − D') + 1, C = S_r^{−w1}, E = e^{−r_w·w2}."""
    return math.exp(th[SINC_W]), 5.0 * (1.0 - nd) + 1.0, sr ** (-th[SINC_W + 1]), math.exp(-rw * th[SINC_W + 2])


@inlined
def first_index(g):
    """S0/D0 index of a first rating, as torch's (g.long() − 1).clamp(0, 3)."""
    return min(max(int(g) - 1, 0), 3)


@njit(cache=True)
def step(th, s, d, t, g, lapses, rec, k):
    """NN17Net.step for one card: the state (S', D') after a review (t, G, lapses) from (s, d); fills rec[k]."""
    rt_raw = 0.9 ** (t / s)
    rec[k, R_T] = rt_raw
    a, tsp, sig, z = mlp(th, RW, 3, d, s, clamp(rt_raw, R_MIN, R_MAX))
    rec[k, A_RW], rec[k, T_RW], rec[k, G_RW], rec[k, Z_RW] = a, tsp, sig, z
    _, sg, e = softplus_parts(z)
    rec[k, E_RW], rec[k, SG_RW] = e, sg
    rw = clamp(e, R_MIN, R_MAX)  # ExpActivation's clamp, then step's own (the same box)
    sr_raw = LOG_09 / math.log(rw) * t
    rec[k, SR_RAW] = sr_raw
    sr = clamp(sr_raw, S_MIN, S_MAX)
    a, tsp, sig, z = mlp(th, NEXT_D, 3, d, rw, g)
    rec[k, A_ND], rec[k, T_ND], rec[k, G_ND] = a, tsp, sig
    nd = sigmoid(z)
    if g > 1:
        fa, fb, fc, fe = sinc_t_factors(th, nd, sr, rw)
        prod = fa * fb * fc * fe
        rec[k, PROD], rec[k, ACE] = prod, fa * fc * fe
        sinc_t = 1.0 + prod
        a, tsp, sig, z = mlp(th, SINC, 3, nd, sr, rw)
        rec[k, A_SINC], rec[k, T_SINC], rec[k, G_SINC], rec[k, Z_SINC] = a, tsp, sig, z
        sp, sg, _ = softplus_parts(z)
        sinc_nn = 1.0 + sp
        rec[k, SINC_T], rec[k, SINC_NN], rec[k, SG_SINC] = sinc_t, sinc_nn, sg
        a, tsp, sig, z = mlp(th, BEST_SINC, 2, sinc_t, sinc_nn, 0.0)
        rec[k, A_BEST], rec[k, T_BEST], rec[k, G_BEST], rec[k, Z_BEST] = a, tsp, sig, z
        sp, sg, _ = softplus_parts(z)
        rec[k, SP_BEST], rec[k, SG_BEST] = sp, sg
        ns_raw = sr * (1.0 + sp)
    else:
        a, tsp, sig, z = mlp(th, PLS, 2, rw, lapses, 0.0)
        rec[k, A_PLS], rec[k, T_PLS], rec[k, G_PLS], rec[k, Z_PLS] = a, tsp, sig, z
        sp, sg, _ = softplus_parts(z)
        rec[k, SP_PLS], rec[k, SG_PLS] = sp, sg
        ns_raw = clamp(sp, S_MIN, S_MAX)
    rec[k, NS_RAW] = ns_raw
    return clamp(ns_raw, S_MIN, S_MAX), nd


@njit(cache=True)
def step_back(th, gr, s, d, t, g, lapses, nd, rec, k, g_ns, g_nd):
    """Reverse of `step` (nd = its D'): given dL/d(S', D'), adds dL/dθ into gr, returns dL/d(s, d)."""
    g_ns = g_ns if inside(rec[k, NS_RAW], S_MIN, S_MAX) else 0.0
    rw = clamp(rec[k, E_RW], R_MIN, R_MAX)
    sr = clamp(rec[k, SR_RAW], S_MIN, S_MAX)
    g_rw = 0.0
    g_sr = 0.0
    if g > 1:  # S' = S_r·best, best = 1 + softplus(best_sinc(sinc_t, sinc_nn))
        g_sr += g_ns * (1.0 + rec[k, SP_BEST])
        g_st, g_snn, _ = mlp_back(th, gr, BEST_SINC, 2, rec[k, SINC_T], rec[k, SINC_NN], 0.0, rec[k, A_BEST],
                                  rec[k, T_BEST], rec[k, G_BEST], g_ns * sr * rec[k, SG_BEST])
        dnd, dsr, drw = mlp_back(th, gr, SINC, 3, nd, sr, rw, rec[k, A_SINC], rec[k, T_SINC], rec[k, G_SINC],
                                 g_snn * rec[k, SG_SINC])
        g_nd += dnd
        g_sr += dsr
        g_rw += drw
        prod = rec[k, PROD]
        gr[SINC_W] += g_st * prod
        gr[SINC_W + 1] -= g_st * prod * math.log(sr)
        gr[SINC_W + 2] -= g_st * prod * rw
        g_nd -= g_st * 5.0 * rec[k, ACE]
        g_sr -= g_st * prod * th[SINC_W + 1] / sr
        g_rw -= g_st * prod * th[SINC_W + 2]
    else:  # S' = PLS = clamp(softplus(pls(r_w, lapses)))
        g_pls = g_ns if inside(rec[k, SP_PLS], S_MIN, S_MAX) else 0.0
        drw, _, _ = mlp_back(th, gr, PLS, 2, rw, lapses, 0.0, rec[k, A_PLS], rec[k, T_PLS], rec[k, G_PLS],
                             g_pls * rec[k, SG_PLS])
        g_rw += drw
    # D' = σ(next_d(d, r_w, G))
    g_d, drw, _ = mlp_back(th, gr, NEXT_D, 3, d, rw, g, rec[k, A_ND], rec[k, T_ND], rec[k, G_ND],
                           g_nd * nd * (1.0 - nd))
    g_rw += drw
    # S_r = ln 0.9 / ln r_w · t, clamped
    if inside(rec[k, SR_RAW], S_MIN, S_MAX):
        lr = math.log(rw)
        g_rw -= g_sr * LOG_09 * t / (lr * lr * rw)
    # r_w = clamp(exp(−softplus(rw(d, s, R_t)))), R_t = clamp(0.9^{t/s})
    e = rec[k, E_RW]
    g_e = g_rw if inside(e, R_MIN, R_MAX) else 0.0
    rt_raw = rec[k, R_T]
    dd, g_s, drt = mlp_back(th, gr, RW, 3, d, s, clamp(rt_raw, R_MIN, R_MAX), rec[k, A_RW], rec[k, T_RW], rec[k, G_RW],
                            -g_e * e * rec[k, SG_RW])
    g_d += dd
    if inside(rt_raw, R_MIN, R_MAX):
        g_s -= drt * rt_raw * LOG_09 * t / (s * s)
    return g_s, g_d


@njit(cache=True)
def nn17_cards_loss(model, layout, cards, theta, want, grad, p_out):
    """neural/card_fit.py's card_loss for NN-17 (model: unused, ()): Σ weight·BCE over every target of `cards`,
    each target's P(recall) = rw(D, S, 0.9^{t/S}) (R unclamped) from the state after its history written to
    p_out[its index]; with `want`, the gradient is ADDED into grad, from one forward and one reverse pass per card."""
    feats, c_start, c_steps, c_tfirst, c_count, t_pos, t_dt, t_g, t_y, t_w = layout
    n_max = 1
    for c in cards:
        n_max = max(n_max, c_steps[c])
    S = np.empty(n_max)
    D = np.empty(n_max)
    gS = np.empty(n_max)
    gD = np.empty(n_max)
    rec = np.empty((n_max, N_REC))
    loss = 0.0
    for c in cards:
        x0 = c_start[c]
        n = c_steps[c]
        i0 = first_index(feats[x0, 1])
        s0 = theta[S0 + i0]
        S[0] = clamp(s0, S_MIN, S_MAX)
        D[0] = theta[D0 + i0]
        for k in range(1, n):
            S[k], D[k] = step(theta, S[k - 1], D[k - 1], feats[x0 + k, 0], feats[x0 + k, 1], feats[x0 + k, 2], rec, k)
        gS[:n] = 0.0
        gD[:n] = 0.0
        for j in range(c_tfirst[c], c_tfirst[c] + c_count[c]):
            k = t_pos[j] - 1  # the state after the target's history
            s, d, t = S[k], D[k], t_dt[j]
            if k + 1 < n and t == feats[x0 + k + 1, 0] and inside(rec[k + 1, R_T], R_MIN, R_MAX):
                # the card's next step ran the same rw MLP on the same (D, S, R) (its R clamped, but inside the
                # box): the same numbers, read from its record
                r, a, tsp, sig = rec[k + 1, R_T], rec[k + 1, A_RW], rec[k + 1, T_RW], rec[k + 1, G_RW]
                e, sg = rec[k + 1, E_RW], rec[k + 1, SG_RW]
            else:
                r = 0.9 ** (t / s)
                a, tsp, sig, z = mlp(theta, RW, 3, d, s, r)
                _, sg, e = softplus_parts(z)
            p = clamp(e, R_MIN, R_MAX)
            p_out[j] = p
            lo, gp = bce(p, t_y[j], t_w[j])
            loss += lo
            if want:
                g_e = gp if inside(e, R_MIN, R_MAX) else 0.0
                dd, ds, dr = mlp_back(theta, grad, RW, 3, d, s, r, a, tsp, sig, -g_e * e * sg)
                gS[k] += ds - dr * r * LOG_09 * t / (s * s)
                gD[k] += dd
        if want:
            for k in range(n - 1, 0, -1):
                x = x0 + k
                gs, gd = step_back(theta, grad, S[k - 1], D[k - 1], feats[x, 0], feats[x, 1], feats[x, 2], D[k],
                                   rec, k, gS[k], gD[k])
                gS[k - 1] += gs
                gD[k - 1] += gd
            if inside(s0, S_MIN, S_MAX):
                grad[S0 + i0] += gS[0]
            grad[D0 + i0] += gD[0]
    return loss
