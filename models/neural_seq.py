"""The card-sequence trainer shared by the neural models: one pass of the network per card sequence.

Why: every target of a card is a prefix of the card's review sequence (`ReviewData`), so a recurrent network gets
the predictions of ALL of a card's targets from the states along ONE run over the card. Upstream (srs-benchmark's
`other.py` Trainer with fsrs-optimizer's BatchDataset) instead pads every target's whole history into its own
column, so a card with n reviews costs 1 + 2 + ... + n steps per epoch instead of n.

How a network plugs in (`CardSeqNet`, a torch module):
- `step_features(data)`: the input vector of every review of data's concatenated card sequences, [N, F];
- `n_steps(pos)`: how many of a card's steps a target with history length `pos` needs (GRU: pos; GRU-P: pos − 1,
  because its last step carries the target's own interval, see models/gru_p.py);
- `card_states(x, c_steps)`: x is [L, C, F] (time-major, card c zero-padded beyond its c_steps[c] steps); returns
  the states [L + 1, C, ...] where index k is the state after the card's first k steps (index 0: the initial
  state); states beyond a card's length are never read;
- `target_p(states, batch)`: P(recall) of every target of the batch from the states of its card;
- `forward_batch(batch)`: the same predictions computed upstream's way, each target from its own padded history
  (`training.Batch`): used by `--trainer upstream` and by the tests that check the one-pass path against it.

Fine-tuning (`fit_cards`) follows upstream's recipe (spec models.md §0.4, §2) with cards as the unit of batching:
- training rows whose history is longer than max_seq_len are left out of the loss (upstream's BatchDataset drops
  them), and each card is run only as far as its longest kept target needs;
- batches are groups of whole cards holding ≈ batch_size targets (a card joins the group in which its first target
  falls). Grouping "shuffled" (default) regroups the cards in a new random order every epoch (torch.randperm on a
  generator seeded 2023); "sorted" cuts the cards sorted by length once and shuffles the ORDER of the groups every
  epoch, as upstream does with its length-sorted target batches. Measured (bench/bench_neural.py, simulated users,
  and upstream-check): with "sorted", a group of long cards is a handful of cards, its gradient is far noisier than
  upstream's 512 distinct cards, and the Log Loss gets worse (GRU-P 0.2850 vs upstream's trainer 0.2753, GRU 0.3040
  vs 0.2854 on two simulated users); "shuffled" mixes long and short cards and matches upstream's trainer (0.2743,
  0.2818). The global torch seed is 42 at the start of every fit;
- optimizer from the network (AdamW(lr, weight_decay=wd) for GRU/GRU-P/Transformer, Adam for NN-17);
  CosineAnnealingLR(T_max = groups·epochs) stepped every group; loss = Σ weight·BCE (a sum, torch's BCE clamps its
  logs at −100) over all targets of the group's cards, from one forward and one backward pass;
- the weights after the LAST epoch are kept. This reproduces upstream's effective behaviour: its Trainer "keeps the
  best epoch" by storing `model.state_dict()`, which for an nn.Module aliases the live tensors, so the returned
  "best" weights are always the final ones (spec models.md §12.9; SB other.py@00c9de57 `Trainer.train/eval`).

Compiled GRU family. The one-layer GRU of GRU and GRU-P is nn.GRU's exact recurrence compiled by numba on PACKED
card sequences (no padded steps): `gru_cards_run` gives a batch's predictions, its Σ weight·BCE and the gradient of
every parameter in one forward and one reverse pass (CardSeqNet.loss_and_grad / predict_np), and `gru_sequences` is
the same recurrence as a torch autograd Function for the autograd path. torch's CPU GRU records about ten autograd
nodes per time step, which cost far more than the arithmetic of these tiny networks. Both are tested equal (1e-6) to
nn.GRU run upstream's way, one padded history per target. Optimizers are torch's fused Adam/AdamW (same update as
the default implementation, in one kernel). NN-17, the Transformer and the LSTM run in torch (autograd).

Per model: NN-17 groups "sorted" (models/nn17.py says why); the Transformer keeps upstream's per-target windows
(its no-mask quirk, models/transformer.py); the LSTM runs its own Reptile-style fine-tune over the same whole-card
batches (models/lstm.py).

Prediction (`predict_cards`) runs the same pass over every card of the test rows (no length limit), in groups of
cards with ≈ 16,384 targets. Everything is deterministic on CPU for a given seed.

Pretrained weights live in pretrain/<name>.pth (state dicts written by pretrain.py); `load_pretrained` raises a clear
error naming the command that makes a missing file.
"""

