"""The Transformer's divergence check without its evaluation pass (models/transformer.py `evaluates_finite`): where
the weights and inputs are within its limits, the no-dropout evaluation every kernel path makes is finite at those
limits, by the kernels themselves; outside them fit_compiled still evaluates, and NaN weights still raise."""

from __future__ import annotations

import numpy as np
import pytest

import models.transformer as tf
from config import RunConfig
from models.base import InadequateData
from models.transformer import TransformerFlat, evaluates_finite, fit_compiled, history_bound, kernel_batch
from neural.transformer_kernels import D_NF, FC, N_PARAMS
from neural.transformer_lanes import LANES_MAX_WINDOW


def _windows(rng, L: int, B: int, t_max: float):
    """B padded windows of length L (a third shorter), intervals up to t_max, ratings 1-4, targets' Δt up to 1e5."""
    n = np.full(B, L)
    n[: B // 3] = max(1, L - 2)
    real = np.arange(L)[:, None] < n
    t = np.where(real, rng.choice([0.0, 1.0, t_max, t_max / 3], (L, B)), 0.0)
    g = np.where(real, rng.integers(1, 5, (L, B)).astype(float), 0.0)
    dt = rng.choice([0.0, 1.0, 1e5], B)
    y = (rng.random(B) < 0.5).astype(float)
    return t, g, n, dt, y, np.ones(B)


def _evaluations(theta, t, g, n, dt, y, w):
    """Every no-dropout evaluation the kernels make: the lane kernel (short windows) or the per-target kernel
    (check_diverged's pass), and the per-target kernel's collapsed prediction."""
    yield kernel_batch(theta, t, g, n, dt, y, w, None, lanes_eval=True)
    yield kernel_batch(theta, t, g, n, dt, y, w, None)


@pytest.mark.parametrize("seed", range(4))
def test_evaluation_is_finite_at_the_limits(seed):
    """Weights up to ±1e3, inputs up to 1e5, the head's bound at 700 with z pushed to both ends (the decoder's
    final LayerNorm outputting (1, 1) exactly): the loss and every P(recall) finite on windows the lane kernel and
    the per-target kernel take."""
    rng = np.random.default_rng(seed)
    theta = rng.choice([-1e3, 1e3, -1.0, 0.5], N_PARAMS) * rng.random(N_PARAMS)
    theta[D_NF:D_NF + 2] = 0.0  # gamma 0, beta 1: out = (1, 1) whatever the input
    theta[D_NF + 2:D_NF + 4] = 1.0
    for sign in (-1.0, 1.0):
        theta[FC:FC + 3] = sign * np.array([350.0, 349.5, 0.5])  # z = ±700
        assert evaluates_finite(theta, 1e5)
        for L in (1, 4, LANES_MAX_WINDOW, 40):
            for loss, p in _evaluations(theta, *_windows(rng, L, 70, 1e5)):
                assert np.isfinite(loss) and np.isfinite(p).all() and ((p >= 0) & (p <= 1)).all()


def test_limits():
    rng = np.random.default_rng(0)
    theta = rng.normal(size=N_PARAMS)
    assert evaluates_finite(theta, 36500.0)
    assert not evaluates_finite(theta, 2e5) and not evaluates_finite(theta, np.nan)
    for k, value in [(0, np.nan), (0, np.inf), (0, 2e3), (FC + 2, 701.0)]:
        bad = theta.copy()
        bad[k] = value
        assert not evaluates_finite(bad, 36500.0)


def test_fit_compiled_evaluates_only_outside_the_limits(user8, monkeypatch):
    """Ordinary weights: no check_diverged pass. The head's bound above 700 (fc's bias 701, kept by a zero learning
    rate): the pass runs, and passes (S = e^701 is finite); fc's bias NaN: InadequateData, as before."""
    data = user8.subset(np.arange(300))
    calls = []
    check = tf.check_diverged
    monkeypatch.setattr(tf, "check_diverged", lambda *a: calls.append(1) or check(*a))
    cfg = RunConfig(algo="Transformer")
    assert history_bound(data) == max(np.abs(data.seq_delta_t).max(), 4)
    fit_compiled(TransformerFlat(), data, cfg, n_epoch=1)
    assert calls == []
    net = TransformerFlat()
    theta = net.theta()
    theta[FC:FC + 2] = 0.0
    theta[FC + 2] = 701.0
    net.set_theta(theta)
    fit_compiled(net, data, cfg, n_epoch=1, lr=0.0)
    assert calls == [1]
    theta[FC + 2] = np.nan
    net.set_theta(theta)
    with pytest.raises(InadequateData):
        fit_compiled(net, data, cfg, n_epoch=1, lr=0.0)
