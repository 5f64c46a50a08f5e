"""DASH, DASH[MCM] and DASH[ACT-R] (spec models.md §3.1–3.3): logistic models of the whole review history.

For a target after `pos` reviews, let Δ_j be the time from review j (j = 0..pos−1, the first review included) to the
target: Δ_{pos−1} = the target's own interval, Δ_{j−1} = Δ_j + (interval before review j). Upstream builds it as the
reverse cumulative sum of t_item[1:] (features/dash_engineer.py@00c9de57; other.py create_features, Jan 2025).
- DASH: for windows W ∈ {1, 7, 30, ∞} days, n_W = #{j: Δ_j ≤ W} (≤: boundary included), c_W = #{those with
  G_j > 1}; p = σ(Σ θ_k·ln(1 + x_k) + b) with x = [n_1, c_1, n_7, c_7, n_30, c_30, n_∞, c_∞]. No clipping.
  With --short the same-day reviews are simply part of the history (Δ from their own position) and DASH-short's
  init is used (for DASH[MCM] too, as upstream's `DASH.__init__`).
- DASH[MCM]: every counted review weighs e^{−Δ_j/τ_W}, τ = [0.2434, 1.9739, 16.0090, 129.8426].
- DASH[ACT-R]: p = σ(w0·ln(1 + max(0, Σ_j Δ_j^{−w1}·(w3 if G_j > 1 else w2))) + w4), where upstream clamps Δ at 0.1
  and drops entries equal to 0.1 (its zero padding) — so any Δ ≤ 0.1 contributes nothing. Clip w0, w1 ≥ 0.001.
  With --short --secs (upstream's "With same-day reviews" row) that drops every genuine Δ ≤ 0.1 day (2.4 h): a
  review's same-day predecessors within 2.4 h do not count (a quirk reproduced). Upstream's Δ is float32
  (sp − cumsum(sp) + cumsum(sp)[−1] over the float32 intervals); with fractional days its rounding is reproduced
  (actr_float32_deltas), with the drop at Δ ≤ float32(0.1); whole-day cards keep the float64 sums, equal there.

Training quirks reproduced (fsrs_optimizer.BatchDataset measures a row's length as len(tensor)):
- DASH/DASH[MCM]'s tensor is the 8-feature vector, length 8 for every row, so NO training row is dropped for a long
  history, and the "sort by length" sorts equal keys: pandas' quicksort under upstream's numpy 1.26.4 PERMUTES the
  time-ordered rows (upstream/legacy_sort.py; numpy >= 2 would leave them in place). The fast trainer replays exactly
  that: the rows in numpy 1.26's order, cut every 512, the batches in torch.randperm order (seed 2023), Adam with
  the cosine schedule, and the best of the full-set losses before every epoch and after the last (seq_engine's
  batching "length" with equal_lengths, sort_kind NUMPY126, check_every_epoch). `--trainer upstream` sorts its rows
  the same way (SeqModel.batch_sort).
  Why (issue #19): the fast trainer used to train on shuffled whole-card batches and keep the better of the initial
  and the final weights only. Side by side with upstream's own January-2025 code on the 36 simulated users (sizes
  equal), mean Log Loss ours vs upstream went from DASH-short 0.3610 vs 0.3581, DASH 0.3468 vs 0.3459, DASH[MCM]
  0.3484 vs 0.3477 (worse on 29, 22 and 22 users of 36) to equal on every user to the 6th decimal (0.3581, 0.3459,
  0.3477). Most of DASH-short's gap was the checkpoint rule (its 5 Adam steps on a small fold overshoot; upstream
  keeps an earlier epoch's weights): that rule alone gave 0.3589. Upstream's batches in time order instead of numpy
  1.26's permutation give 0.3585 / 0.3459 / 0.3475 (per user up to ±0.003): the permutation is worth reproducing,
  not noise. On the upstream-check users the published reference depends on it by up to 5e-4; in the published
  results' tie order (the default, upstream/legacy_sort.py) every row here equals it to the 6th decimal.
- DASH[ACT-R]'s tensor has one row per previous review: the usual ≤ max_seq_len filter.
- DASH[ACT-R]'s `state_dict` rounds to 4 decimals, and upstream predicts with `Model(state_dict)`: the fitted
  (and the default, fallback) weights are rounded to 4 decimals. DASH's `state_dict` does not round.

Engine plug-in: the features depend on the whole history, so each variant defines card_loss_grad / card_predict
(contract: engine/seq_model_stub.py). DASH's and DASH[MCM]'s features depend on the data alone: their
`target_inputs` (window_inputs: per target an O(history) walk, 8 log1p) runs once per fit or prediction, and a pass
is then 9 multiply-adds, a sigmoid and a BCE per target. DASH[ACT-R]'s sum depends on w1: per target an O(history)
loop in every pass, over the ln Δ its target_inputs (actr_inputs) computed once.
The engine compiles its kernels once per module that exports these names; the three variants live in this one file,
so each is exposed as a small module object `models.dash.kernels_<variant>` registered in sys.modules at import.
"""