from __future__ import annotations

import math
import os
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from numba import njit
from torch import Tensor, nn

import training
from models.base import InadequateData, Model, ReviewData
from models.kernel_math import bce

TORCH_SEED = 42
SHUFFLE_SEED = 2023
PREDICT_TARGETS = 16384
PRETRAIN_DIR = Path(__file__).resolve().parents[1] / "pretrain"


class CardBatch:
    """A group of whole cards and all their (selected) targets, as numpy arrays (float64) with torch views made on
    first use in the network's dtype.

    x_packed holds the inputs of card c's steps in rows c_off[c] .. c_off[c+1]−1 (c_steps[c] of them); `x` is the same
    zero-padded and time-major: x[k, c] is the input of step k of card c. Target j belongs to
    card t_card[j] and has history length t_pos[j] (its history is the card's reviews 0..t_pos[j]−1), elapsed time
    t_dt[j], last history rating t_last_g[j], label t_y[j] and weight t_w[j]; t_row[j] is its row in the ReviewData
    the batch was built from.
    """

    def __init__(self, x_packed, c_steps, t_card, t_pos, t_dt, t_last_g, t_y, t_w, t_row, dtype=torch.float32):
        self.x_packed, self.c_steps, self.t_row, self.dtype = x_packed, c_steps, t_row, dtype
        self.c_off = np.concatenate([[0], np.cumsum(c_steps)]).astype(np.int64)
        self.t_card_np, self.t_pos_np, self.t_dt_np = t_card, t_pos, t_dt
        self.t_last_g_np, self.t_y_np, self.t_w_np = t_last_g, t_y, t_w

    def __len__(self) -> int:
        return len(self.t_pos_np)

    def _t(self, name, arr, dtype=None):
        cache = self.__dict__.setdefault("_torch", {})
        if name not in cache:
            cache[name] = torch.as_tensor(arr, dtype=dtype or self.dtype)
        return cache[name]

    @property
    def x_np(self) -> np.ndarray:
        """The inputs zero-padded, time-major [L, C, F]."""
        if "_x_np" not in self.__dict__:
            width = int(self.c_steps.max()) if len(self.c_steps) else 0
            padded = np.zeros((len(self.c_steps), width, self.x_packed.shape[1]))
            padded[np.arange(width)[None, :] < self.c_steps[:, None]] = self.x_packed
            self._x_np = np.ascontiguousarray(padded.transpose(1, 0, 2))
        return self._x_np

    x = property(lambda self: self._t("x", self.x_np))
    t_card = property(lambda self: self._t("t_card", self.t_card_np, torch.long))
    t_pos = property(lambda self: self._t("t_pos", self.t_pos_np, torch.long))
    t_dt = property(lambda self: self._t("t_dt", self.t_dt_np))
    t_last_g = property(lambda self: self._t("t_last_g", self.t_last_g_np))
    t_y = property(lambda self: self._t("t_y", self.t_y_np))
    t_w = property(lambda self: self._t("t_w", self.t_w_np))


