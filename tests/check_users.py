"""Shared by the model tests: the two upstream-check users (tests/fixtures/upstream-check: real collections with
upstream's own per-user results), their features built once per test session (tests/conftest.py), and the
engine-against-autograd comparison every engine model is held to."""

from __future__ import annotations

import json

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

import upstream.training as training

from data_loader import load_revlogs
from features import FeatureConfig, build_features
from models.base import ReviewData

CHECK = Path(__file__).resolve().parent / "fixtures" / "upstream-check"
# Upstream's own per-user results on CHECK: {model: {user: {"size": n, "metrics": {...}}}}
UPSTREAM = json.loads((CHECK / "upstream-results.json").read_text())

# Upstream's trainers sorted training rows by history length with numpy's unstable quicksort, whose tie order
# depends on the numpy version and the CPU (upstream/legacy_sort.py); which rows share a batch decides the trained
# weights. UPSTREAM came from numpy 2.0-2.2 on an AVX-512 CPU, the default order ("published", tests/conftest.py):
# the trainers that replay upstream's batches equal it. UPSTREAM_NO_AVX512 is upstream's code run with numpy 1.26
# on a CPU without AVX-512 ("generic"). See fixtures/upstream-check/README.md.
UPSTREAM_NO_AVX512 = json.loads((CHECK / "upstream-results-no-avx512.json").read_text())


@lru_cache(maxsize=None)
def check_features(user: int, short: bool) -> ReviewData:
    """One upstream-check user's targets, day mode (`short`: same-day reviews in the histories)."""
    return build_features(load_revlogs(CHECK, user), FeatureConfig(short=short))


@dataclass
class EngineVsTorch:
    """A model's engine next to autograd at one weight vector: predictions, summed weighted BCE and its gradient."""
    p: np.ndarray
    p_ref: np.ndarray
    loss: float
    loss_ref: float
    grad: np.ndarray
    grad_ref: np.ndarray


def engine_vs_torch(model, net, w, data: ReviewData, weights: np.ndarray) -> EngineVsTorch:
    """model.engine (one forward and one reverse pass per card) at w, and the same model stepped in torch (`net`,
    float64, weights w) through upstream's per-target padded histories, its gradient by autograd."""
    batch = training.make_batches(data, weights, 10 ** 6, 10 ** 6, torch.float64)[0]
    p_torch = net.forward_batch(batch)
    loss = (torch.nn.functional.binary_cross_entropy(p_torch, batch.y, reduction="none") * batch.weight).sum()
    loss.backward()
    p_ref = np.empty(len(data))
    p_ref[batch.rows] = p_torch.detach().numpy()
    value, grad = model.engine.loss_and_grad(w, data, weights=weights)
    return EngineVsTorch(model.engine.predict(w, data), p_ref, value, float(loss.detach()), grad,
                         net.w.grad.numpy())
