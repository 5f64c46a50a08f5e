"""FSRS-6 as a plug-in of the general engine (models/fsrs6_kernels.py on the FSRS-5/6 core of models/fsrs_v5.py)
against the hand-specialised FSRS-6 kernel (models/fsrs6_fast.py): two independent forward/adjoint
implementations of the same equations must agree on predictions, loss, gradient and trained weights."""

from __future__ import annotations

import numpy as np
import pytest

from bench.simulate import simulate_user
from config import RunConfig
from features import FeatureConfig, build_features
from models import fsrs6_fast as ff
from models.seq_engine import SeqEngine


@pytest.fixture(scope="module")
def user():
    return build_features(simulate_user(8000, seed=11), FeatureConfig(short=True))


@pytest.mark.parametrize("module, floor_grade", [("models.fsrs6_kernels", 3), ("models.fsrs6_kernels_g2", 2)])
def test_engine_plugin_equals_specialised_kernel(module, floor_grade, user):
    engine = SeqEngine(module, ff.LOWER, ff.UPPER)
    rng = np.random.default_rng(5)
    weights = rng.uniform(0.5, 1.5, len(user))
    for w in (ff.DEFAULT_W, ff.LOWER + (ff.UPPER - ff.LOWER) * rng.uniform(0.05, 0.95, 21)):
        np.testing.assert_allclose(engine.predict(w, user), ff.predict(w, user, clamp_grade=floor_grade),
                                   rtol=1e-12, atol=1e-14)
        loss, grad = engine.loss_and_grad(w, user, weights=weights, w_init=ff.DEFAULT_W, sigma=ff.SIGMA)
        ref_loss, ref_grad = ff.loss_and_grad(w, ff.DEFAULT_W, ff.SIGMA, user, weights=weights,
                                              clamp_grade=floor_grade)
        assert loss == pytest.approx(ref_loss, rel=1e-12)
        np.testing.assert_allclose(grad, ref_grad, rtol=1e-9, atol=1e-9 * np.abs(ref_grad).max())
    cfg = RunConfig(n_epoch=2)
    fitted = engine.fit(ff.DEFAULT_W, user, cfg, w_init=ff.DEFAULT_W, sigma=ff.SIGMA)
    np.testing.assert_allclose(fitted, ff.fit(ff.DEFAULT_W, ff.SIGMA, user, cfg, clamp_grade=floor_grade),
                               rtol=1e-9, atol=1e-12)
