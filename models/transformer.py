"""Transformer (127 parameters): spec models.md §2.4, SB models/transformer.py@139fa513.

`nn.Transformer(d_model=2, nhead=2, 1 encoder layer, 1 decoder layer, dim_feedforward=2)` (dropout 0.1, active while
training, as upstream) + Linear(2→1): 124 + 3 = 127 parameters. Source: the FSRS-style sequence (t_k, G_k) with
t_0 = 0, no positional encoding; target: one zero token. S = exp(fc(decoder output)),
p = (1 + (19/81)·t/S)^(−0.5). Fine-tune: AdamW(lr 4e-2, weight_decay 1e-5), 5 epochs, batch 512, cosine; the final
epoch's weights (upstream's aliased "best" state dict).

PER-TARGET WINDOWS [QUIRK]: upstream passes no padding mask, so the encoder and the decoder's cross-attention attend
to the zero-padded positions and a target's prediction depends on how far its batch is padded (training: batches of
512 targets sorted by history length; prediction: the test rows in order, chunks of 8,192, each padded to its own
longest history). Attention without a causal mask is not a recurrence either: no state along a card can be shared
between its targets. So this model keeps upstream's layout in both trainers (upstream/training.py's sorted batches, then
upstream's prediction chunks) and is not on the one-pass-per-card path.

The two trainers:
- `--trainer fast` (default): the same recipe compiled (`fit_compiled`, `predict_compiled`; the kernel is
  neural/transformer_kernels.py): one numba call per batch for the forward and reverse pass of every target (float64,
  the padded positions attending and attended to exactly as in torch), torch's AdamW + cosine schedule in numba
  (kernel_math), the batch order from torch_rng.TorchGenerator's randperm(2023), and the dropout masks torch's
  module draws (all ten sites, same generator, same order: `draw_masks`; emulated by torch_rng.BernoulliStream where
  torch_rng.portable_bernoulli() (AMD CPUs, and CPUs where torch's own draws were checked equal to it once),
  drawn by torch elsewhere). Tested against autograd of the module in float64 with the same masks (forward
  1e-12, gradient 1e-9 of its largest component) and against the torch recipe over two epochs (weights 1e-8):
  tests/test_transformer_compiled.py. The only differences from the torch path are float64 instead of float32
  (embedded users: Log Loss equal to the 6th decimal, one user 1e-6 apart; 36 simulated users: every user within
  1e-6; AUC within 0.001 except one 255-review user, 0.012, whose predictions take ~20 distinct values, so
  float32's ties and float64's near-ties order differently) and the evaluation
  passes of upstream/training.py, which the kept-final rule makes moot (only the all-NaN "diverged" error depends on them,
  checked when the final weights evaluate NaN). With no padding masks the cost is O(B·L²) per batch; without dropout
  (prediction, the divergence check) a target's padded positions are identical and processed once, so upstream's
  prediction chunks cost O(n²) per target of history n, not O(L²) of the chunk's longest. (In training the padded
  keys and values are identical too and could enter once with their count, 54% of the training pairs of the 36
  simulated users being padding; tried, ~0.6× the kernel time on long windows, but any change of rounding moves
  this model's AUC: its predictions take few distinct values up to 1e-15 (a LayerNorm over 2 features outputs ±1
  up to eps), so 1e-15 changes reorder near-ties and moved AUC by up to 1e-3 on sim36 while every other metric
  stayed equal. Re-applied and measured again (issue #19, with the cross-attention exps by exp_nonpos): about
  even on the windows users have, training 0.91x on a mean-10-window user but 1.04-1.06x on a 45k-review user's
  mean-6 windows, projection unchanged within noise; so not worth moving AUC for, and kept out.) The default path imports no torch where portable_bernoulli() (the
  module lives in neural/transformer_torch.py); its dropout masks come from torch_rng.BernoulliStream's compiled
  twister.
  Measured on 36 simulated users (/tmp/sim36, 229,622 reviews, whole process, one process): 68.5 s of CPU with
  the written-out torch forward, 10.3 s once compiled (the kernel ≈ 5 s, the masks ≈ 3.7 s by numpy's generator);
  then the masks' twister compiled and the attention's exps vectorised (results bit-identical): 0.72× of that
  version's CPU paired run by run (9.08 vs 12.42 s, machine shared), 21× upstream's CPU side by side (8.64 vs
  180.23 s, same minute, every user's size equal; README). What is left: the kernel ≈ 4 s (most of it the
  per-position work of the many short-history batches: ≈ 78% of the training targets have windows under 8), the
  masks ≈ 1.2 s, prediction and the divergence check ≈ 0.6 s, start-up and the shared pipeline the rest.
  Then (issue #19) training batches of windows up to 20 run with their targets side by side
  (neural/transformer_lanes.py: the same operations per target, vectorised across targets; ~2× a batch at windows
  up to 11, 1.1-1.7× at 12-20): predictions equal to ~5e-16 relative, Log Loss and RMSE(bins) equal to 1e-16 on the
  embedded and 6 sim36 users, AUC moved only through near-ties (largest 3e-5 embedded and on 6 sim36 users,
  3e-4 on a 45k-review user; accepted for the speed: upstream's float32 torch orders such near-ties its own
  way, so no order at 1e-16 is upstream's); the divergence check's evaluation of those windows too (without
  dropout). That user's CPU 1.35× less (in one process, alternating); the row's projection 4.6-5.1 -> 3.3-3.6
  CPU-hours (paired runs).
  Where a user's CPU went next (issue #19; a 45k-review simulated user, the parts timed in one process after a
  warm-up user): the lane kernel's training passes ≈ 48%, the dropout masks' draw ≈ 18% (their transposes to the
  lane layout another 4%), the per-target kernel ≈ 13% (training windows over 20, prediction), the divergence
  check's evaluation ≈ 7%, prediction ≈ 7%, set-up and the shared pipeline the rest; a small sim36 user (3k
  targets) in similar shares. Then, with every fitted weight and prediction bit-identical to before (embedded users,
  sim36 1-6 and 14, the 45k user): the stream's tempering two words a lane (torch_rng; draws 1.51 -> 1.04 ns)
  and no evaluation pass where the final weights bound every value (`evaluates_finite`). Paired against the
  version before (separate processes alternated five times, each the median of its repetitions after a warm-up
  user; CPU time, a 2-core machine shared with other jobs): the 45k-review user 0.834 -> 0.646 s (medians; the
  pairs' ratios 1.10-1.31, median 1.29x), 8 sim36 users (1-6, 14, 20) 0.391 -> 0.314 s (ratios 0.85-1.52, median
  1.38x, noisier); the row's projection (bench_executors.py project, old and new back to back, three pairs)
  3.72 / 3.40 / 3.07 -> 3.37 / 2.69 / 2.84 CPU-hours (medians 3.40 -> 2.84, 1.2x; the pairs 1.10, 1.26, 1.08x).
  Tried and not kept: the masks written from the stream's fill straight to the lane layout by one compiled pass
  (its strided byte copies lose to numpy's transposes beyond windows of ~6: 40 vs 56 µs a batch at L = 2, equal
  at 6, 1.3x slower at 14). What is left changes rounding, and this model's AUC follows any rounding change
  through near-ties (above) further than the 1e-5 its result lines are held to: float32 (upstream's precision),
  the lane kernel for prediction or longer windows, vectorised cross-attention exps, another lane count.
  THE ROUNDING POLICY since then (issue #19, the lead's decision): float64 rounding changes are allowed where
  these hold and are reported: every user's size exact; Log Loss and RMSE(bins) of every user equal to before
  within 1e-9 relative; AUC moving only through near-ties (its largest move reported on the embedded users,
  sim36 1-12 and the 45k-review user); predictions for fixed weights equal within 1e-12 relative; the kernels
  still equal to torch autograd in float64 (tests/test_transformer_compiled.py). float32 stays out (it moves Log
  Loss digits). Under it (neural/transformer_lanes.py has the kernel-level numbers): the lane kernel's
  cross-attention exps by exp_nonpos1 across the lanes, its head's two pow calls as 1/√base and p/base, and
  training windows up to 31 (was 20) in the lane kernel. The lane kernel only trains (and evaluates for the
  divergence check), so predictions for fixed weights are bit-identical (the prediction path is unchanged).
  Against before, unrounded metrics: every size equal; Log Loss within 2.9e-16 and RMSE(bins) within 3.5e-16
  relative; AUC moves at most 1.7e-5 on the embedded users, 1.8e-4 on sim36 1-12 (users 5 and 6; the others
  <= 7.2e-5), 3.9e-7 on the 45k-review user.
- `--trainer upstream`: nn.Transformer itself (neural/transformer_torch.py) trained by upstream/training.py (neural_seq.
  fit_upstream), in float32 as upstream. (`transformer_forward`, the module's forward written out with the
  attention as broadcast products, is the torch reference the tests hold the kernel to.)
"""

