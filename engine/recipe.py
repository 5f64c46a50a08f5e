"""How a model is trained (a model file's RECIPE): the optimizer, its settings, which weights are kept and the recency
weights, read by both trainers (the compiled engine through engine/traced.py, and engine/autograd_engine.py). Its own
module, torch-free, so that a model on the compiled engine (FSRS-7) starts without importing torch."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from models.base import recency_weights
from engine.seq_engine import LR, SEED


def upstream_recency(n: int) -> np.ndarray:
    """upstream's --recency weights (0.25 + 0.75·x³), the default recency function."""
    return recency_weights(n)


@dataclass
class Recipe:
    """How a model is trained. The defaults are upstream's Trainer as the compiled engine runs it.

    optimizer: "adam" | "adamw" (mini-batches of whole cards, per-step cosine lr) | "lbfgs" (full batch, torch's
      L-BFGS with a strong-Wolfe line search, at most `max_iter` iterations; the objective is the weighted BCE sum
      over every kept target divided by the sum of their weights, plus `prior_weight`·Σ((w − w_init)/σ)²).
    n_epoch / batch_size: None takes the run's (--n_epoch, --batch_size).
    keep: "best" (the lower full objective of the initial weights and the trained ones; "every_epoch" checks the end
      of every epoch too, as upstream's Trainer does) or "last" (the weights training ends with).
    recency: None or True → the weights `recency_fn` gives, applied when the run has --recency (None) or always
      (True); False → never.
    prior_weight: the factor of the L2 prior Σ((w − w_init)/σ)² (SIGMA given). For "lbfgs" a callable
      f(n_targets) may give it (SBD: 2/n_targets).
    revert_if_worse (lbfgs): back to w_init when the fit ends with a higher objective than it started with.
    penalty (adam / adamw): None, or a loss term of the weights alone, (value, gradient) = penalty(w) on numpy
      weights, added beside the prior and scaled like it (the batch's share of targets per step; whole in the
      full objective): FSRS-7's --sched_penalties (models/fsrs7_penalty.py). Runs on this engine only.
    """

    optimizer: str = "adam"
    lr: float = LR
    betas: tuple = (0.9, 0.999)
    weight_decay: float = 0.0
    n_epoch: int | None = None
    batch_size: int | None = None
    keep: str = "best"
    recency: bool | None = None
    recency_fn: Callable[[int], np.ndarray] = upstream_recency
    prior_weight: float | Callable[[int], float] = 1.0
    max_iter: int = 200
    history_size: int = 20
    tolerance_grad: float = 1e-7
    tolerance_change: float = 1e-9
    revert_if_worse: bool = False
    seed: int = SEED
    penalty: Callable[[np.ndarray], tuple[float, np.ndarray]] | None = None
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, values: dict | None) -> "Recipe":
        values = dict(values or {})
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"RECIPE: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        recipe = cls(**values)
        if recipe.optimizer not in ("adam", "adamw", "lbfgs"):
            raise ValueError(f"RECIPE: optimizer {recipe.optimizer!r} is not adam, adamw or lbfgs")
        if recipe.keep not in ("best", "last", "every_epoch"):
            raise ValueError(f"RECIPE: keep {recipe.keep!r} is not best, last or every_epoch")
        return recipe

    def prior_weight_for(self, n_targets: int) -> float:
        """The prior's factor for a fit of n_targets targets (prior_weight, or prior_weight(n_targets))."""
        return self.prior_weight(n_targets) if callable(self.prior_weight) else float(self.prior_weight)

    def epochs_and_batch(self, cfg) -> tuple[int, int]:
        """(n_epoch, batch_size): the recipe's own, else the run's (--n_epoch, --batch_size)."""
        n_epoch = self.n_epoch if self.n_epoch is not None else getattr(cfg, "n_epoch", 5)
        batch_size = self.batch_size if self.batch_size is not None else getattr(cfg, "batch_size", 512)
        return int(n_epoch), int(batch_size)

    def row_weights(self, cfg, n_rows: int) -> np.ndarray | None:
        """The training rows' loss weights (recency_fn over all n_rows, upstream's way: set on the whole training
        frame before any row is dropped), or None when the recipe / the run has no recency."""
        use = self.recency if self.recency is not None else bool(getattr(cfg, "recency", False))
        return np.asarray(self.recency_fn(n_rows), dtype=np.float64) if use else None
