"""DASH, DASH[MCM], DASH[ACT-R] (models/dash.py) and ACT-R (models/act_r.py): hand-computed forward values, engine
vs torch predictions and gradients on a real user, upstream's batching/row-limit/rounding quirks, training, the
upstream-check sizes and Log Loss, and the CLI rows."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

import models.dash as dash
from upstream.legacy_sort_avx512 import argsort_numpy22_avx512
from engine.seq_engine import NUMPY126
from check_users import CHECK, UPSTREAM, engine_vs_torch
import upstream.training as training
from config import RunConfig
from models.act_r import ACTR
from models.base import ReviewData
from models.dash import DASH, DASHACTR, DASHMCM
from upstream.history_torch import ACTRNet, DASHACTRNet, DASHNet
from runner import read_results, run

ALL = [DASH, DASHMCM, DASHACTR, ACTR]


def one_card(dts, gs, target_t) -> ReviewData:
    rows = pd.DataFrame({"card_id": [0], "delta_t": [float(target_t)], "y": [1], "i": [len(dts) + 1],
                         "seq_start": [0], "seq_pos": [len(dts)]})
    return ReviewData(rows, np.array(dts, dtype=np.float64), np.array(gs, dtype=np.int8))


def sigmoid(z):
    return 1 / (1 + math.exp(-z))


# ----------------------------------------------------------------------------------------------- by hand

# Good on day 0, Again 3 days later, Good 10 days after that; target 7 days later.
# Time from each review to the target: 7 + 10 + 3 = 20 (Good), 7 + 10 = 17 (Again), 7 (Good).
HISTORY = ([0, 3, 10], [3, 1, 3], 7)


def test_dash_forward_by_hand_window_boundary_included():
    # W=1: none; W=7: the last review (Δ = 7 ≤ 7, success); W=30 and ∞: all three, two successes
    x = [0, 0, 1, 1, 3, 2, 3, 2]
    for cfg, w in ((RunConfig(algo="DASH"), DASH.default_w), (RunConfig(algo="DASH", short=True), dash.DASH_SHORT_W)):
        expected = sigmoid(sum(wk * math.log(1 + xk) for wk, xk in zip(w, x)) + w[8])
        assert DASH(cfg).predict(one_card(*HISTORY))[0] == pytest.approx(expected, rel=1e-12)
    assert DASH(RunConfig(algo="DASH")).w[0] == 0.2024 and DASH(RunConfig(algo="DASH", short=True)).w[0] == -0.1766


def test_mcm_forward_by_hand():
    w = DASHMCM.default_w
    tau = [0.2434, 1.9739, 16.0090, 129.8426]
    n7 = math.exp(-7 / tau[1])
    n30 = math.exp(-20 / tau[2]) + math.exp(-17 / tau[2]) + math.exp(-7 / tau[2])
    c30 = math.exp(-20 / tau[2]) + math.exp(-7 / tau[2])
    ninf = math.exp(-20 / tau[3]) + math.exp(-17 / tau[3]) + math.exp(-7 / tau[3])
    cinf = math.exp(-20 / tau[3]) + math.exp(-7 / tau[3])
    x = [0, 0, n7, n7, n30, c30, ninf, cinf]
    expected = sigmoid(sum(wk * math.log(1 + xk) for wk, xk in zip(w, x)) + w[8])
    assert DASHMCM(RunConfig(algo="DASH[MCM]")).predict(one_card(*HISTORY))[0] == pytest.approx(expected, rel=1e-12)
    # --short: the DASH-short init, as upstream's DASH class does for MCM too
    assert DASHMCM(RunConfig(algo="DASH[MCM]", short=True)).w == dash.DASH_SHORT_W


def test_dash_actr_forward_by_hand_and_small_delta_quirk():
    model = DASHACTR(RunConfig(algo="DASH[ACT-R]"))
    w = model.w
    assert w == [1.4164, 0.516, -0.0564, 1.9223, 1.0549]
    s = 20 ** -w[1] * w[3] + 17 ** -w[1] * w[2] + 7 ** -w[1] * w[3]
    expected = sigmoid(w[0] * math.log(1 + max(0.0, s)) + w[4])
    assert model.predict(one_card(*HISTORY))[0] == pytest.approx(expected, rel=1e-12)
    # upstream clamps Δ at 0.1 and drops entries equal to 0.1: any Δ ≤ 0.1 day contributes nothing
    assert model.predict(one_card([0, 0.02], [3, 3], 0.05))[0] == pytest.approx(sigmoid(w[4]), rel=1e-12)
    # only the first review (Δ = 2.05, as upstream's float32 sum of 2 and 0.05) counts
    s = float(np.float32(2.0 + float(np.float32(0.05)))) ** -w[1] * w[3]
    expected = sigmoid(w[0] * math.log(1 + s) + w[4])
    assert model.predict(one_card([0, 2], [3, 3], 0.05))[0] == pytest.approx(expected, rel=1e-12)
    # a negative sum is clamped at 0
    w_neg = [1.0, 0.5, -3.0, 0.1, 0.2]
    assert model.engine.predict(w_neg, one_card([0, 3], [1, 1], 5))[0] == pytest.approx(sigmoid(0.2), rel=1e-12)


def test_act_r_forward_by_hand_with_same_day_review():
    """Reviews at times 0, 0 (same day), 3; target at 5 days. Time in seconds × h, clamped at ≥ 1."""
    model = ACTR(RunConfig(algo="ACT-R"))
    a, c, s, tau, h = model.w
    assert model.w == [0.1768, 0.217, 0.2549, -0.7042, 0.025]  # upstream predicts with state_dict's 4 decimals
    k = 86400 * h
    m1 = math.log(max(1.0, 0 * k) ** -a)  # = 0: the same-day gap is clamped to 1
    d1 = c * math.exp(m1) + a
    m2 = math.log((3 * k) ** -a + (3 * k) ** -d1)
    d2 = c * math.exp(m2) + a
    m_now = math.log((5 * k) ** -a + (5 * k) ** -d1 + (2 * k) ** -d2)
    expected = 1 / (1 + math.exp((tau - m_now) / s))
    assert model.predict(one_card([0, 0, 3], [3, 3, 3], 2))[0] == pytest.approx(expected, rel=1e-12)


# ----------------------------------------------------------------------------------------------- engine vs torch

def torch_net(cls, w):
    if cls is DASH or cls is DASHMCM:
        return DASHNet(w, cls.decay, dtype=torch.float64)
    net_cls = DASHACTRNet if cls is DASHACTR else ACTRNet
    return net_cls(w, cls.lower, cls.upper, dtype=torch.float64)


def random_w(cls, rng) -> np.ndarray:
    w = np.array(cls.default_w) * rng.uniform(0.5, 1.5, len(cls.default_w))
    return np.clip(w, cls.lower, cls.upper)


@pytest.mark.parametrize("cls,short", [(DASH, False), (DASHMCM, False), (DASHACTR, False), (ACTR, False),
                                       (DASHMCM, True), (DASHACTR, True), (ACTR, True)])
def test_engine_equals_torch_predictions_and_gradients(cls, short, user8, user8_short):
    """The card kernels give what autograd gives through upstream's per-target padded histories."""
    data = user8_short if short else user8
    rng = np.random.default_rng(11)
    model = cls(RunConfig(algo=cls.name, short=short))
    weights = rng.uniform(0.5, 1.5, len(data))
    for w in (np.array(model.default_w), random_w(cls, rng)):
        c = engine_vs_torch(model, torch_net(cls, w), w, data, weights)
        np.testing.assert_allclose(c.p, c.p_ref, rtol=1e-10, atol=1e-13)
        assert c.loss == pytest.approx(c.loss_ref, rel=1e-10)
        np.testing.assert_allclose(c.grad, c.grad_ref, rtol=1e-7, atol=1e-9 * np.abs(c.grad).max())


