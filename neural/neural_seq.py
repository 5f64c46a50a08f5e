"""The card-sequence trainer shared by the neural models: one pass of the network per card sequence.

Why: every target of a card is a prefix of the card's review sequence (`ReviewData`), so a recurrent network gets
the predictions of ALL of a card's targets from the states along ONE run over the card. Upstream (srs-benchmark's
`other.py` Trainer with fsrs-optimizer's BatchDataset) instead pads every target's whole history into its own
column, so a card with n reviews costs 1 + 2 + ... + n steps per epoch instead of n.

How a network plugs in (`CardSeqNet`, a torch module):
- `step_features(data)`: the input vector of every review of data's concatenated card sequences, [N, F];
- `n_steps(pos)`: how many of a card's steps a target with history length `pos` needs (default: pos);
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
  falls), the cards regrouped in a new random order every epoch (torch.randperm on a generator seeded 2023). Cutting
  length-sorted cards once and shuffling only the order of the groups, as upstream does with its length-sorted
  target batches, was measured worse (bench/bench_neural.py, two simulated users): a group of long cards is a
  handful of cards, its gradient far noisier than upstream's 512 distinct cards (GRU-P 0.2850 vs upstream's trainer
  0.2753, GRU 0.3040 vs 0.2854); shuffled groups mix long and short cards and match upstream's trainer (0.2743,
  0.2818);
- optimizer from the network (AdamW(lr, weight_decay=wd) for GRU/GRU-P/Transformer, Adam for NN-17);
  CosineAnnealingLR(T_max = groups·epochs) stepped every group; loss = Σ weight·BCE (a sum, torch's BCE clamps its
  logs at −100) over all targets of the group's cards, from one forward and one backward pass;
- the weights after the LAST epoch are kept. This reproduces upstream's effective behaviour: its Trainer "keeps the
  best epoch" by storing `model.state_dict()`, which for an nn.Module aliases the live tensors, so the returned
  "best" weights are always the final ones (spec models.md §12.9; SB other.py@00c9de57 `Trainer.train/eval`).

Compiled networks (`CompiledCardNet`): GRU, GRU-P (neural/gru_kernels.py), NN-17 (neural/nn17_kernels.py) and the
LSTM (neural/lstm_kernels.py) give their loss and gradient as a compiled `card_loss`, and fit_cards runs this whole
recipe (the same groups, Adam/AdamW, cosine schedule, clip box) in one numba call in float64 (neural/card_fit.py),
because for these small networks torch's per-operation cost (autograd nodes per time step, every optimizer step,
parameter conversions) far exceeded the arithmetic. The compiled loop is tested equal to this recipe stepped in torch
(tests/test_neural.py, tests/test_nn17_compiled.py, tests/test_lstm_compiled.py).

Per model: the Transformer keeps upstream's per-target windows (its no-mask quirk, models/transformer.py); the LSTM
runs its own Reptile-style fine-tune over the same whole-card batches (models/lstm.py), through the same compiled
loop with its own recipe (card_fit.recipe).

Prediction (`predict_cards`) runs the same pass over every card of the test rows (no length limit), in groups of
cards with ≈ 16,384 targets. Everything is deterministic on CPU for a given seed.

Pretrained weights live in pretrain/<name>.pth (state dicts written by pretrain.py) and, for the models with a
torch-free twin, in pretrain/<name>.npz (the same arrays); `load_pretrained` raises a clear error naming the command
that makes a missing file.

This module is the torch half: the CardSeqNet contract and its torch modules, the upstream trainer, the torch
predictions of networks without a compiled loss, and the weight files. The torch-free half (CardSet, CardBatch,
fit_cards, predict_cards, NeuralModel, the FlatNet twins) is neural/card_net.py, re-exported here.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import upstream.training as training
from models.base import ReviewData
from neural.card_net import (PREDICT_TARGETS, PRETRAIN_DIR, SHUFFLE_SEED, TORCH_SEED, CardBatch,  # noqa: F401
                             CardSet, CompiledNet, FlatNet, NeuralModel, card_first_mask, epoch_orders, fit_cards,
                             predict_cards, pretrain_path, read_weights)


class CardSeqNet(training.TrainableModule):
    """Base class of the neural models (see the module docstring for the contract)."""

    lr: float = 4e-2
    wd: float = 1e-5
    optimizer: str = "adamw"  # "adamw" (AdamW with wd) or "adam" (upstream BaseModel: Adam, wd ignored)

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
        """upstream/training.py's hook after every optimizer step."""
        self.clip_params_()

    # --- the torch paths that card_net's torch-free code (NeuralModel, predict_cards) calls on the module it holds:
    # card_net does not import this module, which imports it ---------------------------------------------------
    @classmethod
    def pretrained(cls, name: str, command: str) -> "CardSeqNet":
        """torch_net: a fresh module of this class with pretrain/<name>.pth loaded."""
        return torch_net(cls, name, command)

    def predict_torch(self, data: ReviewData, chunk: int = PREDICT_TARGETS) -> np.ndarray:
        """predict_cards stepped in torch (module function predict_torch)."""
        return predict_torch(self, data, chunk)

    def fit_upstream(self, data: ReviewData, cfg, *, n_epoch: int, lr: float | None = None) -> None:
        """The module function fit_upstream on this network."""
        fit_upstream(self, data, cfg, n_epoch=n_epoch, lr=lr)