class CardSeqNet(training.TrainableModule):
    """Base class of the neural models (see the module docstring for the contract)."""

    lr: float = 4e-2
    wd: float = 1e-5
    optimizer: str = "adamw"  # "adamw" (AdamW with wd) or "adam" (upstream BaseModel: Adam, wd ignored)
    grouping: str = "shuffled"  # how fit_cards groups cards into batches (see fit_cards)

    # --- contract ---------------------------------------------------------------------------------------------
    def step_features(self, data: ReviewData) -> np.ndarray:
        raise NotImplementedError

    def n_steps(self, pos: np.ndarray) -> np.ndarray:
        return pos

    def card_states(self, x: Tensor, c_steps: np.ndarray):
        raise NotImplementedError

    def target_p(self, states, batch: CardBatch) -> Tensor:
        raise NotImplementedError

    # --- shared -----------------------------------------------------------------------------------------------
    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    def loss_and_grad(self, batch: CardBatch) -> tuple[float, list[np.ndarray]] | None:
        """Optional compiled Σ weight·BCE of a batch and its gradient per parameter (in `parameters()` order);
        None: fit_cards uses autograd on predict_batch."""
        return None

    def predict_np(self, batch: CardBatch) -> np.ndarray:
        """P(recall) of the batch's targets as float64 numpy (no gradient); compiled models override it."""
        return self.predict_batch(batch).double().numpy()

    def predict_batch(self, batch: CardBatch) -> Tensor:
        return self.target_p(self.card_states(batch.x, batch.c_steps), batch)

    def make_optimizer(self, lr: float) -> torch.optim.Optimizer:
        if self.optimizer == "adam":
            return torch.optim.Adam(self.parameters(), lr=lr, betas=(0.9, 0.999), fused=True)
        return torch.optim.AdamW(self.parameters(), lr=lr, weight_decay=self.wd, fused=True)

    def n_params(self) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad)

    def clip_params_(self) -> None:
        """Project the parameters into their allowed box after every optimizer step (default: nothing)."""

    def clip_(self) -> None:
        """training.py's hook after every optimizer step: clip, and under `fit_upstream` record the live weights so
        that the final epoch's weights can be returned (the aliasing quirk, see the module docstring)."""
        self.clip_params_()
        if getattr(self, "_record_last", False):
            self._last_state = {k: v.detach().clone() for k, v in self.state_dict().items()}


# ----------------------------------------------------------------------------------------------- GRU layer
# Sequences are PACKED: sequence c occupies rows off[c] .. off[c+1]−1 of x / out / gates (no padding).

@njit(cache=True)
def _gru_forward(x, off, h0, w_ih, w_hh, b_ih, b_hh, out, gates):
    """torch.nn.GRU's recurrence (gate order r, z, n) over each packed sequence from h0[c].
    out[r] = h after step r; gates[r] = (r, z, n, W_hn·h + b_hn) for the backward pass."""
    n_f = x.shape[1]
    H = w_hh.shape[1]
    h = np.zeros(H)
    for c in range(len(off) - 1):
        for j in range(H):
            h[j] = h0[c, j]
        for row in range(off[c], off[c + 1]):
            for j in range(H):
                ar = b_ih[j] + b_hh[j]
                az = b_ih[H + j] + b_hh[H + j]
                ai = b_ih[2 * H + j]
                ah = b_hh[2 * H + j]
                for f in range(n_f):
                    xf = x[row, f]
                    ar += w_ih[j, f] * xf
                    az += w_ih[H + j, f] * xf
                    ai += w_ih[2 * H + j, f] * xf
                for i in range(H):
                    hi = h[i]
                    ar += w_hh[j, i] * hi
                    az += w_hh[H + j, i] * hi
                    ah += w_hh[2 * H + j, i] * hi
                r = 1.0 / (1.0 + math.exp(-ar))
                z = 1.0 / (1.0 + math.exp(-az))
                n = math.tanh(ai + r * ah)
                gates[row, j] = r
                gates[row, H + j] = z
                gates[row, 2 * H + j] = n
                gates[row, 3 * H + j] = ah
                out[row, j] = (1.0 - z) * n + z * h[j]
            for j in range(H):
                h[j] = out[row, j]