def long_card_data() -> ReviewData:
    """Card A: 80 daily reviews (targets with histories 1..79, longer than max_seq_len 64 from 65 on); card B: three
    reviews whose two targets come last in time (so time order differs from history-length order)."""
    seq_dt = np.array([0.0] + [1.0] * 79 + [0.0, 2.0, 5.0])
    seq_g = np.array([3] * 80 + [1, 3, 3], dtype=np.int8)
    pos = np.r_[np.arange(1, 80), [1, 2]]
    start = np.r_[np.zeros(79, dtype=np.int64), [80, 80]]
    rows = pd.DataFrame({"card_id": np.r_[np.zeros(79), [1, 1]].astype(np.int64), "delta_t": seq_dt[start + pos],
                         "y": np.r_[np.tile([1, 1, 0], 27)[:79], [1, 0]], "i": pos + 1, "seq_start": start,
                         "seq_pos": pos})
    return ReviewData(rows, seq_dt, seq_g)


def test_dash_trains_on_every_row_upstream_batches_in_tie_order(monkeypatch):
    """DASH's BatchDataset length is len(8-feature vector) = 8: no row is dropped for a history longer than
    max_seq_len, and the sort by that equal length leaves the time-ordered rows in numpy 1.26's quicksort tie order
    (legacy_sort, itself checked against numpy 1.26.4's outputs in tests/test_legacy_sort.py)."""
    data = long_card_data()
    seen = {}

    def fake_train(net, d, cfg, **kw):
        seen["batches"] = training.make_batches(d, np.ones(len(d)), 16, cfg.max_seq_len,
                                                sort_kind=kw.get("sort_kind", "stable"))
        seen["sort_kind"] = kw.get("sort_kind")
        seen["net"] = net

    monkeypatch.setattr(training, "train", fake_train)
    DASH(RunConfig(algo="DASH", trainer="upstream")).fit(data)
    rows = np.concatenate([b.rows for b in seen["batches"]])
    assert seen["sort_kind"] == NUMPY126
    assert list(rows) == list(argsort_numpy22_avx512(np.ones(len(data), dtype=np.int64)))  # the order tests pin
    # the features it looks up equal those computed from each row's own padded history
    batch = training.make_batches(data, np.ones(len(data)), 10 ** 6, 10 ** 6)[0]
    net = seen["net"]
    in_batch = DASHNet(net.w.detach().numpy(), False).forward_batch(batch)
    np.testing.assert_allclose(net.forward_batch(batch).detach().numpy(), in_batch.detach().numpy(), rtol=1e-6)
    # the fast trainer keeps every row too
    model = DASHMCM(RunConfig(algo="DASH[MCM]"))
    limits = []
    monkeypatch.setattr(model.engine, "fit", lambda w0, train, cfg, **kw: limits.append(cfg.max_seq_len) or w0)
    model.fit(data)
    assert limits[0] >= 128


