"""HLR, SM2-trainable and Anki (trained and default) on the general engine: hand-computed forward values, an
independent plain-Python Anki scheduler, engine vs torch predictions and gradients (real users and branch-forcing
cards), training, upstream-check sizes and Log Loss, and the CLI rows."""

from __future__ import annotations

import importlib
import math

import numpy as np
import pandas as pd
import pytest
import torch

from check_users import CHECK, UPSTREAM, engine_vs_torch
import upstream.training as training
from config import RunConfig
from models.anki import Anki
from models.base import ReviewData
from models.hlr import HLR, HLRNet, count_features
from engine.seq_model import TorchSeqNet
from models.sm2_trainable import SM2Trainable
from runner import read_results, run

MODELS = [HLR, SM2Trainable, Anki]


def cards(histories) -> ReviewData:
    """One target per (intervals, grades, target interval) history; cards laid out one after another."""
    seq_dt, seq_g, rows = [], [], []
    for dts, gs, target in histories:
        rows.append({"card_id": len(rows), "delta_t": float(target), "y": 1, "i": len(dts) + 1,
                     "seq_start": len(seq_dt), "seq_pos": len(dts)})
        seq_dt += list(dts)
        seq_g += list(gs)
    return ReviewData(pd.DataFrame(rows), np.array(seq_dt, dtype=np.float64), np.array(seq_g, dtype=np.int8))


def predict_one(cls, dts, gs, target, w=None, **cfg):
    model = cls(RunConfig(algo=cls.name, **cfg))
    if w is not None:
        model.w = list(w)
    return float(model.predict(cards([(dts, gs, target)]))[0])


# ----------------------------------------------------------------------------------------------- by hand

def test_hlr_by_hand_counts_every_previous_review():
    """Good on day 0, Again after 3 days, Good after 5, target 7 days later: 2 successes, 1 failure, the first
    review included."""
    th1, th2, b = HLR.default_w
    h = 2 ** (th1 * math.sqrt(2) + th2 * math.sqrt(1) + b)
    assert predict_one(HLR, [0, 3, 5], [3, 1, 3], 7) == pytest.approx(0.5 ** (7 / h), rel=1e-12)
    # HLR-short: a same-day review (interval 0) inside the history counts as well: 3 successes, 1 failure
    h = 2 ** (th1 * math.sqrt(3) + th2 * 1 + b)
    assert predict_one(HLR, [0, 0, 3, 5], [1, 3, 2, 4], 2) == pytest.approx(0.5 ** (2 / h), rel=1e-12)


def test_sm2_trainable_by_hand_default_and_custom_weights():
    """Good, Good after 1, Hard after 6, Easy after 15; target 20 days later. Defaults reproduce SM-2's EF rule:
    EF' = EF + 0.1 − (5−q)(0.08 + 0.02(5−q)); the interval of the 3rd+ success uses the OLD EF."""
    ef = 2.5
    ef = ef + 0.1 - (5 - 4) * (0.08 + 0.02 * (5 - 4))  # Good (q = 4): reps 1, ivl 1
    ef = ef + 0.1 - (5 - 4) * (0.08 + 0.02 * (5 - 4))  # Good: reps 2, ivl 6
    ivl = 6 * ef  # Hard (q = 3): reps 3, ivl 6·EF
    ef = ef + 0.1 - (5 - 3) * (0.08 + 0.02 * (5 - 3))
    ivl = ivl * ef  # Easy (q = 5): reps 4
    assert predict_one(SM2Trainable, [0, 1, 6, 15], [3, 3, 2, 4], 20) == pytest.approx(0.9 ** (20 / ivl), rel=1e-12)
    # custom weights; Again resets reps so the next success is the "second" one (w1); EF floor 1.3
    w = [0.5, 3.0, 1.6, 0.05, 6.0, 0.1]
    ef = 1.6 - 0.05 * (4 - 6.0) ** 2 + 0.1  # Good first: ivl w0
    ef = max(ef - 0.05 * (2 - 6.0) ** 2 + 0.1, 1.3)  # Again: reps 1, ivl w0; EF 1.5 − 0.8 + 0.1 = 0.8 → 1.3
    ivl = 3.0  # Good: reps 2 → w1
    ef = ef - 0.05 * (4 - 6.0) ** 2 + 0.1  # 1.3 − 0.2 + 0.1 = 1.2 → 1.3 (clamped)
    ef = max(ef, 1.3)
    ivl = ivl * ef  # Hard: reps 3 → ivl·EF
    got = predict_one(SM2Trainable, [0, 2, 1, 4], [3, 1, 3, 2], 9, w=w)
    assert got == pytest.approx(0.9 ** (9 / ivl), rel=1e-12)


