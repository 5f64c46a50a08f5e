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
between its targets. So this model keeps upstream's layout in both trainers (training.py's sorted batches, then
upstream's prediction chunks) and is not on the one-pass-per-card path. `--trainer fast` (default) runs the module's
forward written out (`transformer_forward`: the same ops, weights and dropout draws, attention as broadcast products
instead of torch.bmm's per-matrix loop); `--trainer upstream` runs nn.Transformer itself.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import training
from models.base import ReviewData
from models.gru_p import DECAY, FACTOR
from models.kernel_math import adam_step, cosine_lr
from models.neural_seq import SHUFFLE_SEED, TORCH_SEED, CardSeqNet, FlatNet, NeuralModel, fit_upstream
from models.torch_rng import BernoulliStream, portable_bernoulli
from models.transformer_kernels import DROPOUT, PARAMS, batch_loss

PREDICT_BATCH = 8192  # upstream's Collection.batch_predict


class TransformerNet(CardSeqNet):
    lr = 4e-2
    wd = 1e-5
    functional = True  # see transformer_forward

    def __init__(self):
        super().__init__()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # nested-tensor notice for a 1-layer encoder
            self.transformer = nn.Transformer(d_model=2, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                                              dim_feedforward=2)
        self.fc = nn.Linear(2, 1)

    def stability(self, src: Tensor) -> Tensor:
        """src [L, B, 2] (zero-padded, no mask) → S [B]: nn.Transformer's forward, by `transformer_forward` unless
        `self.functional` is False (`--trainer upstream`: the module itself)."""
        tgt = torch.zeros(1, src.shape[1], 2, dtype=src.dtype)
        if self.functional:
            out = transformer_forward(self.transformer, src, tgt, self.training)
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                out = self.transformer(src, tgt)
        return torch.exp(self.fc(out[0])).squeeze(-1)

    def forward_batch(self, batch: training.Batch) -> Tensor:
        s = self.stability(torch.stack([batch.t, batch.g], dim=-1))
        return (1 + FACTOR * batch.delta_t / s) ** DECAY

    def theta(self) -> np.ndarray:
        """The parameters as the kernel's flat float64 vector (transformer_kernels.PARAMS order)."""
        return np.concatenate([self.get_parameter(n).detach().double().numpy().ravel() for n, _ in PARAMS])

    def set_theta(self, theta: np.ndarray) -> None:
        with torch.no_grad():
            k = 0
            for n, _ in PARAMS:
                p = self.get_parameter(n)
                p.copy_(torch.from_numpy(theta[k:k + p.numel()]).view_as(p))
                k += p.numel()


# ------------------------------------------------------------------------------- nn.Transformer, written out
# nn.Transformer(d_model=2, nhead=2, 1 + 1 layers, dim_feedforward=2, post-norm, ReLU, no masks) spends most of its
# time in torch.bmm over 2·B tiny matrices (head_dim 1: a per-matrix loop in C++). With head_dim 1 the attention
# scores are plain products and the weighted sum a sum over the keys, so the same computation runs as broadcast
# element-wise ops, ~1.6x faster per batch. Every other op is the module's own call on the module's own weights,
# in the module's order, and every dropout draws from torch's generator on a tensor of the same size at the same
# point, so the masks are the module's (tests/test_neural.py: float64 equal to 1e-15 with dropout active; in
# float32 the key sums round differently from bmm's, ~1 ulp).

def _attention(x: Tensor, mem: Tensor, mha: nn.MultiheadAttention, training: bool, dropout=F.dropout) -> Tensor:
    """nn.MultiheadAttention(2, 2 heads)(x, mem, mem, need_weights=False) with no masks: x [L, B, 2], mem [S, B, 2]."""
    e = x.shape[-1]
    w, b = mha.in_proj_weight, mha.in_proj_bias
    if x is mem:  # self-attention: one packed projection, as F.multi_head_attention_forward does
        q, k, v = F.linear(x, w, b).unflatten(-1, (3, e)).unsqueeze(0).transpose(0, -2).squeeze(-2).contiguous()
    else:  # cross-attention: q on its own, k and v packed
        w_q, w_kv = w.split([e, 2 * e])
        b_q, b_kv = b.split([e, 2 * e])
        q = F.linear(x, w_q, b_q)
        k, v = F.linear(mem, w_kv, b_kv).unflatten(-1, (2, e)).unsqueeze(0).transpose(0, -2).squeeze(-2).contiguous()
    q, k, v = q.permute(1, 2, 0), k.permute(1, 2, 0), v.permute(1, 2, 0)  # [B, heads, L]: head_dim 1
    attn = torch.softmax(q.unsqueeze(-1) * k.unsqueeze(-2), dim=-1)  # [B, heads, L, S]; scale 1/sqrt(1)
    attn = dropout(attn, mha.dropout, training)
    out = (attn * v.unsqueeze(-2)).sum(-1).permute(2, 0, 1)  # [L, B, heads]
    return F.linear(out, mha.out_proj.weight, mha.out_proj.bias)


def _feed_forward(layer, x: Tensor, training: bool, dropout=F.dropout) -> Tensor:
    return layer.linear2(dropout(F.relu(layer.linear1(x)), layer.dropout.p, training))


def transformer_forward(tf: nn.Transformer, src: Tensor, tgt: Tensor, training: bool, dropout=F.dropout) -> Tensor:
    """nn.Transformer(src, tgt) for this model's configuration (post-norm layers, final norms, no masks).
    `dropout(x, p, training)` is F.dropout; the tests pass one that applies given masks (`draw_masks`)."""
    el, dl = tf.encoder.layers[0], tf.decoder.layers[0]
    p = el.dropout1.p
    x = el.norm1(src + dropout(_attention(src, src, el.self_attn, training, dropout), p, training))
    x = el.norm2(x + dropout(_feed_forward(el, x, training, dropout), p, training))
    mem = tf.encoder.norm(x)
    y = dl.norm1(tgt + dropout(_attention(tgt, tgt, dl.self_attn, training, dropout), p, training))
    y = dl.norm2(y + dropout(_attention(y, mem, dl.multihead_attn, training, dropout), p, training))
    y = dl.norm3(y + dropout(_feed_forward(dl, y, training, dropout), p, training))
    return tf.decoder.norm(y)


# ------------------------------------------------------------------------------- the compiled path (--trainer fast)

def mask_shapes(length: int, batch: int) -> list[tuple[int, ...]]:
    """The shapes of the ten tensors nn.Transformer's forward drops out, in its order, for src [length, batch, 2]
    and a one-token target (models/transformer_kernels.py names the sites)."""
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
                 y: np.ndarray, w: np.ndarray, masks: tuple | None, grad: np.ndarray | None = None
                 ) -> tuple[float, np.ndarray]:
    """(Σ weight·BCE, P(recall)) of one padded batch (t, g [L, B]; lengths: the real history lengths) by the
    compiled kernel; `masks` (kernel_masks) switch training mode on; `grad` (len N_PARAMS) receives the gradient
    added to it."""
    p = np.empty(t.shape[1])
    loss = batch_loss(theta, np.ascontiguousarray(t, dtype=np.float64), np.ascontiguousarray(g, dtype=np.float64),
                      np.asarray(lengths, np.int64), np.asarray(dt, np.float64), np.asarray(y, np.float64), np.asarray(w, np.float64),
                      _NO_MASKS if masks is None else masks, masks is not None,
                      np.empty(0) if grad is None else grad, p)
    return loss, p


