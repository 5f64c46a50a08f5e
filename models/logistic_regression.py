"""Logistic Regression (34 coefficients): spec models.md §9; SB models/logistic_regression.py@07166732 and
features/logistic_regression_engineer.py.

Published run: `--algo LogisticRegression --short --secs --recency --equalize_test_with_non_secs` (upstream file
name `LogisticRegression-short-secs-recency-equalize_test_with_non_secs`, README label "Logistic Regression",
inputs "IL, FIL, G, SR"). Here those flags are the row's defaults (`builtin_flags`, as the LSTM's): `other.py --model
LogisticRegression` writes result/LogisticRegression.jsonl from the general secs pipeline (features.py with
`secs`, split.equalized_folds), so its test reviews are the day-mode table's.

p = σ(x · c) with c = mean + std·θ (fixed mean/std vectors below, θ trained from 0). The 34 inputs of a target row
are computed over the user's target rows of its card, in time order, exactly as upstream's engineer does after its
post-processing (so "previous" means the card's previous TARGET row; a card's first target stands for its first
review): with r = rating of the review just before the target, e_prev = that review's interval (fractional days;
0 for the card's first target), same_day = [whole-day interval of that review = 0] (1 for the first target),
label = the target's own interval (fractional days) and label_sd = [its whole-day interval = 0], and running
per-card sums (the current row included) of same-day / long-term passes and fails (first target excluded), passes,
same-day and long-term counts, the cumulative time T (sum of e_prev) and the time since the first review or the
last lapse (T minus its value at the latest row whose r was Again, or the first row):
- 10 "degree-1" features, each times g(label) with g(x) = (ln(x + 1e−5) + 1.3)/5: 1, one-hot r ∈ {2, 3, 4},
  [r = 2]·first, [r > 2]·first, log1p(same-day fails), log1p(long-term passes·(1 − label_sd)),
  log1p(long-term fails·(1 − label_sd)), log1p(same-day passes);
- 24 "degree-0" features: 1, one-hot r, one-hot first rating, one-hot first rating·first, log1p(same-day fails),
  log1p(long-term passes·(1 − label_sd)), g(e_prev), log1p(long-term fails), log1p(long-term passes),
  log1p(same-day passes·label_sd), [any pass], g(time since first review or lapse), label_sd, g(T), and
  [first rating > 1]·log1p of same-day fails, long-term fails, same-day count, long-term count.
(One-hots are of ratings 2–4, all zero for Again; the "first rating" is r of the card's first target row.)

Training per fold (upstream's `optimize`): row weights 0.1 + 0.9·x⁴ with x = linspace(0, 1, N) over the fold's
training rows in time order (always on: its published --recency); AdamW on θ, lr 0.2, betas (0, 0.85), eps 1e−8,
weight decay 0.3; 10 epochs of shuffled batches of 2048, loss Σ weight·BCE-with-logits per batch; cosine annealing
of the lr to 0 over all steps; the final θ. Here in float64 numpy with torch.randperm's shuffles from a generator
seeded 42 per fit (upstream: float32, torch's global generator), so per-user numbers match upstream's to training
noise, not to the digit.

Where a user's time goes (issue #19; CPU, in process): on the 45k-review simulated user ~165 ms before this round —
the 34 inputs (`features`, once per user) ~35–45 ms, the day-mode feature pipeline the equalised folds need ~16 ms
(pipeline.py, twice), the five fits ~80 ms (AdamW kernel ~50 ms, torch-order shuffles ~9 ms, reading the inputs
back from the frame ~7 ms), metrics ~9 ms; on a 1k-review user ~24 ms, half of it per-call overhead (pandas'
grouped cumsum set-up, selecting 34 labelled columns 10 times, numpy temporaries). Now `features` runs its
running sums (`_group_cumsum`, pandas' compensated sum to the bit) and its 34-column assembly (`_assemble`)
compiled: 80 → 20 ms on the 45k-review user, 3.7 → 0.9 ms on a 1k one, bit-identical on every user checked; the
inputs are read back as one positional slice; the AdamW kernel prefetches the shuffled rows it gathers
(`_adamw_epochs`: its largest fit 28 → 15–17 ms, θ to the bit), and `features` returns pandas' block layout
(no transposing copy when the frame takes it). Left as they were: the shuffles (~9 ms on that user) and the
day-mode feature pipeline (shared, pipeline.py). Whole users (CPU, in process, alternating with the previous
version): the 45k-review one ~1.3× (254 → 196 ms with section timers), four sim36 users of 1.9k–14k reviews
1.1–1.5× (medians of 5 runs 1.3–1.5×). The table's projection (three pairs side by side): 1.48 → 0.92, 1.42 → 1.00,
0.70 → 0.71 CPU-hours — the row is noisy at this size of sample; every result line identical (θ bit for bit).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from config import ACCEPTS_SECS, BUILTIN_FLAGS
from models.base import Model, ReviewData
from engine.kernel_math import adam_step, cosine_lr
from upstream.torch_rng import TorchGenerator

MEAN = [-0.9012, -0.6941, -0.6258, -0.4678, 0.3926, 0.1316, 0.3508, -0.3259, -0.2125, -0.1402, 1.2775, 0.0669,
        0.3914, 0.5828, 0.9292, 1.1583, 1.4103, 0.9388, 0.9164, 0.9797, -0.6411, 0.4951, 0.1038, -0.1564, 0.4332,
        0.3287, 0.3429, 0.4068, -0.1779, -0.0585, -0.1062, -0.3521, -0.1613, -0.1758]
STD = [0.2869, 0.2811, 0.2910, 0.2166, 0.1740, 0.1612, 0.1428, 0.1352, 0.1284, 0.0331, 0.4013, 0.2065, 0.2022,
       0.1670, 0.2454, 0.2954, 0.2896, 0.3473, 0.5685, 0.2795, 0.1298, 0.0467, 0.1200, 0.1317, 0.0785, 0.1190,
       0.0854, 0.1634, 0.1892, 0.1052, 0.0750, 0.1913, 0.1372, 0.0783]
N_FEATURES = 34
RECIPE = dict(lr=0.2, betas=(0.0, 0.85), eps=1e-8, weight_decay=0.3, n_epoch=10, batch_size=2048, seed=42)
COLUMNS = [f"lr_x{k}" for k in range(N_FEATURES)]


def g(x: np.ndarray) -> np.ndarray:
    """Upstream's interval transform: (ln(x + 1e−5) + 1.3)/5, x in (fractional) days."""
    return (np.log(x + 1e-5) + 1.3) / 5