from __future__ import annotations

import math

import numpy as np

from models.base import ReviewData, recency_weights
from neural.card_net import SHUFFLE_SEED, TORCH_SEED, FlatNet, LazyClass, NeuralModel
from engine.kernel_math import adam_step, cosine_lr
from upstream.target_batches import check_diverged, pad_histories, target_batches
from upstream.torch_rng import BernoulliStream, TorchGenerator, portable_bernoulli
from neural.transformer_kernels import D_NF, DROPOUT, FC, KEEP_SCALE, PARAMS, batch_loss
from neural.transformer_lanes import LANES_MAX_WINDOW, batch_loss_lanes, lane_masks, no_dropout

PREDICT_BATCH = 8192  # upstream's Collection.batch_predict


# ------------------------------------------------------------------------------- the compiled path (--trainer fast)

def mask_shapes(length: int, batch: int) -> list[tuple[int, ...]]:
    """The shapes of the ten tensors nn.Transformer's forward drops out, in its order, for src [length, batch, 2]
    and a one-token target (neural/transformer_kernels.py names the sites)."""
    L, B = length, batch
    return [(B, 2, L, L), (L, B, 2), (L, B, 2), (L, B, 2), (B, 2, 1, 1), (1, B, 2), (B, 2, 1, L), (1, B, 2),
            (1, B, 2), (1, B, 2)]