class CompiledCardNet(CardSeqNet, CompiledNet):
    """A CardSeqNet whose loss and gradient are a compiled `card_loss` (neural/card_fit.py's contract) over a flat
    float64 copy of its parameters in param_shapes() order: fit_cards runs the whole fine-tune in one compiled call
    (card_fit.fit_card_groups) and predict_cards one compiled pass per group of cards (card_net.CompiledNet).
    Subclasses set card_loss and model_consts(), usually by inheriting their torch-free description first."""

    def param_shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        return [(name, tuple(p.shape)) for name, p in self.named_parameters()]

    def flat_params(self) -> list[nn.Parameter]:
        return [self.get_parameter(name) for name, _ in self.param_shapes()]

    def theta(self) -> np.ndarray:
        return np.concatenate([p.detach().double().numpy().ravel() for p in self.flat_params()])

    def set_theta(self, theta: np.ndarray) -> None:
        with torch.no_grad():
            k = 0
            for p in self.flat_params():
                p.copy_(torch.from_numpy(theta[k:k + p.numel()]).view_as(p))
                k += p.numel()

    def _batch(self, batch: CardBatch, grad: np.ndarray | None) -> tuple[float, np.ndarray]:
        """(loss, p) of a CardBatch: its cards are packed one after another; targets regrouped card by card."""
        t_order = np.argsort(batch.t_card_np, kind="stable")
        counts = np.bincount(batch.t_card_np, minlength=len(batch.c_steps))
        layout = (batch.x_packed, batch.c_off[:-1], batch.c_steps, np.cumsum(counts) - counts, counts,
                  batch.t_pos_np[t_order], batch.t_dt_np[t_order], batch.t_last_g_np[t_order],
                  batch.t_y_np[t_order], batch.t_w_np[t_order])
        p = np.empty(len(batch))
        loss = self._call(layout, np.arange(len(batch.c_steps)), self.theta(), grad, p)
        out = np.empty(len(batch))
        out[t_order] = p
        return loss, out

    def loss_and_grad(self, batch: CardBatch):
        grad = np.zeros(len(self.theta()))
        loss, _ = self._batch(batch, grad)
        flat, k = {}, 0
        for p in self.flat_params():
            flat[id(p)] = grad[k:k + p.numel()].reshape(tuple(p.shape))
            k += p.numel()
        return loss, [flat[id(p)] for p in self.parameters()]

    def predict_np(self, batch: CardBatch) -> np.ndarray:
        return self._batch(batch, None)[1]


# ----------------------------------------------------------------------------------------------- batching

def card_batches(net: CardSeqNet, data: ReviewData, batch_size: int, keep: np.ndarray | None = None,
                 weights: np.ndarray | None = None) -> list[CardBatch]:
    """Groups of whole cards with ≈ batch_size targets each, cards sorted by the number of steps they need.
    `keep` selects the targets; `weights` are per row of `data`."""
    return CardSet(net, data, keep, weights).batches(batch_size)


# ----------------------------------------------------------------------------------------------- predict / fit

def predict_torch(net: CardSeqNet, data: ReviewData, chunk: int = PREDICT_TARGETS) -> np.ndarray:
    """predict_cards for a network stepped in torch (no compiled loss)."""
    out = np.full(len(data), np.nan)
    net.eval()
    with torch.no_grad():
        for b in card_batches(net, data, chunk):
            out[b.t_row] = net.predict_np(b)
    return out


def batch_loss(net: CardSeqNet, batch: CardBatch) -> Tensor:
    p = net.predict_batch(batch)
    return (F.binary_cross_entropy(p, batch.t_y, reduction="none") * batch.t_w).sum()


def fit_upstream(net: CardSeqNet, data: ReviewData, cfg, *, n_epoch: int, lr: float | None = None) -> None:
    """Upstream's way: upstream/training.py's per-target padded trainer (sorted-length batches, randperm(2023) order), then
    the final epoch's weights (upstream's aliased "best" state dict)."""
    from dataclasses import replace

    run_cfg = replace(cfg, n_epoch=n_epoch) if hasattr(cfg, "__dataclass_fields__") else cfg
    training.train(net, data, run_cfg, lr=net.lr if lr is None else lr, dtype=net.dtype, keep="final")
    net.eval()


# ----------------------------------------------------------------------------------------------- weights

def torch_net(net_class: type, name: str, command: str) -> CardSeqNet:
    """A fresh `net_class` module (from torch.manual_seed(TORCH_SEED), as upstream) with pretrain/<name>.pth loaded."""
    torch.manual_seed(TORCH_SEED)
    net = net_class()
    load_pretrained(net, name, command)
    return net

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
    """The state dict as float32 tensors in `path` (.pth) and, for the torch-free runs, the same arrays in
    path.with_suffix(".npz")."""
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().float().clone() for k, v in net.state_dict().items()}
    torch.save(state, path)
    np.savez(path.with_suffix(".npz"), **{k: v.numpy() for k, v in state.items()})


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
