"""The shared minibatch trainer of gradient-trained models, as srs-benchmark runs it (spec models.md §0.4,
pipeline.md §6.1).

What it reproduces, rule by rule:
- training rows whose history is longer than `max_seq_len` are dropped (none left: InadequateData);
- the rest are sorted by history length (stable sort: fsrs-optimizer >= 6, upstream's FSRS-6 runs; numpy's default
  quicksort: fsrs-optimizer 5.x / January-2025 `other.py`, whose pandas `sort_values` was not stable; the model
  picks, see `sort_kind`) and cut into consecutive batches of `batch_size`, each padded with
  zeros to its own longest history. numpy's quicksort orders equal keys by its version and the CPU's SIMD routine:
  the published results' order (numpy 2.2, AVX-512) by default, on every CPU (upstream/legacy_sort.py; docs/trainers.md);
- the ORDER of the batches is shuffled every epoch by `torch.randperm` on one generator seeded 2023 for the run;
  the global torch seed is 42;
- Adam(lr 4e-2, betas (0.9, 0.999)), CosineAnnealingLR with T_max = batches·epochs, stepped every batch;
- batch loss = Σ weight·BCE(p, y) (a sum; torch's BCE clamps its logs at −100) + penalty·B/N, where B is the
  batch's real size and N the number of training rows kept; the model's clipper runs after every step;
- before every epoch and after the last one the whole training set is evaluated (mean weighted BCE + penalty/N)
  and the weights with the lowest value are kept; the initial weights are candidates. `keep="final"` is the
  neural models' upstream rule instead (neural_seq.fit_upstream: upstream's aliased state dict returns the final
  weights): the weights after the last step are kept, so the evaluations could change nothing but the "training
  diverged" error (every evaluation NaN); they are run only as far as that question needs (`check_diverged`:
  normally one pass, over the final weights, instead of epochs + 1). Evaluation draws no random numbers, so
  skipping it leaves every dropout mask and batch order unchanged;
- with `recency`, row weights 0.25 + 0.75·x³, x = linspace(0, 1, n) over ALL training rows in time order, assigned
  before the long rows are dropped (upstream sets the column on the training frame before BatchDataset filters).

A model plugs in through `TrainableModule` (a torch module with `forward_batch`, optional `penalty` and `clip_`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.base import InadequateData, ReviewData, recency_weights  # noqa: F401 (recency_weights re-exported)
from upstream.target_batches import check_diverged, pad_histories, target_batches  # noqa: F401 (re-exported)
from upstream.torch_rng import SHUFFLE_SEED

TORCH_SEED = 42


@dataclass
class Batch:
    """One minibatch. Histories are time-major like upstream: t[k, b] / g[k, b] is review k of row b's history."""

    t: Tensor  # [L, B] float: interval before each history review (0 for the first, 0 for padding)
    g: Tensor  # [L, B] float: rating of each history review (0 for padding)
    lengths: Tensor  # [B] long: real history length (>= 1)
    delta_t: Tensor  # [B] float: the target's elapsed time
    y: Tensor  # [B] float 0/1
    weight: Tensor  # [B] float
    rows: np.ndarray  # [B] positions of these targets in the ReviewData given to the trainer (extra features)

    def __len__(self) -> int:
        return int(self.lengths.shape[0])


class TrainableModule(nn.Module):
    """What the trainer needs from a model. Subclasses implement `forward_batch`; the rest is optional."""

    def forward_batch(self, batch: Batch) -> Tensor:
        """P(recall) of every target in the batch, shape [B]."""
        raise NotImplementedError

    def penalty(self) -> Tensor | None:
        """Regulariser over the whole training set (the trainer scales it by B/N per batch and by 1/N in eval)."""
        return None

    def clip_(self) -> None:
        """Project the parameters back into their allowed box (called after every optimizer step)."""

    def make_optimizer(self, lr: float) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=lr, betas=(0.9, 0.999))


@dataclass
class TrainResult:
    best_loss: float
    best_epoch: int  # 0 = initial weights, k = after k epochs
    eval_losses: list[float] = field(default_factory=list)  # before epoch 1, ..., after the last epoch
    n_rows: int = 0  # training rows kept (N)
    n_batches: int = 0


