"""FSRS-6's compiled trainer: the engine plug-in generated from its torch equations (models/fsrs6.py) through its
(predict / loss_and_grad / fit), against a float64 torch autograd reference written from the equations, and
bench/simulate.py."""

from __future__ import annotations

import math
import sys

import numpy as np
import pandas as pd
import pytest
import torch

from bench.simulate import simulate_user
from features import FeatureConfig, build_features
from models import fsrs6 as ff
from engine.seq_engine import Cards
from models.base import ReviewData


# ------------------------------------------------------------------------------------------------ fixtures

@pytest.fixture(scope="module")
def user_data() -> ReviewData:
    return build_features(simulate_user(6000, seed=3), FeatureConfig(short=True))


def random_data(seed: int, n_cards: int = 25, max_len: int = 12) -> ReviewData:
    """Histories with every branch: same-day reviews of all grades, lapses, long gaps; targets = delta_t > 0."""
    rng = np.random.default_rng(seed)
    seq_dt, seq_g, rows = [], [], []
    for c in range(n_cards):
        start = len(seq_dt)
        for k in range(int(rng.integers(2, max_len))):
            dt = 0.0 if k == 0 else float(rng.choice([0, 0, 1, 2, 5, 20, 100, 1000, 20000]))
            g = int(rng.choice([1, 2, 3, 4], p=[0.25, 0.15, 0.45, 0.15]))
            seq_dt.append(dt)
            seq_g.append(g)
            if k > 0 and dt > 0:
                rows.append({"card_id": c, "delta_t": dt, "y": int(g > 1), "seq_start": start, "seq_pos": k})
    rows = pd.DataFrame(rows).sample(frac=1.0, random_state=seed).reset_index(drop=True)  # any row order
    return ReviewData(rows, np.array(seq_dt), np.array(seq_g, dtype=np.int8))


def random_w(rng) -> np.ndarray:
    return ff.LOWER + (ff.UPPER - ff.LOWER) * rng.uniform(0.02, 0.98, 21)


# ------------------------------------------------------------------------------------------------ torch reference

def torch_objective(w, w_init, data: ReviewData, weights=None, clamp_grade=3, max_seq_len=None):
    """The objective written straightforwardly: one recurrence from scratch per target row (float64 autograd)."""
    sigma = torch.tensor(ff.SIGMA, dtype=torch.float64)
    rows = data.rows
    loss = torch.zeros((), dtype=torch.float64)
    preds = []
    for k in range(len(rows)):
        t_hist, g_hist = data.history(k)
        if max_seq_len is not None and len(t_hist) > max_seq_len:
            preds.append(None)
            continue
        g0 = int(g_hist[0])
        s = w[g0 - 1].clamp(ff.S_MIN, ff.S_MAX)
        d = (w[4] - torch.exp(w[5] * (g0 - 1)) + 1).clamp(1, 10)
        for t, g in zip(t_hist[1:], g_hist[1:]):
            t, g = float(t), int(g)
            r = (1 + (0.9 ** (-1 / w[20]) - 1) * t / s) ** (-w[20])
            if t < 1:
                sinc = torch.exp(w[17] * (g - 3 + w[18])) * s.pow(-w[19])
                ns = s * (sinc.clamp(min=1) if g >= clamp_grade else sinc)
            elif g > 1:
                hb = w[15] if g == 2 else (w[16] if g == 4 else 1.0)
                ns = s * (1 + torch.exp(w[8]) * (11 - d) * s.pow(-w[9]) * (torch.exp(w[10] * (1 - r)) - 1) * hb)
            else:
                sf = w[11] * d.pow(-w[12]) * ((s + 1).pow(w[13]) - 1) * torch.exp(w[14] * (1 - r))
                ns = torch.minimum(sf, s / torch.exp(w[17] * w[18]))
            nd = d - w[6] * (g - 3) * (10 - d) / 9
            nd = w[7] * (w[4] - torch.exp(3 * w[5]) + 1) + (1 - w[7]) * nd
            s, d = ns.clamp(ff.S_MIN, ff.S_MAX), nd.clamp(1, 10)
        t = float(rows["delta_t"].iat[k])
        p = (1 + (0.9 ** (-1 / w[20]) - 1) * t / s) ** (-w[20])
        preds.append(p)
        y = float(rows["y"].iat[k])
        wt = 1.0 if weights is None else float(weights[k])
        loss = loss - wt * (y * torch.log(p) + (1 - y) * torch.log(1 - p))
    w_init_t = torch.as_tensor(w_init, dtype=torch.float64)
    loss = loss + torch.sum(((w - w_init_t) / sigma) ** 2)
    return loss, preds