def test_anki_by_hand_late_early_and_swapped_good_easy():
    """Defaults w = [1, 4, 2.5, 1.3, 1.2, 0, 1]. Upstream's Good/Easy swap [QUIRK] is what is computed."""
    # Good day 0 → ivl 1, ease 2.5
    # Good after 1 (on time, late 0): Good uses (ivl + late)·ease·bonus = 1·2.5·1.3 = 3.25
    # Easy after 2 (early by 1.25, elapsed 2): Easy uses max(elapsed·ease, ivl) = max(5, 3.25) = 5; ease 2.65
    # Hard after 7 (late 2): ivl·1.2 = 6; ease 2.5
    # Again after 10: ivl·w5 = 0 → soft floor max(0.01·(0 − 1) + 1, 0) = 0.99; ease 2.3
    p = predict_one(Anki, [0, 1, 2, 7, 10], [3, 3, 4, 2, 1], 3)
    assert p == pytest.approx(0.9 ** (3 / 0.99), rel=1e-12)
    # Easy day 0 → ivl 4
    # Good after 2 (early, elapsed 2): max(2·2.5, 4)·(1.3 − 0.3/2) = 5·1.15 = 5.75
    # Easy after 6 (late 0.25): (5.75 + 0.25/2)·2.5 = 14.6875; ease 2.65
    # Hard after 3 (early, elapsed 3): max(3·1.2, 14.6875·1.2/2) = 8.8125; ease 2.5
    ivl = max(3 * 1.2, (5.75 + 0.25 / 2) * 2.5 * 1.2 / 2)
    assert predict_one(Anki, [0, 2, 6, 3], [4, 3, 4, 2], 5) == pytest.approx(0.9 ** (5 / ivl), rel=1e-12)
    # trained-style weights: interval modifier w6 multiplies passes only; lapse multiplier w5; ease clamp 1.3
    w = [2.0, 5.0, 1.31, 1.5, 1.1, 0.4, 1.2]
    ivl, ease = 2.0, 1.31  # Good first
    ivl, ease = max((ivl + 3) * ease * 1.5 * 1.2, 1.0), ease  # Good after 5 (late 3)
    ivl, ease = ivl * 0.4, max(ease - 0.2, 1.3)  # Again
    assert ivl > 1 and ease == 1.3
    ivl, ease = ivl * 1.1 * 1.2, 1.3  # Hard after 10 (late)
    assert predict_one(Anki, [0, 5, 30, 10], [3, 3, 1, 2], 4, w=w) == pytest.approx(0.9 ** (4 / ivl), rel=1e-12)


def plain_anki(w, dts, gs):
    """An independent plain-Python Anki interval (upstream's formulas, no numba, no torch)."""
    ivl = w[0] if gs[0] < 4 else w[1]
    ease = w[2]
    ivl, ease = max(ivl, 0.01 * (ivl - 1) + 1 if ivl <= 1 else ivl), min(max(ease, 1.3), 5.5)
    for t, g in zip(dts[1:], gs[1:]):
        late = t - ivl
        if g == 1:
            new = ivl * w[5]
        else:
            if late < 0:
                elapsed = ivl + late
                new = {2: max(elapsed * w[4], ivl * w[4] / 2), 4: max(elapsed * ease, ivl),
                       3: max(elapsed * ease, ivl) * (w[3] - (w[3] - 1) / 2)}[g]
            else:
                new = {2: ivl * w[4], 4: (ivl + late / 2) * ease, 3: (ivl + late) * ease * w[3]}[g]
            new *= w[6]
        ease = min(max(ease + {1: -0.2, 2: -0.15, 3: 0.0, 4: 0.15}[g], 1.3), 5.5)
        ivl = min(max(new if new > 1 else 0.01 * (new - 1) + 1, 0.01), 36500)
    return ivl


def test_anki_default_equals_plain_python_scheduler_on_a_real_user(user12):
    model = Anki(RunConfig(algo="Anki", default=True))
    model.fit(user12)  # --dry: no training
    assert model.w == Anki.default_w and model.n_params == 0
    p = model.predict(user12)
    rows = user12.rows
    for k in range(0, len(rows), 7):
        dts, gs = user12.history(k)
        ivl = plain_anki(Anki.default_w, [float(x) for x in dts], [int(x) for x in gs])
        assert p[k] == pytest.approx(0.9 ** (rows["delta_t"].iat[k] / ivl), rel=1e-12, abs=1e-15)


# ----------------------------------------------------------------------------------------------- engine vs torch

def random_w(cls, rng) -> np.ndarray:
    lo, hi = np.array(cls.lower, float), np.array(cls.upper, float)
    d = np.array(cls.default_w, float)
    lo = np.where(np.isfinite(lo), lo, d - 1.5)
    hi = np.minimum(np.where(np.isfinite(hi), hi, d + 1.5), lo + 12)
    return lo + (hi - lo) * rng.uniform(0.05, 0.95, len(lo))