@njit(cache=True)
def _gru_backward(x, off, h0, w_hh, out, gates, gout, gw_ih, gw_hh, gb_ih, gb_hh, gh0):
    """Backpropagation through time of `_gru_forward`: accumulates the weight gradients and writes d loss / d h0,
    given d loss / d out."""
    n_f = x.shape[1]
    H = w_hh.shape[1]
    dh = np.zeros(H)
    dprev = np.zeros(H)
    hp = np.zeros(H)
    for c in range(len(off) - 1):
        dh[:] = 0.0
        for row in range(off[c + 1] - 1, off[c] - 1, -1):
            for j in range(H):
                dh[j] += gout[row, j]
                hp[j] = out[row - 1, j] if row > off[c] else h0[c, j]
                dprev[j] = 0.0
            for j in range(H):
                r = gates[row, j]
                z = gates[row, H + j]
                n = gates[row, 2 * H + j]
                ah = gates[row, 3 * H + j]
                dn = dh[j] * (1.0 - z) * (1.0 - n * n)
                dz = dh[j] * (hp[j] - n) * z * (1.0 - z)
                dr = dn * ah * r * (1.0 - r)
                dah = dn * r
                dprev[j] += dh[j] * z
                gb_ih[j] += dr
                gb_ih[H + j] += dz
                gb_ih[2 * H + j] += dn
                gb_hh[j] += dr
                gb_hh[H + j] += dz
                gb_hh[2 * H + j] += dah
                for f in range(n_f):
                    xf = x[row, f]
                    gw_ih[j, f] += dr * xf
                    gw_ih[H + j, f] += dz * xf
                    gw_ih[2 * H + j, f] += dn * xf
                for i in range(H):
                    gw_hh[j, i] += dr * hp[i]
                    gw_hh[H + j, i] += dz * hp[i]
                    gw_hh[2 * H + j, i] += dah * hp[i]
                    dprev[i] += w_hh[j, i] * dr + w_hh[H + j, i] * dz + w_hh[2 * H + j, i] * dah
            for j in range(H):
                dh[j] = dprev[j]
        for j in range(H):
            gh0[c, j] = dh[j]


HEAD_SIGMOID_CELL = 0  # GRU-P: one more GRU step with the target's own (delta_t, last rating), p = σ(fc(h))
HEAD_POWER_CURVE = 1  # GRU: S = exp(fc(h)), p = (1 + factor·t/S)^decay


@njit(cache=True)
def gru_cards_run(head, x, off, t_card, t_pos, t_dt, t_g, t_y, t_w, w_ih, w_hh, b_ih, b_hh, fc_w, fc_b, factor,
                  decay, grad, p_out, g_w_ih, g_w_hh, g_b_ih, g_b_hh, g_fc_w, g_fc_b):
    """A one-layer GRU with one of the two heads above over a batch of whole cards (packed by `off`): writes every
    target's P(recall) into p_out and returns Σ weight·BCE; with `grad`, also accumulates its gradient into g_*
    (one reverse pass over every card). The same computation autograd performs on CardSeqNet.predict_batch
    (tested equal), without its per-operation overhead."""
    n_s = x.shape[0]
    n_c = len(off) - 1
    H = w_hh.shape[1]
    T = len(t_pos)
    out = np.empty((n_s, H))
    gates = np.empty((n_s, 4 * H))
    h0 = np.zeros((n_c, H))
    _gru_forward(x, off, h0, w_ih, w_hh, b_ih, b_hh, out, gates)
    gout = np.zeros((n_s, H)) if grad else np.zeros((0, H))
    loss = 0.0
    if head == HEAD_SIGMOID_CELL:  # the target's own last step from the state after pos − 1 steps
        xt = np.empty((T, x.shape[1]))
        ht = np.zeros((T, H))
        for j in range(T):
            xt[j, 0] = t_dt[j]
            xt[j, 1] = t_g[j]
            if t_pos[j] >= 2:
                row = off[t_card[j]] + t_pos[j] - 2
                for i in range(H):
                    ht[j, i] = out[row, i]
        off_t = np.arange(T + 1)
        out_t = np.empty((T, H))
        gates_t = np.empty((T, 4 * H))
        _gru_forward(xt, off_t, ht, w_ih, w_hh, b_ih, b_hh, out_t, gates_t)
        gout_t = np.zeros((T, H))
        for j in range(T):
            z = fc_b[0]
            for i in range(H):
                z += fc_w[0, i] * out_t[j, i]
            p = 1.0 / (1.0 + math.exp(-z))
            p_out[j] = p
            lo, gp = bce(p, t_y[j], t_w[j])
            loss += lo
            if grad:
                gz = gp * p * (1.0 - p)
                g_fc_b[0] += gz
                for i in range(H):
                    g_fc_w[0, i] += gz * out_t[j, i]
                    gout_t[j, i] = gz * fc_w[0, i]
        if grad:
            gh = np.zeros((T, H))
            _gru_backward(xt, off_t, ht, w_hh, out_t, gates_t, gout_t, g_w_ih, g_w_hh, g_b_ih, g_b_hh, gh)
            for j in range(T):
                if t_pos[j] >= 2:
                    row = off[t_card[j]] + t_pos[j] - 2
                    for i in range(H):
                        gout[row, i] += gh[j, i]
    else:  # S = exp(fc(h)) after pos steps, power forgetting curve
        for j in range(T):
            row = off[t_card[j]] + t_pos[j] - 1
            z = fc_b[0]
            for i in range(H):
                z += fc_w[0, i] * out[row, i]
            s = math.exp(z)
            u = 1.0 + factor * t_dt[j] / s
            p = u ** decay
            p_out[j] = p
            lo, gp = bce(p, t_y[j], t_w[j])
            loss += lo
            if grad:
                gz = gp * decay * p / u * (-factor * t_dt[j] / s)  # dp/dz with S = e^z
                g_fc_b[0] += gz
                for i in range(H):
                    g_fc_w[0, i] += gz * out[row, i]
                    gout[row, i] += gz * fc_w[0, i]
    if grad:
        _gru_backward(x, off, h0, w_hh, out, gates, gout, g_w_ih, g_w_hh, g_b_ih, g_b_hh, np.zeros((n_c, H)))
    return loss


