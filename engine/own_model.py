"""Bring your own model: one torch file, run like any registered model (`python other.py --model my_model.py`).

The contract (docs/own-model.md walks through an example). A model file defines, at module level:

    NAME = "MyModel"              # row name and result-file name (optional: default the file's stem)
    DEFAULT_W = [...]             # initial parameters (floats); their number is the row's parameter count
    LOWER = [...]; UPPER = [...]  # optional clip box applied after every optimizer step (±math.inf allowed;
                                  # default: no bound)
    SIGMA = [...]                 # optional L2 prior widths: penalty PRIOR_WEIGHT·Σ((w − w_init)/σ)²
    PRIOR_WEIGHT = 1.0            # optional factor of that penalty
    ROUND = None                  # optional: trained weights rounded to this many decimals before predicting
    RECIPE = dict(optimizer="adam", lr=4e-2, betas=(0.9, 0.999), weight_decay=0.0, n_epoch=5, batch_size=512,
                  keep="best", recency=None)   # optional overrides (engine/recipe.Recipe lists them all)

    def init(w, g, t):          -> tuple of tensors [B]   # state after a card's first review
    def step(w, state, t, g):   -> tuple of tensors [B]   # state after a later review (t days elapsed, grade g)
    def curve(w, state, t):     -> tensor [B]             # P(recall) after t days from the state
    def initial_weights(train, cfg) -> list[float]        # optional (e.g. an S0 fit); default DEFAULT_W
    def clip(w) -> tensor                                 # optional bounds that depend on other parameters,
                                                          # applied after the LOWER/UPPER box (FSRS-7)

w is a float64 tensor of the parameters, g an int64 tensor of grades 1..4, t a float64 tensor of elapsed days (0 at
a card's first review); every function is vectorised over a batch of B cards and written in torch only: no numba,
no hand-written gradient. The functions may also be spelled torch_init / torch_step / torch_curve (the existing
engine plug-ins, models/hlr.py, models/fsrs_v5.py, ..., carry those next to their numba kernels).

Training and prediction run on the compiled engine through a plug-in generated from the file (engine/traced.py:
the functions are traced with proxies, differentiated by torch's own derivative rules and written out as numba)
when the file traces and its RECIPE is Adam or L-BFGS; otherwise (an op the tracer refuses, AdamW, `--trainer
autograd`, a GPU device) on the card-major autograd engine (engine/autograd_engine.py), with one stderr line
saying why. Both compute the same numbers: a batch is whole cards, one forward pass yields every target's
prediction, and the gradient is the chain rule through it; by default with upstream's Trainer recipe (Adam 4e-2,
cosine schedule, 5 epochs, batches of >= 512 targets, best checkpoint), any RECIPE key overriding it.
`--trainer upstream` runs the same functions through upstream/training.py's per-target trainer instead (for comparison).

Loading: `load(path)` imports the file (importlib, under a name unique to its path) and checks the contract;
`model_class(path)` gives a `Model` subclass that the runner uses like a registered one. A registry line
"MyModel": "models.my_model" (a module, no ":Class") registers such a file under a name.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import numpy as np

from config import RunConfig, declared_name, is_model_path  # noqa: F401 (declared_name: re-exported)
from models.base import InadequateData, Model, ReviewData


class ModelFileError(ValueError):
    """A model file that is missing or breaks the contract (the command line reports it and exits with 2)."""


def file_version(path: str | Path) -> str:
    """The first 12 hex digits of the sha1 of a model file's content: what its results and compiled code belong
    to (an edited file gets new ones)."""
    return hashlib.sha1(Path(path).read_bytes()).hexdigest()[:12]


def load(path: str | Path) -> ModuleType:
    """Import a model file and check its contract; ModelFileError (one line saying what is wrong) otherwise."""
    path = Path(path).expanduser().resolve()
    if not path.is_file():
        raise ModelFileError(f"model file {path} not found")
    name = f"own_model_{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # a researcher's file: any error in it is reported, not raised through the runner
        raise ModelFileError(f"{path}: importing it failed: {type(exc).__name__}: {exc}") from exc
    check(module, str(path))
    sys.modules[name] = module
    return module


def _fn(module: ModuleType, name: str):
    return getattr(module, f"torch_{name}", None) or getattr(module, name, None)


def check(module: ModuleType, where: str) -> None:
    """The contract's checks: what is required is there, the vectors have DEFAULT_W's length, the recipe parses."""
    from engine.recipe import Recipe

    w = getattr(module, "DEFAULT_W", None)
    if not isinstance(w, (list, tuple)) or not w or not all(isinstance(x, (int, float)) for x in w):
        raise ModelFileError(f"{where}: DEFAULT_W must be a non-empty list of numbers")
    for fn in ("init", "step", "curve"):
        if not callable(_fn(module, fn)):
            raise ModelFileError(f"{where}: no function {fn}(...) (or torch_{fn})")
    for vec in ("LOWER", "UPPER", "SIGMA"):
        value = getattr(module, vec, None)
        if value is not None and (not isinstance(value, (list, tuple)) or len(value) != len(w)):
            raise ModelFileError(f"{where}: {vec} must be a list of {len(w)} numbers (one per DEFAULT_W entry)")
    try:
        Recipe.from_dict(getattr(module, "RECIPE", None))
    except (TypeError, ValueError) as exc:
        raise ModelFileError(f"{where}: {exc}") from exc


def refuse_unbatchable(module: ModuleType) -> None:
    """ModelFileError (its line named) for a model file that turns a tensor into a Python value (an `if` on it,
    float(), .item()): the tracer cannot compile it, and the autograd engine, which steps a batch of cards at once,
    fails on it for every user. Tracing here (its plug-in is kept for the run) refuses it before any user runs."""
    from engine.traced import TraceError, compile_module

    try:
        compile_module(module)
    except TraceError as exc:
        if not exc.batchable:
            where = exc.where(module.__file__) or module.__file__
            raise ModelFileError(f"{where}: {exc}") from None


def model_class(target: str | Path | ModuleType, name: str | None = None) -> type:
    """A `Model` class around a model file (a path) or an imported contract module (a registry entry)."""
    if isinstance(target, ModuleType):
        module = target
    elif is_model_path(str(target)):
        module = load(target)
        refuse_unbatchable(module)
    else:
        module = importlib.import_module(str(target))
        check(module, str(target))
    if name is None:
        name = getattr(module, "NAME", None) or Path(getattr(module, "__file__", "model")).stem
    return type(f"Own_{name}", (OwnModel,), {"module": module, "name": name, "__module__": __name__})


class OwnModel(Model):
    """fit/predict of a contract module on the autograd engine (n_params = len(DEFAULT_W), 0 with --dry)."""

    module: ModuleType = None
    autograd = True

    def __init__(self, cfg=None):
        from engine.recipe import Recipe

        if cfg is None:
            cfg = RunConfig()
        self.cfg = cfg
        mod = self.module
        self.default_w = [float(x) for x in mod.DEFAULT_W]
        n = len(self.default_w)
        self.lower = list(getattr(mod, "LOWER", None) or [-math.inf] * n)
        self.upper = list(getattr(mod, "UPPER", None) or [math.inf] * n)
        self.sigma = getattr(mod, "SIGMA", None)
        recipe = dict(getattr(mod, "RECIPE", None) or {})
        if hasattr(mod, "PRIOR_WEIGHT"):
            recipe.setdefault("prior_weight", mod.PRIOR_WEIGHT)
        self.recipe = Recipe.from_dict(recipe)
        self.w = list(self.default_w)
        self.n_params = 0 if cfg.default else n
        device = getattr(cfg, "device", "cpu")
        if getattr(cfg, "trainer", "fast") == "upstream" or cfg.default:
            from engine.autograd_engine import AutogradEngine

            self.engine = AutogradEngine(mod, self.lower, self.upper, device=device if device != "cpu" else None)
        else:  # the generated compiled plug-in when the file traces (engine/traced.py), else the autograd engine
            from engine.traced import engine_for

            self.engine = engine_for(mod, self.lower, self.upper, self.recipe, trainer=cfg.trainer, device=device,
                                     label=self.name)

    def initial_weights(self, train: ReviewData) -> list[float]:
        hook = getattr(self.module, "initial_weights", None)
        return [float(x) for x in hook(train, self.cfg)] if hook else list(self.default_w)

    def fit(self, train: ReviewData) -> "OwnModel":
        if self.cfg.default:
            return self
        if len(train) == 0:
            raise InadequateData("no training rows")
        w_init = self.initial_weights(train)
        if getattr(self.cfg, "trainer", "fast") == "upstream":
            w = self._fit_upstream(w_init, train)
        else:
            w = self.engine.fit(w_init, train, self.cfg, self.recipe, w_init=w_init, sigma=self.sigma)
        digits = getattr(self.module, "ROUND", None)
        self.w = [round(float(x), digits) if digits is not None else float(x) for x in w]
        return self

    def _fit_upstream(self, w_init, train: ReviewData) -> np.ndarray:
        """upstream/training.py's per-target trainer on the same torch functions (Adam recipe; float64)."""
        import types

        import torch

        import upstream.training as training
        from upstream.seq_torch import TorchSeqNet

        init, step = _fn(self.module, "init"), _fn(self.module, "step")
        funcs = types.SimpleNamespace(  # upstream/training.py's batches carry grades as floats; the contract gives int64
            torch_init=lambda w, g, t: init(w, g.long(), t), torch_step=lambda w, s, t, g: step(w, s, t, g.long()),
            torch_curve=_fn(self.module, "curve"))
        if self.recipe.optimizer == "lbfgs":
            return self._lbfgs_upstream(funcs, w_init, train)
        sigma = None
        if self.sigma is not None:
            sigma = np.asarray(self.sigma, dtype=np.float64) / math.sqrt(self.recipe.prior_weight_for(len(train)))
        net = TorchSeqNet(funcs, w_init, self.lower, self.upper, w_init=w_init, sigma=sigma, dtype=torch.float64)
        training.train(net, train, self.cfg, lr=self.recipe.lr, dtype=torch.float64)
        return net.w.detach().double().numpy()

    def _lbfgs_upstream(self, funcs, w_init, train: ReviewData) -> np.ndarray:
        """Upstream's full-batch L-BFGS the way upstream computes it (SBD's fit): every training row's own history,
        in BatchDataset's length-sorted batches of 8192 (upstream's FIT_BATCH_SIZE), summed."""
        import torch
        import torch.nn.functional as F

        import upstream.training as training
        from engine.autograd_engine import lbfgs_fit

        weights = self.recipe.row_weights(self.cfg, len(train))
        weights = np.ones(len(train)) if weights is None else weights
        batches = training.make_batches(train, weights, 8192, self.cfg.max_seq_len, torch.float64)

        def forward(w, b):  # TorchSeqNet.forward_batch with the optimizer's tensor as the weights
            state = funcs.torch_init(w, b.g[0], b.t[0])
            history = [[x] for x in state]
            for k in range(1, b.t.shape[0]):
                state = funcs.torch_step(w, state, b.t[k], b.g[k])
                for lst, x in zip(history, state):
                    lst.append(x)
            cols = torch.arange(len(b))
            return funcs.torch_curve(w, tuple(torch.stack(h)[b.lengths - 1, cols] for h in history), b.delta_t)

        def bce_sum(w):
            return sum((F.binary_cross_entropy(forward(w, b), b.y, reduction="none") * b.weight).sum()
                       for b in batches)

        n = sum(len(b) for b in batches)
        denom = float(sum(float(b.weight.sum()) for b in batches))
        inv_var = np.zeros(len(w_init)) if self.sigma is None else 1.0 / np.asarray(self.sigma, float) ** 2
        return lbfgs_fit(w_init, bce_sum, denom, n, w_init, inv_var, np.ones(len(w_init)), self.lower, self.upper,
                         self.recipe)

    def predict(self, test: ReviewData) -> np.ndarray:
        return self.engine.predict(self.w, test)

    def parameters(self) -> list[float]:
        return [round(float(x), 6) for x in self.w]