def assert_engine_equals_torch(cls, w, data, weights):
    net = TorchSeqNet(importlib.import_module(cls.kernels), w, cls.lower, cls.upper, dtype=torch.float64)
    c = engine_vs_torch(cls(RunConfig(algo=cls.name)), net, w, data, weights)
    np.testing.assert_allclose(c.p, c.p_ref, rtol=1e-10, atol=1e-12)
    assert c.loss == pytest.approx(c.loss_ref, rel=1e-10)
    np.testing.assert_allclose(c.grad, c.grad_ref, rtol=1e-8, atol=1e-9 * max(np.abs(c.grad_ref).max(), 1.0))


@pytest.mark.parametrize("cls", MODELS)
def test_engine_equals_torch_on_real_users(cls, user12, user8_short):
    """One forward + one reverse pass per card = autograd through per-target padded histories (float64), at the
    defaults and at random weights, without and with same-day reviews in the histories."""
    rng = np.random.default_rng(11)
    for data in (user12, user8_short):
        weights = rng.uniform(0.5, 1.5, len(data))
        for w in (np.array(cls.default_w), random_w(cls, rng)):
            assert_engine_equals_torch(cls, w, data, weights)


def test_anki_gradient_on_branch_ties_and_bounds():
    """Cards that hit every branch and torch's tie rules: soft floor at exactly 1 (w0 = 1), early Hard with
    elapsed·w4 = ivl·w4/2, early Easy/Good with elapsed·ease = ivl, ease clamped at 1.3 and 5.5, w5 = 0 lapses."""
    tie_cards = [
        ([0, 1], [3, 2], 3),  # w0 = 2: early Hard after 1 day: 1·w4 = 2·w4/2
        ([0, 1], [3, 4], 2),  # w0 = 2.5, ease 2.5: early Easy after 1: elapsed 1·2.5 = 2.5 = ivl
        ([0, 1], [3, 3], 2),  # same, Good
        ([0, 1, 1, 1, 1, 1], [4, 1, 1, 1, 1, 1], 1),  # ease down to the 1.3 floor
        ([0, 9, 30, 60, 200, 500, 900, 2000, 5000], [4] * 9, 7),  # ease up to 5.5
        ([0, 3, 1, 2, 4, 1], [3, 3, 3, 2, 4, 1], 4),
    ]
    data = cards(tie_cards)
    weights = np.linspace(0.5, 1.5, len(data))
    for w in ([1.0, 4.0, 2.5, 1.3, 1.2, 0.0, 1.0], [2.0, 4.0, 2.5, 1.3, 1.2, 0.0, 1.0],
              [2.5, 4.0, 2.5, 1.3, 1.2, 0.5, 1.0], [1.0, 1.0, 1.31, 1.0, 0.5, 1.0, 0.5]):
        assert_engine_equals_torch(Anki, np.array(w), data, weights)


def test_hlr_upstream_net_equals_engine(user12):
    """The upstream trainer's HLR module (precomputed float32 count features looked up by row) predicts what the
    engine predicts."""
    w = np.array([3.0, -0.5, 3.1])
    model = HLR(RunConfig(algo="HLR"))
    net = HLRNet(w, count_features(user12), dtype=torch.float64)
    batch = training.make_batches(user12, np.ones(len(user12)), 10 ** 6, 10 ** 6, torch.float64)[0]
    p = np.empty(len(user12))
    p[batch.rows] = net.forward_batch(batch).detach().numpy()
    np.testing.assert_allclose(p, model.engine.predict(w, user12), rtol=1e-6)


# ----------------------------------------------------------------------------------------------- training

@pytest.mark.parametrize("cls", MODELS)
@pytest.mark.parametrize("trainer", ["fast", "upstream"])
def test_training_lowers_training_loss(cls, trainer, user12):
    model = cls(RunConfig(algo=cls.name, trainer=trainer))
    keep = None if cls is HLR else (user12.rows["seq_pos"].to_numpy() <= 64)
    data = user12 if keep is None else user12.subset(keep)
    before, _ = model.engine.loss_and_grad(cls.default_w, data)
    model.fit(user12)
    after, _ = model.engine.loss_and_grad(model.w, data)
    assert after < before * 0.99
    assert all(lo <= x <= hi for x, lo, hi in zip(model.w, cls.lower, cls.upper))
    if cls is not HLR:  # upstream predicts with state_dict()'s 4-decimal weights
        assert model.w == [round(x, 4) for x in model.w]


# ----------------------------------------------------------------------------------------------- upstream-check