def _np(t: Tensor) -> np.ndarray:
    return np.ascontiguousarray(t.detach().double().numpy())


def _pack_mask(steps: np.ndarray, width: int) -> np.ndarray:
    return np.arange(width)[None, :] < np.asarray(steps)[:, None]  # [C, L]


class _GRUSeqs(torch.autograd.Function):
    """nn.GRU (one layer) over zero-padded time-major sequences of different lengths from given initial states,
    forward and backward compiled (numba) on the packed sequences: torch's CPU GRU records ~10 autograd nodes per
    time step, which dominates the cost of these tiny networks. Float64 inside, returned in x's dtype; outputs beyond
    a sequence's length are 0. Tested equal to nn.GRU (tests/test_neural.py)."""

    @staticmethod
    def forward(ctx, x, steps, h0, w_ih, w_hh, b_ih, b_hh):
        n_l, n_c, _ = x.shape
        mask = _pack_mask(steps, n_l)
        xs = np.ascontiguousarray(_np(x).transpose(1, 0, 2)[mask])
        off = np.concatenate([[0], np.cumsum(steps)]).astype(np.int64)
        h0s, w_hh_np = _np(h0), _np(w_hh)
        H = w_hh.shape[1]
        out = np.empty((len(xs), H))
        gates = np.empty((len(xs), 4 * H))
        _gru_forward(xs, off, h0s, _np(w_ih), w_hh_np, _np(b_ih), _np(b_hh), out, gates)
        ctx.saved = (xs, off, h0s, w_hh_np, out, gates, mask)
        ctx.dtypes = (h0.dtype, w_ih.dtype)
        padded = np.zeros((n_c, n_l, H))
        padded[mask] = out
        return torch.from_numpy(padded.transpose(1, 0, 2).copy()).to(x.dtype)

    @staticmethod
    def backward(ctx, gout):
        xs, off, h0s, w_hh_np, out, gates, mask = ctx.saved
        H = w_hh_np.shape[1]
        gw_ih = np.zeros((3 * H, xs.shape[1]))
        gw_hh = np.zeros((3 * H, H))
        gb_ih = np.zeros(3 * H)
        gb_hh = np.zeros(3 * H)
        gh0 = np.zeros_like(h0s)
        g = np.ascontiguousarray(_np(gout).transpose(1, 0, 2)[mask])
        _gru_backward(xs, off, h0s, w_hh_np, out, gates, g, gw_ih, gw_hh, gb_ih, gb_hh, gh0)
        dh, dw = ctx.dtypes
        return (None, None, torch.from_numpy(gh0).to(dh), torch.from_numpy(gw_ih).to(dw),
                torch.from_numpy(gw_hh).to(dw), torch.from_numpy(gb_ih).to(dw), torch.from_numpy(gb_hh).to(dw))