def _starts(keys: np.ndarray) -> np.ndarray:
    s = np.ones(len(keys), dtype=bool)
    s[1:] = keys[1:] != keys[:-1]
    return s


@njit(cache=True)
def _group_cumsum(v: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Inclusive running sum restarting at each group start, summed within the group, as pandas' grouped cumsum
    (`Series.groupby(group).cumsum()`, which upstream's engineer calls) computes it: Kahan-compensated, a NaN
    left out of the sum and NaN in its own row. So fractional times carry no rounding from a user-wide running
    total, and the result is pandas' to the bit (tests) — ~25x faster than pandas' per-call set-up and group
    factorising, 8 calls per user (issue #19)."""
    out = np.empty(len(v))
    acc = 0.0
    comp = 0.0
    for i in range(len(v)):
        if starts[i]:
            acc = 0.0
            comp = 0.0
        x = v[i]
        if math.isnan(x):
            out[i] = math.nan
            continue
        y = x - comp
        t = acc + y
        comp = t - acc - y
        acc = t
        out[i] = t
    return out


def features(data: ReviewData) -> np.ndarray:
    """The [n_rows, 34] inputs of every target row of a user (rows as features.py builds them with --secs), in
    column-major (Fortran) order: the layout of a pandas block, so restrict_targets adds them to the frame
    without a transposing copy (~5 ms of 40k rows)."""
    rows = data.rows
    n = len(rows)
    # card-major order, time order within a card (rows are in time order)
    order = np.argsort(rows["card_id"].to_numpy(), kind="stable")
    card = rows["card_id"].to_numpy()[order]
    start = _starts(card)
    idx = np.arange(n)
    first_of = np.maximum.accumulate(np.where(start, idx, 0))
    label_real = rows["delta_t"].to_numpy(np.float64)[order]
    label_int = np.maximum(rows["elapsed_days"].to_numpy(np.int64)[order], 0)
    prev = rows["seq_start"].to_numpy(np.int64)[order] + rows["seq_pos"].to_numpy(np.int64)[order] - 1
    r = np.asarray(data.seq_rating, dtype=np.int64)[prev]  # rating of the review before the target
    prev_real = np.where(start, 0.0, np.concatenate(([0.0], label_real[:-1])))
    prev_int = np.where(start, 0, np.concatenate(([0], label_int[:-1])))

    same_day = (prev_int == 0).astype(np.float64)
    success = (r > 1).astype(np.float64)
    fail = 1.0 - success
    is_first = start.astype(np.float64)
    not_first = 1.0 - is_first
    label_sd = (label_int == 0).astype(np.float64)
    first_r = r[first_of]
    first_gt1 = (first_r > 1).astype(np.float64)

    def csum(v):
        return _group_cumsum(v, start)

    sd_fail = csum(same_day * not_first * fail)
    nsd_fail = csum((1 - same_day) * not_first * fail)
    sd_pass = csum(same_day * not_first * success)
    nsd_pass = csum((1 - same_day) * not_first * success)
    n_pass = csum(success)
    n_sd = csum(same_day)
    n_nsd = csum(1 - same_day)
    times = csum(prev_real)
    # time since the first review or the last lapse: `times` is non-decreasing within a card, so its running
    # maximum over the masked rows is its value at the latest masked row (a card's first row is always masked)
    masked = start | (success == 0)
    last_masked = np.maximum.accumulate(np.where(masked, idx, -1))
    since = times - times[last_masked]

    # the logarithms in numpy as before (the same values to the bit); the 34 columns, their products and the
    # scatter back to row order in one compiled pass (`_assemble`)
    cols = np.stack([r.astype(np.float64), is_first, first_r.astype(np.float64), label_sd, g(label_real),
                     np.log1p(sd_fail), np.log1p(nsd_pass * (1 - label_sd)), np.log1p(nsd_fail * (1 - label_sd)),
                     np.log1p(sd_pass), g(prev_real), np.log1p(nsd_fail), np.log1p(nsd_pass),
                     np.log1p(sd_pass * label_sd), (n_pass > 0).astype(np.float64), g(since), g(times), first_gt1,
                     np.log1p(n_sd), np.log1p(n_nsd)])
    return _assemble(cols, order)


@njit(cache=True)
def _assemble(cols, order):
    """out[order[q]] = the 34 inputs of card-major row q from its per-row quantities `cols` (features: r, first,
    first rating, label_sd, g(label), then the logarithms and flags in the order they are stacked there): the
    10 degree-1 features times g(label), then the 24 degree-0 ones. The same products numpy's column-wise
    version took (so the same values to the bit, signed zeros included), written row by row into the result:
    the numpy version's eight [n, 34] temporaries (stack, product, concatenate, scatter) were ~60% of the
    function on a 45k-review user (issue #19)."""
    n = cols.shape[1]
    out = np.empty((N_FEATURES, n))  # returned as out.T: pandas' block layout (see features)
    for q in range(n):
        r = cols[0, q]
        first = cols[1, q]
        fr = cols[2, q]
        gl = cols[4, q]
        l_sdf = cols[5, q]
        l_nsdp_l = cols[6, q]
        fgt1 = cols[16, q]
        r_out = order[q]
        h2 = 1.0 if r == 2 else 0.0
        h3 = 1.0 if r == 3 else 0.0
        h4 = 1.0 if r == 4 else 0.0
        out[0, r_out] = 1.0 * gl
        out[1, r_out] = h2 * gl
        out[2, r_out] = h3 * gl
        out[3, r_out] = h4 * gl
        out[4, r_out] = (h2 * first) * gl
        out[5, r_out] = ((1.0 if r > 2 else 0.0) * first) * gl
        out[6, r_out] = l_sdf * gl
        out[7, r_out] = l_nsdp_l * gl
        out[8, r_out] = cols[7, q] * gl
        out[9, r_out] = cols[8, q] * gl
        f2 = 1.0 if fr == 2 else 0.0
        f3 = 1.0 if fr == 3 else 0.0
        f4 = 1.0 if fr == 4 else 0.0
        out[10, r_out] = 1.0
        out[11, r_out] = h2
        out[12, r_out] = h3
        out[13, r_out] = h4
        out[14, r_out] = f2
        out[15, r_out] = f3
        out[16, r_out] = f4
        out[17, r_out] = f2 * first
        out[18, r_out] = f3 * first
        out[19, r_out] = f4 * first
        out[20, r_out] = l_sdf
        out[21, r_out] = l_nsdp_l
        out[22, r_out] = cols[9, q]
        out[23, r_out] = cols[10, q]
        out[24, r_out] = cols[11, q]
        out[25, r_out] = cols[12, q]
        out[26, r_out] = cols[13, q]
        out[27, r_out] = cols[14, q]
        out[28, r_out] = cols[3, q]
        out[29, r_out] = cols[15, q]
        out[30, r_out] = fgt1 * l_sdf
        out[31, r_out] = fgt1 * cols[10, q]
        out[32, r_out] = fgt1 * cols[17, q]
        out[33, r_out] = fgt1 * cols[18, q]
    return out.T


def recency(n: int) -> np.ndarray:
    """Row weights 0.1 + 0.9·x⁴, x = linspace(0, 1, n) over the training rows in time order."""
    return 0.1 + 0.9 * np.linspace(0, 1, n) ** 4


class LogisticRegression(Model):
    name = "LogisticRegression"
    accepts_secs = name in ACCEPTS_SECS  # the general --secs pipeline (features.py)
    builtin_flags = BUILTIN_FLAGS[name]  # its published mode, always on: short, secs, recency, equalized test rows

    def __init__(self, cfg=None):
        self.cfg = cfg
        self.n_params = 0 if cfg is not None and cfg.default else N_FEATURES
        self.theta = np.zeros(N_FEATURES)

    @classmethod
    def restrict_targets(cls, data: ReviewData, root: Path, user_id: int, cfg=None) -> ReviewData:
        """Runner hook (once per user, before the split): the 34 inputs of every row, over the whole user as
        upstream computes them (a row's inputs read the card's earlier rows, which a test fold does not hold)."""
        # features() is feature-major already (pandas' block layout): the frame takes it without a copy
        x = pd.DataFrame(features(data), columns=COLUMNS, index=data.rows.index, copy=False)
        return ReviewData(pd.concat([data.rows, x], axis=1), data.seq_delta_t, data.seq_rating)

    @staticmethod
    def inputs(data: ReviewData) -> np.ndarray:
        cols = data.rows.columns
        if COLUMNS[0] not in cols:
            return features(data)
        first = cols.get_loc(COLUMNS[0])
        if isinstance(first, int) and list(cols[first:first + N_FEATURES]) == COLUMNS:
            # restrict_targets appends them side by side: a positional slice of one block, ~2x faster than
            # selecting 34 labels (10 calls per user)
            return data.rows.iloc[:, first:first + N_FEATURES].to_numpy(np.float64, copy=True)
        return data.rows[COLUMNS].to_numpy(np.float64, copy=True)

    @property
    def coefficients(self) -> np.ndarray:
        return np.asarray(MEAN) + np.asarray(STD) * self.theta

    def fit(self, train: ReviewData) -> "LogisticRegression":
        """AdamW on θ over shuffled batches (RECIPE), compiled (`_adamw_epochs`): the gradient of Σ
        weight·BCE-with-logits is std·Xᵀ(weight·(σ(z) − y)), torch's formula; the shuffles are torch.randperm's on a
        generator seeded 42 (upstream/torch_rng.py). Equal to the same loop in torch float64 to ~1e-12 (tests), ~100x
        faster than it for a 34-parameter model, and no torch import (~2 s per process)."""
        if self.cfg is not None and self.cfg.default:
            return self
        x = np.ascontiguousarray(self.inputs(train))
        y = train.rows["y"].to_numpy(np.float64)
        gen = TorchGenerator(RECIPE["seed"])
        perms = np.stack([gen.randperm(len(y)) for _ in range(RECIPE["n_epoch"])])
        self.theta = _adamw_epochs(x, y, recency(len(y)), np.asarray(MEAN), np.asarray(STD), perms,
                                   RECIPE["batch_size"], RECIPE["lr"], *RECIPE["betas"], RECIPE["eps"],
                                   RECIPE["weight_decay"])
        return self

    def predict(self, test: ReviewData) -> np.ndarray:
        return 1.0 / (1.0 + np.exp(-(self.inputs(test) @ self.coefficients)))

    def parameters(self) -> list[float]:
        return [round(float(c), 6) for c in self.coefficients]


PREFETCH_AHEAD = 8  # rows of the permutation requested this far ahead of the one being gathered


@intrinsic
def _prefetch_row(typingctx, arr, i):
    """Ask the CPU to start loading row i of the 2-D array `arr` into cache (LLVM's prefetch: no result, never
    faults), so that gathering the rows of a shuffled batch does not wait on one memory access at a time."""
    def codegen(context, builder, signature, args):
        view = context.make_array(signature.args[0])(context, builder, args[0])
        stride = builder.extract_value(view.strides, 0)
        addr = builder.add(builder.ptrtoint(view.data, ir.IntType(64)), builder.mul(args[1], stride))
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [ir.IntType(8).as_pointer(), i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
        # read, keep in all cache levels, data cache
        builder.call(fn, [builder.inttoptr(addr, ir.IntType(8).as_pointer()), ir.Constant(i32, 0),
                          ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()
    return types.void(arr, types.intp), codegen


@njit(cache=True, error_model="numpy")
def _adamw_epochs(x, y, weight, mean, std, perms, batch_size, lr0, b1, b2, eps, weight_decay):
    """θ after AdamW over the batches of each epoch's permutation (cosine lr to 0 over all steps, torch's
    CosineAnnealingLR), each batch's gradient std·Σ_rows weight·(σ(x·c) − y)·x with c = mean + std·θ.

    Speed without changing a bit: a batch's rows are first gathered into one contiguous block (the permutation
    reads rows all over x), and four rows' dot products run side by side, each still summed in feature order, so
    the adds of four independent chains overlap instead of waiting on one another (one row's 34 dependent adds were
    the critical path). 1.5× on the 45k-review simulated user's five fits (0.16 → 0.11 CPU s), same θ to the bit.

    Then (issue #19): the gather asks for the row PREFETCH_AHEAD places ahead in the permutation (`_prefetch_row`),
    so the rows' cache misses overlap instead of coming one at a time: that user's largest fit (34k rows, 10
    epochs; x is 9 MB) 28 → 15–17 ms (CPU, best of 7, alternating), the same as reading the rows in order
    (13–15 ms); θ the same to the bit. Tried and not kept: gathering the batch feature-major and running the dot
    products across rows (vectorised, each still in feature order): 27 ms, no better than the prefetch alone
    (and 67 ms until the block's rows were padded: a 16 KB stride put a row's 34 stores in one L1 set)."""
    n, k = x.shape
    theta, m, v, grad = np.zeros(k), np.zeros(k), np.zeros(k), np.zeros(k)
    c = np.empty(k)
    xb = np.empty((min(batch_size, n), k))
    zb = np.empty(min(batch_size, n))
    n_batches = (n + batch_size - 1) // batch_size
    total = max(perms.shape[0] * n_batches, 1)
    step = 0
    for e in range(perms.shape[0]):
        for lo in range(0, n, batch_size):
            for j in range(k):
                c[j] = mean[j] + std[j] * theta[j]
                grad[j] = 0.0
            nb = min(batch_size, n - lo)
            for q in range(nb):
                if q + PREFETCH_AHEAD < nb:
                    _prefetch_row(x, perms[e, lo + q + PREFETCH_AHEAD])
                i = perms[e, lo + q]
                for j in range(k):
                    xb[q, j] = x[i, j]
            q = 0
            while q + 4 <= nb:
                z0 = 0.0
                z1 = 0.0
                z2 = 0.0
                z3 = 0.0
                for j in range(k):
                    cj = c[j]
                    z0 += xb[q, j] * cj
                    z1 += xb[q + 1, j] * cj
                    z2 += xb[q + 2, j] * cj
                    z3 += xb[q + 3, j] * cj
                zb[q] = z0
                zb[q + 1] = z1
                zb[q + 2] = z2
                zb[q + 3] = z3
                q += 4
            while q < nb:
                z = 0.0
                for j in range(k):
                    z += xb[q, j] * c[j]
                zb[q] = z
                q += 1
            for q in range(nb):
                i = perms[e, lo + q]
                # e^−z = inf for z < −709: σ = 0, as torch's
                r = (1.0 / (1.0 + math.exp(-zb[q])) - y[i]) * weight[i]
                for j in range(k):
                    grad[j] += r * xb[q, j]
            for j in range(k):
                grad[j] *= std[j]
            lr = cosine_lr(lr0, step, total)
            step += 1
            adam_step(theta, grad, m, v, step, lr, b1, b2, eps, weight_decay)
    return theta
