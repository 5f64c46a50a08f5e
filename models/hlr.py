"""HLR, half-life regression (3 parameters; spec models.md §5), as upstream srs-benchmark runs it.

Upstream (other.py of January 2025, `HLR` + the "HLR" branch of `create_features_helper`; later
features/neural_engineer.py: HLRFeatureEngineer and models/hlr.py@3307aec7): the features of a target are the square
roots of the numbers of successes (ratings 2-4) and failures (rating 1) among ALL its previous reviews, the card's
first review included (`r_item[:-1]` of the cumulative rating list); with `--short` the history keeps the same-day
reviews, so they are counted too (row HLR-short). Then
    h = 2^(θ1·√n_succ + θ2·√n_fail + b),   p = 0.5^(t/h)
with no clamp on h or p and no parameter clipper. init [θ1, θ2, b] = [2.5819, −0.8674, 2.7245].

Training details that differ from the recurrent models: the per-row tensor has length 2, and upstream's
BatchDataset measures a row's "history length" with len(tensor), so no training row is ever dropped by
max_seq_len = 64 and every row has the same sort key. Both our trainers train on all rows; the upstream-style one
batches them in time order. Upstream's state_dict is the raw float list (no rounding).
Known residual of the upstream-style trainer (upstream-check Log Loss off by ~3e-4): upstream's January-2025 run
sorted that constant key with pandas' default quicksort under numpy 1.26, whose x86-simd-sort argsort PERMUTES an
all-equal array (numpy >= 2 returns the identity for an already-sorted array). Feeding the rows in numpy 1.26.4's
np.argsort(np.full(n, 2), kind="quicksort") order reproduces upstream's HLR Log Loss exactly (0.306259 / 0.155947,
checked offline with numpy 1.26.4 in a subprocess); that permutation is not re-implemented here.

Engine plug-in: the state is the pair of counts (no parameter enters the recurrence), the curve reads them.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from numba import njit

from models.base import InadequateData, ReviewData
from models.seq_model import SeqModel

N_STATE = 2
LN2 = math.log(2.0)
NO_LIMIT = 1 << 40  # max_seq_len that keeps every training row (upstream's len(tensor) == 2 for HLR)


# ---------------------------------------------------------------------------------------- numba kernels

@njit(cache=True)
def init(w, g, t, out):
    out[0] = 1.0 if g > 1 else 0.0
    out[1] = 1.0 if g == 1 else 0.0


@njit(cache=True)
def step(w, prev, t, g, out):
    out[0] = prev[0] + (1.0 if g > 1 else 0.0)
    out[1] = prev[1] + (1.0 if g == 1 else 0.0)


@njit(cache=True)
def curve(w, state, t):
    h = 2.0 ** (w[0] * math.sqrt(state[0]) + w[1] * math.sqrt(state[1]) + w[2])
    return 0.5 ** (t / h)


@njit(cache=True)
def init_vjp(w, g, t, state, gstate, gw):
    pass  # the counts do not depend on w


@njit(cache=True)
def step_vjp(w, prev, t, g, new, gnew, gprev, gw):
    # The counts carry no parameter dependence, so their adjoints are irrelevant for gw: leave none.
    gprev[0] = 0.0
    gprev[1] = 0.0


@njit(cache=True)
def curve_vjp(w, state, t, gp, gstate, gw):
    """dp/dx with x = θ·features + b: p = exp(−ln2·t·2^(−x)) → dp/dx = p·ln2²·t/h (0 once p underflows)."""
    x1 = math.sqrt(state[0])
    x2 = math.sqrt(state[1])
    h = 2.0 ** (w[0] * x1 + w[1] * x2 + w[2])
    p = 0.5 ** (t / h)
    if p == 0.0 or h == 0.0:
        return
    gx = gp * p * LN2 * LN2 * t / h
    gw[0] += gx * x1
    gw[1] += gx * x2
    gw[2] += gx


# ---------------------------------------------------------------------------------------- torch (reference)

def torch_init(w, g, t):
    return (g > 1).to(w.dtype), (g == 1).to(w.dtype)


def torch_step(w, state, t, g):
    return state[0] + (g > 1).to(w.dtype), state[1] + (g == 1).to(w.dtype)


def torch_curve(w, state, t):
    import torch  # the upstream-style trainer only: a default run does not import torch

    h = 2 ** (w[0] * torch.sqrt(state[0]) + w[1] * torch.sqrt(state[1]) + w[2])
    return 0.5 ** (t / h)


def count_features(data: ReviewData) -> np.ndarray:
    """[n, 2]: √(successes), √(failures) among each target's previous reviews (vectorised prefix sums)."""
    g = np.asarray(data.seq_rating, dtype=np.int64)
    succ = np.concatenate([[0], np.cumsum(g > 1)])
    fail = np.concatenate([[0], np.cumsum(g == 1)])
    start = data.rows["seq_start"].to_numpy(np.int64)
    end = start + data.rows["seq_pos"].to_numpy(np.int64)
    return np.sqrt(np.stack([succ[end] - succ[start], fail[end] - fail[start]], axis=1).astype(np.float64))


def __getattr__(name: str):
    """HLRNet (upstream's torch module, models/seq_torch.py) is importable from here, loaded with torch only when
    asked for."""
    if name == "HLRNet":
        from models.seq_torch import HLRNet

        return HLRNet
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---------------------------------------------------------------------------------------- the model

class HLR(SeqModel):
    name = "HLR"
    kernels = "models.hlr"
    default_w = [2.5819, -0.8674, 2.7245]
    lower = [-math.inf] * 3  # upstream has no clipper for HLR
    upper = [math.inf] * 3

    def fit(self, train: ReviewData) -> "HLR":
        if self.cfg.default:
            return self
        if len(train) == 0:
            raise InadequateData("no training rows")
        cfg = dataclasses.replace(self.cfg, max_seq_len=NO_LIMIT)  # upstream drops no HLR row (see docstring)
        w_init = list(self.default_w)
        if getattr(self.cfg, "trainer", "fast") in ("fast", "autograd"):
            w = self.engine.fit(w_init, train, cfg, lr=self.lr)
        else:
            import training
            from models.seq_torch import HLRNet

            net = HLRNet(w_init, count_features(train), dtype=self.torch_dtype)
            # every row gets the same nominal history length, so the trainer's stable length sort keeps the time
            # order, as upstream's sort on len(tensor) == 2 does; the net reads the real features by row position
            flat = ReviewData(train.rows.assign(seq_pos=1), train.seq_delta_t, train.seq_rating)
            training.train(net, flat, cfg, lr=self.lr, sort_kind=self.batch_sort, dtype=self.torch_dtype)
            w = net.w.detach().double().numpy()
        self.w = [float(x) for x in w]
        return self
