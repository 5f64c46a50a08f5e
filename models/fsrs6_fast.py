"""FSRS-6 with compiled full-sequence gradients (the `--trainer fast` path, issue #5).

Why this is fast
----------------
Every target row of a card is a prefix of the same review sequence (`ReviewData`: history = seq[start:start+pos]).
The upstream trainer (and fsrs-optimizer) re-runs the recurrence from the first review for every target, padded to
the longest history of a batch, so one epoch costs Σ_targets history_length steps of autograd-tracked torch ops.
Here the loss of ALL targets of a card is computed with ONE forward pass over the card's sequence (storing S and D
after each review), and its gradient with ONE reverse pass that carries the adjoints of (S, D) backwards and adds
each target's dBCE/dS where that target reads the state. So an epoch costs Σ_cards sequence_length steps of plain
float64 arithmetic in a numba kernel, with no graph, no padding and no Python per batch (the whole Adam loop,
mini-batches, cosine schedule, clipping and best-epoch selection run inside one `@njit` call).

Objective (spec/pipeline.md §6.1, the same as the upstream trainer's summed over an epoch):
    L(w) = Σ_i weight_i · BCE(R_i(w), y_i) + γ · Σ_j ((w_j − w_init_j) / σ_j)²,   γ = 1,
with w clipped to the FSRS-6 bounds after every optimiser step. Training rows whose history is longer than
`max_seq_len` are left out of the loss (upstream's BatchDataset drops them); the recurrence that later targets need
is unaffected because every row's state only depends on the card's earlier reviews.

Semantics follow the torch model exactly (spec/models.md §1.2, fsrs-optimizer `FSRS.step`):
- first review: S = w[G−1], D = clamp(w4 − e^{w5(G−1)} + 1, 1, 10);
- later review, using the OLD D for stability: same-day (t < 1) SInc = e^{w17(G−3+w18)}·S^{−w19},
  S' = S·max(SInc, 1) if G ≥ `clamp_grade` (3 in the benchmark's FSRS6 class; 2 in fsrs-rs ≥ 0.9 / newer OPT)
  else S·SInc; recall S' = S(1 + e^{w8}(11−D)S^{−w9}(e^{w10(1−R)}−1)·h·b); lapse
  S' = min(w11·D^{−w12}((S+1)^{w13}−1)e^{w14(1−R)}, S/e^{w17 w18});
  S clamped to [0.001, 36500]; D' = D − w6(G−3)(10−D)/9, D'' = w7·D0(4) + (1−w7)·D' with the UNCLAMPED
  D0(4) = w4 − e^{3 w5} + 1 (as `init_d(4)` in OPT/SB/RS), clamped to [1, 10];
- R(t, S) = (1 + F·t/S)^{−w20}, F = 0.9^{−1/w20} − 1.
Gradients use torch semantics: a clamp passes the gradient where min ≤ x ≤ max and zero outside; `max(SInc, 1)`
(torch `clamp(min=1)`) sends it to SInc when SInc ≥ 1 and nowhere otherwise; `min(S_f, S_min)` sends it to the
smaller one (half to each on an exact tie, like `torch.minimum`).

Optimiser: Adam (lr 4e-2, betas 0.9/0.999) with a per-step cosine schedule over mini-batches of whole cards
(≈ `batch_size` targets each, card order shuffled per epoch with a seeded numpy Generator), `n_epoch` epochs,
penalty·B/N per batch, clipping after each step, and the upstream best-checkpoint rule (full objective evaluated
before each epoch and after the last; the lowest wins, the initial weights included). `method="lbfgs"` runs
scipy's L-BFGS-B with the bounds on the same objective instead (measured slower for the same held-out loss; see
bench/bench_fsrs6.py).

JIT: the kernels are compiled on first use (≈ 5–10 s without a cache; `cache=True` stores them in __pycache__, so
later processes load them in well under a second). `warmup()` triggers compilation explicitly.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from models import fsrs6_params as params
from models.base import ReviewData, recency_weights  # noqa: F401 (recency_weights: upstream's --recency; re-exported)
from models.fsrs_v4 import hard_easy
from models.kernel_math import adam_step, card_batch_bounds, cosine_lr, l2_prior
from models.seq_engine import Cards as _Cards  # targets grouped by card: the layout of every one-pass kernel

N_PARAMS = 21
S_MIN = params.S_MIN
S_MAX = params.S_MAX
DEFAULT_W = np.array(params.DEFAULT_W)
SIGMA = np.array(params.SIGMA)
LOWER = np.array(params.CLIP_LO, dtype=np.float64)
UPPER = np.array(params.CLIP_HI, dtype=np.float64)

CLAMP_GRADE = 3  # same-day SInc floor of 1 applies for G >= this (3: benchmark FSRS6; 2: fsrs-rs >= 0.9)
LR = params.LR
SEED = 2023
LN09 = math.log(0.9)


# ---------------------------------------------------------------------------------------------- kernels (float64)

@njit(cache=True)
def _consts(w):
    """Per-parameter-vector constants, computed once per call instead of once per review."""
    c = np.empty(12)
    d = w[20]
    ef = math.exp(-LN09 / d)
    c[0] = ef - 1.0  # F
    c[1] = ef * LN09 / (d * d)  # dF/dw20
    c[2] = w[4] - math.exp(3.0 * w[5]) + 1.0  # D0(4), unclamped
    c[3] = math.exp(w[8])
    c[4] = math.exp(-w[17] * w[18])
    c[5] = math.exp(3.0 * w[5])
    for g in range(1, 5):
        c[5 + g] = math.exp(w[17] * (g - 3 + w[18]))  # short-term growth factor without S^-w19
    return c


@njit(cache=True)
def _forward_card(w, cst, seq_dt, seq_g, start, n, S_out, D_out, X1, X2, X3, clamp_grade):
    """States after reviews 0..n-1 of the card whose sequence begins at `start` (n >= 1).

    X1..X3 keep each step's transcendental intermediates (R; the power term S^-w9, S^-w19·e^.. or D^-w12;
    e^{w10(1-R)} or e^{w14(1-R)}) so the reverse pass needs only logs and products."""
    d = w[20]
    F = cst[0]
    d04 = cst[2]
    g0 = seq_g[start]
    s = min(max(w[g0 - 1], S_MIN), S_MAX)
    dd = min(max(w[4] - math.exp(w[5] * (g0 - 1)) + 1.0, 1.0), 10.0)
    S_out[0] = s
    D_out[0] = dd
    for k in range(1, n):
        t = seq_dt[start + k]
        g = seq_g[start + k]
        if t < 1.0:
            sinc = cst[5 + g] * s ** (-w[19])
            X2[k] = sinc
            if g >= clamp_grade and sinc < 1.0:
                sinc = 1.0
            ns = s * sinc
        else:
            r = math.exp(-d * math.log1p(F * t / s))
            X1[k] = r
            if g > 1:
                hb = hard_easy(w, g)
                pw = s ** (-w[9])
                e10 = math.exp(w[10] * (1.0 - r))
                X2[k] = pw
                X3[k] = e10
                ns = s * (1.0 + cst[3] * (11.0 - dd) * pw * (e10 - 1.0) * hb)
            else:
                dpw = dd ** (-w[12])
                e14 = math.exp(w[14] * (1.0 - r))
                X2[k] = dpw
                X3[k] = e14
                sf = w[11] * dpw * ((s + 1.0) ** w[13] - 1.0) * e14
                sm = s * cst[4]
                ns = sf if sf < sm else sm
        ndp = dd - w[6] * (g - 3) * (10.0 - dd) / 9.0
        nd = w[7] * d04 + (1.0 - w[7]) * ndp
        s = min(max(ns, S_MIN), S_MAX)
        dd = min(max(nd, 1.0), 10.0)
        S_out[k] = s
        D_out[k] = dd


@njit(cache=True)
def _card_loss_grad(w, cst, seq_dt, seq_g, start, n, t_pos, t_dt, t_y, t_wt, tb, te,
                    S_buf, D_buf, X1, X2, X3, gS_add, grad, clamp_grade):
    """Σ weight·BCE over the card's targets tb..te-1 (sorted by position); adds d/dw into `grad`."""
    _forward_card(w, cst, seq_dt, seq_g, start, n, S_buf, D_buf, X1, X2, X3, clamp_grade)
    d = w[20]
    F = cst[0]
    dF = cst[1]
    loss = 0.0
    for k in range(n):
        gS_add[k] = 0.0
    for j in range(tb, te):
        k = t_pos[j] - 1
        s = S_buf[k]
        t = t_dt[j]
        x = F * t / s
        l1x = math.log1p(x)
        lnr = -d * l1x
        if t_y[j] > 0.5:
            loss -= t_wt[j] * lnr
            dl_dlnr = -t_wt[j]
        else:
            r = math.exp(lnr)
            loss -= t_wt[j] * math.log(-math.expm1(lnr))
            dl_dlnr = t_wt[j] * r / (1.0 - r)
        gS_add[k] += dl_dlnr * d * x / ((1.0 + x) * s)
        grad[20] += dl_dlnr * (-l1x - d / (1.0 + x) * t / s * dF)

    d04 = cst[2]
    e8 = cst[3]
    gs = 0.0
    gd = 0.0
    for k in range(n - 1, 0, -1):
        gs += gS_add[k]
        s = S_buf[k - 1]
        dd = D_buf[k - 1]
        t = seq_dt[start + k]
        g = seq_g[start + k]
        # ---- difficulty: D_k = clamp(w7·d04 + (1−w7)·(D − w6(g−3)(10−D)/9), 1, 10)
        ndp = dd - w[6] * (g - 3) * (10.0 - dd) / 9.0
        nd = w[7] * d04 + (1.0 - w[7]) * ndp
        if nd < 1.0 or nd > 10.0:
            gnd = 0.0
        else:
            gnd = gd
        gd_old = 0.0
        if gnd != 0.0:
            gndp = gnd * (1.0 - w[7])
            grad[7] += gnd * (d04 - ndp)
            grad[4] += gnd * w[7]
            grad[5] += gnd * w[7] * (-3.0 * cst[5])
            grad[6] += gndp * (-(g - 3) * (10.0 - dd) / 9.0)
            gd_old = gndp * (1.0 + w[6] * (g - 3) / 9.0)
        # ---- stability
        gs_old = 0.0
        if gs != 0.0:
            if t < 1.0:
                sinc = X2[k]
                if g >= clamp_grade and sinc < 1.0:
                    ns = s
                    if ns >= S_MIN and ns <= S_MAX:
                        gs_old = gs
                else:
                    a = s * sinc
                    if a >= S_MIN and a <= S_MAX:
                        gs_old = gs * sinc * (1.0 - w[19])
                        grad[17] += gs * a * (g - 3 + w[18])
                        grad[18] += gs * a * w[17]
                        grad[19] += gs * a * (-math.log(s))
            else:
                x = F * t / s
                r = X1[k]
                dr_ds = r * d * x / ((1.0 + x) * s)
                dr_dd = r * (-math.log1p(x) - d / (1.0 + x) * t / s * dF)
                if g > 1:
                    hb = hard_easy(w, g)
                    pw = X2[k]
                    e10 = X3[k]
                    core = e8 * (11.0 - dd) * pw * (e10 - 1.0)  # inc / hb
                    inc = core * hb
                    ns = s * (1.0 + inc)
                    if ns >= S_MIN and ns <= S_MAX:
                        dns_dr = -s * e8 * (11.0 - dd) * pw * hb * w[10] * e10
                        gs_old = gs * (1.0 + inc - w[9] * inc + dns_dr * dr_ds)
                        grad[20] += gs * dns_dr * dr_dd
                        gd_old += gs * (-s * e8 * pw * (e10 - 1.0) * hb)
                        grad[8] += gs * s * inc
                        grad[9] += gs * s * inc * (-math.log(s))
                        grad[10] += gs * s * e8 * (11.0 - dd) * pw * hb * e10 * (1.0 - r)
                        if g == 2:
                            grad[15] += gs * s * core
                        elif g == 4:
                            grad[16] += gs * s * core
                else:
                    dpw = X2[k]
                    e14 = X3[k]
                    sp = (s + 1.0) ** w[13]
                    sf = w[11] * dpw * (sp - 1.0) * e14
                    em = cst[4]
                    sm = s * em
                    ns = sf if sf < sm else sm
                    if ns >= S_MIN and ns <= S_MAX:
                        cf = 1.0 if sf < sm else (0.5 if sf == sm else 0.0)
                        cm = 1.0 - cf
                        if cf > 0.0:
                            gf = gs * cf
                            dsf_dr = -sf * w[14]
                            gs_old += gf * (w[11] * dpw * w[13] * sp / (s + 1.0) * e14 + dsf_dr * dr_ds)
                            grad[20] += gf * dsf_dr * dr_dd
                            gd_old += gf * (-w[12] * sf / dd)
                            grad[11] += gf * dpw * (sp - 1.0) * e14
                            grad[12] += gf * sf * (-math.log(dd))
                            grad[13] += gf * w[11] * dpw * sp * math.log(s + 1.0) * e14
                            grad[14] += gf * sf * (1.0 - r)
                        if cm > 0.0:
                            gm = gs * cm
                            gs_old += gm * em
                            grad[17] += gm * (-w[18] * sm)
                            grad[18] += gm * (-w[17] * sm)
        gs = gs_old
        gd = gd_old
    # ---- first review
    gs += gS_add[0]
    g0 = seq_g[start]
    s0 = w[g0 - 1]
    if s0 >= S_MIN and s0 <= S_MAX:
        grad[g0 - 1] += gs
    d0 = w[4] - math.exp(w[5] * (g0 - 1)) + 1.0
    if d0 >= 1.0 and d0 <= 10.0:
        grad[4] += gd
        grad[5] += gd * (-(g0 - 1) * math.exp(w[5] * (g0 - 1)))
    return loss


