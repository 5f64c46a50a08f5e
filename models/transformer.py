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

import warnings

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import training
from models.base import ReviewData
from models.gru_p import DECAY, FACTOR
from models.neural_seq import CardSeqNet, NeuralModel, fit_upstream

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


# ------------------------------------------------------------------------------- nn.Transformer, written out
# nn.Transformer(d_model=2, nhead=2, 1 + 1 layers, dim_feedforward=2, post-norm, ReLU, no masks) spends most of its
# time in torch.bmm over 2·B tiny matrices (head_dim 1: a per-matrix loop in C++). With head_dim 1 the attention
# scores are plain products and the weighted sum a sum over the keys, so the same computation runs as broadcast
# element-wise ops, ~1.6x faster per batch. Every other op is the module's own call on the module's own weights,
# in the module's order, and every dropout draws from torch's generator on a tensor of the same size at the same
# point, so the masks are the module's (tests/test_neural.py: float64 equal to 1e-15 with dropout active; in
# float32 the key sums round differently from bmm's, ~1 ulp).

def _attention(x: Tensor, mem: Tensor, mha: nn.MultiheadAttention, training: bool) -> Tensor:
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
    attn = F.dropout(attn, mha.dropout, training)
    out = (attn * v.unsqueeze(-2)).sum(-1).permute(2, 0, 1)  # [L, B, heads]
    return F.linear(out, mha.out_proj.weight, mha.out_proj.bias)


def _feed_forward(layer, x: Tensor, training: bool) -> Tensor:
    return layer.linear2(F.dropout(F.relu(layer.linear1(x)), layer.dropout.p, training))


def transformer_forward(tf: nn.Transformer, src: Tensor, tgt: Tensor, training: bool) -> Tensor:
    """nn.Transformer(src, tgt) for this model's configuration (post-norm layers, final norms, no masks)."""
    el, dl = tf.encoder.layers[0], tf.decoder.layers[0]
    p = el.dropout1.p
    x = el.norm1(src + F.dropout(_attention(src, src, el.self_attn, training), p, training))
    x = el.norm2(x + F.dropout(_feed_forward(el, x, training), p, training))
    mem = tf.encoder.norm(x)
    y = dl.norm1(tgt + F.dropout(_attention(tgt, tgt, dl.self_attn, training), p, training))
    y = dl.norm2(y + F.dropout(_attention(y, mem, dl.multihead_attn, training), p, training))
    y = dl.norm3(y + F.dropout(_feed_forward(dl, y, training), p, training))
    return tf.decoder.norm(y)


def predict_windows(net: TransformerNet, data: ReviewData, chunk: int = PREDICT_BATCH) -> np.ndarray:
    """Upstream's prediction layout: rows in order, chunks of `chunk`, each zero-padded to its longest history."""
    rows = data.rows
    starts = rows["seq_start"].to_numpy(np.int64)
    lengths = rows["seq_pos"].to_numpy(np.int64)
    dt = np.array(rows["delta_t"], dtype=np.float64)
    out = np.empty(len(rows))
    net.eval()
    with torch.no_grad():
        for lo in range(0, len(rows), chunk):
            sl = slice(lo, lo + chunk)
            t, g = training.pad_histories(data.seq_delta_t, data.seq_rating, starts[sl], lengths[sl])
            src = torch.as_tensor(np.stack([t.T, g.T], axis=-1), dtype=net.dtype)
            s = net.stability(src)
            out[sl] = ((1 + FACTOR * torch.as_tensor(dt[sl], dtype=net.dtype) / s) ** DECAY).double().numpy()
    return out


class Transformer(NeuralModel):
    name = "Transformer"
    net_class = TransformerNet
    n_epoch = 5

    def new_net(self) -> TransformerNet:
        net = super().new_net()
        net.functional = getattr(self.cfg, "trainer", "fast") != "upstream"  # the module itself upstream-style
        return net

    def fit(self, train: ReviewData) -> "Transformer":
        if self.cfg.default:
            return self
        fit_upstream(self.net, train, self.cfg, n_epoch=self.n_epoch)  # both trainers: see the module docstring
        return self

    def predict(self, test: ReviewData) -> np.ndarray:
        return predict_windows(self.net, test)

    @staticmethod
    def pretrain_fn(net: TransformerNet, data: ReviewData, *, n_epoch: int, lr: float, wd: float, batch_size: int,
                    max_seq_len: int, short: bool) -> TransformerNet:
        """Upstream's pretraining on per-target windows (sorted batches of batch_size), final weights."""
        from config import RunConfig

        net.wd = wd
        cfg = RunConfig(algo="Transformer", short=short, batch_size=batch_size, max_seq_len=max_seq_len)
        fit_upstream(net, data, cfg, n_epoch=n_epoch, lr=lr)
        return net
