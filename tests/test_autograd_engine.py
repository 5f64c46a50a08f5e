"""The card-major autograd engine (engine/autograd_engine.py) against the compiled engine (engine/seq_engine.py) on
every engine plug-in that carries torch step functions: the same predictions, loss and gradient at any weights (an
independent implementation: hand-written numba VJPs vs torch autograd), the same weights after a short fit, and the
same Log Loss for a whole run (`--trainer autograd` vs the default). Plus the recipe options (keep last, AdamW,
full-batch L-BFGS) and its card batches (a card shorter than the batch's longest never steps on padding)."""

from __future__ import annotations

import importlib
import math

import numpy as np
import pandas as pd
import pytest
import torch

import models
from check_users import CHECK, check_features
from config import RunConfig
from engine.autograd_engine import AutogradEngine, Recipe
from models.base import ReviewData
from runner import read_results, run

# every engine plug-in with torch_init/torch_step/torch_curve (FSRS-6's compiled path is models/fsrs6.py's functional API over its plug-in)
PLUGINS = ["FSRSv4", "FSRS-4.5", "FSRS-5", "HLR", "SM2-trainable", "Anki"]


def _model(name: str, **flags):
    return models.model_class(name)(RunConfig(algo=name, **flags))


def _engines(name: str):
    model = _model(name)
    return model, AutogradEngine(importlib.import_module(model.kernels), model.lower, model.upper)


def _data(model) -> ReviewData:
    return check_features(8, model.cfg.include_short)


def _random_weights(model, rng) -> np.ndarray:
    lo, hi = np.array(model.lower, float), np.array(model.upper, float)
    lo = np.where(np.isfinite(lo), lo, np.array(model.default_w) - 1.0)
    hi = np.where(np.isfinite(hi), np.minimum(hi, lo + 20), np.array(model.default_w) + 1.0)
    return lo + (hi - lo) * rng.uniform(0.05, 0.95, len(lo))


@pytest.mark.parametrize("name", PLUGINS)
def test_predictions_loss_and_gradient_equal_the_compiled_engine(name):
    """User 8 of upstream-check (4,450 targets), at the defaults and at random in-box weights, random row weights."""
    model, auto = _engines(name)
    data = _data(model)
    rng = np.random.default_rng(17)
    weights = rng.uniform(0.5, 1.5, len(data))
    for w in (np.array(model.default_w, float), _random_weights(model, rng)):
        p, p_auto = model.engine.predict(w, data), auto.predict(w, data)
        assert (np.isnan(p) == np.isnan(p_auto)).all() and np.isfinite(p).sum() > 4000
        np.testing.assert_allclose(p_auto, p, rtol=0, atol=1e-12)
        loss, grad = model.engine.loss_and_grad(w, data, weights=weights)
        loss_auto, grad_auto = auto.loss_and_grad(w, data, weights=weights)
        assert loss_auto == pytest.approx(loss, rel=1e-12)
        np.testing.assert_allclose(grad_auto, grad, rtol=1e-8, atol=1e-8 * np.abs(grad).max())