def draw_masks(length: int, batch: int, stream: BernoulliStream | None = None) -> list[np.ndarray]:
    """The ten 0/1 dropout masks (uint8) one training forward of the module draws, from torch's default generator
    in the same order and sizes: F.dropout(x, p) on the CPU is x · empty_like(x).bernoulli_(1 − p) / (1 − p), one
    Bernoulli draw per element in memory order whatever the dtype (tests/test_transformer_compiled.py checks it),
    so drawing the masks alone consumes the generator exactly as the module does. Drawn by torch itself, or, with
    `stream` (torch_rng.BernoulliStream: the same generator emulated, only where torch_rng.portable_bernoulli()),
    all ten from one fill: they are consecutive in the stream."""
    shapes = mask_shapes(length, batch)
    if stream is None:
        import torch

        return [torch.empty(s, dtype=torch.uint8).bernoulli_(1 - DROPOUT).numpy() for s in shapes]
    sizes = [math.prod(s) for s in shapes]
    flat = stream.bernoulli(sum(sizes), 1 - DROPOUT)
    ends = np.cumsum(sizes)
    return [flat[e - n:e].reshape(s) for e, n, s in zip(ends, sizes, shapes)]


def kernel_masks(masks: list[np.ndarray]) -> tuple:
    """draw_masks' arrays as the kernel reads them (views; the one-token sites as [B, 2] or [B, 2, L])."""
    a = masks
    B = a[0].shape[0]
    return (a[0], a[1], a[2], a[3], a[4].reshape(B, 2), a[5].reshape(B, 2), a[6].reshape(B, 2, -1),
            a[7].reshape(B, 2), a[8].reshape(B, 2), a[9].reshape(B, 2))


_NO_MASKS = (np.ones((1, 1, 1, 1), np.uint8), *(np.ones((1, 1, 1), np.uint8),) * 3, np.ones((1, 1), np.uint8),
             np.ones((1, 1), np.uint8), np.ones((1, 1, 1), np.uint8), *(np.ones((1, 1), np.uint8),) * 3)


