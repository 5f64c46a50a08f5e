"""SBD (models/sbd.py, a one-file torch model on the autograd engine): forward values from the closed form by hand,
training lowers the objective on a real user, the defaults come back when a fit ends worse, the row's name,
parameter count and label, and the upstream-check run: sizes equal to the other rows', the card-major L-BFGS equal
to the per-target one (upstream's way of computing the same objective)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

import models
import rows
from check_users import CHECK, UPSTREAM, check_features
from config import RunConfig
from evaluate import display_name
from models import sbd
from engine.autograd_engine import Recipe, lbfgs_fit
from models.base import ReviewData, recency_weights
from runner import read_results, run


def one_card(dts, gs, target_t) -> ReviewData:
    rows_ = pd.DataFrame({"card_id": [0], "delta_t": [float(target_t)], "y": [1], "i": [len(dts) + 1],
                          "seq_start": [0], "seq_pos": [len(dts)]})
    return ReviewData(rows_, np.array(dts, dtype=np.float64), np.array(gs, dtype=np.int8))


def closed_form(w, dts, gs, target_t):
    """The model's closed form (models/sbd.py docstring), in plain floats: S0 = e^L·ρ^(r−1); a = t^(1/k) +
    e^(v/k)·ρ^(−g/2)·√S; R = (1 + a/S)^(−β(n)), β(n) = e^α·(δ + n)^c; pass S' = S + a, fail S' = S·(1 − R)^c."""
    lo, hi, k, alpha, c, v, log_delta = w
    rho = math.exp((hi - lo) / 3)
    beta = lambda n: math.exp(alpha) * (math.exp(log_delta) + n) ** c  # noqa: E731

    def recall(t, s, g, n):
        a = t ** (1 / k) + math.exp(v / k) * rho ** (-g / 2) * math.sqrt(s)
        return (1 + a / s) ** (-beta(n)), a

    r0 = gs[0]
    s, g, n = math.exp(lo) * rho ** (r0 - 1), r0 - 1, max(0.0, (3 - r0) / 2)
    for t, r in zip(dts[1:], gs[1:]):
        p, a = recall(t, s, g, n)
        s = s + a if r >= 2 else s * (1 - p) ** c
        g, n = r - 1, min(50.0, n + max(0.0, (3 - r) / 2))
    return recall(target_t, s, g, n)[0]


@pytest.mark.parametrize("dts, gs, target", [([0, 3, 7, 2], [3, 2, 1, 3], 5.0), ([0, 1, 4], [1, 3, 4], 10.0),
                                             ([0, 2, 6, 15], [4, 3, 3, 3], 30.0)])
def test_forward_values_by_hand(dts, gs, target):
    model = models.model_class("SBD")(RunConfig(algo="SBD"))
    expected = closed_form(sbd.DEFAULT_W, dts, gs, target)
    assert 1e-6 < expected < 1 - 1e-6
    assert model.predict(one_card(dts, gs, target))[0] == pytest.approx(expected, rel=1e-10)


def test_row_name_parameters_and_label():
    cfg = RunConfig(algo="SBD")
    assert cfg.name == "SBD-recency" == RunConfig(algo="SBD", recency=True).name  # recency is its published mode
    assert models.model_class("SBD")(cfg).n_params == 7
    assert rows.config_for(rows.BY_NAME["SBD-recency"], RunConfig()).algo == "SBD"
    assert display_name("SBD-recency") == "SBD"


def test_training_lowers_the_objective_on_a_real_user():
    model = models.model_class("SBD")(RunConfig(algo="SBD"))
    data = check_features(12, False).subset(np.arange(1500))
    weights = recency_weights(len(data))
    before = model.engine.loss_and_grad(sbd.DEFAULT_W, data, weights, max_seq_len=64)[0]
    model.fit(data)
    after = model.engine.loss_and_grad(model.w, data, weights, max_seq_len=64)[0]
    assert after < before * 0.98
    assert model.w != sbd.DEFAULT_W and all(x == round(x, 4) for x in model.w)


def test_defaults_come_back_when_the_fit_ends_worse():
    """An objective that is never finite: the line search gets nowhere and the fit returns w_init."""
    import torch

    w0 = np.array(sbd.DEFAULT_W)
    recipe = Recipe.from_dict(sbd.RECIPE)
    out = lbfgs_fit(w0 + 0.1, lambda w: torch.sum(w) * math.nan, 1.0, 100, w0, np.ones(7), np.ones(7),
                    [-math.inf] * 7, [math.inf] * 7, recipe)
    np.testing.assert_array_equal(out, w0)


def test_upstream_check_sizes_and_both_trainers(tmp_path):
    """User 12: the size every row has (upstream's FSRS-5 size), and the card-major L-BFGS's result equal to the
    per-target L-BFGS's (--trainer upstream: every row's own history, batches of 8192, as upstream's fit)."""
    lines = {}
    for trainer in ("fast", "upstream"):
        cfg = RunConfig(algo="SBD", data=CHECK, users=[12], processes=1, result_dir=tmp_path, quiet=True,
                        trainer=trainer)
        assert run(cfg).exit_code == 0
        lines[trainer] = read_results(tmp_path / f"{cfg.name}.jsonl")[0][0]
    fast, upstream = lines["fast"], lines["upstream"]
    assert fast["size"] == upstream["size"] == UPSTREAM["FSRS-5"]["12"]["size"]
    np.testing.assert_allclose(fast["parameters"]["0"], upstream["parameters"]["0"], atol=2e-4)
    assert fast["metrics"]["LogLoss"] == pytest.approx(upstream["metrics"]["LogLoss"], abs=2e-6)
    assert fast["metrics"]["LogLoss"] < 0.2
