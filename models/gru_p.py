"""GRU-P (297 parameters) and GRU (39 parameters): spec models.md §2.1–2.2, one pass per card (models/neural_seq.py).

GRU-P (SB models/gru_p.py@00c9de57, features in other.py@00c9de57): a GRU(2→8) over the shifted sequence
step k = (t_{k+1}, G_k) — the rating of review k paired with the interval after it; the last step's interval is the
target's own delta_t — and p = σ(Linear(8→1)(h_last)). No forgetting curve: the probability comes out directly.
Fine-tune: AdamW(lr 1e-2, weight_decay 1e-5), 16 epochs, batch 512, cosine. `--short` (GRU-P-short) puts same-day
reviews into the sequence as steps (interval 0 between same-day reviews); targets stay long-term only.

One pass per card for GRU-P. A target with history length n ends with the step (its own delta_t, G_{n−1}); the
card's own shifted step n−1 is exactly that, because the interval after review n−1 IS the target's delta_t. So the
card is run ONCE through the GRU over its first n_max steps and every target reads its final state off the card's
sequence (h after step n−1). A target whose last inputs differ from its card's step (none that features.py builds;
e.g. a hand-edited delta_t) gets one GRU step of its own from the card's state after n−1 steps, so the result is
upstream's per-target computation in every case. The GRU is nn.GRU's recurrence compiled with its gradient
(models/gru_kernels.py); the per-target path `forward_batch` runs torch's own nn.GRU upstream's way, and the tests
hold the two equal.

GRU (SB models/rnn.py@6b652a99, `model_name == "GRU"`): a GRU(2→2) over the FSRS-style steps (t_k, G_k) (t_0 = 0),
S = exp(Linear(2→1)(h_last)), p = (1 + (19/81)·t/S)^(−0.5). Fine-tune: AdamW(lr 4e-2, weight_decay 1e-5), 5 epochs.

Both: orthogonal weight_ih/weight_hh and zero biases before the pretrained weights are loaded; the weights come from
pretrain/GRU-P.pth, pretrain/GRU-P-short.pth and pretrain/GRU.pth (made by pretrain.py; see its docstring for the
exact commands and data of the shipped files).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor, nn

import training
from models.gru_kernels import HEAD_POWER_CURVE, HEAD_SIGMOID_CELL, gru_card_states, gru_cards_loss, gru_cell
from models.neural_seq import CardBatch, CompiledCardNet, NeuralModel

DECAY = -0.5
FACTOR = 0.9 ** (1 / DECAY) - 1  # 19/81: the FSRS-4.5 power curve, R(S, S) = 0.9


def _orthogonal_gru(n_input: int, n_hidden: int) -> nn.GRU:
    rnn = nn.GRU(input_size=n_input, hidden_size=n_hidden, num_layers=1)
    nn.init.orthogonal_(rnn.weight_ih_l0)
    nn.init.orthogonal_(rnn.weight_hh_l0)
    rnn.bias_ih_l0.data.fill_(0)
    rnn.bias_hh_l0.data.fill_(0)
    return rnn


class GRUFamilyNet(CompiledCardNet):
    """A one-layer GRU + Linear(H→1) whose loss, gradient and whole fine-tune run compiled (models/gru_kernels.py)."""

    head_kind: int = HEAD_SIGMOID_CELL
    card_loss = gru_cards_loss

    def model_consts(self) -> tuple:
        return (self.head_kind, self.rnn.hidden_size, FACTOR, DECAY)

    def flat_params(self) -> list[nn.Parameter]:
        r = self.rnn
        return [r.weight_ih_l0, r.weight_hh_l0, r.bias_ih_l0, r.bias_hh_l0, self.fc.weight, self.fc.bias]


class GRUPNet(GRUFamilyNet):
    lr = 1e-2
    wd = 1e-5

    def __init__(self, n_hidden: int = 8):
        super().__init__()
        self.rnn = _orthogonal_gru(2, n_hidden)
        self.fc = nn.Linear(n_hidden, 1)

    def step_features(self, data):
        """Step k = (interval after review k, rating of review k). At a card's last review the 'next interval'
        belongs to another card, but no target ever reads that step from the sequence (its last step is its own)."""
        next_dt = np.append(np.asarray(data.seq_delta_t, dtype=np.float64)[1:], 0.0)
        return np.stack([next_dt, np.asarray(data.seq_rating, dtype=np.float64)], axis=1)

    def card_states(self, x, c_steps):
        return gru_card_states(self.rnn, x, c_steps)

    def last_step(self, h_prev: Tensor, dt: Tensor, g: Tensor) -> Tensor:
        return gru_cell(self.rnn, torch.stack([dt, g], dim=1), h_prev)

    def target_p(self, states, batch: CardBatch):
        h = self.last_step(states[batch.t_pos - 1, batch.t_card], batch.t_dt, batch.t_last_g)
        return torch.sigmoid(self.fc(h)).squeeze(-1)

    def forward_batch(self, batch: training.Batch) -> Tensor:
        """Upstream's per-target tensor (t_item[1:], r_item[:-1]) with the target's delta_t as the last interval,
        zero-padded, through nn.GRU; the output at the last real step."""
        cols = torch.arange(len(batch))
        last = batch.lengths - 1
        t_next = torch.zeros_like(batch.t)
        t_next[:-1] = batch.t[1:]
        t_next[last, cols] = batch.delta_t
        out, _ = self.rnn(torch.stack([t_next, batch.g], dim=-1))
        return torch.sigmoid(self.fc(out[last, cols])).squeeze(-1)


class GRUNet(GRUFamilyNet):
    head_kind = HEAD_POWER_CURVE
    lr = 4e-2
    wd = 1e-5

    def __init__(self, n_hidden: int = 2):
        super().__init__()
        self.rnn = _orthogonal_gru(2, n_hidden)
        self.fc = nn.Linear(n_hidden, 1)

    def step_features(self, data):
        return np.stack([np.asarray(data.seq_delta_t, dtype=np.float64), np.asarray(data.seq_rating, dtype=np.float64)],
                        axis=1)

    def card_states(self, x, c_steps):
        return gru_card_states(self.rnn, x, c_steps)

    def head(self, h: Tensor, dt: Tensor) -> Tensor:
        s = torch.exp(self.fc(h)).squeeze(-1)
        return (1 + FACTOR * dt / s) ** DECAY

    def target_p(self, states, batch: CardBatch):
        return self.head(states[batch.t_pos, batch.t_card], batch.t_dt)

    def forward_batch(self, batch: training.Batch) -> Tensor:
        cols = torch.arange(len(batch))
        out, _ = self.rnn(torch.stack([batch.t, batch.g], dim=-1))
        return self.head(out[batch.lengths - 1, cols], batch.delta_t)


class GRUP(NeuralModel):
    name = "GRU-P"
    net_class = GRUPNet
    n_epoch = 16


class GRU(NeuralModel):
    name = "GRU"
    net_class = GRUNet
    n_epoch = 5