@njit(cache=True)
def _scratch(c_n):
    m = 1
    for x in c_n:
        if x > m:
            m = x
    return np.empty((6, m))  # S, D, X1, X2, X3, dL/dS per step


@njit(cache=True)
def _loss_grad_cards(w, seq_dt, seq_g, c_start, c_n, c_tb, c_te, cards, t_pos, t_dt, t_y, t_wt, grad, clamp_grade):
    buf = _scratch(c_n)
    cst = _consts(w)
    loss = 0.0
    for ci in cards:
        loss += _card_loss_grad(w, cst, seq_dt, seq_g, c_start[ci], c_n[ci], t_pos, t_dt, t_y, t_wt, c_tb[ci],
                                c_te[ci], buf[0], buf[1], buf[2], buf[3], buf[4], buf[5], grad, clamp_grade)
    return loss


@njit(cache=True)
def _loss_cards(w, seq_dt, seq_g, c_start, c_n, c_tb, c_te, t_pos, t_dt, t_y, t_wt, buf, clamp_grade):
    """Σ weight·BCE over all cards (forward only)."""
    cst = _consts(w)
    d = w[20]
    F = cst[0]
    loss = 0.0
    S_buf = buf[0]
    for ci in range(len(c_start)):
        _forward_card(w, cst, seq_dt, seq_g, c_start[ci], c_n[ci], S_buf, buf[1], buf[2], buf[3], buf[4],
                      clamp_grade)
        for j in range(c_tb[ci], c_te[ci]):
            lnr = -d * math.log1p(F * t_dt[j] / S_buf[t_pos[j] - 1])
            if t_y[j] > 0.5:
                loss -= t_wt[j] * lnr
            else:
                loss -= t_wt[j] * math.log(-math.expm1(lnr))
    return loss


