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
"""

from __future__ import annotations

import math

from numba import njit

from models.dash import round4, with_max_seq_len
from models.kernel_math import bce, sigmoid
from models.seq_model import SeqModel

SECONDS_PER_DAY = 86400.0
# scratch columns per review k of the card: τ_k, e^{m_k} (0 for k = 0), ∂m_k/∂a, ∂m_k/∂c, ∂m_k/∂h
N_STATE = 5


@njit(cache=True)
def activation(w, st, k, tau_now):
    """(m, ∂m/∂a, ∂m/∂c, ∂m/∂h) at time tau_now from the reviews 0..k−1 stored in st."""
    a = w[0]
    c = w[1]
    h = w[4]
    s = 0.0
    sa = 0.0
    sc = 0.0
    sh = 0.0
    for i in range(k):
        e = st[i, 1]
        d = c * e + a
        dd_a = 1.0 + c * e * st[i, 2]
        dd_c = e + c * e * st[i, 3]
        dd_h = c * e * st[i, 4]
        raw = (tau_now - st[i, 0]) * SECONDS_PER_DAY * h
        if raw >= 1.0:  # max(1, ·): torch's clamp_min passes the gradient at equality too
            lx = math.log(raw)
            dlx_h = 1.0 / h
        else:
            lx = 0.0
            dlx_h = 0.0
        term = math.exp(-d * lx)
        s += term
        sa -= term * lx * dd_a
        sc -= term * lx * dd_c
        sh -= term * (lx * dd_h + d * dlx_h)
    if s > 0.0:
        return math.log(s), sa / s, sc / s, sh / s
    return -math.inf, 0.0, 0.0, 0.0  # every term underflowed: e^{m} = 0 from here on, as for the first review


@njit(cache=True)
def card(w, seq_dt, seq_g, start, n, t_pos, t_dt, t_y, t_wt, tb, te, buf, gw, out, with_grad):
    st = buf[0]
    st[0, 0] = seq_dt[start]
    st[0, 1] = 0.0
    st[0, 2] = 0.0
    st[0, 3] = 0.0
    st[0, 4] = 0.0
    for k in range(1, n):  # the history reviews' activations at their own presentation
        st[k, 0] = st[k - 1, 0] + seq_dt[start + k]
        m, ma, mc, mh = activation(w, st, k, st[k, 0])
        st[k, 1] = math.exp(m)
        st[k, 2] = ma
        st[k, 3] = mc
        st[k, 4] = mh
    loss = 0.0
    s = w[2]
    tau = w[3]
    for j in range(tb, te):
        k = t_pos[j]
        m, ma, mc, mh = activation(w, st, k, st[k - 1, 0] + t_dt[j])
        q = (tau - m) / s
        p = sigmoid(-q)
        if with_grad:
            lo, gp = bce(p, t_y[j], t_wt[j])
            loss += lo
            gq = -gp * p * (1.0 - p)
            gw[3] += gq / s
            gw[2] -= gq * q / s
            gm = -gq / s
            gw[0] += gm * ma
            gw[1] += gm * mc
            gw[4] += gm * mh
        else:
            out[j] = p
    return loss


@njit(cache=True)
def card_loss_grad(w, seq_dt, seq_g, start, n, t_pos, t_dt, t_y, t_wt, tb, te, buf, gw):
    return card(w, seq_dt, seq_g, start, n, t_pos, t_dt, t_y, t_wt, tb, te, buf, gw, gw, True)


@njit(cache=True)
def card_predict(w, seq_dt, seq_g, start, n, t_pos, t_dt, tb, te, buf, out):
    card(w, seq_dt, seq_g, start, n, t_pos, t_dt, t_dt, t_dt, tb, te, buf, out, out, False)


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
    engine_batching = "length"
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
