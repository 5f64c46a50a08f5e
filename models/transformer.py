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
upstream's prediction chunks) and is not on the one-pass-per-card path; `--trainer fast` and `--trainer upstream`
run the same computation.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
from torch import Tensor, nn

import training
from models.base import ReviewData
from models.gru_p import DECAY, FACTOR
from models.neural_seq import CardSeqNet, NeuralModel, fit_upstream

PREDICT_BATCH = 8192  # upstream's Collection.batch_predict


class TransformerNet(CardSeqNet):
    lr = 4e-2
    wd = 1e-5

    def __init__(self):
        super().__init__()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # nested-tensor notice for a 1-layer encoder
            self.transformer = nn.Transformer(d_model=2, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                                              dim_feedforward=2)
        self.fc = nn.Linear(2, 1)

    def stability(self, src: Tensor) -> Tensor:
        """src [L, B, 2] (zero-padded, no mask) → S [B]."""
        tgt = torch.zeros(1, src.shape[1], 2, dtype=src.dtype)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = self.transformer(src, tgt)
        return torch.exp(self.fc(out[0])).squeeze(-1)

    def forward_batch(self, batch: training.Batch) -> Tensor:
        s = self.stability(torch.stack([batch.t, batch.g], dim=-1))
        return (1 + FACTOR * batch.delta_t / s) ** DECAY


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