@njit(cache=True)
def _predict_kernel(w, seq_dt, seq_g, c_start, c_n, c_tb, c_te, t_pos, t_dt, out, clamp_grade):
    buf = _scratch(c_n)
    cst = _consts(w)
    d = w[20]
    F = cst[0]
    S_buf = buf[0]
    for ci in range(len(c_start)):
        _forward_card(w, cst, seq_dt, seq_g, c_start[ci], c_n[ci], S_buf, buf[1], buf[2], buf[3], buf[4],
                      clamp_grade)
        for j in range(c_tb[ci], c_te[ci]):
            out[j] = math.exp(-d * math.log1p(F * t_dt[j] / S_buf[t_pos[j] - 1]))


@njit(cache=True)
def _adam_fit(w0, w_init, inv_var, lower, upper, seq_dt, seq_g, c_start, c_n, c_tb, c_te, t_pos, t_dt, t_y, t_wt,
              orders, batch_size, lr, clamp_grade, check_every_epoch):
    """Adam + per-step cosine schedule over mini-batches of whole cards; best full-objective checkpoint among the
    initial weights and the end of every epoch (check_every_epoch, upstream's rule) or of the last one only."""
    n_epoch = orders.shape[0]
    n_cards = len(c_start)
    n_targets = c_te[n_cards - 1] - c_tb[0] if n_cards > 0 else 0
    buf = _scratch(c_n)
    grad = np.zeros(len(w0))
    sizes = c_te - c_tb
    n_batches_total = 0
    for e in range(n_epoch):
        n_batches_total += len(card_batch_bounds(sizes[orders[e]], batch_size)) - 1
    w = w0.copy()
    m = np.zeros(len(w0))
    v = np.zeros(len(w0))
    b1 = 0.9
    b2 = 0.999
    eps = 1e-8
    best_w = w.copy()
    best = _loss_cards(w, seq_dt, seq_g, c_start, c_n, c_tb, c_te, t_pos, t_dt, t_y, t_wt, buf,
                       clamp_grade) + l2_prior(w, w_init, inv_var)
    step = 0
    for e in range(n_epoch):
        order = orders[e]
        bounds = card_batch_bounds(sizes[order], batch_size)
        for b in range(len(bounds) - 1):
            for j in range(len(w)):
                grad[j] = 0.0
            nt = 0
            cst = _consts(w)
            for pos in range(bounds[b], bounds[b + 1]):
                ci = order[pos]
                nt += c_te[ci] - c_tb[ci]
                _card_loss_grad(w, cst, seq_dt, seq_g, c_start[ci], c_n[ci], t_pos, t_dt, t_y, t_wt, c_tb[ci],
                                c_te[ci], buf[0], buf[1], buf[2], buf[3], buf[4], buf[5], grad, clamp_grade)
            scale = nt / n_targets
            for j in range(len(w)):
                grad[j] += 2.0 * scale * (w[j] - w_init[j]) * inv_var[j]
            lr_t = cosine_lr(lr, step, n_batches_total)
            step += 1
            adam_step(w, grad, m, v, step, lr_t, b1, b2, eps, 0.0)
            for j in range(len(w)):
                w[j] = min(max(w[j], lower[j]), upper[j])
        if check_every_epoch or e == n_epoch - 1:
            cur = _loss_cards(w, seq_dt, seq_g, c_start, c_n, c_tb, c_te, t_pos, t_dt, t_y, t_wt, buf,
                              clamp_grade) + l2_prior(w, w_init, inv_var)
            if cur < best:
                best = cur
                best_w[:] = w
    return best_w, best