def torch_loss_grad(w_np, w_init, data, **kw):
    w = torch.tensor(w_np, dtype=torch.float64, requires_grad=True)
    loss, _ = torch_objective(w, w_init, data, **kw)
    loss.backward()
    return float(loss.detach()), w.grad.numpy().copy()


# ------------------------------------------------------------------------------------------------ forward

def test_forward_matches_fsrs_rs_python():
    fsrs_rs = pytest.importorskip("fsrs_rs_python")
    w = np.array(fsrs_rs.DEFAULT_PARAMETERS, dtype=np.float64)
    model = fsrs_rs.FSRS(list(fsrs_rs.DEFAULT_PARAMETERS))
    data = random_data(11, n_cards=40, max_len=16)
    # fsrs-rs >= 0.9 floors the same-day growth at 1 from Hard up (G >= 2)
    ours = ff.predict(w, data, floor_grade=2)
    rows = data.rows
    factor = 0.9 ** (-1 / w[20]) - 1
    worst = 0.0
    for k in range(len(rows)):
        t_hist, g_hist = data.history(k)
        item = fsrs_rs.FSRSItem([fsrs_rs.FSRSReview(int(g), int(t)) for t, g in zip(t_hist, g_hist)])
        s = model.memory_state(item).stability
        r = (1 + factor * rows["delta_t"].iat[k] / s) ** (-w[20])
        worst = max(worst, abs(r - ours[k]))
    assert worst < 1e-6


def test_predict_equals_naive_per_row(user_data):
    rng = np.random.default_rng(5)
    data = user_data.subset(np.arange(300))
    for w in (ff.DEFAULT_W, random_w(rng)):
        fast = ff.predict(w, data)
        _, preds = torch_objective(torch.tensor(w, dtype=torch.float64), w, data)
        naive = np.array([float(p) for p in preds])
        np.testing.assert_allclose(fast, naive, rtol=0, atol=1e-9)


def test_predict_any_row_order_and_subset(user_data):
    perm = np.random.default_rng(0).permutation(len(user_data))[:500]
    sub = user_data.subset(perm)
    np.testing.assert_array_equal(ff.predict(ff.DEFAULT_W, sub), ff.predict(ff.DEFAULT_W, user_data)[perm])


# ------------------------------------------------------------------------------------------------ gradients

@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_loss_and_grad_vs_autograd_random(seed):
    rng = np.random.default_rng(100 + seed)
    data = random_data(seed)
    w = random_w(rng)
    w_init = ff.clip_weights(ff.DEFAULT_W * np.exp(rng.normal(0, 0.2, 21)))
    weights = rng.uniform(0.25, 1.0, len(data))
    loss, grad = ff.loss_and_grad(w, w_init, ff.SIGMA, data, weights)
    ref_loss, ref_grad = torch_loss_grad(w, w_init, data, weights=weights)
    assert loss == pytest.approx(ref_loss, rel=1e-10)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-8, atol=1e-10 * np.abs(ref_grad).max())


CLAMPED = {
    # S hits 0.001 (w0 at its bound, same-day Again shrinks it), D saturates at 1 and 10 (w6 = 4), D0(Again)
    # clamps at 10 (w4 = 10), the lapse minimum picks S/e^{w17 w18} (w17 = w18 = 2), large S reaches 36500.
    "low_s_saturated_d": {0: 0.001, 4: 10.0, 6: 4.0, 17: 2.0, 18: 2.0, 19: 0.8},
    "huge_s": {3: 100.0, 8: 4.5, 9: 0.0, 10: 3.5, 16: 6.0, 20: 0.8, 6: 0.001},
    "bounds_mix": {5: 4.0, 7: 0.75, 11: 5.0, 12: 0.25, 13: 0.9, 14: 4.0, 15: 1.0, 17: 0.0, 18: 0.0, 19: 0.0},
}


@pytest.mark.parametrize("case", sorted(CLAMPED))
@pytest.mark.parametrize("clamp_grade", [2, 3])
def test_loss_and_grad_vs_autograd_clamped(case, clamp_grade):
    w = ff.DEFAULT_W.copy()
    for j, v in CLAMPED[case].items():
        w[j] = v
    data = random_data(7, n_cards=30, max_len=14)
    loss, grad = ff.loss_and_grad(w, ff.DEFAULT_W, ff.SIGMA, data, floor_grade=clamp_grade)
    ref_loss, ref_grad = torch_loss_grad(w, ff.DEFAULT_W, data, clamp_grade=clamp_grade)
    assert loss == pytest.approx(ref_loss, rel=1e-10)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-8, atol=1e-10 * np.abs(ref_grad).max())


