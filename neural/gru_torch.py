"""GRU-P's and GRU's torch modules (descriptions in models/gru_p.py): the upstream trainer's model, the batched / CUDA
trainer's (neural/neural_batched.py), pretrain.py's, and the per-target reference (`forward_batch`, torch's own nn.GRU
run upstream's way) the compiled kernels are tested against. Imported only by those paths, so that a default run
never loads torch.

`GRUSeqs` is the compiled recurrence of neural/gru_kernels.py as a torch autograd Function (one pass per card in
`card_states`), tested equal to nn.GRU.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor, nn

import upstream.training as training
from neural.gru_kernels import _gru_backward, _gru_forward, from_lockstep, to_lockstep
from engine.kernel_math import lockstep_plan
from models.gru_p import DECAY, FACTOR, GRUPSpec, GRUSpec  # noqa: F401 (DECAY, FACTOR: re-exported)
from neural.neural_seq import CardBatch, CompiledCardNet


def _orthogonal_gru(n_input: int, n_hidden: int) -> nn.GRU:
    rnn = nn.GRU(input_size=n_input, hidden_size=n_hidden, num_layers=1)
    nn.init.orthogonal_(rnn.weight_ih_l0)
    nn.init.orthogonal_(rnn.weight_hh_l0)
    rnn.bias_ih_l0.data.fill_(0)
    rnn.bias_hh_l0.data.fill_(0)
    return rnn


class GRUFamilyNet(CompiledCardNet):
    """The torch module of a GRU-family spec (models/gru_p.py): nn.GRU + nn.Linear, orthogonal start, the card
    states through the compiled autograd twin below."""

    def __init__(self, n_hidden: int | None = None):
        super().__init__()
        if n_hidden is not None:
            self.n_hidden = n_hidden
        self.rnn = _orthogonal_gru(self.n_input, self.n_hidden)
        self.fc = nn.Linear(self.n_hidden, 1)

    def card_states(self, x, c_steps):
        return gru_card_states(self.rnn, x, c_steps)


class GRUPNet(GRUPSpec, GRUFamilyNet):
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


class GRUNet(GRUSpec, GRUFamilyNet):
    def head(self, h: Tensor, dt: Tensor) -> Tensor:
        s = torch.exp(self.fc(h)).squeeze(-1)
        return (1 + FACTOR * dt / s) ** DECAY

    def target_p(self, states, batch: CardBatch):
        return self.head(states[batch.t_pos, batch.t_card], batch.t_dt)

    def forward_batch(self, batch: training.Batch) -> Tensor:
        cols = torch.arange(len(batch))
        out, _ = self.rnn(torch.stack([batch.t, batch.g], dim=-1))
        return self.head(out[batch.lengths - 1, cols], batch.delta_t)


# ----------------------------------------------------------------------------------------------- autograd twin

def _np(t: Tensor) -> np.ndarray:
    return np.ascontiguousarray(t.detach().double().numpy())


class GRUSeqs(torch.autograd.Function):
    """nn.GRU (one layer) over zero-padded time-major sequences of different lengths from given initial states,
    forward and backward compiled over the sequences in lockstep (neural/gru_kernels.py). Float64 inside, returned in
    x's dtype; outputs beyond a sequence's length are 0."""

    @staticmethod
    def forward(ctx, x, steps, h0, w_ih, w_hh, b_ih, b_hh):
        n_l, n_c, _ = x.shape
        order = np.argsort(-steps, kind="stable")
        A, base = lockstep_plan(steps[order])
        H = w_hh.shape[1]
        a0 = int(A[0]) if len(A) else 0
        xs = to_lockstep(_np(x), order, A, base)
        h0s = np.ascontiguousarray(_np(h0)[order[:a0]].T).ravel()
        w_hh_np = _np(w_hh)
        hs = np.empty(base[-1] * H)
        gates = np.empty(base[-1] * 4 * H)
        _gru_forward(xs, A, base, h0s, _np(w_ih), w_hh_np, _np(b_ih), _np(b_hh), hs, gates)
        ctx.saved = (xs, A, base, order, h0s, w_hh_np, hs, gates, n_l, n_c)
        ctx.dtypes = (h0.dtype, w_ih.dtype)
        return torch.from_numpy(from_lockstep(hs, order, A, base, n_l, n_c, H)).to(x.dtype)

    @staticmethod
    def backward(ctx, gout):
        xs, A, base, order, h0s, w_hh_np, hs, gates, n_l, n_c = ctx.saved
        H = w_hh_np.shape[1]
        n_f = len(xs) // max(1, base[-1])
        gw_ih = np.zeros((3 * H, n_f))
        gw_hh = np.zeros((3 * H, H))
        gb_ih = np.zeros(3 * H)
        gb_hh = np.zeros(3 * H)
        a0 = len(h0s) // H
        gh0s = np.zeros(len(h0s))
        g = to_lockstep(_np(gout), order, A, base)
        _gru_backward(xs, A, base, h0s, w_hh_np, hs, gates, g, gw_ih, gw_hh, gb_ih, gb_hh, gh0s)
        gh0 = np.zeros((n_c, H))
        gh0[order[:a0]] = gh0s.reshape(H, a0).T
        dh, dw = ctx.dtypes
        return (None, None, torch.from_numpy(gh0).to(dh), torch.from_numpy(gw_ih).to(dw),
                torch.from_numpy(gw_hh).to(dw), torch.from_numpy(gb_ih).to(dw), torch.from_numpy(gb_hh).to(dw))


def gru_sequences(rnn: nn.GRU, x: Tensor, steps: np.ndarray, h0: Tensor) -> Tensor:
    """out[k, c] = state of a one-layer nn.GRU after step k of sequence c started from h0[c] (zero beyond
    steps[c])."""
    return GRUSeqs.apply(x, np.asarray(steps, dtype=np.int64), h0, rnn.weight_ih_l0, rnn.weight_hh_l0,
                         rnn.bias_ih_l0, rnn.bias_hh_l0)


def gru_card_states(rnn: nn.GRU, x: Tensor, c_steps: np.ndarray) -> Tensor:
    """States [L + 1, C, H] of a one-layer nn.GRU run over each card (index 0: h0 = 0, k: after k steps)."""
    h0 = torch.zeros(x.shape[1], rnn.hidden_size, dtype=x.dtype)
    if x.shape[0] == 0:
        return h0[None]
    return torch.cat([h0[None], gru_sequences(rnn, x, c_steps, h0)], dim=0)


def gru_cell(rnn: nn.GRU, x: Tensor, h: Tensor) -> Tensor:
    """One GRU step per row: x [T, F] from states h [T, H] (the compiled twin of torch.gru_cell)."""
    return gru_sequences(rnn, x[None], np.ones(x.shape[0], dtype=np.int64), h)[0]