@pytest.mark.parametrize("algo", ["HLR", "SM2-trainable", "Anki"])
def test_upstream_check_sizes_and_log_loss(algo, tmp_path):
    """Sizes exact. Log Loss: the fast trainer minimises the same objective with card mini-batches and ends at or
    below upstream's value here (these models are far from converged after 5 epochs on user 8); see the module
    docs and the report for the upstream-trainer comparison."""
    cfg = RunConfig(algo=algo, data=CHECK, processes=1, result_dir=tmp_path, quiet=True)
    assert run(cfg).exit_code == 0
    lines, _ = read_results(tmp_path / f"{algo}.jsonl")
    assert len(lines) == 2
    for line in lines:
        ref = UPSTREAM[algo][str(line["user"])]
        assert line["size"] == ref["size"]
        assert line["metrics"]["LogLoss"] < ref["metrics"]["LogLoss"] + 2e-3
        assert line["metrics"]["LogLoss"] > ref["metrics"]["LogLoss"] - 0.07
        assert len(line["parameters"]["0"]) == len(models_class(algo).default_w)


@pytest.mark.parametrize("algo", ["SM2-trainable", "Anki", "HLR"])
def test_upstream_trainer_reproduces_upstream(algo, tmp_path):
    """--trainer upstream (length-sorted batches in numpy's quicksort tie order, as fsrs-optimizer 5.x's pandas
    sort left them; HLR: every row has one sort key, which that order permutes) gives upstream's published metrics
    (made in the tie order the tests pin: conftest.py) to the 6th decimal."""
    cfg = RunConfig(algo=algo, data=CHECK, processes=1, result_dir=tmp_path, quiet=True, trainer="upstream")
    assert run(cfg).exit_code == 0
    lines, _ = read_results(tmp_path / f"{cfg.name}.jsonl")
    assert len(lines) == 2
    for line in lines:
        ref = UPSTREAM[algo][str(line["user"])]
        assert line["size"] == ref["size"]
        for key, value in ref["metrics"].items():
            # AUC ranks near-equal predictions, which come out equal or an ulp apart with numpy's SIMD exp: it
            # moves by up to 2e-5 between CPUs (SM-2 trainable user 8 here 0.445607, published 0.445624)
            assert line["metrics"][key] == pytest.approx(value, abs=5e-5 if key == "AUC" else 2e-6), key


def models_class(algo):
    import models

    return models.model_class(algo)


def test_rows_run_on_embedded_data(tmp_path):
    expected = {"HLR": 3, "HLR-short": 3, "SM2-trainable": 6, "Anki": 7, "Anki-default": 0}
    for algo, extra in (("HLR", {}), ("HLR", {"short": True}), ("SM2-trainable", {}), ("Anki", {}),
                        ("Anki", {"default": True})):
        cfg = RunConfig(algo=algo, processes=1, users=[1], result_dir=tmp_path, quiet=True, **extra)
        assert run(cfg).done == 1
        (line,), _ = read_results(tmp_path / f"{cfg.name}.jsonl")
        assert 0 < line["metrics"]["LogLoss"] < 1
        assert models_class(algo)(cfg).n_params == expected[cfg.name]


# ----------------------------------------------------------------------------------------------- HLR's inputs

def test_hlr_target_inputs_are_the_counts_of_every_previous_review(user12):
    """The compiled engine's per-target inputs (the state before the target: successes and failures, from the plug-in
    generated for HLR's data-only state, computed once per fit; then the elapsed time) against the vectorised prefix
    sums the upstream-style trainer uses (count_features: their square roots), row by row, on a real user."""
    cards = HLR(RunConfig(algo="HLR")).engine.cards(user12)
    t_in = cards.t_dt
    assert t_in.shape == (len(user12), 3)
    np.testing.assert_array_equal(np.sqrt(t_in[:, :2]), count_features(user12)[cards.t_row])
    np.testing.assert_array_equal(t_in[:, 2], user12.rows["delta_t"].to_numpy(np.float64)[cards.t_row])


def test_hlr_target_inputs_by_hand_with_lengths_out_of_order():
    """One card Good, Again, Easy, Hard, Again: targets after 4, 2 and 5 reviews (the running count restarts when a
    length goes down), and one after none, which has no state to read (NaN)."""
    target_inputs = importlib.import_module(HLR(RunConfig(algo="HLR")).plugin()).target_inputs
    t_in = target_inputs(np.zeros(5), np.array([3, 1, 4, 2, 1]), np.array([0]), np.array([0]), np.array([4]),
                         np.array([4, 2, 5, 0]), np.array([7.0, 1.5, 30.0, 2.0]))
    expected = [[3.0, 1.0, 7.0], [1.0, 1.0, 1.5], [3.0, 2.0, 30.0], [np.nan, np.nan, 2.0]]
    np.testing.assert_array_equal(t_in, np.array(expected))