def test_prior_and_max_seq_len_as_the_compiled_engine():
    model, auto = _engines("FSRS-5")
    data = _data(model)
    w_init = np.array(model.default_w)
    w = w_init * 1.05
    a = model.engine.loss_and_grad(w, data, w_init=w_init, sigma=model.sigma, max_seq_len=8)
    b = auto.loss_and_grad(w, data, w_init=w_init, sigma=model.sigma, max_seq_len=8)
    assert b[0] == pytest.approx(a[0], rel=1e-12)
    np.testing.assert_allclose(b[1], a[1], rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("name, flags", [("FSRS-5", {}), ("FSRSv4", {"recency": True}), ("Anki", {}),
                                         ("HLR", {"batch_size": 256})])
def test_short_fit_gives_the_compiled_engines_weights(name, flags):
    """Two epochs on 1,500 rows: same permutations, batches, Adam steps, prior, frozen S0 (v4), training filter
    (v4's i > 2), recency weights and checkpoint rule as SeqEngine.fit."""
    model = _model(name, n_epoch=2, **flags)
    auto = AutogradEngine(importlib.import_module(model.kernels), model.lower, model.upper)
    train = _data(model).subset(np.arange(1500))
    w_init = model.initial_weights(train)
    keep = model.training_rows(train)
    mask = None
    if model.frozen:
        mask = np.ones(len(w_init))
        mask[list(model.frozen)] = 0.0
    kw = dict(w_init=w_init, sigma=model.sigma, grad_mask=mask, keep=keep)
    a = model.engine.fit(w_init, train, model.cfg, **kw)
    b = auto.fit(w_init, train, model.cfg, **kw)
    assert np.abs(a - np.array(w_init)).max() > 1e-2  # training moved the weights
    np.testing.assert_allclose(b, a, rtol=0, atol=1e-6)
    la = model.engine.loss_and_grad(a, train)[0]
    assert auto.loss_and_grad(b, train)[0] == pytest.approx(la, rel=1e-9)


def test_a_run_with_the_autograd_trainer_equals_the_compiled_run(tmp_path):
    """`--trainer autograd` (result FSRS-5-autograd-trainer) vs the default trainer on upstream-check user 12:
    the same Log Loss, size and weights in the result lines."""
    lines = {}
    for trainer in ("fast", "autograd"):
        cfg = RunConfig(algo="FSRS-5", data=CHECK, users=[12], processes=1, result_dir=tmp_path, quiet=True,
                        trainer=trainer)
        assert run(cfg).exit_code == 0
        lines[trainer] = read_results(tmp_path / f"{cfg.name}.jsonl")[0][0]
    assert (tmp_path / "FSRS-5-autograd-trainer.jsonl").exists()
    fast, auto = lines["fast"], lines["autograd"]
    assert auto["size"] == fast["size"] == 3055
    assert auto["metrics"] == fast["metrics"]
    assert auto["parameters"] == fast["parameters"]


def test_autograd_trainer_refused_for_models_without_torch_steps(tmp_path):
    from data_loader import DataError

    with pytest.raises(DataError, match="torch step functions"):
        run(RunConfig(algo="DASH", trainer="autograd", processes=1, result_dir=tmp_path, quiet=True))


# ----------------------------------------------------------------------------------------------- batches, recipes

def _cards(histories) -> ReviewData:
    """One target per prefix of each card's history: histories[c] = [(t, g), ...] (t of the first review 0)."""
    dts, gs, rows = [], [], []
    for c, reviews in enumerate(histories):
        start = len(dts)
        dts += [float(t) for t, _ in reviews]
        gs += [g for _, g in reviews]
        for k in range(1, len(reviews)):
            rows.append({"card_id": c, "delta_t": float(reviews[k][0]), "y": int(reviews[k][1] > 1), "i": k + 1,
                         "seq_start": start, "seq_pos": k})
    return ReviewData(pd.DataFrame(rows), np.array(dts), np.array(gs, dtype=np.int8))


def test_each_target_reads_the_state_before_its_review_with_cards_of_different_lengths():
    """HLR's state is the success/failure counts: target k of a card reads the counts of reviews 0..k-1, whatever
    the other cards' lengths in the batch (p = 0.5^(t/h), h = 2^(θ1·√succ + θ2·√fail + b), by hand)."""
    data = _cards([[(0, 3), (2, 1), (1, 3), (4, 3)], [(0, 1), (3, 3)], [(0, 3), (1, 3), (5, 3)]])
    w = [1.0, -0.5, 0.25]
    p = AutogradEngine(importlib.import_module("models.hlr"), [-math.inf] * 3, [math.inf] * 3).predict(w, data)
    counts = [(1, 0), (1, 1), (2, 1), (0, 1), (1, 0), (2, 0)]  # (succ, fail) before each target, in row order

    def by_hand(t, s, f):
        return 0.5 ** (t / 2 ** (w[0] * math.sqrt(s) + w[1] * math.sqrt(f) + w[2]))

    expected = [by_hand(t, s, f) for t, (s, f) in zip(data.rows["delta_t"], counts)]
    np.testing.assert_allclose(p, expected, rtol=1e-14)


def test_recipe_options():
    model, auto = _engines("Anki")
    train = _data(model).subset(np.arange(800))
    w0 = np.array(model.default_w)
    start = auto.loss_and_grad(w0, train)[0]
    cfg = RunConfig(algo="Anki", n_epoch=2)
    best = auto.fit(w0, train, cfg)
    last = auto.fit(w0, train, cfg, Recipe(keep="last"))
    adamw = auto.fit(w0, train, cfg, {"optimizer": "adamw", "weight_decay": 0.5})
    lbfgs = auto.fit(w0, train, cfg, {"optimizer": "lbfgs", "lr": 1.0, "max_iter": 30})
    for w in (best, last, adamw, lbfgs):
        assert np.all(w >= np.array(model.lower)) and np.all(w <= np.array(model.upper))
    assert auto.loss_and_grad(best, train)[0] <= start
    assert not np.allclose(adamw, last)  # the decoupled decay moved the weights
    assert auto.loss_and_grad(lbfgs, train)[0] < start
    with pytest.raises(ValueError, match="unknown key"):
        Recipe.from_dict({"learning_rate": 1})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_predictions_equal_the_cpu_ones():
    model, cpu = _engines("FSRS-5")
    gpu = AutogradEngine(importlib.import_module(model.kernels), model.lower, model.upper, device="cuda")
    data = _data(model)
    w = np.array(model.default_w)
    np.testing.assert_allclose(gpu.predict(w, data), cpu.predict(w, data), rtol=0, atol=1e-12)
    np.testing.assert_allclose(gpu.loss_and_grad(w, data)[1], cpu.loss_and_grad(w, data)[1], rtol=1e-10)


# ----------------------------------------------------------------------------------------------- FSRS-6

def test_fsrs6_torch_functions_equal_its_compiled_plug_in():
    from models import fsrs6
    from models.fsrs6 import CLIP_HI, CLIP_LO, DEFAULT_W, SIGMA

    auto = AutogradEngine(fsrs6, CLIP_LO, CLIP_HI)
    data = check_features(8, True)
    rng = np.random.default_rng(3)
    weights = rng.uniform(0.5, 1.5, len(data))
    w_init = np.array(DEFAULT_W)
    for w in (w_init, np.clip(w_init * rng.uniform(0.7, 1.3, 21), CLIP_LO, CLIP_HI)):
        np.testing.assert_allclose(auto.predict(w, data), fsrs6.predict(w, data), rtol=0, atol=1e-12)
        loss, grad = fsrs6.loss_and_grad(w, w_init, SIGMA, data, weights)
        loss_auto, grad_auto = auto.loss_and_grad(w, data, weights, w_init=w_init, sigma=SIGMA)
        assert loss_auto == pytest.approx(loss, rel=1e-12)
        np.testing.assert_allclose(grad_auto, grad, rtol=1e-8, atol=1e-8 * np.abs(grad).max())
    train = data.subset(np.arange(1500))
    cfg = RunConfig(algo="FSRS-6", n_epoch=2)
    a = fsrs6.fit(w_init, SIGMA, train, cfg)
    b = auto.fit(w_init, train, cfg, w_init=w_init, sigma=SIGMA)
    assert np.abs(a - w_init).max() > 1e-2
    np.testing.assert_allclose(b, a, rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", ["FSRS-5", "SBD", "HLR"])
def test_sweep_gradient_equals_the_taped_one(name):
    """The default gradient (no-tape forward, wide per-element Jacobians, numpy adjoint sweep) against plain autograd
    through the time loop, on mini-batch-sized card sets: FSRS-5 (2 live state components), SBD (log S live, its
    grade index and brittleness count carry no gradient), HLR (no live component)."""
    from engine.autograd_engine import _CardBatch, _card_targets
    from engine.seq_engine import Cards

    model = _model(name)
    module = importlib.import_module(model.kernels) if name != "SBD" else model.module
    sweep = AutogradEngine(module, model.lower, model.upper)
    tape = AutogradEngine(module, model.lower, model.upper, gradient="tape")
    cards = Cards(check_features(8, model.cfg.include_short))
    targets_of = _card_targets(cards, cards.c_tb, cards.c_te)
    rng = np.random.default_rng(2)
    w = np.array(model.default_w) + rng.normal(0, 0.05, len(model.default_w))
    for _ in range(5):
        ids = rng.choice(len(cards.c_start), 80, replace=False)
        batch = _CardBatch(cards, ids, cards.c_n[ids], sweep.device, sweep.dtype, targets_of)
        loss, grad = sweep._batch_loss_grad(w, batch)
        loss_tape, grad_tape = tape._batch_loss_grad(w, batch)
        assert loss == pytest.approx(loss_tape, rel=1e-13)
        np.testing.assert_allclose(grad, grad_tape, rtol=1e-10, atol=1e-12 * np.abs(grad_tape).max())