from __future__ import annotations

import copy
import math
import sys
import types

import numpy as np
from numba import njit

from config import ACCEPTS_SECS
from models.base import InadequateData, ReviewData
from models.history_constants import ACTR_MIN_DELTA, MCM_TAU, WINDOWS
from engine.jit import inlined
from engine.kernel_math import bce, sigmoid
from engine.seq_engine import NUMPY126
from engine.seq_model import SeqModel

N_STATE = 8
# upstream compares its float32 Δ, clamped at 0.1, with 0.1 (a float32 0.1 in a float32 tensor): Δ ≤ float32(0.1)
# is dropped (whole-day Δ never falls between 0.1 and float32(0.1) = 0.10000000149)
ACTR_MIN_DELTA_F32 = float(np.float32(ACTR_MIN_DELTA))


# ------------------------------------------------------------------------------------------ DASH / DASH[MCM]

@njit(cache=True)
def window_features(seq_dt, seq_g, start, pos, t_dt, decay, f):
    """f[0..7] = [n_1, c_1, n_7, c_7, n_30, c_30, n_∞, c_∞] of the target after `pos` reviews (elapsed t_dt);
    with `decay` each review counts e^{−Δ/τ_W} instead of 1."""
    for k in range(8):
        f[k] = 0.0
    delta = t_dt
    for i in range(pos - 1, -1, -1):
        success = seq_g[start + i] > 1
        for k in range(4):
            if delta <= WINDOWS[k]:
                e = math.exp(-delta / MCM_TAU[k]) if decay else 1.0
                f[2 * k] += e
                if success:
                    f[2 * k + 1] += e
        delta += seq_dt[start + i]


@njit(cache=True)
def window_inputs(seq_dt, seq_g, c_start, c_tb, c_te, t_pos, t_dt, decay):
    """ln(1 + x_k) of every target's 8 window features (row j: target j): they depend on the data alone, so the
    engine computes them once per fit or prediction (the plug-in's `target_inputs`) instead of in every pass —
    the O(history) window walk and 8 log1p per target were nearly all of a pass."""
    out = np.empty((len(t_pos), 8))
    f = np.empty(8)
    for c in range(len(c_start)):
        for j in range(c_tb[c], c_te[c]):
            window_features(seq_dt, seq_g, c_start[c], t_pos[j], t_dt[j], decay, f)
            for k in range(8):
                out[j, k] = math.log1p(f[k])
    return out


@njit(cache=True)
def dash_inputs(seq_dt, seq_g, c_start, c_tb, c_te, t_pos, t_dt):
    return window_inputs(seq_dt, seq_g, c_start, c_tb, c_te, t_pos, t_dt, False)


@njit(cache=True)
def mcm_inputs(seq_dt, seq_g, c_start, c_tb, c_te, t_pos, t_dt):
    return window_inputs(seq_dt, seq_g, c_start, c_tb, c_te, t_pos, t_dt, True)


