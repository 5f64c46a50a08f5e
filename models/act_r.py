"""ACT-R (5 parameters, spec models.md §4; Pavlik & Anderson 2005/2008), as srs-benchmark's models/act_r.py@2a5494a2
and the Jan-2025 other.py `ACT_R` evaluate it.

Input (ACTRFeatureEngineer): the cumulative times τ_k = Σ_{m ≤ k} t_m of a card's reviews k = 0..K, where t_0 = 0
is the first review's interval and τ_K is the target ("now", its own interval included). Ratings are not used.
  m_0 = −∞ (so d_0 = a),   m_k = ln Σ_{j<k} max(1, (τ_k − τ_j)·86400·h)^{−d_j},   d_j = c·e^{m_j} + a,
  p = 1 / (1 + e^{(τ − m_K)/s}),   w = [a, c, s, τ, h].
Clip after every step: a, c, s, h ∈ [0.001, 1], τ ≤ −0.001.

--short --secs (upstream's "With same-day reviews" row): the same model over fractional days, same-day reviews in
the histories and as targets. Upstream's cumulative times are a float32 tensor (torch.cumsum of the float32
intervals: partial sums in double, each rounded to float32) and τ_k − τ_j a float32 subtraction; with fractional
days that rounding shows (a same-day Δ late in a long card history is quantized to float32's spacing of the
card's total time, ~5 s at 1,000 days, against the 1/h = 40 s floor of max(1, Δ·86400·h)), so `target_inputs`
reproduces it for such cards; whole-day cards (day mode) keep the float64 sums, which are then equal.

Quirks reproduced:
- fsrs_optimizer.BatchDataset measures a row as len(tensor) = history + 1, so training drops rows whose history is
  longer than max_seq_len − 1 (63), not max_seq_len.
- `state_dict` rounds to 4 decimals and upstream predicts with `Model(state_dict)`: the fitted weights (and the
  default/fallback ones) are rounded to 4 decimals.

Engine plug-in (contract: engine/seq_model_stub.py, custom-card form): one pass along the card computes the
activations m_1..m_{n−1} of the history reviews together with their derivatives with respect to a, c and h
(forward mode: d_j depends on the parameters through m_j); each target then sums over its history once more with
its own interval. O(n²) per card of n ≤ 128 reviews, computed once per card and pass.

Where the time goes (big simulated user, 45k reviews, 5 folds): ~75% in training (`adam_fit`), ~11.5M
(review, earlier review) pairs — 8.9M in the replays of upstream's length batches (each target replays its card
from the first review, O(history²), as upstream does), 2.6M in the full-objective checks after every epoch —
each costing an exp and a log (libm, ~55% of the kernel) plus the decay's arithmetic. Keeping decay terms across
targets does not help: the weights change after every batch, so a term can only be reused within one batch, and a
batch holds one target per card and history length (two targets of one card share a batch only where few cards
are that long and a batch spans several lengths). What helps:
- the decay d_j and its derivatives are computed once per review and pass (`decay`), not once per later review;
- ln(Δ·86400·h) = ln Δ + ln(86400·h), with ln Δ read from a table for whole-day Δ < 4096 (the benchmark's
  intervals are whole days): no log call per pair;
- the engine's "length-shared" batching: a card's targets within one batch (a range of history lengths) replay the
  card once, up to the longest (−25% pairs on that user);
- predictions and the full-objective checks run a forward pass without the derivative sums (`card_predict`):
  ~10% of the kernel, bit-identical.
Together the kernel is 1.5× faster on that user (0.57 → 0.38 CPU s), the whole user 1.4× (0.73 → 0.52 CPU s,
median of 4 runs paired with the previous version); users of a few thousand reviews, where the shared pipeline
costs more than training, gain nothing. Results equal to the last printed digit (floating-point rounding only:
sums in another order, ln Δ + ln(86400·h) instead of ln(Δ·86400·h)). What is left is one exp per pair (libm,
~7 ns; numba here has no vector math library) and the loop around it.

Second round (issue #19; same user, 6.7M training pairs and 4.0M check pairs over its five fits, the captured
`adam_fit` calls replayed in process, CPU, alternating with the previous version):
- e^{m_k} is S_k = Σ_j max(1, ·)^{−d_j} itself, so a history review's decay d_k = c·S_k + a and its derivatives
  (c·∂S/∂x, + 1 for a, + S for c) need no log, no exp and no division; only targets take ln S (`decay`);
- ln(86400·h) and 1/h once per batch (the engine's `precompute`), not once per activation;
- ln Δ of every pair once per Cards (`target_inputs`: the card's history triangle and each target's own row,
  ~2 MB for this user), so a pair is a load, an add and the exp; a pair is "off" (term 1, no gradient) where
  ln Δ + ln(86400·h) < 0, i.e. Δ·86400·h < 1 up to the rounding at exactly 1.
`adam_fit` 0.27–0.36 → 0.19–0.25 CPU s (~1.3×), the whole user ~1.2× (the rest: features, batching set-up,
predictions, metrics, ~0.09 s). Fitted weights within 2e−16 of the previous version's. Replacing libm's exp by
vec_math.exp1 in the (short, mean history ~7 pair-weighted) pair loops was slower (a 13-term polynomial per
value without vectorisation); with the exp out of the loop (an experiment, wrong values) training would take
~0.09 s of its ~0.15 s: the exp is ~40% of training, the per-item bookkeeping (~340k item replays of ~5 reviews)
the rest. vec_math.exp_table (2^(i/128) from a table and a degree-5 polynomial, inlined; within 1 ulp of libm's)
in its place: `adam_fit` ~1.1× faster (in-process A/B, median of 8 alternating pairs), weights within 1e−15.
(In DASH[ACT-R]'s loop, whose time is mostly per target, it gained ~4%, within noise, and is not used there.)
What is left: the exp (~5 ns a pair) and the per-item loop. The next step would be several cards side by side
(items of one batch with the same history length: ~80% of the training pairs on this user) with a vectorised
exp, which needs an engine hook for a model's own batch loop.
The table's projection (bench_executors.py project, 6 simulated users, three pairs run side by side with the
previous version): 1.58 → 1.05, 1.89 → 0.98, 1.36 → 1.07 CPU-hours for 10,000 users (1.27–1.93×, median 1.5×);
result lines of the embedded data, six sim36 users and the 45k-review one identical, unrounded LogLoss within
1.2e−16.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from config import ACCEPTS_SECS
from models.dash import round4, whole_days, with_max_seq_len
from models.history_constants import SECONDS_PER_DAY
from engine.jit import inlined
from engine.kernel_math import bce, sigmoid
from engine.seq_model import SeqModel
from engine.vec_math import exp_table

# scratch columns per review k of the card: d_k, ∂d_k/∂a, ∂d_k/∂c, ∂d_k/∂h
N_STATE = 4


# ln of whole-day intervals: the benchmark's intervals are whole days, so every τ_k − τ_i below this bound reads
# its logarithm here instead of calling log (ln(Δ·86400·h) = ln Δ + ln(86400·h)); other values call log.
N_LOG_DAYS = 4096
LOG_DAYS = np.log(np.maximum(np.arange(N_LOG_DAYS, dtype=np.float64), 1.0))
NO_INTERVAL = -math.inf  # ln Δ stored for Δ <= 0: ln Δ + ln(86400·h) < 0, so max(1, ·) takes 1


@inlined
def log_days(dt):
    """ln Δ for Δ = dt days (NO_INTERVAL for Δ <= 0): whole days below N_LOG_DAYS from LOG_DAYS, else log."""
    idx = int(dt)
    if idx == dt and 0 <= idx < N_LOG_DAYS:
        return LOG_DAYS[idx] if idx > 0 else NO_INTERVAL
    return math.log(dt) if dt > 0.0 else NO_INTERVAL


@njit(cache=True)
def target_inputs(seq_dt, seq_g, c_start, c_tb, c_te, t_pos, t_dt):
    """ln Δ of every (review, earlier review) pair the card functions sum over, once per Cards (the engine's
    target_inputs hook: they depend on the data alone). Returns (lnd, hist, tgt), handed to the card functions in
    place of t_dt:
    - the card's history triangle: ln(τ_k − τ_i) for k = 1..n−1, i < k (n = its longest target's history) at
      lnd[hist[j] + k(k−1)/2 + i], hist[j] the same for every target j of the card;
    - target j's own row: ln(τ_{K−1} + t_dt[j] − τ_i), i < K = t_pos[j], at lnd[tgt[j] + i].
    τ and Δ are built by the same additions and subtractions as upstream's cumulative times, so ln Δ is the
    previous in-pass computation's to the bit. Storage: Σ_cards n(n−1)/2 + Σ_targets K doubles (the pairs of one
    full-objective pass), ~2 MB for 45k reviews."""
    n_t = len(t_pos)
    hist = np.empty(n_t, dtype=np.int64)
    tgt = np.empty(n_t, dtype=np.int64)
    size = 0
    for c in range(len(c_start)):
        n = t_pos[c_te[c] - 1]
        size += n * (n - 1) // 2
        for j in range(c_tb[c], c_te[c]):
            size += t_pos[j]
    lnd = np.empty(size)
    tau = np.empty(max(1, t_pos.max() if n_t else 1))
    acc = np.empty(len(tau))
    off = 0
    for c in range(len(c_start)):
        start = c_start[c]
        n = t_pos[c_te[c] - 1]
        # fractional days (--secs; a whole-day card stays on the day-mode path, where float32 is exact): upstream's
        # cumulative times are a float32 tensor (torch.cumsum of float32 t accumulates in double and rounds each
        # partial sum to float32) and τ_k − τ_i a float32 subtraction, which quantizes a same-day Δ of a long card
        # history to the float32 spacing of its total time (~5 s at 1,000 days, against ACT-R's 40 s floor)
        f32 = not whole_days(seq_dt, start, n, t_dt, c_tb[c], c_te[c])
        tau[0] = seq_dt[start]
        acc[0] = np.float64(np.float32(seq_dt[start]))
        if f32:
            tau[0] = acc[0]
        for k in range(1, n):
            if f32:
                acc[k] = acc[k - 1] + np.float64(np.float32(seq_dt[start + k]))
                tau[k] = np.float64(np.float32(acc[k]))
            else:
                tau[k] = tau[k - 1] + seq_dt[start + k]
        base = off
        for k in range(1, n):
            for i in range(k):
                d = tau[k] - tau[i]
                lnd[off + i] = log_days(np.float64(np.float32(d)) if f32 else d)
            off += k
        for j in range(c_tb[c], c_te[c]):
            hist[j] = base
            tgt[j] = off
            k = t_pos[j]
            if f32:
                now = np.float64(np.float32(acc[k - 1] + np.float64(np.float32(t_dt[j]))))
            else:
                now = tau[k - 1] + t_dt[j]
            for i in range(k):
                d = now - tau[i]
                lnd[off + i] = log_days(np.float64(np.float32(d)) if f32 else d)
            off += k
    return lnd, hist, tgt



# wc (the engine's per-batch `precompute`): w followed by the constants of h that every activation needs
N_W = 5
WC_LOG_DAY_H = 5  # ln(86400·h)
WC_INV_H = 6  # 1/h


@njit(cache=True)
def precompute(w, opts):
    """wc = [a, c, s, τ, h, ln(86400·h), 1/h]: once per batch instead of a log per activation."""
    wc = np.empty(N_W + 2)
    for i in range(N_W):  # a loop: a slice assignment's shape check compiles numba's error message (~3 s)
        wc[i] = w[i]
    wc[WC_LOG_DAY_H] = math.log(SECONDS_PER_DAY * w[4])
    wc[WC_INV_H] = 1.0 / w[4]
    return wc


@njit(cache=True)
def precompute_vjp(w, opts, wc, gwc, gw):
    """The card functions differentiate with respect to a, c, s, τ and h directly: gw += gwc[:5]."""
    for j in range(N_W):
        gw[j] += gwc[j]


@inlined
def activation_sums(wc, st, k, lnd, off):
    """(S, ∂S/∂a, ∂S/∂c, ∂S/∂h) from the reviews 0..k−1 (d_i and its derivatives in st, see `decay`) with
    ln Δ_i = lnd[off + i]: S = Σ_i max(1, Δ_i·86400·h)^{−d_i} = e^{m}, each term exp(−d_i·ln(Δ_i·86400·h)) with
    ln(Δ_i·86400·h) = ln Δ_i + ln(86400·h); a term where that is below 0 is 1 with no gradient."""
    log_day_h = wc[WC_LOG_DAY_H]
    inv_h = wc[WC_INV_H]
    s = 0.0
    sa = 0.0
    sc = 0.0
    sh = 0.0
    for i in range(k):
        lx = lnd[off + i] + log_day_h
        if lx < 0.0:  # 1^{−d} = 1, and no gradient
            s += 1.0
            continue
        d = st[i, 0]
        term = exp_table(-d * lx)
        s += term
        tl = term * lx
        sa -= tl * st[i, 1]
        sc -= tl * st[i, 2]
        sh -= term * (lx * st[i, 3] + d * inv_h)
    return s, sa, sc, sh


@inlined
def activation_value(wc, st, k, lnd, off):
    """S alone (no derivatives), as `activation_sums` computes it: for predictions and the full-objective
    checks."""
    log_day_h = wc[WC_LOG_DAY_H]
    s = 0.0
    for i in range(k):
        lx = lnd[off + i] + log_day_h
        s += exp_table(-st[i, 0] * lx) if lx >= 0.0 else 1.0
    return s


@inlined
def decay(wc, st, k, s, sa, sc, sh):
    """Store review k's decay d_k = c·e^{m_k} + a = c·S_k + a and its derivatives with respect to a, c and h
    (c·∂S/∂x, plus 1 for a and S for c) in st[k] (review 0: S = 0, d_0 = a). e^{m} is S itself: no log and no exp
    per review. They depend on the weights only, so each is computed once per card pass instead of once per later
    review that sums over it."""
    c = wc[1]
    st[k, 0] = c * s + wc[0]
    st[k, 1] = 1.0 + c * sa
    st[k, 2] = s + c * sc
    st[k, 3] = c * sh


@inlined
def card_loss_grad(w, seq_dt, seq_g, start, n, t_pos, t_in, t_y, t_wt, tb, te, buf, gw):
    """t_in: target_inputs' (lnd, hist, tgt). Inlined into the engine's loops: ~9% of `adam_fit` on the 45k-review
    user (one call per work item, ~340k; in-process A/B, median of 8 alternating pairs), weights bit-identical;
    inlined, the training loss adam_fit does not read is dead code the compiler may drop."""
    lnd, hist, tgt = t_in
    st = buf[0]
    decay(w, st, 0, 0.0, 0.0, 0.0, 0.0)
    off = hist[tb]
    for k in range(1, n):  # the history reviews' activations at their own presentation
        sk, sa, sc, sh = activation_sums(w, st, k, lnd, off)
        off += k
        decay(w, st, k, sk, sa, sc, sh)
    loss = 0.0
    s = w[2]
    tau = w[3]
    for j in range(tb, te):
        sk, sa, sc, sh = activation_sums(w, st, t_pos[j], lnd, tgt[j])
        if sk > 0.0:
            m = math.log(sk)
            inv = 1.0 / sk
        else:  # every term underflowed: m = −∞, and no gradient through it
            m = -math.inf
            inv = 0.0
        q = (tau - m) / s
        p = sigmoid(-q)
        lo, gp = bce(p, t_y[j], t_wt[j])
        loss += lo
        gq = -gp * p * (1.0 - p)
        gw[3] += gq / s
        gw[2] -= gq * q / s
        gm = -gq / s * inv
        gw[0] += gm * sa
        gw[1] += gm * sc
        gw[4] += gm * sh
    return loss


@njit(cache=True)
def card_predict(w, seq_dt, seq_g, start, n, t_pos, t_in, tb, te, buf, out):
    """The forward pass alone (predictions, and the engine's full-objective checks through its card_loss): no
    derivative sums, ~1/4 of the training kernel's pairs on the 45k-review user."""
    lnd, hist, tgt = t_in
    st = buf[0]
    st[0, 0] = w[0]  # d_0 = a
    off = hist[tb]
    for k in range(1, n):
        st[k, 0] = w[1] * activation_value(w, st, k, lnd, off) + w[0]
        off += k
    for j in range(tb, te):
        sk = activation_value(w, st, t_pos[j], lnd, tgt[j])
        m = math.log(sk) if sk > 0.0 else -math.inf
        out[j] = sigmoid(-((w[3] - m) / w[2]))


# ------------------------------------------------------------------------------------------ the model

class ACTR(SeqModel):
    name = "ACT-R"
    accepts_secs = name in ACCEPTS_SECS  # --short --secs: fractional cumulative times
    kernels = "models.act_r"
    default_w = [0.176786766570677, 0.216967308403809, 0.254893976981164, -0.704205679427144, 0.025]
    lower = [0.001, 0.001, 0.001, -math.inf, 0.001]
    upper = [1.0, 1.0, 1.0, -0.001, 1.0]
    # From its defaults (Log Loss ≈ 3) five epochs stop far from convergence, so the batches decide the result:
    # the fast trainer replays upstream's length-sorted target batches (user 8 of upstream-check: 0.1264 with card
    # batches vs upstream's 0.1167).
    engine_batching = "length-shared"
    autograd = False  # no torch step functions: the card kernels are hand-written (--trainer autograd refused)

    def __init__(self, cfg=None):
        super().__init__(cfg)
        self.w = round4(self.default_w)  # upstream's fallback / --dry weights go through state_dict too

    def torch_net(self, w_init, grad_mask):
        from upstream.history_torch import ACTRNet

        return ACTRNet(w_init, self.lower, self.upper, dtype=self.torch_dtype)

    def fit(self, train) -> "ACTR":
        # upstream's tensor is history + 1 long, so BatchDataset keeps histories of at most max_seq_len − 1
        cfg = self.cfg
        self.cfg = with_max_seq_len(cfg, cfg.max_seq_len - 1)
        try:
            super().fit(train)
        finally:
            self.cfg = cfg
        self.w = round4(self.w)
        return self
