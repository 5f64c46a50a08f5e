"""Numba helpers shared by every compiled kernel (the engine's, the DASH/ACT-R card kernels, the neural ones)."""

from __future__ import annotations

import math

import numpy as np
from numba import njit, types
from numba.extending import intrinsic

from engine.jit import inlined

BCE_LOG_FLOOR = -100.0  # torch's binary_cross_entropy clamps its logs here
BCE_GRAD_EPS = 1e-12  # ... and the denominator p(1-p) of its gradient here
SOFTPLUS_THRESHOLD = 20.0  # torch's nn.Softplus default: above it, softplus(x) = x


@inlined
def bce(p, y, wt):
    """(weighted BCE, d/dp) with torch's clamping, so the compiled trainers follow the torch ones exactly."""
    if y > 0.5:
        loss = -wt * max(math.log(p), BCE_LOG_FLOOR) if p > 0.0 else -wt * BCE_LOG_FLOOR
    else:
        loss = -wt * max(math.log1p(-p), BCE_LOG_FLOOR) if p < 1.0 else -wt * BCE_LOG_FLOOR
    return loss, wt * (p - y) / max(p * (1.0 - p), BCE_GRAD_EPS)


@inlined
def cosine_lr(lr, step, total):
    """torch's CosineAnnealingLR (eta_min 0, closed form) at optimizer step `step` of T_max = `total`."""
    return lr * 0.5 * (1.0 + math.cos(math.pi * step / total))


@njit(cache=True)
def adam_step(w, grad, m, v, step, lr, b1, b2, eps, weight_decay):
    """One Adam update of w in place (step = 1 for the first update), torch's formula; weight_decay > 0 makes it
    AdamW (decoupled: w shrinks by lr·weight_decay·w before the update)."""
    bc1 = 1.0 - b1 ** step
    bc2 = 1.0 - b2 ** step
    for j in range(len(w)):
        if weight_decay != 0.0:
            w[j] *= 1.0 - lr * weight_decay
        m[j] = b1 * m[j] + (1.0 - b1) * grad[j]
        v[j] = b2 * v[j] + (1.0 - b2) * grad[j] * grad[j]
        w[j] -= lr * (m[j] / bc1) / (math.sqrt(v[j] / bc2) + eps)


# FSRS v1-v4's day-mode lower clamp of S; their plug-ins' one run-time option (upstream's --secs: 1e-4)
LEGACY_S_MIN = 0.01


@njit(cache=True)
def weights_then_s_min(w, opts):
    """The `precompute` of a plug-in whose only run-time option is s_min (FSRS v1-v4, 4.5): wc = w followed by
    s_min (opts[0]; LEGACY_S_MIN without it), which the steps read as wc[len(w)]."""
    n = len(w)
    wc = np.empty(n + 1)
    for j in range(n):
        wc[j] = w[j]
    wc[n] = opts[0] if len(opts) > 0 else LEGACY_S_MIN
    return wc


@njit(cache=True)
def weights_then_s_min_vjp(w, opts, wc, gwc, gw):
    """s_min has no adjoint: the weights' part of gwc is copied."""
    for j in range(len(w)):
        gw[j] += gwc[j]


@inlined
def sigmoid(z):
    """1 / (1 + e^−z) without overflow for either sign."""
    if z >= 0.0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)


@inlined
def softplus(x):
    """torch's softplus (beta 1, threshold 20): ln(1 + e^x), or x itself above the threshold."""
    return x if x > SOFTPLUS_THRESHOLD else math.log1p(math.exp(x))


@inlined
def softplus_grad(x):
    """d softplus / dx as torch computes it: 1 above the threshold, else the sigmoid."""
    return 1.0 if x > SOFTPLUS_THRESHOLD else sigmoid(x)


@inlined
def mish(x):
    """torch's Mish, x·tanh(ln(1 + e^x)) (tanh of the softplus is 1 in float64 long before the threshold)."""
    return x * math.tanh(softplus(x))