def _as_w(w) -> np.ndarray:
    w = np.ascontiguousarray(w, dtype=np.float64)
    if w.shape != (N_PARAMS,):
        raise ValueError(f"FSRS-6 needs {N_PARAMS} parameters, got shape {w.shape}")
    return w


def clip(w: np.ndarray) -> np.ndarray:
    return np.minimum(np.maximum(w, LOWER), UPPER)


# ------------------------------------------------------------------------------------------------ public API

def predict(w, data: ReviewData, clamp_grade: int = CLAMP_GRADE) -> np.ndarray:
    """R for every row of `data` in row order: one forward pass per card, float64."""
    w = _as_w(w)
    cards = _Cards(data)
    out = np.full(len(data), np.nan)
    p = np.empty(len(cards.t_row))
    _predict_kernel(w, cards.seq_dt, cards.seq_g, cards.c_start, cards.c_n, cards.c_tb, cards.c_te, cards.t_pos,
                    cards.t_dt, p, clamp_grade)
    out[cards.t_row] = p
    return out


def loss_and_grad(w, w_init, sigma, data: ReviewData, weights=None, clamp_grade: int = CLAMP_GRADE,
                  max_seq_len: int | None = None) -> tuple[float, np.ndarray]:
    """Σ weight·BCE + Σ((w − w_init)/σ)² and its gradient (torch clamp semantics), all rows of `data`
    (or only those with history length ≤ max_seq_len when given)."""
    w, w_init = _as_w(w), _as_w(w_init)
    inv_var = 1.0 / np.asarray(sigma, dtype=np.float64) ** 2
    keep = None if max_seq_len is None else data.rows["seq_pos"].to_numpy() <= max_seq_len
    cards = _Cards(data, weights, keep)
    return _eval(w, w_init, inv_var, cards, clamp_grade)


