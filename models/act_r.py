"""ACT-R (5 parameters, spec models.md §4; Pavlik & Anderson 2005/2008), as srs-benchmark's models/act_r.py@2a5494a2
and the Jan-2025 other.py `ACT_R` evaluate it.

Input (ACTRFeatureEngineer): the cumulative times τ_k = Σ_{m ≤ k} t_m of a card's reviews k = 0..K, where t_0 = 0
is the first review's interval and τ_K is the target ("now", its own interval included). Ratings are not used.
  m_0 = −∞ (so d_0 = a),   m_k = ln Σ_{j<k} max(1, (τ_k − τ_j)·86400·h)^{−d_j},   d_j = c·e^{m_j} + a,
  p = 1 / (1 + e^{(τ − m_K)/s}),   w = [a, c, s, τ, h].
Clip after every step: a, c, s, h ∈ [0.001, 1], τ ≤ −0.001.

Quirks reproduced:
- fsrs_optimizer.BatchDataset measures a row as len(tensor) = history + 1, so training drops rows whose history is
  longer than max_seq_len − 1 (63), not max_seq_len.
- `state_dict` rounds to 4 decimals and upstream predicts with `Model(state_dict)`: the fitted weights (and the
  default/fallback ones) are rounded to 4 decimals.

Engine plug-in (contract: models/seq_model_stub.py, custom-card form): one pass along the card computes the
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
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from models.dash import round4, with_max_seq_len
from models.kernel_math import bce, sigmoid
from models.seq_model import SeqModel

SECONDS_PER_DAY = 86400.0
# scratch columns per review k of the card: τ_k, d_k, ∂d_k/∂a, ∂d_k/∂c, ∂d_k/∂h
N_STATE = 5


# ln of whole-day intervals: the benchmark's intervals are whole days, so every τ_k − τ_i below this bound reads
# its logarithm here instead of calling log (ln(Δ·86400·h) = ln Δ + ln(86400·h)); other values call log.
N_LOG_DAYS = 4096
LOG_DAYS = np.log(np.maximum(np.arange(N_LOG_DAYS, dtype=np.float64), 1.0))


@njit(cache=True, inline="always")
def log_interval(dt, day_h, log_day_h):
    """(ln max(1, Δ·86400·h), whether max takes the interval: torch's clamp_min passes the gradient at equality
    too) for Δ = dt days; day_h = 86400·h, log_day_h = its log. Whole days below N_LOG_DAYS read ln Δ from LOG_DAYS
    (Δ = 0 is clamped); anything else calls log."""
    idx = int(dt)
    if idx == dt and 0 <= idx < N_LOG_DAYS:
        if idx == 0:
            return 0.0, False
        return LOG_DAYS[idx] + log_day_h, True
    raw = dt * day_h
    if raw >= 1.0:
        return math.log(raw), True
    return 0.0, False


@njit(cache=True)
def activation(w, st, k, tau_now):
    """(m, ∂m/∂a, ∂m/∂c, ∂m/∂h) at time tau_now from the reviews 0..k−1 stored in st (τ_i, d_i and d_i's
    derivatives, see `decay`)."""
    h = w[4]
    day_h = SECONDS_PER_DAY * h
    log_day_h = math.log(day_h)
    inv_h = 1.0 / h
    s = 0.0
    sa = 0.0
    sc = 0.0
    sh = 0.0
    for i in range(k):
        lx, on = log_interval(tau_now - st[i, 0], day_h, log_day_h)
        if not on:  # 1^{−d} = 1, and no gradient
            s += 1.0
            continue
        d = st[i, 1]
        term = math.exp(-d * lx)
        s += term
        tl = term * lx
        sa -= tl * st[i, 2]
        sc -= tl * st[i, 3]
        sh -= term * (lx * st[i, 4] + d * inv_h)
    if s > 0.0:
        return math.log(s), sa / s, sc / s, sh / s
    return -math.inf, 0.0, 0.0, 0.0  # every term underflowed: e^{m} = 0 from here on, as for the first review


@njit(cache=True)
def activation_value(w, st, k, tau_now):
    """m alone (no derivatives), as `activation` computes it: for predictions and the full-objective checks."""
    day_h = SECONDS_PER_DAY * w[4]
    log_day_h = math.log(day_h)
    s = 0.0
    for i in range(k):
        lx, on = log_interval(tau_now - st[i, 0], day_h, log_day_h)
        s += math.exp(-st[i, 1] * lx) if on else 1.0
    return math.log(s) if s > 0.0 else -math.inf


@njit(cache=True)
def decay(w, st, k, m, ma, mc, mh):
    """Store review k's decay d_k = c·e^{m_k} + a and its derivatives with respect to a, c and h in st[k, 1:5]
    (m_0 = −∞: d_0 = a). They depend on the weights only, so each is computed once per card pass instead of once
    per later review that sums over it."""
    a = w[0]
    c = w[1]
    e = math.exp(m)
    st[k, 1] = c * e + a
    st[k, 2] = 1.0 + c * e * ma
    st[k, 3] = e + c * e * mc
    st[k, 4] = c * e * mh


@njit(cache=True)
def card_loss_grad(w, seq_dt, seq_g, start, n, t_pos, t_dt, t_y, t_wt, tb, te, buf, gw):
    st = buf[0]
    st[0, 0] = seq_dt[start]
    decay(w, st, 0, -math.inf, 0.0, 0.0, 0.0)
    for k in range(1, n):  # the history reviews' activations at their own presentation
        st[k, 0] = st[k - 1, 0] + seq_dt[start + k]
        m, ma, mc, mh = activation(w, st, k, st[k, 0])
        decay(w, st, k, m, ma, mc, mh)
    loss = 0.0
    s = w[2]
    tau = w[3]
    for j in range(tb, te):
        k = t_pos[j]
        m, ma, mc, mh = activation(w, st, k, st[k - 1, 0] + t_dt[j])
        q = (tau - m) / s
        p = sigmoid(-q)
        lo, gp = bce(p, t_y[j], t_wt[j])
        loss += lo
        gq = -gp * p * (1.0 - p)
        gw[3] += gq / s
        gw[2] -= gq * q / s
        gm = -gq / s
        gw[0] += gm * ma
        gw[1] += gm * mc
        gw[4] += gm * mh
    return loss


@njit(cache=True)
def card_predict(w, seq_dt, seq_g, start, n, t_pos, t_dt, tb, te, buf, out):
    """The forward pass alone (predictions, and the engine's full-objective checks through its card_loss): no
    derivative sums, ~1/4 of the training kernel's pairs on the 45k-review user."""
    st = buf[0]
    st[0, 0] = seq_dt[start]
    st[0, 1] = w[0]  # d_0 = a
    for k in range(1, n):
        st[k, 0] = st[k - 1, 0] + seq_dt[start + k]
        st[k, 1] = w[1] * math.exp(activation_value(w, st, k, st[k, 0])) + w[0]
    for j in range(tb, te):
        k = t_pos[j]
        m = activation_value(w, st, k, st[k - 1, 0] + t_dt[j])
        out[j] = sigmoid(-((w[3] - m) / w[2]))


# ------------------------------------------------------------------------------------------ the model

class ACTR(SeqModel):
    name = "ACT-R"
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
        from models.history_torch import ACTRNet

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