def gru_sequences(rnn: nn.GRU, x: Tensor, steps: np.ndarray, h0: Tensor) -> Tensor:
    """out[k, c] = state of a one-layer nn.GRU after step k of sequence c started from h0[c] (zero beyond
    steps[c])."""
    return _GRUSeqs.apply(x, np.asarray(steps, dtype=np.int64), h0, rnn.weight_ih_l0, rnn.weight_hh_l0,
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


# ----------------------------------------------------------------------------------------------- batching

def _card_layout(data: ReviewData, net: CardSeqNet, keep: np.ndarray | None):
    """Targets sorted by (card, history length) and the cards they belong to, each with the steps it needs."""
    rows = data.rows
    start = rows["seq_start"].to_numpy(np.int64)
    pos = rows["seq_pos"].to_numpy(np.int64)
    sel = np.arange(len(rows)) if keep is None else np.flatnonzero(keep)
    sel = sel[pos[sel] >= 1]  # a first review has no history: never a target
    order = sel[np.lexsort((pos[sel], start[sel]))]
    if len(order) == 0:
        empty = np.zeros(0, dtype=np.int64)
        return order, empty, empty, empty, empty
    st = start[order]
    first = np.ones(len(order), dtype=bool)
    first[1:] = st[1:] != st[:-1]
    t_card = np.cumsum(first) - 1  # card number of each target
    c_first = np.flatnonzero(first)
    c_last = np.append(c_first[1:], len(order)) - 1
    c_start = st[c_first]
    c_steps = np.asarray(net.n_steps(pos[order][c_last]), dtype=np.int64)
    c_count = c_last - c_first + 1
    return order, t_card, c_start, c_steps, c_count


class CardSet:
    """The selected targets of `data` grouped by card, ready to be cut into batches of whole cards."""

    def __init__(self, net: CardSeqNet, data: ReviewData, keep: np.ndarray | None = None,
                 weights: np.ndarray | None = None):
        self.order, self.t_card, self.c_start, self.c_steps, self.c_count = _card_layout(data, net, keep)
        self.n_cards = len(self.c_start)
        self.dtype = net.dtype
        self.feats = np.asarray(net.step_features(data), dtype=np.float64)
        rows = data.rows
        r = self.order
        pos = rows["seq_pos"].to_numpy(np.int64)[r]
        start = rows["seq_start"].to_numpy(np.int64)[r]
        w = np.ones(len(rows)) if weights is None else np.asarray(weights, dtype=np.float64)
        # per selected target (in `order`): history length, delta_t, last history rating, y, weight
        self.t_pos = pos
        self.t_dt = rows["delta_t"].to_numpy(np.float64)[r]
        self.t_last_g = data.seq_rating[start + pos - 1].astype(np.float64) if len(r) else np.zeros(0)
        self.t_y = rows["y"].to_numpy(np.float64)[r]
        self.t_w = w[r]

    def batches(self, batch_size: int, card_order: np.ndarray | None = None) -> list[CardBatch]:
        """Consecutive groups of cards in `card_order` (default: by the number of steps they need, so padding is
        small) holding ≈ batch_size targets each: a card joins the group where its first target falls."""
        if self.n_cards == 0:
            return []
        c_order = np.argsort(self.c_steps, kind="stable") if card_order is None else np.asarray(card_order)
        counts = self.c_count[c_order]
        c_group = (np.cumsum(counts) - counts) // max(1, int(batch_size))
        n_groups = int(c_group[-1]) + 1
        g_first = np.searchsorted(c_group, np.arange(n_groups))
        c_rank = np.empty(self.n_cards, dtype=np.int64)  # position of each card inside its group
        c_rank[c_order] = np.arange(self.n_cards) - g_first[c_group]
        group_of_card = np.empty(self.n_cards, dtype=np.int64)
        group_of_card[c_order] = c_group
        t_group = group_of_card[self.t_card]
        t_sorted = np.argsort(t_group, kind="stable")
        t_bounds = np.searchsorted(t_group[t_sorted], np.arange(n_groups + 1))
        g_bounds = np.append(g_first, self.n_cards)
        dtype, feats = self.dtype, self.feats
        out = []
        for g in range(n_groups):
            cards = c_order[g_bounds[g]:g_bounds[g + 1]]
            steps = self.c_steps[cards]
            off = np.cumsum(steps) - steps
            idx = np.repeat(self.c_start[cards] - off, steps) + np.arange(int(steps.sum()))
            t = t_sorted[t_bounds[g]:t_bounds[g + 1]]
            out.append(CardBatch(
                x_packed=feats[idx], c_steps=steps, t_card=c_rank[self.t_card[t]], t_pos=self.t_pos[t],
                t_dt=self.t_dt[t], t_last_g=self.t_last_g[t], t_y=self.t_y[t], t_w=self.t_w[t], t_row=self.order[t],
                dtype=dtype))
        return out


def card_batches(net: CardSeqNet, data: ReviewData, batch_size: int, keep: np.ndarray | None = None,
                 weights: np.ndarray | None = None) -> list[CardBatch]:
    """Groups of whole cards with ≈ batch_size targets each, cards sorted by the number of steps they need.
    `keep` selects the targets; `weights` are per row of `data`."""
    return CardSet(net, data, keep, weights).batches(batch_size)


# ----------------------------------------------------------------------------------------------- predict / fit

def predict_cards(net: CardSeqNet, data: ReviewData, chunk: int = PREDICT_TARGETS) -> np.ndarray:
    """P(recall) of every row of `data`, in row order (NaN for a row without history), one pass per card."""
    out = np.full(len(data), np.nan)
    net.eval()
    with torch.no_grad():
        for b in card_batches(net, data, chunk):
            out[b.t_row] = net.predict_np(b)
    return out


def batch_loss(net: CardSeqNet, batch: CardBatch) -> Tensor:
    p = net.predict_batch(batch)
    return (F.binary_cross_entropy(p, batch.t_y, reduction="none") * batch.t_w).sum()


def fit_cards(net: CardSeqNet, data: ReviewData, *, n_epoch: int, batch_size: int = 512, max_seq_len: int = 64,
              lr: float | None = None, weights: np.ndarray | None = None, keep: np.ndarray | None = None,
              seed: int = SHUFFLE_SEED, grouping: str | None = None) -> int:
    """Fine-tune `net` in place on `data` (see the module docstring); returns the number of groups per epoch.
    Raises InadequateData when no target has a history of length 1..max_seq_len."""
    use = data.rows["seq_pos"].to_numpy() <= max_seq_len
    if keep is not None:
        use &= np.asarray(keep, dtype=bool)
    cards = CardSet(net, data, use, weights)
    if cards.n_cards == 0:
        raise InadequateData("Training data is inadequate.")
    generator = torch.Generator().manual_seed(seed)
    grouping = grouping or net.grouping
    fixed = cards.batches(batch_size) if grouping == "sorted" else None
    n_batches = len(fixed) if fixed is not None else len(cards.batches(batch_size, np.arange(cards.n_cards)))
    torch.manual_seed(TORCH_SEED)
    optimizer = net.make_optimizer(net.lr if lr is None else lr)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max(1, n_batches * n_epoch))
    params = list(net.parameters())
    net.train()
    for _ in range(n_epoch):
        if fixed is not None:
            epoch = [fixed[k] for k in torch.randperm(len(fixed), generator=generator).tolist()]
        else:
            epoch = cards.batches(batch_size, torch.randperm(cards.n_cards, generator=generator).numpy())
        for batch in epoch:
            fused = net.loss_and_grad(batch)
            if fused is None:
                optimizer.zero_grad()
                batch_loss(net, batch).backward()
            else:
                for p, g in zip(params, fused[1]):
                    p.grad = torch.from_numpy(g).to(p.dtype)
            optimizer.step()
            scheduler.step()
            with torch.no_grad():
                net.clip_params_()
    net.eval()
    return n_batches