@inlined
def mish_and_grad(x):
    """(Mish(x), d Mish / dx) with d Mish / dx = tanh(sp) + x·σ(x)·(1 − tanh(sp)²), sp = softplus(x) (torch's
    mish_backward), sharing one tanh(softplus(x))."""
    tsp = math.tanh(softplus(x))
    return x * tsp, tsp + x * sigmoid(x) * (1.0 - tsp * tsp)


@njit(cache=True)
def l2_prior(w, w_init, inv_var):
    """Σ_j (w_j − w_init_j)² / σ_j²: the trainers' pull towards the initial weights (inv_var = 1/σ², 0 for none)."""
    p = 0.0
    for j in range(len(w)):
        p += (w[j] - w_init[j]) ** 2 * inv_var[j]
    return p


@njit(cache=True)
def stable_argsort_small(keys, descending):
    """np.argsort(keys, kind="stable") for small non-negative integer keys (sequence lengths), by counting: equal
    keys keep their order; with `descending` the largest key first (still stable). A fine-tune sorts its cards by
    length once per chunk in every pass; numba's merge sort was ~1% of the LSTM's pass."""
    n = len(keys)
    top = 0
    for i in range(n):
        top = max(top, keys[i])
    start = np.zeros(top + 2, dtype=np.int64)
    for i in range(n):
        k = top - keys[i] if descending else keys[i]
        start[k + 1] += 1
    for k in range(top + 1):
        start[k + 1] += start[k]
    out = np.empty(n, dtype=np.int64)
    for i in range(n):
        k = top - keys[i] if descending else keys[i]
        out[start[k]] = i
        start[k] += 1
    return out


@njit(cache=True)
def lockstep_plan(lengths):
    """The time-major layout of sequences sorted by length, longest first (the GRU family's lockstep kernels, the
    LSTM's packed chunks): A[k] = how many are still running at step k (a prefix of slots: slot c is the c-th
    longest sequence) and base[k] = Σ A[:k], the number of (sequence, step) cells before step k. A quantity with W values per cell of step k lives at base[k]·W + w·A[k] + c, so the
    cells of one step and one w are contiguous over the running sequences."""
    n_l = lengths[0] if len(lengths) else 0
    A = np.zeros(n_l, dtype=np.int64)
    for c in range(len(lengths)):
        for k in range(lengths[c]):
            A[k] += 1
    base = np.zeros(n_l + 1, dtype=np.int64)
    for k in range(n_l):
        base[k + 1] = base[k] + A[k]
    return A, base


@njit(cache=True)
def card_batch_bounds(sizes, batch_size):
    """Cut a sequence of cards (sizes = their target counts, in training order) into batches: a batch closes once
    it holds >= batch_size targets, the last one with whatever is left. Returns the boundaries (len = batches + 1)."""
    bounds = np.empty(len(sizes) + 1, dtype=np.int64)
    bounds[0] = 0
    nb = 0
    acc = 0
    for pos in range(len(sizes)):
        acc += sizes[pos]
        if acc >= batch_size or pos == len(sizes) - 1:
            nb += 1
            bounds[nb] = pos + 1
            acc = 0
    return bounds[:nb + 1]


def warm_numba() -> None:
    """Load numba's typing registries (~1 s, the first cached kernel any process loads pays it) by loading one small
    kernel. Called before forking the worker pool, so that every worker inherits them instead of paying it again."""
    card_batch_bounds(np.zeros(1, dtype=np.int64), 1)


@intrinsic
def select(typingctx, cond, a, b):
    """`a if cond else b` for two float64 values already computed, as one LLVM select: the value the conditional
    expression gives, bit for bit, and what LLVM makes of it (a lane loop vectorises the same), but one call in the
    caller's numba IR instead of three blocks, whose passes cost more than linearly in their number (the generated
    code routes every gradient through a where, a clamp or a gather: FSRS-6's reverse lane pass had ~40 of them;
    engine/traced_codegen.py)."""
    if not isinstance(cond, types.Boolean):
        return None

    def codegen(context, builder, signature, llargs):
        c, x, y = llargs
        x = context.cast(builder, x, signature.args[1], types.float64)
        y = context.cast(builder, y, signature.args[2], types.float64)
        return builder.select(c, x, y)

    return types.float64(cond, a, b), codegen