def _eval(w, w_init, inv_var, cards: _Cards, clamp_grade: int) -> tuple[float, np.ndarray]:
    grad = np.zeros(N_PARAMS)
    loss = _loss_grad_cards(w, cards.seq_dt, cards.seq_g, cards.c_start, cards.c_n, cards.c_tb, cards.c_te,
                            np.arange(len(cards.c_start)), cards.t_pos, cards.t_dt, cards.t_y, cards.t_wt,
                            grad, clamp_grade)
    loss += float(np.sum((w - w_init) ** 2 * inv_var))
    grad += 2.0 * (w - w_init) * inv_var
    return float(loss), grad


def fit(w_init, sigma, train: ReviewData, cfg=None, method: str = "adam", seed: int = SEED,
        clamp_grade: int = CLAMP_GRADE, lr: float = LR, check_every_epoch: bool = False) -> np.ndarray:
    """Train all 21 parameters from `w_init` (the post-S0-initialisation vector, also the prior centre).

    cfg supplies n_epoch, batch_size, max_seq_len and recency (RunConfig defaults when None). Returns clipped
    float64 weights. Deterministic for a given seed. The returned weights are the better (lower full objective) of
    w_init and the final weights; check_every_epoch=True also considers the end of every epoch, as upstream does
    (each check is a full forward pass, ~40 % of the fit time at 5 epochs; under the cosine schedule the last
    epoch is practically always the best, so it is off by default).
    """
    n_epoch = getattr(cfg, "n_epoch", 5)
    batch_size = getattr(cfg, "batch_size", 512)
    max_seq_len = getattr(cfg, "max_seq_len", 64)
    recency = getattr(cfg, "recency", False)
    w_init = _as_w(w_init)
    w0 = clip(w_init)
    inv_var = 1.0 / np.asarray(sigma, dtype=np.float64) ** 2
    weights = recency_weights(len(train)) if recency else None
    keep = train.rows["seq_pos"].to_numpy() <= max_seq_len
    cards = _Cards(train, weights, keep)
    n_cards = len(cards.c_start)
    if n_cards == 0:
        return w0
    if method == "lbfgs":
        from scipy.optimize import minimize

        res = minimize(lambda x: _eval(x, w_init, inv_var, cards, clamp_grade), w0, jac=True, method="L-BFGS-B",
                       bounds=list(zip(LOWER, UPPER)))
        return clip(res.x)
    if method != "adam":
        raise ValueError(f"unknown method {method!r}")
    rng = np.random.default_rng(seed)
    orders = np.stack([rng.permutation(n_cards) for _ in range(n_epoch)]).astype(np.int64) if n_epoch > 0 \
        else np.zeros((0, n_cards), dtype=np.int64)
    best_w, _ = _adam_fit(w0, w_init, inv_var, LOWER, UPPER, cards.seq_dt, cards.seq_g, cards.c_start, cards.c_n,
                          cards.c_tb, cards.c_te, cards.t_pos, cards.t_dt, cards.t_y, cards.t_wt, orders,
                          int(batch_size), float(lr), int(clamp_grade), bool(check_every_epoch))
    return clip(best_w)


def warmup() -> None:
    """Compile (or load from cache) every kernel on a two-card toy set."""
    import pandas as pd

    rows = pd.DataFrame({"card_id": [0, 0, 1], "delta_t": [1.0, 3.0, 2.0], "y": [1, 0, 1],
                         "seq_start": [0, 0, 3], "seq_pos": [1, 2, 1]})
    data = ReviewData(rows, np.array([0.0, 1.0, 3.0, 0.0, 2.0]), np.array([3, 3, 1, 1, 3], dtype=np.int8))
    predict(DEFAULT_W, data)
    loss_and_grad(DEFAULT_W, DEFAULT_W, SIGMA, data)
    fit(DEFAULT_W, SIGMA, data)