def fit_upstream(net: CardSeqNet, data: ReviewData, cfg, *, n_epoch: int, lr: float | None = None) -> None:
    """Upstream's way: training.py's per-target padded trainer (sorted-length batches, randperm(2023) order), then
    the final epoch's weights (upstream's aliased "best" state dict)."""
    from dataclasses import replace

    run_cfg = replace(cfg, n_epoch=n_epoch) if hasattr(cfg, "__dataclass_fields__") else cfg
    net._record_last, net._last_state = True, None
    try:
        training.train(net, data, run_cfg, lr=net.lr if lr is None else lr, dtype=net.dtype)
    finally:
        net._record_last = False
    if net._last_state is not None:
        net.load_state_dict(net._last_state)
    net.eval()


# ----------------------------------------------------------------------------------------------- weights

def pretrain_path(name: str) -> Path:
    """pretrain/<name>.pth ($SRS_BENCH_PRETRAIN_DIR replaces the folder, e.g. for experiments and tests)."""
    return Path(os.environ.get("SRS_BENCH_PRETRAIN_DIR") or PRETRAIN_DIR) / f"{name}.pth"


@lru_cache(maxsize=None)
def _read_state(path: str, mtime: float) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def load_pretrained(net: nn.Module, name: str, command: str) -> None:
    """Load pretrain/<name>.pth into `net` (cached per process); a missing file is an error naming `command`."""
    path = pretrain_path(name)
    if not path.exists():
        raise FileNotFoundError(f"pretrained weights {path} not found; make them with: {command}")
    state = _read_state(str(path), path.stat().st_mtime)
    net.load_state_dict({k: v.to(net.dtype) if v.is_floating_point() else v for k, v in state.items()})