def fit_compiled(net: "TransformerNet | TransformerFlat", data: ReviewData, cfg, *, n_epoch: int, lr: float | None = None) -> None:
    """fit_upstream's recipe with the compiled kernel, in float64 on `net`'s weights: training.py's batches
    (max_seq_len filter, stable length sort, batch_size targets each, padded per batch), their order by
    torch.randperm on a generator seeded 2023 every epoch, the dropout masks drawn by torch after
    torch.manual_seed(42) batch by batch (draw_masks; emulated where that is exact), torch's AdamW(lr, weight_decay=net.wd) update and
    CosineAnnealingLR(T_max = batches·epochs); the FINAL weights are kept. training.train would also evaluate the
    training set before every epoch and after the last to pick the best, which the kept-final rule makes moot
    except for one outcome: InadequateData when every one of those evaluations is NaN. So the epoch-start weights
    are saved and evaluated only when the final ones evaluate NaN (training.diverged)."""
    lr = net.lr if lr is None else lr
    weights = training.recency_weights(len(data)) if getattr(cfg, "recency", False) else np.ones(len(data))
    batches = [(b.t.numpy(), b.g.numpy(), b.lengths.numpy(), b.delta_t.numpy(), b.y.numpy(), b.weight.numpy()) for b in
               training.make_batches(data, weights, cfg.batch_size, cfg.max_seq_len, torch.float64)]
    n = sum(len(b[2]) for b in batches)
    theta = net.theta()
    m, v, grad = np.zeros_like(theta), np.zeros_like(theta), np.zeros_like(theta)
    t_max = max(1, len(batches) * n_epoch)
    stream = BernoulliStream(TORCH_SEED) if portable_bernoulli() else None
    if stream is None:
        torch.manual_seed(TORCH_SEED)
    generator = torch.Generator().manual_seed(SHUFFLE_SEED)
    starts, step = [], 0
    for _ in range(n_epoch):
        starts.append(theta.copy())
        for k in torch.randperm(len(batches), generator=generator).tolist():
            t, g, lengths, dt, y, w = batches[k]
            grad[:] = 0.0
            kernel_batch(theta, t, g, lengths, dt, y, w, kernel_masks(draw_masks(*t.shape, stream)), grad)
            lr_t = cosine_lr(lr, step, t_max)
            step += 1
            adam_step(theta, grad, m, v, step, lr_t, 0.9, 0.999, 1e-8, net.wd)
    training.check_diverged([theta] + starts, lambda th: sum(kernel_batch(th, *b, None)[0] for b in batches) / n)
    net.set_theta(theta)
    net.eval()