@inlined
def windows_card(w, lf, t_y, t_wt, tb, te, gw, out, with_grad):
    """Loss (+ gradient into gw) or predictions (into out) of one card's targets; lf[j] = target j's ln(1 + x)
    (window_inputs, which the engine passes in place of t_dt).

    Inlined with its two entry points into the engine's loops: upstream's batches make every target its own work
    item (a call each, 9 multiply-adds of work), and the call cost as much as the work: the last-fold fit of a
    7.4k-review user 10.8 → 5.3 ms (best of 5, CPU), result lines bit-identical (36 simulated users)."""
    loss = 0.0
    for j in range(tb, te):
        z = w[8]
        for k in range(8):
            z += w[k] * lf[j, k]
        p = sigmoid(z)
        if with_grad:
            lo, gp = bce(p, t_y[j], t_wt[j])
            loss += lo
            gz = gp * p * (1.0 - p)
            for k in range(8):
                gw[k] += gz * lf[j, k]
            gw[8] += gz
        else:
            out[j] = p
    return loss


@inlined
def windows_card_loss_grad(w, seq_dt, seq_g, start, n, t_pos, t_dt, t_y, t_wt, tb, te, buf, gw):
    """DASH's and DASH[MCM]'s card loss and gradient (t_dt: their window_inputs)."""
    return windows_card(w, t_dt, t_y, t_wt, tb, te, gw, gw, True)


@inlined
def windows_card_predict(w, seq_dt, seq_g, start, n, t_pos, t_dt, tb, te, buf, out):
    windows_card(w, t_dt, out, out, tb, te, out, out, False)  # labels and weights: unread placeholders


# ------------------------------------------------------------------------------------------ DASH[ACT-R]

@njit(cache=True)
def actr_inputs(seq_dt, seq_g, c_start, c_tb, c_te, t_pos, t_dt):
    """(ln Δ_j, [G_j > 1]) of every target's counted past reviews (Δ_j > 0.1), newest first, target j's at
    off[j]..off[j+1]−1: they depend on the data alone, so the engine computes them once per fit or prediction (the
    plug-in's `target_inputs`) and a pass does one exp per pair instead of a log and an exp. Δ_j is built by the
    same additions as before (upstream's reverse cumulative sum), so ln Δ_j is bit for bit what the pass took."""
    n_t = len(t_pos)
    off = np.zeros(n_t + 1, dtype=np.int64)
    size = 0
    for j in range(n_t):
        size += t_pos[j]
    lnd = np.empty(size)
    succ = np.empty(size, dtype=np.bool_)
    q = 0
    cs = np.empty(max(1, t_pos.max() if n_t else 1), dtype=np.float32)
    for c in range(len(c_start)):
        start = c_start[c]
        whole = whole_days(seq_dt, start, t_pos[c_te[c] - 1], t_dt, c_tb[c], c_te[c])
        for j in range(c_tb[c], c_te[c]):
            pos = t_pos[j]
            if whole:
                delta = t_dt[j]
                for i in range(pos - 1, -1, -1):
                    if delta > ACTR_MIN_DELTA:
                        lnd[q] = math.log(delta)
                        succ[q] = seq_g[start + i] > 1
                        q += 1
                    delta += seq_dt[start + i]
            else:  # fractional days (--secs): upstream's float32 Δ, see actr_float32_deltas
                actr_float32_deltas(seq_dt, start, pos, t_dt[j], cs)
                for i in range(pos - 1, -1, -1):
                    delta = np.float64(cs[i])  # (numba's float() of a float32 stays float32)
                    if delta > ACTR_MIN_DELTA_F32:
                        lnd[q] = math.log(delta)
                        succ[q] = seq_g[start + i] > 1
                        q += 1
            off[j + 1] = q
    return lnd, succ, off