def test_act_r_trains_on_histories_of_at_most_63(user8, monkeypatch):
    """ACT-R's tensor is history + 1 long, so upstream's max_seq_len 64 keeps histories ≤ 63 (both trainers)."""
    seen = []
    model = ACTR(RunConfig(algo="ACT-R"))
    monkeypatch.setattr(model.engine, "fit", lambda w0, train, cfg, **kw: seen.append(cfg.max_seq_len) or w0)
    model.fit(user8)
    # the upstream trainer (SeqModel.fit → training.train; one module object everywhere)
    monkeypatch.setattr(training, "train", lambda net, data, cfg, **kw: seen.append(cfg.max_seq_len))
    ACTR(RunConfig(algo="ACT-R", trainer="upstream")).fit(user8)
    assert seen == [63, 63]
    assert model.cfg.max_seq_len == 64  # the run config itself is untouched


@pytest.mark.parametrize("cls", ALL)
def test_training_lowers_training_loss(cls, user8):
    train = user8.subset(np.arange(1500))
    model = cls(RunConfig(algo=cls.name))
    before, _ = model.engine.loss_and_grad(model.default_w, train)
    model.fit(train)
    after, _ = model.engine.loss_and_grad(model.w, train)
    assert after < before * 0.99
    assert all(lo <= x <= hi for x, lo, hi in zip(model.w, cls.lower, cls.upper))
    if cls in (DASHACTR, ACTR):  # upstream's state_dict rounding
        assert model.w == [round(x, 4) for x in model.w]


# ----------------------------------------------------------------------------------------------- upstream-check