def kernel_batch(theta: np.ndarray, t: np.ndarray, g: np.ndarray, lengths: np.ndarray, dt: np.ndarray,
                 y: np.ndarray, w: np.ndarray, masks: tuple | None, grad: np.ndarray | None = None,
                 lanes_eval: bool = False) -> tuple[float, np.ndarray]:
    """(Σ weight·BCE, P(recall)) of one padded batch (t, g [L, B]; lengths: the real history lengths) by the
    compiled kernel; `masks` (kernel_masks) switch training mode on; `grad` (len N_PARAMS) receives the gradient
    added to it. Training windows up to LANES_MAX_WINDOW run in the lane kernel (neural/transformer_lanes.py);
    `lanes_eval` sends evaluation (no masks) there too, its padded positions processed one by one (the same values
    up to rounding; not for predictions, whose near-ties a rounding change reorders)."""
    p = np.empty(t.shape[1])
    if (masks is not None or lanes_eval) and t.shape[0] <= LANES_MAX_WINDOW:  # a short window: targets side by side
        loss = batch_loss_lanes(theta, np.ascontiguousarray(t, dtype=np.float64),
                                np.ascontiguousarray(g, dtype=np.float64), np.asarray(dt, np.float64),
                                np.asarray(y, np.float64), np.asarray(w, np.float64),
                                lane_masks(masks) if masks is not None else no_dropout(*t.shape),
                                KEEP_SCALE if masks is not None else 1.0, np.empty(0) if grad is None else grad, p)
        return loss, p
    loss = batch_loss(theta, np.ascontiguousarray(t, dtype=np.float64), np.ascontiguousarray(g, dtype=np.float64),
                      np.asarray(lengths, np.int64), np.asarray(dt, np.float64), np.asarray(y, np.float64), np.asarray(w, np.float64),
                      _NO_MASKS if masks is None else masks, masks is not None,
                      np.empty(0) if grad is None else grad, p)
    return loss, p


# evaluates_finite's limits: weights and inputs this small keep every value of the forward pass finite (docstring)
_THETA_MAX, _INPUT_MAX, _HEAD_MAX = 1e3, 1e5, 700.0


def history_bound(data: ReviewData) -> float:
    """The largest |value| any training window can hold: every interval and rating of the user's histories (NaN
    if one is NaN)."""
    t, g = data.seq_delta_t, data.seq_rating
    return float(max(np.abs(t).max(initial=0.0), np.abs(g).max(initial=0)))


def evaluates_finite(theta: np.ndarray, input_max: float) -> bool:
    """True when the training set's evaluation with weights `theta` (no dropout) is finite whatever its windows,
    so that check_diverged's evaluation (only NaN or not matters to it) can be skipped; False means: evaluate.
    Why it holds, with every weight finite and |θ| <= 1e3, every input |t|, |g| <= 1e5 days (`input_max`),
    windows of at most max_seq_len (64): the in-projection gives |q|, |k|, |v| <= 2·1e8 + 1e3, so a score q·k is
    below 4.1e16 and the softmax's shift max q·k, rounded (and the scores contracted to fused multiply-adds), is
    off by at most 4.1e16·2⁻⁵³ < 4.6: its largest exp is at least e^−4.6, Σ exps > 0, and a head's output at most
    64·e^4.6·|v| < 1.3e12 (a convex combination of the values but for that rounding; it is what limits the inputs
    and weights: at |q·k| ~ 1e36 the shift's rounding alone underflowed every exp of a one-key window here); a
    linear layer multiplies a bound by at most 2·1e3 and adds 1e3, so the largest value before a LayerNorm (the
    residual after the self-attention) is below 3e15 and its square below 1e31; a LayerNorm over 2 features
    outputs x̂ = ±d/√(d² + ε), |x̂| <= 1 (up to rounding), i.e. |γ| + |β| at most (<= 2e3), so every later value
    is a bounded polynomial in the weights (the cross-attention's scores below 2e13, shifted within 0.01; the
    rest below 1e12). The head: z = fc·out + b with out the decoder's final LayerNorm, |z| <= Σ|fc_k|·(|γ_k| +
    |β_k|) + |b|; when that is <= 700, S = exp(z) is finite and > 0 (no ZeroDivisionError), 1 + F·Δt/S is >= 1
    (inf at most), p = base^(-1/2) is in [0, 1] and the clamped BCE finite. So the final weights' evaluation, the
    first check_diverged makes, would return a finite loss: the same outcome without the pass (on a 45k-review
    user ~7% of its CPU; fine-tuned weights stay within a few units of the pretrained ones and intervals are days,
    so the limits hold for real users). tests/test_transformer_divergence.py evaluates at those limits."""
    if not np.isfinite(theta).all() or not (input_max <= _INPUT_MAX) or not (np.abs(theta).max() <= _THETA_MAX):
        return False
    head = (abs(theta[FC]) * (abs(theta[D_NF]) + abs(theta[D_NF + 2]))
            + abs(theta[FC + 1]) * (abs(theta[D_NF + 1]) + abs(theta[D_NF + 3])) + abs(theta[FC + 2]))
    return bool(head <= _HEAD_MAX)