@njit(cache=True)
def whole_days(seq_dt, start, n, t_dt, tb, te):
    """Whether a card's intervals (its first n reviews and its targets' own) are whole days below 2^24: always in
    day mode, with --secs only where no same-day review is involved. There upstream's float32 time arithmetic
    (DASH[ACT-R]'s Δ, ACT-R's cumulative times) is exact, equal to the float64 sums, and the day-mode path is kept
    as it was."""
    for k in range(n):
        x = seq_dt[start + k]
        if x != math.floor(x) or x >= 16777216.0:
            return False
    for j in range(tb, te):
        if t_dt[j] != math.floor(t_dt[j]) or t_dt[j] >= 16777216.0:
            return False
    return True


@njit(cache=True)
def actr_float32_deltas(seq_dt, start, pos, t_dt, out):
    """out[i] = Δ of the card's review i (i < pos) to the target as upstream computes it in float32
    (features/dash_engineer.py: sp = float32 tensor of t_item[1:], Δ = sp − cumsum(sp) + cumsum(sp)[−1]). torch's
    CPU cumsum accumulates float32 in double and rounds each partial sum to float32; the subtraction and the
    addition are float32 operations. With fractional days (--secs) this rounding is visible: a same-day review
    of a long history has its Δ quantized to the float32 spacing of the card's total time (~5 s at 1,000 days),
    which also decides which Δ fall at or below the 0.1 clamp."""
    acc = 0.0
    total = np.float32(0.0)
    for i in range(pos):
        sp = np.float32(seq_dt[start + i + 1]) if i + 1 < pos else np.float32(t_dt)
        acc += np.float64(sp)
        cum = np.float32(acc)
        out[i] = np.float32(sp - cum)  # float32 − float32: a float32 result
        total = cum
    for i in range(pos):
        out[i] = np.float32(out[i] + total)


@inlined
def actr_card(w, t_in, t_y, t_wt, tb, te, gw, out, with_grad):
    """Loss (+ gradient into gw) or predictions (into out) of one card's targets; per target a sum over its
    counted past reviews, newest first, from actr_inputs' ln Δ (t_in = (lnd, succ, off)).

    Speed (issue #19): Δ^(−w1) is exp(−w1·ln Δ) from the one ln Δ that dS/dw1 needs anyway (was `delta ** -w1`
    plus a log: a pow call costs about two exps, and the log was taken in prediction too), and this function and
    its two entry points are inlined into the engine's loops (training calls it once per target, a few pairs
    each, and a real call passing ~10 arrays cost about as much as those pairs). Same numbers to rounding: pow
    and exp∘log differ in the last bits, and the fitted weights, rounded to 4 decimals, came out equal on the
    embedded data, 36 simulated users and a 45k-review one (result lines identical). Measured against the pow
    version, in process, CPU, alternating: the 45k-review user's last-fold fit (mean history 5.4) ~1.8× faster
    (median of 4 pairs), whole users ~1.25× (the rest is features, metrics, set-up), the table's projection
    1.38 → 1.00 CPU-hours (3 pairs). Tried and slower on such short histories: the pairs in a vectorised loop
    (vec_math-style log and exp over per-target arrays, ~2.5× faster per pair on long histories; the arrays, as
    views of the engine's scratch, cost more per target than 5 pairs save), a branch-free loop, and reusing
    the terms of a same-day review's repeated Δ.

    Second round: ln Δ is read from actr_inputs (once per fit or prediction) instead of a log per pair and pass,
    and the Δ ≤ 0.1 entries are not stored at all; the operations on each counted pair are the same, so the fitted
    weights are bit-identical (45k-review user's five fits). Those fits (`adam_fit`, replayed in process, CPU,
    best of 7, alternating) 0.14–0.15 → 0.09–0.10 s (~1.5×); about half of what is left is the six full-objective
    passes (the start and every epoch's end: upstream's best-checkpoint rule with length batches), one exp per
    pair each. Whole user 1.15–1.3× (0.17–0.21 → 0.15–0.16 CPU s); the rest is the pipeline (features ~20 ms,
    length batches ~13 ms before seq_engine.time_order, metrics ~12 ms). With ~2.7 counted pairs per target on
    that user, a pass's time is mostly per target (log1p, the sigmoid's exp, the loss's log, the engine's
    loop: ~100–130 ns a target), so cheaper pairs barely show. Measured and not kept: Δ^(−w1) cached per
    distinct Δ and recomputed when w1 changes (142 distinct values for its 135k pairs; bit-identical, no faster),
    vec_math.exp_table instead of libm's exp (~4%, within noise; not bit-identical), the exps of a card's pairs
    in one vectorised loop of vec_math.exp1 (slower). The table's projection (bench_executors.py project, three
    pairs side by side with the previous version): 1.20 → 0.88, 0.93 → 0.78, 0.85 → 0.65 CPU-hours (1.19–1.36×);
    result lines identical (embedded, six sim36 users, the 45k-review one)."""
    lnd, succ, off = t_in
    neg_w1 = -w[1]
    loss = 0.0
    for j in range(tb, te):
        s = 0.0
        ds1 = 0.0  # dS/dw1
        ds_fail = 0.0  # dS/dw2
        ds_succ = 0.0  # dS/dw3
        for q in range(off[j], off[j + 1]):
            ld = lnd[q]
            pw = math.exp(neg_w1 * ld)
            if succ[q]:
                s += pw * w[3]
                ds_succ += pw
                ds1 -= ld * pw * w[3]
            else:
                s += pw * w[2]
                ds_fail += pw
                ds1 -= ld * pw * w[2]
        u = max(s, 0.0)
        lu = math.log1p(u)
        p = sigmoid(w[0] * lu + w[4])
        if with_grad:
            lo, gp = bce(p, t_y[j], t_wt[j])
            loss += lo
            gz = gp * p * (1.0 - p)
            gw[0] += gz * lu
            gw[4] += gz
            if s >= 0.0:  # torch's clamp_min passes the gradient where input >= min
                gs = gz * w[0] / (1.0 + u)
                gw[1] += gs * ds1
                gw[2] += gs * ds_fail
                gw[3] += gs * ds_succ
        else:
            out[j] = p
    return loss


