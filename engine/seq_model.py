"""`SeqModel`: a trainable model defined by its step function, run by either trainer.

- `--trainer fast` (default): the compiled one-pass-per-card engine (engine/seq_engine.py) with the model's numba
  kernels (the module named by `kernels`).
- `--trainer autograd`: the card-major autograd trainer (engine/autograd_engine.py) on the module's torch functions:
  the same batches, steps and checkpoint rule as the compiled engine, gradients by torch autograd instead of the
  hand-written VJPs (the reference a researcher's own torch model runs on, and checked against the compiled path).
- `--trainer upstream`: srs-benchmark's torch trainer (upstream/training.py) over per-target padded histories, with the
  same model stepped in torch (`torch_init`, `torch_step`, `torch_curve` of the same module). It is the reference
  the fast path is tested against (predictions and gradients), and the side the bench scripts compare with.

A subclass sets the class attributes below and may override `initial_weights` (e.g. the FSRS S0 fit) and
`training_rows` (e.g. FSRS v4's i > 2 filter).
"""

from __future__ import annotations

import importlib
from functools import partial
from typing import TYPE_CHECKING

import numpy as np

from models.base import InadequateData, Model, ReviewData
from engine.seq_engine import NUMPY126, SeqEngine

if TYPE_CHECKING:
    import upstream.training as training


def __getattr__(name: str):
    """TorchSeqNet (upstream/seq_torch.py) is still importable from here; it is loaded, with torch (~1.5 s), only
    when asked for: the default trainer never needs torch."""
    if name == "TorchSeqNet":
        from upstream.seq_torch import TorchSeqNet

        return TorchSeqNet
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class SeqModel(Model):
    """fit/predict for a model whose kernels module follows engine/seq_model_stub.py (+ the torch functions)."""

    kernels: str = ""  # module with the numba and torch step functions
    default_w: list[float] = []
    lower: list[float] = []
    upper: list[float] = []
    sigma: list[float] | None = None  # L2 prior widths (None: no prior)
    frozen: tuple[int, ...] = ()  # indices whose gradient is zeroed during training
    lr: float = 4e-2
    # Order of equal-length rows in upstream's target batches (the upstream-style trainer's, and the fast trainer's
    # with engine_batching "length"/"length-shared": ACT-R, DASH[ACT-R]): the numbers of every January-2025
    # `other.py` model and of fsrs-optimizer 5.x come from a pandas sort that was not stable (numpy 1.26's
    # quicksort), whose tie order depends on the CPU; NUMPY126 is that order on this CPU
    # (upstream/legacy_sort.upstream_argsort), so these trainers equal upstream's code run on the same machine
    # (tests/check_users.py: upstream_value).
    batch_sort: str = NUMPY126
    # Mini-batches of the fast trainer: "cards" (one pass per card) or "length" (upstream's target batches, for
    # models whose 5 epochs stop far from convergence, where the batches decide where training ends), or
    # "length-shared" (the same batches, a card's targets within one batch replayed together: seq_engine).
    engine_batching: str = "cards"
    # the kernels module carries torch_init/torch_step/torch_curve, so `--trainer autograd` can run it
    autograd: bool = True
    # the compiled engine runs the plug-in engine/traced.py generates from those torch functions (its scalar steps,
    # their VJPs and its lane kernels: the equations written once), the module's RUN_OPTIONS its engine_opts; else
    # the kernels module is itself the plug-in (hand-written numba)
    traced: bool = False
    # the fast trainer replays upstream's length-sorted batches in upstream's tie order (upstream/legacy_sort.py): with
    # engine_batching "length"/"length-shared", or by a fit of the model's own (HLR)
    replays_upstream_batches: bool = False

    def __init__(self, cfg=None):
        if cfg is None:
            from config import RunConfig

            cfg = RunConfig()
        self.cfg = cfg
        self.w = list(self.default_w)
        self.n_params = 0 if cfg.default else len(self.default_w)
        if getattr(cfg, "trainer", "fast") == "autograd":
            from engine.autograd_engine import AutogradEngine

            self.engine = AutogradEngine(importlib.import_module(self.kernels), self.lower, self.upper)
        else:
            self.engine = SeqEngine(self.plugin(), self.lower, self.upper, opts=self.engine_opts())

    def plugin(self) -> str:
        """The compiled engine's plug-in module: the kernels module, or the one generated from it (`traced`)."""
        if not self.traced:
            return self.kernels
        from engine.trace_cache import plugin_for

        return plugin_for(importlib.import_module(self.kernels), n_w=len(self.default_w), use_clip=False)

    @property
    def torch_dtype(self):
        """The upstream-style trainer's dtype (torch.float32, as upstream); a property so that torch is imported
        only by that trainer."""
        import torch

        return torch.float32

    # hooks ---------------------------------------------------------------------------------------------------
    def engine_opts(self) -> tuple:
        """The kernels' run-time options (engine/seq_model_stub.py: precompute's opts; e.g. the FSRS versions' s_min,
        upstream's --secs value). None by default."""
        return ()

    def initial_weights(self, train: ReviewData) -> list[float]:
        """Starting point (and prior centre) of training."""
        return list(self.default_w)

    def training_rows(self, train: ReviewData) -> np.ndarray | None:
        """Boolean mask of the rows the loss uses (None: all)."""
        return None

    def torch_net(self, w_init, grad_mask) -> training.TrainableModule:
        """The torch module the upstream-style trainer fits (default: the kernels' torch step functions)."""
        from upstream.seq_torch import TorchSeqNet

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
        if getattr(self.cfg, "trainer", "fast") in ("fast", "autograd"):
            w = self.engine.fit(w_init, train, self.cfg, w_init=w_init, sigma=self.sigma, grad_mask=mask, keep=keep,
                                lr=self.lr, batching=self.engine_batching, sort_kind=self.batch_sort,
                                check_every_epoch=self.engine_batching.startswith("length"))  # as upstream
        else:
            import upstream.training as training

            net = self.torch_net(w_init, mask)
            data = train if keep is None else train.subset(keep)
            training.train(net, data, self.cfg, lr=self.lr, sort_kind=self.batch_sort, dtype=self.torch_dtype)
            w = net.w.detach().double().numpy()
        self.w = [float(x) for x in w]
        return self

    def predict(self, test: ReviewData) -> np.ndarray:
        return self.engine.predict(self.w, test)

    def compile_units(self) -> list:
        """The engine's units, and the tie-order sort of upstream's batches where the fast trainer replays them."""
        units = super().compile_units()
        trains = self.n_params > 0 and getattr(self.cfg, "trainer", "fast") == "fast"
        if trains and self.batch_sort == NUMPY126 and (self.replays_upstream_batches or
                                                        self.engine_batching.startswith("length")):
            from engine.jit_cache import Unit
            from upstream.legacy_sort import upstream_argsort

            units.append(Unit("upstream's tie-order sort", 4.5, partial(upstream_argsort, np.zeros(4, np.int64))))
        return units

    def parameters(self) -> list[float]:
        return [round(float(x), 6) for x in self.w]