def save_state(net: nn.Module, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({k: v.detach().float().clone() for k, v in net.state_dict().items()}, path)


# ----------------------------------------------------------------------------------------------- the Model

class NeuralModel(Model):
    """fit/predict of a CardSeqNet for one (user, fold, partition): start from pretrain/<weights_name>.pth, fine-tune
    (`--trainer fast`: one pass per card; `--trainer upstream`: training.py's per-target padded trainer), predict
    with one pass per card. `--dry` (`--default`) evaluates the pretrained weights without fine-tuning."""

    net_class: type = CardSeqNet
    n_epoch: int = 5  # the model's own epoch count (upstream: a class attribute; --n_epoch does not change it)
    pretrain_epochs: int = 32

    def __init__(self, cfg=None):
        if cfg is None:
            from config import RunConfig

            cfg = RunConfig(algo=self.name)
        self.cfg = cfg
        self.net = self.new_net()
        self.n_params = 0 if cfg.default else self.net.n_params()

    @classmethod
    def weights_name(cls, cfg) -> str:
        """pretrain/<this>.pth: the model name plus upstream's pretraining suffixes (-short)."""
        return cls.name + ("-short" if getattr(cfg, "short", False) else "")

    @classmethod
    def pretrain_command(cls, cfg) -> str:
        short = " --short" if getattr(cfg, "short", False) else ""
        return f"python pretrain.py --model {cls.name}{short} --data PATH --users 1-500"

    def new_net(self) -> CardSeqNet:
        torch.manual_seed(TORCH_SEED)
        net = self.net_class()
        load_pretrained(net, self.weights_name(self.cfg), self.pretrain_command(self.cfg))
        return net

    def fit(self, train: ReviewData) -> "NeuralModel":
        if self.cfg.default:
            return self
        if len(train) == 0:
            raise InadequateData("no training rows")
        weights = training.recency_weights(len(train)) if getattr(self.cfg, "recency", False) else None
        if getattr(self.cfg, "trainer", "fast") == "fast":
            fit_cards(self.net, train, n_epoch=self.n_epoch, batch_size=self.cfg.batch_size,
                      max_seq_len=self.cfg.max_seq_len, weights=weights)
        else:
            fit_upstream(self.net, train, self.cfg, n_epoch=self.n_epoch)
        return self

    def predict(self, test: ReviewData) -> np.ndarray:
        return predict_cards(self.net, test)

    def parameters(self):
        return None  # upstream writes no parameter list for torch modules


def card_first_mask(data: ReviewData) -> np.ndarray:
    """True at the sequence position of each card's first review (cards with at least one target; positions of
    cards without targets belong to no one and are never read)."""
    first = np.zeros(len(data.seq_delta_t), dtype=bool)
    first[data.rows["seq_start"].to_numpy(np.int64)] = True
    return first


def concat_data(parts: list[ReviewData]) -> ReviewData:
    """Several users' targets as one data set (upstream's pretraining concatenates the users' feature rows); each
    user's card sequences are shifted so every card keeps its own sequence."""
    import pandas as pd

    rows, dts, gs, offset = [], [], [], 0
    for d in parts:
        r = d.rows.copy()
        r["seq_start"] = r["seq_start"].to_numpy() + offset
        rows.append(r)
        dts.append(d.seq_delta_t)
        gs.append(d.seq_rating)
        offset += len(d.seq_delta_t)
    return ReviewData(pd.concat(rows, ignore_index=True), np.concatenate(dts), np.concatenate(gs))