def fit_compiled(net, data: ReviewData, cfg, *, n_epoch: int, lr: float | None = None) -> None:
    """neural_seq.fit_upstream's recipe by the compiled kernel, in float64, on `net`'s weights (a TransformerFlat,
    or the torch module on the torch paths: anything with theta/set_theta/lr/wd): upstream's padded target batches
    (upstream/target_batches.py), their order by torch.randperm on a generator seeded 2023 every epoch
    (torch_rng.TorchGenerator), the dropout masks torch draws after torch.manual_seed(42) batch by batch
    (draw_masks), torch's AdamW(lr, weight_decay=net.wd) update and CosineAnnealingLR(T_max = batches·epochs)
    (kernel_math); the FINAL weights are kept. training.train would also evaluate the training set before every
    epoch and after the last to pick the best, which the kept-final rule makes moot except for one outcome:
    InadequateData when every one of those evaluations is NaN; so the epoch-start weights are kept aside and
    evaluated only if the final ones evaluate NaN (target_batches.check_diverged)."""
    lr = net.lr if lr is None else lr
    weights = recency_weights(len(data)) if getattr(cfg, "recency", False) else np.ones(len(data))
    batches = [b[:6] for b in target_batches(data, weights, cfg.batch_size, cfg.max_seq_len)]
    n = sum(len(b[2]) for b in batches)
    theta = net.theta()
    m, v, grad = np.zeros_like(theta), np.zeros_like(theta), np.zeros_like(theta)
    t_max = max(1, len(batches) * n_epoch)
    stream = BernoulliStream(TORCH_SEED) if portable_bernoulli() else None
    if stream is None:  # torch draws the masks (MKL's stream on Intel CPUs)
        import torch

        torch.manual_seed(TORCH_SEED)
    generator = TorchGenerator(SHUFFLE_SEED)
    starts, step = [], 0
    for _ in range(n_epoch):
        starts.append(theta.copy())
        for k in generator.randperm(len(batches)).tolist():
            t, g, lengths, dt, y, w = batches[k]
            grad[:] = 0.0
            kernel_batch(theta, t, g, lengths, dt, y, w, kernel_masks(draw_masks(*t.shape, stream)), grad)
            lr_t = cosine_lr(lr, step, t_max)
            step += 1
            adam_step(theta, grad, m, v, step, lr_t, 0.9, 0.999, 1e-8, net.wd)
    # (only NaN or not matters here, so short windows may go through the lane kernel: padded positions not
    # collapsed, the same loss up to rounding; and no evaluation at all where the weights bound every value)
    if not evaluates_finite(theta, history_bound(data)):
        check_diverged([theta] + starts,
                       lambda th: sum(kernel_batch(th, *b, None, lanes_eval=True)[0] for b in batches) / n)
    net.set_theta(theta)
    net.eval()


