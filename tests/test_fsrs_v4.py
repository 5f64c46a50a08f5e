"""FSRS v4 and FSRS-4.5 on the general engine (engine/seq_engine.py): hand-computed forward values, engine vs
torch predictions and gradients, training, upstream-check sizes and Log Loss, and the engine's own contract."""

from __future__ import annotations

import importlib
import math

import numpy as np
import pandas as pd
import pytest
import torch

from check_users import CHECK, UPSTREAM, engine_vs_torch
from config import RunConfig
from models.base import ReviewData
from models.fsrs_v4 import FSRSv4
from models.fsrs_v45 import FSRS45
from engine.seq_model import TorchSeqNet
from runner import read_results, run



def one_card(dts, gs, target_t) -> ReviewData:
    rows = pd.DataFrame({"card_id": [0], "delta_t": [float(target_t)], "y": [1], "i": [len(dts) + 1],
                         "seq_start": [0], "seq_pos": [len(dts)]})
    return ReviewData(rows, np.array(dts, dtype=np.float64), np.array(gs, dtype=np.int8))


# ----------------------------------------------------------------------------------------------- by hand

def test_v4_forward_by_hand():
    """Good on day 0, Good after 3 days, Again after 10 days; target 5 days later (v4 defaults)."""
    w = FSRSv4.default_w
    s, d = w[2], w[4] - w[5] * 0  # Good: S = w2, D = w4
    r = 1 / (1 + 3 / (9 * s))
    s = s * (1 + math.exp(w[8]) * (11 - d) * s ** -w[9] * (math.exp(w[10] * (1 - r)) - 1))
    d = w[7] * w[4] + (1 - w[7]) * d
    r = 1 / (1 + 10 / (9 * s))
    s = w[11] * d ** -w[12] * ((s + 1) ** w[13] - 1) * math.exp(w[14] * (1 - r))  # lapse: v4 has no cap
    expected = 1 / (1 + 5 / (9 * s))
    model = FSRSv4(RunConfig(algo="FSRSv4"))
    got = model.predict(one_card([0, 3, 10], [3, 3, 1], 5))
    assert got[0] == pytest.approx(expected, rel=1e-12)


def test_v45_forward_by_hand_with_lapse_cap_and_easy_bonus():
    """Easy first, Hard after 2 days, Again after 60 days (4.5 caps the post-lapse S at S); target 7 days."""
    w = FSRS45.default_w
    f = 19 / 81
    s, d = w[3], min(max(w[4] - w[5] * 1, 1), 10)
    r = (1 + f * 2 / s) ** -0.5
    s = s * (1 + math.exp(w[8]) * (11 - d) * s ** -w[9] * (math.exp(w[10] * (1 - r)) - 1) * w[15])  # Hard
    d = min(max(w[7] * w[4] + (1 - w[7]) * (d + w[6]), 1), 10)
    r = (1 + f * 60 / s) ** -0.5
    s = min(w[11] * d ** -w[12] * ((s + 1) ** w[13] - 1) * math.exp(w[14] * (1 - r)), s)
    expected = (1 + f * 7 / s) ** -0.5
    got = FSRS45(RunConfig(algo="FSRS-4.5")).predict(one_card([0, 2, 60], [4, 2, 1], 7))
    assert got[0] == pytest.approx(expected, rel=1e-12)


# ----------------------------------------------------------------------------------------------- engine vs torch

def random_w(cls, rng) -> np.ndarray:
    lo, hi = np.array(cls.lower, float), np.array(cls.upper, float)
    hi = np.minimum(hi, lo + 20)
    return lo + (hi - lo) * rng.uniform(0.05, 0.95, len(lo))


