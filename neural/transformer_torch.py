"""The Transformer's torch half: the module (nn.Transformer + Linear, 127 parameters; models/transformer.py has
the model, its quirks and the compiled path) for `--trainer upstream` (nn.Transformer itself) and `--trainer
autograd` (the same forward written out, `transformer_forward`), the torch prediction in upstream's chunks, and the
reference the compiled kernel is tested against (tests/test_transformer_compiled.py)."""

from __future__ import annotations

import warnings

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import upstream.training as training
from models.base import ReviewData
from models.gru_p import DECAY, FACTOR
from neural.neural_seq import CardSeqNet
from upstream.target_batches import pad_histories
from neural.transformer_kernels import PARAMS

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


def predict_windows(net: TransformerNet, data: ReviewData, chunk: int = PREDICT_BATCH) -> np.ndarray:
    """Upstream's prediction layout by the module: rows in order, chunks of `chunk`, each zero-padded to its
    longest history."""
    rows = data.rows
    starts = rows["seq_start"].to_numpy(np.int64)
    lengths = rows["seq_pos"].to_numpy(np.int64)
    dt = np.array(rows["delta_t"], dtype=np.float64)
    out = np.empty(len(rows))
    net.eval()
    with torch.no_grad():
        for lo in range(0, len(rows), chunk):
            sl = slice(lo, lo + chunk)
            t, g = pad_histories(data.seq_delta_t, data.seq_rating, starts[sl], lengths[sl])
            src = torch.as_tensor(np.stack([t.T, g.T], axis=-1), dtype=net.dtype)
            s = net.stability(src)
            out[sl] = ((1 + FACTOR * torch.as_tensor(dt[sl], dtype=net.dtype) / s) ** DECAY).double().numpy()
    return out