def predict_compiled(net: "TransformerFlat", data: ReviewData, chunk: int = PREDICT_BATCH) -> np.ndarray:
    """Upstream's prediction layout by the kernel on the float64 weights: rows in order, chunks of `chunk`, each
    zero-padded to its longest history."""
    rows = data.rows
    starts = rows["seq_start"].to_numpy(np.int64)
    lengths = rows["seq_pos"].to_numpy(np.int64)
    dt = np.array(rows["delta_t"], dtype=np.float64)
    out = np.empty(len(rows))
    theta = net.theta()
    for lo in range(0, len(rows), chunk):
        sl = slice(lo, lo + chunk)
        t, g = pad_histories(data.seq_delta_t, data.seq_rating, starts[sl], lengths[sl])
        ones = np.ones(len(t))
        out[sl] = kernel_batch(theta, t.T, g.T, lengths[sl], dt[sl], ones, ones, None)[1]
    return out


def train_windows(net, data: ReviewData, cfg, *, n_epoch: int, compiled: bool, lr: float | None = None) -> None:
    """Upstream's recipe on its per-target windows, the final weights: by the kernel (`fit_compiled`) or by
    upstream/training.py's torch loop (`fit_upstream`: the written-out forward or nn.Transformer itself, as `net` says)."""
    if compiled:
        fit_compiled(net, data, cfg, n_epoch=n_epoch, lr=lr)
    else:
        from neural.neural_seq import fit_upstream

        fit_upstream(net, data, cfg, n_epoch=n_epoch, lr=lr)


class TransformerFlat(FlatNet):
    """The compiled path's network: the 127 weights as one float64 vector (PARAMS order), no torch module per fold
    (building nn.Transformer and loading its state cost more than a small user's whole fine-tune). float64 storage:
    the fine-tuned weights predict exactly as they were trained."""

    store_dtype = np.float64
    lr, wd = 4e-2, 1e-5  # TransformerNet's

    def param_shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        return PARAMS

    def eval(self) -> "TransformerFlat":
        return self


class Transformer(NeuralModel):
    name = "Transformer"
    first_run_seconds = 25  # its first run's compiling (warmup.py), measured in an empty cache
    net_class = LazyClass("neural.transformer_torch:TransformerNet")
    flat_class = TransformerFlat
    n_epoch = 5

    def new_net(self):
        net = super().new_net()  # TransformerFlat where NeuralModel.torch_free(), else the torch module
        if not isinstance(net, TransformerFlat):
            net.functional = getattr(self.cfg, "trainer", "fast") != "upstream"  # the module itself upstream-style
            if self.compiled:
                net.double()  # the kernel's float64 weights, held by the module between fit and predict
        return net

    @property
    def compiled(self) -> bool:
        """--trainer fast: the compiled kernel (fit_compiled, predict_windows(compiled=True)); autograd: the
        written-out forward in torch; upstream: nn.Transformer itself."""
        return getattr(self.cfg, "trainer", "fast") == "fast"

    def fit(self, train: ReviewData) -> "Transformer":
        if self.cfg.default:
            return self
        train_windows(self.net, train, self.cfg, n_epoch=self.n_epoch, compiled=self.compiled)  # module docstring
        return self

    def predict(self, test: ReviewData) -> np.ndarray:
        if self.compiled:
            return predict_compiled(self.net, test)
        from neural.transformer_torch import predict_windows

        return predict_windows(self.net, test)

    @staticmethod
    def pretrain_fn(net, data: ReviewData, *, n_epoch: int, lr: float, wd: float, batch_size: int,
                    max_seq_len: int, short: bool, trainer: str = "fast"):
        """Upstream's pretraining on per-target windows (sorted batches of batch_size), final weights, on the torch
        module `net`: by the compiled kernel (trainer "fast": fit_compiled in float64 on the module turned double,
        ~16x faster; pretrain.py saves float32) or by upstream/training.py's torch loop (any other trainer)."""
        from config import RunConfig

        net.wd = wd
        cfg = RunConfig(algo="Transformer", short=short, batch_size=batch_size, max_seq_len=max_seq_len)
        if trainer == "fast":
            net.double()
        train_windows(net, data, cfg, n_epoch=n_epoch, compiled=trainer == "fast", lr=lr)
        return net