# Both trainers replay upstream's batches for all four rows (rows in the published results' quicksort tie order:
# legacy_sort, pinned by conftest.py) and equal upstream's published numbers to the 6th decimal.
@pytest.mark.parametrize("trainer", ["fast", "upstream"])
def test_upstream_check_sizes_and_log_loss(trainer, tmp_path):
    for cls in ALL:
        cfg = RunConfig(algo=cls.name, data=CHECK, processes=1, result_dir=tmp_path, quiet=True, trainer=trainer)
        assert run(cfg).exit_code == 0
        lines, _ = read_results(tmp_path / f"{cfg.name}.jsonl")
        assert len(lines) == 2
        for line in lines:
            user = str(line["user"])
            assert line["size"] == UPSTREAM[cls.name][user]["size"]
            here = UPSTREAM[cls.name][user]["metrics"]["LogLoss"]
            assert line["metrics"]["LogLoss"] == pytest.approx(here, abs=2e-6), (cls.name, user)
            assert len(line["parameters"]["0"]) == len(cls.default_w)


def test_cli_rows_on_embedded_data(tmp_path):
    for algo, extra in (("DASH", {}), ("DASH", {"short": True}), ("DASH[MCM]", {}), ("DASH[ACT-R]", {}),
                        ("ACT-R", {}), ("ACT-R", {"trainer": "upstream"})):
        cfg = RunConfig(algo=algo, processes=1, users=[1], result_dir=tmp_path, quiet=True, **extra)
        assert run(cfg).done == 1
        lines, _ = read_results(tmp_path / f"{cfg.name}.jsonl")
        assert 0 < lines[0]["metrics"]["LogLoss"] < 1
    assert (tmp_path / "DASH-short.jsonl").exists() and (tmp_path / "ACT-R-upstream-trainer.jsonl").exists()


def test_dash_actr_long_history_by_hand_predictions_and_w1_gradient():
    """The kernel takes Δ^(−w1) as exp(−w1·ln Δ) (models/dash.py): on a 300-review card with same-day reviews,
    intervals around the 0.1 cut and up to years, every target's prediction equals upstream's formula with `**`
    computed here in numpy, and dLoss/dw1 (the one term that needs ln Δ) equals a central finite difference.
    Upstream's Δ are float32 (features/dash_engineer.py: sp − cumsum(sp) + cumsum(sp)[−1] on a float32 tensor,
    torch's cumsum summing in double): at this card's ~10^5 days that rounding moves the short Δ by up to ~0.004
    day, across the 0.1 cut too, and the expected values here reproduce it."""
    rng = np.random.default_rng(7)
    n = 300
    dts = np.concatenate([[0.0], rng.choice([0.0, 0.04, 0.1, 0.11, 1.0, 3.5, 40.0, 700.0], n - 1)])
    gs = rng.integers(1, 5, n).astype(np.int8)
    pos = np.arange(1, n)
    target_dt = dts[1:] + rng.choice([0.0, 0.05, 2.0], n - 1)
    rows = pd.DataFrame({"card_id": 0, "delta_t": target_dt, "y": (rng.random(n - 1) < 0.7).astype(int),
                         "i": pos + 1, "seq_start": 0, "seq_pos": pos})
    data = ReviewData(rows, dts, gs)
    model = DASHACTR(RunConfig(algo="DASH[ACT-R]"))
    w = np.array([1.3, 0.45, -0.2, 1.7, 0.9])
    expected = []
    for k, p in enumerate(pos):
        sp = np.concatenate([dts[1:p], [target_dt[k]]]).astype(np.float32)  # upstream's t_item[1:]
        cs = np.cumsum(sp.astype(np.float64)).astype(np.float32)
        delta = ((sp - cs) + cs[-1]).astype(np.float32).astype(np.float64)  # review j → target
        kept = delta > np.float32(0.1)
        s = np.sum(np.where(gs[:p] > 1, w[3], w[2])[kept] * delta[kept] ** -w[1])
        expected.append(sigmoid(w[0] * math.log1p(max(s, 0.0)) + w[4]))
    np.testing.assert_allclose(model.engine.predict(w, data), expected, rtol=1e-12, atol=0)
    _, grad = model.engine.loss_and_grad(w, data)
    h = 1e-6
    lo = model.engine.loss_and_grad(w - [0, h, 0, 0, 0], data)[0]
    hi = model.engine.loss_and_grad(w + [0, h, 0, 0, 0], data)[0]
    assert grad[1] == pytest.approx((hi - lo) / (2 * h), rel=1e-6)