@inlined
def actr_card_loss_grad(w, seq_dt, seq_g, start, n, t_pos, t_in, t_y, t_wt, tb, te, buf, gw):
    return actr_card(w, t_in, t_y, t_wt, tb, te, gw, gw, True)


@inlined
def actr_card_predict(w, seq_dt, seq_g, start, n, t_pos, t_in, tb, te, buf, out):
    actr_card(w, t_in, out, out, tb, te, out, out, False)  # labels and weights: unread placeholders


def _kernel_namespace(variant: str, loss_grad, predict, inputs=None) -> str:
    """Expose one variant's kernels as the module `models.dash.kernels_<variant>` (what seq_engine.instantiate
    imports by name); returns that name. inputs: its target_inputs (engine/seq_model_stub.py), if any."""
    name = f"{__name__}.kernels_{variant}"
    module = types.ModuleType(name, f"Engine kernels of {variant} (defined in {__name__}).")
    module.N_STATE = N_STATE
    module.card_loss_grad = loss_grad
    module.card_predict = predict
    if inputs is not None:
        module.target_inputs = inputs
    sys.modules[name] = module
    return name


KERNELS_DASH = _kernel_namespace("dash", windows_card_loss_grad, windows_card_predict, dash_inputs)
KERNELS_MCM = _kernel_namespace("mcm", windows_card_loss_grad, windows_card_predict, mcm_inputs)
KERNELS_ACTR = _kernel_namespace("actr", actr_card_loss_grad, actr_card_predict, actr_inputs)


def with_max_seq_len(cfg, max_seq_len: int):
    """A copy of the run config whose training-history limit is `max_seq_len`."""
    out = copy.copy(cfg)
    out.max_seq_len = max_seq_len
    return out


# ------------------------------------------------------------------------------------------ the models

DASH_SHORT_W = [-0.1766, 0.4483, -0.3618, 0.5953, -0.5104, 0.8609, -0.3643, 0.6447, 1.2815]
NO_ROW_LIMIT = 1 << 30