def test_clamped_cases_really_clamp():
    """The CLAMPED vectors do reach the clamps they are meant to exercise (S at both ends, D at both ends)."""
    data = random_data(7, n_cards=30, max_len=14)
    k = ff.engine().k
    cards = Cards(data)
    states = np.zeros((cards.max_n, sys.modules[ff.plugin()].N_STATE))
    seen = set()
    for case in CLAMPED:
        w = np.array(ff.DEFAULT_W)
        for j, v in CLAMPED[case].items():
            w[j] = v
        wc = k.precompute(w, np.array([3.0]))
        for ci in range(len(cards.c_start)):
            n = int(cards.c_n[ci])
            k.forward_card(wc, cards.seq_dt, cards.seq_g, cards.c_start[ci], n, states)
            S, D = states[:n, 0], states[:n, 1]
            seen |= {"s_min"} if (S == ff.S_MIN).any() else set()
            seen |= {"s_max"} if (S == ff.S_MAX).any() else set()
            seen |= {"d_min"} if (D == 1.0).any() else set()
            seen |= {"d_max"} if (D == 10.0).any() else set()
    assert seen == {"s_min", "s_max", "d_min", "d_max"}


def test_fused_target_loss_equals_bce_of_predictions(user_data):
    """The plug-in's ln-R target loss (target_loss / target_loss_vjp) is the plain BCE of the predicted R."""
    data = user_data.subset(np.arange(2000))
    w = random_w(np.random.default_rng(12))
    p = ff.predict(w, data)
    y = data.rows["y"].to_numpy(np.float64)
    ok = ~np.isnan(p)
    bce = -np.sum(y[ok] * np.log(p[ok]) + (1 - y[ok]) * np.log1p(-p[ok]))
    sigma = np.full(21, np.inf)
    loss, _ = ff.loss_and_grad(w, w, sigma, data)
    assert loss == pytest.approx(bce, rel=1e-12)
    cards = Cards(data)
    fwd = ff.engine().k.loss_cards(w, np.array([3.0]), *cards.args(), cards.t_y, cards.t_wt, cards.max_n)
    assert fwd == pytest.approx(bce, rel=1e-12)


def test_grad_vs_central_differences(user_data):
    data = user_data.subset(np.arange(400))
    w = random_w(np.random.default_rng(9))
    _, grad = ff.loss_and_grad(w, ff.DEFAULT_W, ff.SIGMA, data)
    for j in range(21):
        h = 1e-6 * max(1.0, abs(w[j]))
        e = np.zeros(21)
        e[j] = h
        num = (ff.loss_and_grad(w + e, ff.DEFAULT_W, ff.SIGMA, data)[0]
               - ff.loss_and_grad(w - e, ff.DEFAULT_W, ff.SIGMA, data)[0]) / (2 * h)
        assert grad[j] == pytest.approx(num, rel=1e-5, abs=1e-5)


def test_max_seq_len_masks_rows_from_loss():
    data = random_data(4, n_cards=30, max_len=14)
    short = data.rows["seq_pos"].to_numpy() <= 5
    a = ff.loss_and_grad(ff.DEFAULT_W, ff.DEFAULT_W, ff.SIGMA, data, max_seq_len=5)
    b = ff.loss_and_grad(ff.DEFAULT_W, ff.DEFAULT_W, ff.SIGMA, data.subset(short))
    assert a[0] == pytest.approx(b[0], rel=1e-12)
    np.testing.assert_allclose(a[1], b[1], rtol=1e-12)


# ------------------------------------------------------------------------------------------------ fit

class Cfg:
    n_epoch = 5
    batch_size = 512
    max_seq_len = 64
    recency = False


@pytest.mark.parametrize("recency", [False, True])
def test_fit_lowers_objective_and_respects_bounds(user_data, recency):
    cfg = Cfg()
    cfg.recency = recency
    w_init = ff.DEFAULT_W.copy()
    weights = ff.recency_weights(len(user_data)) if recency else None
    before = ff.loss_and_grad(w_init, w_init, ff.SIGMA, user_data, weights, max_seq_len=64)[0]
    w = ff.fit(w_init, ff.SIGMA, user_data, cfg)
    after = ff.loss_and_grad(w, w_init, ff.SIGMA, user_data, weights, max_seq_len=64)[0]
    assert after < before
    assert np.all(w >= ff.LOWER) and np.all(w <= ff.UPPER)
    w_lb = ff.fit(w_init, ff.SIGMA, user_data, cfg, method="lbfgs")
    assert np.all(w_lb >= ff.LOWER) and np.all(w_lb <= ff.UPPER)
    assert ff.loss_and_grad(w_lb, w_init, ff.SIGMA, user_data, weights, max_seq_len=64)[0] < before