@pytest.mark.parametrize("cls", [FSRSv4, FSRS45])
def test_engine_equals_torch_predictions_and_gradients(cls, user8):
    """One forward + one reverse pass per card gives what autograd gives through per-target padded histories."""
    rng = np.random.default_rng(7)
    model = cls(RunConfig(algo=cls.name))
    kern = importlib.import_module(cls.kernels)
    rows = user8.rows
    weights = rng.uniform(0.5, 1.5, len(rows))
    for w in (np.array(cls.default_w), random_w(cls, rng)):
        c = engine_vs_torch(model, TorchSeqNet(kern, w, cls.lower, cls.upper, dtype=torch.float64), w, user8,
                            weights)
        np.testing.assert_allclose(c.p, c.p_ref, rtol=1e-10, atol=1e-12)
        assert c.loss == pytest.approx(c.loss_ref, rel=1e-10)
        np.testing.assert_allclose(c.grad, c.grad_ref, rtol=1e-8, atol=1e-8 * np.abs(c.grad).max())


def test_engine_prior_frozen_and_max_seq_len(user8):
    """The L2 prior's gradient, frozen parameters and the max_seq_len row filter."""
    model = FSRS45(RunConfig(algo="FSRS-4.5"))
    w = np.array(FSRS45.default_w)
    w_init = w * 1.1
    sigma = np.linspace(0.5, 2.0, len(w))
    base, g0 = model.engine.loss_and_grad(w, user8)
    value, grad = model.engine.loss_and_grad(w, user8, w_init=w_init, sigma=sigma)
    assert value == pytest.approx(base + np.sum(((w - w_init) / sigma) ** 2), rel=1e-12)
    np.testing.assert_allclose(grad - g0, 2 * (w - w_init) / sigma ** 2, rtol=1e-9)
    short = user8.rows["seq_pos"].to_numpy() <= 3
    v_short, _ = model.engine.loss_and_grad(w, user8, max_seq_len=3)
    v_sub, _ = model.engine.loss_and_grad(w, user8.subset(short))
    assert v_short == pytest.approx(v_sub, rel=1e-12)
    # frozen S0: fitting leaves w0..w3 exactly where they started
    fitted = model.engine.fit(w, user8, RunConfig(n_epoch=2), grad_mask=[0, 0, 0, 0] + [1] * 13)
    assert list(fitted[:4]) == list(w[:4]) and not np.allclose(fitted[4:], w[4:])


@pytest.mark.parametrize("cls", [FSRSv4, FSRS45])
def test_training_lowers_training_loss_and_keeps_s0_fit(cls, user8):
    model = cls(RunConfig(algo=cls.name))
    w_init = model.initial_weights(user8)
    keep = model.training_rows(user8)
    assert keep.sum() == int((user8.rows["i"] > 2).sum())
    before, _ = model.engine.loss_and_grad(w_init, user8.subset(keep))
    model.fit(user8)
    after, _ = model.engine.loss_and_grad(model.w, user8.subset(keep))
    assert after < before * 0.99
    assert model.w[:4] == pytest.approx(w_init[:4], abs=0)  # S0 fitted, then frozen
    assert all(lo - 1e-12 <= x <= hi + 1e-12 for x, lo, hi in zip(model.w, cls.lower, cls.upper))


# ----------------------------------------------------------------------------------------------- upstream-check

@pytest.mark.parametrize("algo", ["FSRSv4", "FSRS-4.5"])
def test_upstream_check_sizes_and_log_loss(algo, tmp_path):
    cfg = RunConfig(algo=algo, data=CHECK, processes=1, result_dir=tmp_path, quiet=True)
    assert run(cfg).exit_code == 0
    lines, _ = read_results(tmp_path / f"{algo}.jsonl")
    for line in lines:
        ref = UPSTREAM[algo][str(line["user"])]
        assert line["size"] == ref["size"]
        assert line["metrics"]["LogLoss"] == pytest.approx(ref["metrics"]["LogLoss"], abs=2e-3)
        assert len(line["parameters"]["0"]) == 17


def test_rows_run_on_embedded_data_with_both_trainers(tmp_path):
    for algo in ("FSRSv4", "FSRS-4.5"):
        for trainer in ("fast", "upstream"):
            cfg = RunConfig(algo=algo, processes=1, users=[1], result_dir=tmp_path, quiet=True, trainer=trainer)
            assert run(cfg).done == 1
            lines, _ = read_results(tmp_path / f"{cfg.name}.jsonl")
            assert 0 < lines[0]["metrics"]["LogLoss"] < 1