class DASH(SeqModel):
    name = "DASH"
    accepts_secs = name in ACCEPTS_SECS  # --short --secs: fractional Δ in the windows, same-day targets
    kernels = KERNELS_DASH
    replays_upstream_batches = True  # fit: batching "length"
    decay = False
    default_w = [0.2024, 0.5967, 0.1255, 0.6039, -0.1485, 0.572, 0.0933, 0.4801, 0.787]
    lower = [-math.inf] * 9
    upper = [math.inf] * 9
    autograd = False  # no torch step functions: the card kernels are hand-written (--trainer autograd refused)

    def __init__(self, cfg=None):
        if cfg is not None and cfg.include_short:
            self.default_w = list(DASH_SHORT_W)  # upstream: the short init for DASH and DASH[MCM] alike
        super().__init__(cfg)

    def fit(self, train: ReviewData) -> "DASH":
        if self.cfg.default:
            return self
        if len(train) == 0:
            raise InadequateData("no training rows")
        w_init = self.initial_weights(train)
        if getattr(self.cfg, "trainer", "fast") == "fast":
            # every row trains: upstream's BatchDataset sees a length-8 feature vector, never a long history
            w = self.engine.fit(w_init, train, with_max_seq_len(self.cfg, NO_ROW_LIMIT), lr=self.lr,
                                batching="length", sort_kind=NUMPY126, equal_lengths=True, check_every_epoch=True)
        else:
            import upstream.training as training
            from upstream.history_torch import DASHNet, history_features

            net = DASHNet(w_init, self.decay, history_features(train, self.decay), dtype=self.torch_dtype)
            # every row: one-review "histories" give every row the same sort key, which batch_sort's tie order
            # (numpy 1.26's quicksort) permutes as upstream's did
            rows = train.rows.copy()
            rows["seq_pos"] = 1
            training.train(net, ReviewData(rows, train.seq_delta_t, train.seq_rating), self.cfg, lr=self.lr,
                           sort_kind=self.batch_sort, dtype=self.torch_dtype)
            w = net.w.detach().double().numpy()
        self.w = [float(x) for x in w]
        return self


class DASHMCM(DASH):
    name = "DASH[MCM]"
    kernels = KERNELS_MCM
    decay = True
    default_w = [0.2783, 0.8131, 0.4252, 1.0056, -0.1527, 0.6455, 0.1409, 0.669, 0.843]


def round4(w) -> list[float]:
    """Upstream's `state_dict` of DASH[ACT-R] and ACT-R: round(float(x), 4)."""
    return [round(float(x), 4) for x in w]


class DASHACTR(SeqModel):
    name = "DASH[ACT-R]"
    accepts_secs = name in ACCEPTS_SECS  # --short --secs: the 0.1-day clamp then drops genuine Δ <= 0.1
    kernels = KERNELS_ACTR
    default_w = [1.4164, 0.516, -0.0564, 1.9223, 1.0549]
    lower = [0.001, 0.001, -math.inf, -math.inf, -math.inf]
    upper = [math.inf] * 5
    # Its loss is path-dependent within 5 epochs (whole-card batches end 0.001–0.002 above upstream on
    # upstream-check); upstream's target batches cost nothing extra here, since each target already sums over its
    # own history (O(history) per target either way), and reproduce upstream to the 6th decimal.
    engine_batching = "length"
    autograd = False  # no torch step functions: the card kernels are hand-written (--trainer autograd refused)

    def __init__(self, cfg=None):
        super().__init__(cfg)
        self.w = round4(self.default_w)  # upstream's fallback / --dry weights go through state_dict too

    def torch_net(self, w_init, grad_mask):
        from upstream.history_torch import DASHACTRNet

        return DASHACTRNet(w_init, self.lower, self.upper, dtype=self.torch_dtype)

    def fit(self, train: ReviewData) -> "DASHACTR":
        super().fit(train)
        self.w = round4(self.w)
        return self
