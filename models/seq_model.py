"""`SeqModel`: a trainable model defined by its step function, run by either trainer.

- `--trainer fast` (default): the compiled one-pass-per-card engine (models/seq_engine.py) with the model's numba
  kernels (the module named by `kernels`).
- `--trainer upstream`: srs-benchmark's torch trainer (training.py) over per-target padded histories, with the
  same model stepped in torch (`torch_init`, `torch_step`, `torch_curve` of the same module). It is the reference
  the fast path is tested against (predictions and gradients), and the side the bench scripts compare with.

A subclass sets the class attributes below and may override `initial_weights` (e.g. the FSRS S0 fit) and
`training_rows` (e.g. FSRS v4's i > 2 filter).
"""

from __future__ import annotations

import importlib

import numpy as np
import torch
from torch import Tensor, nn

import training
from models.base import InadequateData, Model, ReviewData
from models.seq_engine import SeqEngine


class TorchSeqNet(training.TrainableModule):
    """The model's weights as one tensor, stepped in torch over time-major padded histories."""

    def __init__(self, kernels, w, lower, upper, w_init=None, sigma=None, grad_mask=None,
                 dtype: torch.dtype = torch.float32):
        super().__init__()
        self.kern = kernels
        self.w = nn.Parameter(torch.tensor(np.asarray(w, dtype=np.float64), dtype=dtype))
        self.register_buffer("lo", torch.tensor(np.asarray(lower, dtype=np.float64), dtype=dtype))
        self.register_buffer("hi", torch.tensor(np.asarray(upper, dtype=np.float64), dtype=dtype))
        self.has_prior = sigma is not None
        if self.has_prior:
            self.register_buffer("w_init", torch.tensor(np.asarray(w_init, dtype=np.float64), dtype=dtype))
            self.register_buffer("sigma", torch.tensor(np.asarray(sigma, dtype=np.float64), dtype=dtype))
        if grad_mask is not None:
            mask = torch.tensor(np.asarray(grad_mask, dtype=np.float64), dtype=dtype)
            self.w.register_hook(lambda g: g * mask)

    def states(self, t: Tensor, g: Tensor) -> list[Tensor]:
        """State components after each review: t, g of shape [L, B] → list of [L, B] tensors."""
        state = self.kern.torch_init(self.w, g[0], t[0])
        out = [[x] for x in state]
        for k in range(1, t.shape[0]):
            state = self.kern.torch_step(self.w, state, t[k], g[k])
            for lst, x in zip(out, state):
                lst.append(x)
        return [torch.stack(lst) for lst in out]

    def forward_batch(self, batch: training.Batch) -> Tensor:
        cols = torch.arange(len(batch))
        state = tuple(s[batch.lengths - 1, cols] for s in self.states(batch.t, batch.g))
        return self.kern.torch_curve(self.w, state, batch.delta_t)

    def penalty(self):
        if not self.has_prior:
            return None
        return torch.sum(torch.square(self.w - self.w_init) / torch.square(self.sigma))

    def clip_(self) -> None:
        self.w.data.copy_(torch.clamp(self.w.data, self.lo, self.hi))


class SeqModel(Model):
    """fit/predict for a model whose kernels module follows models/seq_model_stub.py (+ the torch functions)."""

    kernels: str = ""  # module with the numba and torch step functions
    default_w: list[float] = []
    lower: list[float] = []
    upper: list[float] = []
    sigma: list[float] | None = None  # L2 prior widths (None: no prior)
    frozen: tuple[int, ...] = ()  # indices whose gradient is zeroed during training
    lr: float = 4e-2
    torch_dtype = torch.float32
    # Order of equal-length rows in the upstream-style trainer's batches: the upstream-check numbers of every
    # `other.py` model (January 2025) come from a pandas sort that was not stable (numpy quicksort); with it the
    # upstream-style trainer reproduces them to the 6th decimal (tests/test_fsrs_v123.py).
    batch_sort: str = "quicksort"
    # Mini-batches of the fast trainer: "cards" (one pass per card) or "length" (upstream's target batches, for
    # models whose 5 epochs stop far from convergence, where the batches decide where training ends).
    engine_batching: str = "cards"

    def __init__(self, cfg=None):
        if cfg is None:
            from config import RunConfig

            cfg = RunConfig()
        self.cfg = cfg
        self.w = list(self.default_w)
        self.n_params = 0 if cfg.default else len(self.default_w)
        self.engine = SeqEngine(self.kernels, self.lower, self.upper)

    # hooks ---------------------------------------------------------------------------------------------------
    def initial_weights(self, train: ReviewData) -> list[float]:
        """Starting point (and prior centre) of training."""
        return list(self.default_w)

    def training_rows(self, train: ReviewData) -> np.ndarray | None:
        """Boolean mask of the rows the loss uses (None: all)."""
        return None

    def torch_net(self, w_init, grad_mask) -> training.TrainableModule:
        """The torch module the upstream-style trainer fits (default: the kernels' torch step functions)."""
        return TorchSeqNet(importlib.import_module(self.kernels), w_init, self.lower, self.upper, w_init=w_init,
                           sigma=self.sigma, grad_mask=grad_mask, dtype=self.torch_dtype)

    # protocol ------------------------------------------------------------------------------------------------
    def fit(self, train: ReviewData) -> "SeqModel":
        if self.cfg.default:
            return self
        if len(train) == 0:
            raise InadequateData("no training rows")
        w_init = self.initial_weights(train)
        keep = self.training_rows(train)
        if keep is not None and not keep.any():
            raise InadequateData("no training rows left by the model's training filter")
        mask = None
        if self.frozen:
            mask = np.ones(len(w_init))
            mask[list(self.frozen)] = 0.0
        if getattr(self.cfg, "trainer", "fast") == "fast":
            w = self.engine.fit(w_init, train, self.cfg, w_init=w_init, sigma=self.sigma, grad_mask=mask, keep=keep,
                                lr=self.lr, batching=self.engine_batching, sort_kind=self.batch_sort,
                                check_every_epoch=self.engine_batching == "length")  # upstream's checkpoints too
        else:
            net = self.torch_net(w_init, mask)
            data = train if keep is None else train.subset(keep)
            training.train(net, data, self.cfg, lr=self.lr, sort_kind=self.batch_sort, dtype=self.torch_dtype)
            w = net.w.detach().double().numpy()
        self.w = [float(x) for x in w]
        return self

    def predict(self, test: ReviewData) -> np.ndarray:
        return self.engine.predict(self.w, test)

    def parameters(self) -> list[float]:
        return [round(float(x), 6) for x in self.w]
