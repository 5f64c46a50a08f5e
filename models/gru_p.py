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
from models.gru_kernels import (HEAD_POWER_CURVE, HEAD_SIGMOID_CELL, group_bounds, gru_card_states, gru_cards_loss,
                                gru_cell, gru_fit)
from models.neural_seq import CardBatch, CardSeqNet, CardSet, NeuralModel

DECAY = -0.5
FACTOR = 0.9 ** (1 / DECAY) - 1  # 19/81: the FSRS-4.5 power curve, R(S, S) = 0.9


def _orthogonal_gru(n_input: int, n_hidden: int) -> nn.GRU:
    rnn = nn.GRU(input_size=n_input, hidden_size=n_hidden, num_layers=1)
    nn.init.orthogonal_(rnn.weight_ih_l0)
    nn.init.orthogonal_(rnn.weight_hh_l0)
    rnn.bias_ih_l0.data.fill_(0)
    rnn.bias_hh_l0.data.fill_(0)
    return rnn


class GRUFamilyNet(CardSeqNet):
    """A one-layer GRU + Linear(H→1) whose predictions, loss, gradient and whole fine-tune run compiled
    (models/gru_kernels.py) on a flat float64 copy of the parameters."""

    head_kind: int = HEAD_SIGMOID_CELL

    def _params(self) -> list[nn.Parameter]:
        r = self.rnn
        return [r.weight_ih_l0, r.weight_hh_l0, r.bias_ih_l0, r.bias_hh_l0, self.fc.weight, self.fc.bias]

    def _theta(self) -> np.ndarray:
        return np.concatenate([p.detach().double().numpy().ravel() for p in self._params()])

    def _set_theta(self, theta: np.ndarray) -> None:
        with torch.no_grad():
            k = 0
            for p in self._params():
                p.copy_(torch.from_numpy(theta[k:k + p.numel()]).view_as(p))
                k += p.numel()

    @staticmethod
    def _layout(cards: CardSet | CardBatch):
        """The kernels' card layout (feats, c_start, c_steps, c_tfirst, c_count, t_pos, t_dt, t_g, t_y, t_w) and the
        target order it uses (None: the set's own). A CardBatch's cards are packed one after another."""
        if isinstance(cards, CardSet):
            return (cards.feats, cards.c_start, cards.c_steps, cards.c_tfirst, cards.c_count, cards.t_pos,
                    cards.t_dt, cards.t_last_g, cards.t_y, cards.t_w), None
        b = cards
        t_order = np.argsort(b.t_card_np, kind="stable")
        counts = np.bincount(b.t_card_np, minlength=len(b.c_steps))
        return (b.x_packed, b.c_off[:-1], b.c_steps, np.cumsum(counts) - counts, counts, b.t_pos_np[t_order],
                b.t_dt_np[t_order], b.t_last_g_np[t_order], b.t_y_np[t_order], b.t_w_np[t_order]), t_order

    def _run(self, layout, chosen, theta, grad, p_out) -> float:
        want = grad is not None
        return gru_cards_loss(self.head_kind, self.rnn.hidden_size, layout[0], np.asarray(chosen, np.int64),
                              *layout[1:], theta, FACTOR, DECAY, want, grad if want else np.zeros(0), p_out)

    def _batch(self, batch: CardBatch, grad: np.ndarray | None):
        layout, t_order = self._layout(batch)
        p = np.empty(len(batch))
        loss = self._run(layout, np.arange(len(batch.c_steps)), self._theta(), grad, p)
        out = np.empty(len(batch))
        out[t_order] = p
        return loss, out

    def loss_and_grad(self, batch: CardBatch):
        grad = np.zeros(sum(p.numel() for p in self._params()))
        loss, _ = self._batch(batch, grad)
        flat, k = {}, 0
        for p in self._params():
            flat[id(p)] = grad[k:k + p.numel()].reshape(tuple(p.shape))
            k += p.numel()
        return loss, [flat[id(p)] for p in self.parameters()]

    def predict_np(self, batch: CardBatch) -> np.ndarray:
        return self._batch(batch, None)[1]

    def predict_compiled(self, cards: CardSet, chunk: int) -> np.ndarray:
        """P(recall) of every target of the CardSet (in its `order`), cards in groups of ≈ chunk targets."""
        layout, _ = self._layout(cards)
        theta = self._theta()
        order = cards.card_order()
        bounds = group_bounds(cards.c_count[order], chunk)
        p = np.empty(len(cards.t_pos))
        for g in range(len(bounds) - 1):
            self._run(layout, order[bounds[g]:bounds[g + 1]], theta, None, p)
        return p

    def fit_compiled(self, cards: CardSet, orders: np.ndarray, batch_size: int, lr: float, t_max: int) -> None:
        """neural_seq.fit_cards's loop in one compiled call (gru_kernels.gru_fit), then the weights back in torch."""
        theta = self._theta()
        gru_fit(self.head_kind, self.rnn.hidden_size, cards.feats, cards.c_start, cards.c_steps, cards.c_tfirst,
                cards.c_count, cards.t_pos, cards.t_dt, cards.t_last_g, cards.t_y, cards.t_w,
                np.ascontiguousarray(orders, dtype=np.int64), int(batch_size), theta, FACTOR, DECAY, float(lr),
                float(self.wd), int(t_max))
        self._set_theta(theta)


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