def make_batches(data: ReviewData, weights: np.ndarray, batch_size: int, max_seq_len: int,
                 dtype: torch.dtype = torch.float32, sort_kind: str = "stable") -> list[Batch]:
    """Upstream's BatchDataset (upstream/target_batches.py) as tensors of `dtype`."""
    return [Batch(t=torch.as_tensor(b.t, dtype=dtype), g=torch.as_tensor(b.g, dtype=dtype),
                  lengths=torch.as_tensor(b.lengths), delta_t=torch.as_tensor(b.delta_t, dtype=dtype),
                  y=torch.as_tensor(b.y, dtype=dtype), weight=torch.as_tensor(b.weight, dtype=dtype), rows=b.rows)
            for b in target_batches(data, weights, batch_size, max_seq_len, sort_kind)]


def _eval_loss(module: TrainableModule, batches: list[Batch], n: int) -> float:
    """Mean weighted BCE over all kept training rows + penalty/N (no gradient)."""
    module.eval()
    with torch.no_grad():
        losses = [F.binary_cross_entropy(module.forward_batch(b), b.y, reduction="none") * b.weight for b in batches]
        loss = torch.cat(losses).mean()
        penalty = module.penalty()
        if penalty is not None:
            loss = loss + penalty / n
    return float(loss)


def train(module: TrainableModule, data: ReviewData, cfg, lr: float = 4e-2, sort_kind: str = "stable",
          dtype: torch.dtype = torch.float32, keep: str = "best") -> TrainResult:
    """Train `module` in place on `data` (rows in time order); on return it holds the best-epoch weights, or with
    keep="final" the weights after the last step (see the module docstring)."""
    if len(data) == 0:
        raise InadequateData("no training rows")
    weights = recency_weights(len(data)) if getattr(cfg, "recency", False) else np.ones(len(data))
    batches = make_batches(data, weights, cfg.batch_size, cfg.max_seq_len, dtype, sort_kind)
    n = sum(len(b) for b in batches)
    n_epoch = int(cfg.n_epoch)

    torch.manual_seed(TORCH_SEED)
    generator = torch.Generator().manual_seed(SHUFFLE_SEED)
    optimizer = module.make_optimizer(lr)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max(1, len(batches) * n_epoch))

    result = TrainResult(best_loss=np.inf, best_epoch=0, n_rows=n, n_batches=len(batches))
    best_state = None

    def checkpoint(epoch: int):
        nonlocal best_state
        loss = _eval_loss(module, batches, n)
        result.eval_losses.append(loss)
        if loss < result.best_loss:
            result.best_loss, result.best_epoch = loss, epoch
            best_state = copy.deepcopy(module.state_dict())

    starts = []  # keep="final": the epoch-start weights, for check_diverged
    for epoch in range(n_epoch):
        if keep == "final":
            starts.append(copy.deepcopy(module.state_dict()))
        else:
            checkpoint(epoch)
        module.train()
        for k in torch.randperm(len(batches), generator=generator).tolist():
            batch = batches[k]
            optimizer.zero_grad()
            p = module.forward_batch(batch)
            loss = (F.binary_cross_entropy(p, batch.y, reduction="none") * batch.weight).sum()
            penalty = module.penalty()
            if penalty is not None:
                loss = loss + penalty * len(batch) / n
            loss.backward()
            optimizer.step()
            scheduler.step()
            with torch.no_grad():
                module.clip_()
    if keep == "final":
        final = copy.deepcopy(module.state_dict())

        def evaluate(state):
            module.load_state_dict(state)
            loss = _eval_loss(module, batches, n)
            result.eval_losses.append(loss)
            return loss

        try:
            result.best_loss = check_diverged([final] + starts, evaluate)
        finally:
            module.load_state_dict(final)
        result.best_epoch = n_epoch
        return result
    checkpoint(n_epoch)
    if best_state is None:  # every evaluation was NaN
        raise InadequateData("training diverged (no finite evaluation loss)")
    module.load_state_dict(best_state)
    return result