def test_fit_is_reproducible(user_data):
    a = ff.fit(ff.DEFAULT_W, ff.SIGMA, user_data, Cfg())
    b = ff.fit(list(ff.DEFAULT_W), list(ff.SIGMA), user_data, Cfg())
    np.testing.assert_array_equal(a, b)
    c = ff.fit(ff.DEFAULT_W, ff.SIGMA, user_data, Cfg(), seed=7)
    assert not np.array_equal(a, c)
    d = ff.fit(ff.DEFAULT_W, ff.SIGMA, user_data, Cfg(), check_every_epoch=True)
    obj = [ff.loss_and_grad(x, ff.DEFAULT_W, ff.SIGMA, user_data, max_seq_len=64)[0] for x in (a, d)]
    assert obj[1] <= obj[0] + 1e-9 * abs(obj[0])  # more checkpoints can only find an equal or lower objective


def test_fit_zero_epochs_and_no_rows(user_data):
    cfg = Cfg()
    cfg.n_epoch = 0
    np.testing.assert_array_equal(ff.fit(ff.DEFAULT_W, ff.SIGMA, user_data, cfg), ff.DEFAULT_W)
    cfg = Cfg()
    cfg.max_seq_len = 0  # every row masked
    np.testing.assert_array_equal(ff.fit(ff.DEFAULT_W, ff.SIGMA, user_data, cfg), ff.DEFAULT_W)


# ------------------------------------------------------------------------------------------------ simulator

def test_simulator_deterministic_and_sized():
    a = simulate_user(3000, seed=5)
    b = simulate_user(3000, seed=5)
    pd.testing.assert_frame_equal(a, b)
    assert len(a) == 3000
    assert not a.equals(simulate_user(3000, seed=6))


def test_simulator_layout():
    df = simulate_user(20000, seed=2)
    assert list(df.columns) == ["card_id", "day_offset", "rating", "state", "duration", "elapsed_days",
                                "elapsed_seconds"]
    assert df["rating"].between(1, 4).all()
    assert df["day_offset"].is_monotonic_increasing
    first = ~df["card_id"].duplicated()
    assert (df.loc[first, "state"] == 0).all() and (df.loc[~first, "state"] != 0).all()
    assert (df.loc[first, "elapsed_days"] == -1).all() and (df.loc[first, "elapsed_seconds"] == -1).all()
    prev_day = df.groupby("card_id")["day_offset"].shift()
    later = ~first
    assert (df.loc[later, "elapsed_days"] == df.loc[later, "day_offset"] - prev_day[later]).all()
    assert (df.loc[later, "elapsed_seconds"] > 0).all()
    same_day = (df.loc[later, "elapsed_days"] == 0).mean()
    assert 0.05 < same_day < 0.5  # learning steps give same-day reviews
    freq = df["rating"].value_counts(normalize=True)
    assert 0.08 < freq[1] < 0.2 and 0.02 < freq[2] < 0.12 and 0.02 < freq[4] < 0.12
    assert math.isclose(freq.sum(), 1.0)


def _interval_stats(df):
    """(share of failed interval reviews, median interval in days, share of days with a session in the span)."""
    later = df[df["elapsed_days"] > 0]
    span = df["day_offset"].max() - df["day_offset"].min() + 1
    return (later["rating"] == 1).mean(), later["elapsed_days"].median(), df["day_offset"].nunique() / span


def test_simulator_realistic_closer_to_real_collections():
    """--realistic users skip days (overdue reviews, longer intervals) and fail fewer interval reviews than the
    default users of the same seeds; the bands bracket the two substantial embedded users (2-4 % failed, median
    interval 5 and 25 days, sessions on 13 % and 88 % of days) loosely, as the simulator's memory model is FSRS-6."""
    fails, fails0 = [], []
    for seed in range(4):
        real = simulate_user(20000, seed=seed, realistic=True)
        default = simulate_user(20000, seed=seed)
        assert len(real) == 20000 and real["day_offset"].is_monotonic_increasing
        fail, median, active = _interval_stats(real)
        fail0, median0, active0 = _interval_stats(default)
        assert active0 == 1.0 and 0.1 < active < 0.97
        assert 0.02 < fail < 0.13
        assert 5 <= median <= 40 and median > median0
        fails.append(fail)
        fails0.append(fail0)
    assert np.mean(fails) < np.mean(fails0)  # per user the draws differ; on average retention is higher