def predict_windows(net: "TransformerNet | TransformerFlat", data: ReviewData, chunk: int = PREDICT_BATCH,
                    compiled: bool = False) -> np.ndarray:
    """Upstream's prediction layout: rows in order, chunks of `chunk`, each zero-padded to its longest history;
    by the module in torch or, `compiled`, by the kernel on its float64 weights."""
    rows = data.rows
    starts = rows["seq_start"].to_numpy(np.int64)
    lengths = rows["seq_pos"].to_numpy(np.int64)
    dt = np.array(rows["delta_t"], dtype=np.float64)
    out = np.empty(len(rows))
    net.eval()
    theta = net.theta() if compiled else None
    with torch.no_grad():
        for lo in range(0, len(rows), chunk):
            sl = slice(lo, lo + chunk)
            t, g = training.pad_histories(data.seq_delta_t, data.seq_rating, starts[sl], lengths[sl])
            if compiled:
                ones = np.ones(len(t))
                out[sl] = kernel_batch(theta, t.T, g.T, lengths[sl], dt[sl], ones, ones, None)[1]
                continue
            src = torch.as_tensor(np.stack([t.T, g.T], axis=-1), dtype=net.dtype)
            s = net.stability(src)
            out[sl] = ((1 + FACTOR * torch.as_tensor(dt[sl], dtype=net.dtype) / s) ** DECAY).double().numpy()
    return out


class TransformerFlat(FlatNet):
    """The compiled path's network: the 127 weights as one float64 vector (PARAMS order), no torch module per fold
    (building nn.Transformer and loading its state cost more than a small user's whole fine-tune). float64 storage:
    the fine-tuned weights predict exactly as they were trained."""

    store_dtype = np.float64
    lr, wd = TransformerNet.lr, TransformerNet.wd

    def param_shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        return PARAMS

    def eval(self) -> "TransformerFlat":
        return self


class Transformer(NeuralModel):
    name = "Transformer"
    net_class = TransformerNet
    flat_class = TransformerFlat
    n_epoch = 5

    def new_net(self) -> TransformerNet | TransformerFlat:
        net = super().new_net()  # TransformerFlat where NeuralModel.torch_free(), else the torch module
        if isinstance(net, TransformerNet):
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
        fit = fit_compiled if self.compiled else fit_upstream  # one recipe: see the module docstring
        fit(self.net, train, self.cfg, n_epoch=self.n_epoch)
        return self

    def predict(self, test: ReviewData) -> np.ndarray:
        return predict_windows(self.net, test, compiled=self.compiled)

    @staticmethod
    def pretrain_fn(net: TransformerNet, data: ReviewData, *, n_epoch: int, lr: float, wd: float, batch_size: int,
                    max_seq_len: int, short: bool) -> TransformerNet:
        """Upstream's pretraining on per-target windows (sorted batches of batch_size), final weights."""
        from config import RunConfig

        net.wd = wd
        cfg = RunConfig(algo="Transformer", short=short, batch_size=batch_size, max_seq_len=max_seq_len)
        fit_upstream(net, data, cfg, n_epoch=n_epoch, lr=lr)
        return net
