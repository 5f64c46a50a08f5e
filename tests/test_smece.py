"""metrics.smece (the result line's "smECE") against relplot.smECE itself, which upstream calls, and against a direct
O(n·grid) sum of the same discretised kernel written here; plus values known by hand."""

import math

import numpy as np
import pandas as pd
import pytest

import metrics


def _relplot():
    return pytest.importorskip("relplot", reason="pip install -r requirements.txt (relplot: the reference)")


def _cases():
    """(name, y, p): random and edge cases of the sizes users have, from tiny to 20,000 predictions."""
    rng = np.random.default_rng(38)
    for n in (10, 57, 200, 1000, 5000, 20_000):
        p = rng.uniform(0, 1, n)
        yield f"calibrated-{n}", (rng.uniform(0, 1, n) < p).astype(np.int64), p
        yield f"overconfident-{n}", (rng.uniform(0, 1, n) < 0.5 + 0.6 * (p - 0.5)).astype(np.int64), p
        q = rng.beta(18, 2, n)  # a memory model's predictions: most near 0.9
        yield f"beta-{n}", (rng.uniform(0, 1, n) < q).astype(np.int64), q
        yield f"beta-shifted-{n}", (rng.uniform(0, 1, n) < q - 0.05).astype(np.int64), q
    for n in (300, 20_000):  # calibrated and large: a small smECE, a small bandwidth (a finer grid)
        q = rng.beta(30, 3, n)
        yield f"beta-calibrated-{n}", (rng.uniform(0, 1, n) < q).astype(np.int64), q
    for n in (1, 2, 3, 5):
        p = rng.uniform(0, 1, n)
        yield f"tiny-{n}", rng.integers(0, 2, n), p
    p = rng.uniform(0.8, 1.0, 2000)
    yield "all-recalled", np.ones(2000, dtype=np.int64), p
    yield "none-recalled", np.zeros(2000, dtype=np.int64), p
    p = rng.choice([0.0, 0.25, 0.5, 0.9, 0.95, 1.0], 3000)
    yield "ties-with-0-and-1", (rng.uniform(0, 1, 3000) < np.clip(p, 0.05, 0.95)).astype(np.int64), p
    p = rng.choice([1e-12, 1 - 1e-12, 1e-6, 1 - 1e-6, 0.5], 1000)
    yield "near-0-and-1", (rng.uniform(0, 1, 1000) < p).astype(np.int64), p
    yield "constant", (rng.uniform(0, 1, 500) < 0.6).astype(np.int64), np.full(500, 0.7)
    y = rng.integers(0, 2, 400)
    yield "certain-and-right", y, y.astype(np.float64)
    yield "certain-and-wrong", y, 1.0 - y
    d = rng.uniform(0, 0.003, 400)  # off by < 0.3%: smECE ~0.0015, the search down to its 0.001 floor
    yield "almost-certain-and-right", y, np.where(y == 1, 1 - d, d)


CASES = list(_cases())


def _direct(y, p, eps=0.001):
    """relplot's smECE as a direct sum: every prediction's residual shared linearly between its two grid points, each
    grid point's weight on every other one read off the kernel for it and its mirror images at 0 and 1 (the grid
    index − G//2 sampled as relplot samples its kernel), no convolution; O(n·grid) per bandwidth."""
    f = np.asarray(p, dtype=np.float64)
    r = f - np.asarray(y, dtype=np.float64)

    def ece(sigma):
        g = max(2000, round(20 / sigma)) // 2 + 1
        m = np.arange(-2 * g, 3 * g)  # relplot's kernel sampled at grid index m (its centre at g // 2), 0 off the grid
        table = np.where((m >= 0) & (m < g),
                         np.exp(-((m / (g - 1) - 0.5) ** 2) / (2 * sigma ** 2)) / (math.sqrt(2 * math.pi) * sigma), 0.0)
        k = np.arange(g)
        cell = np.clip((f * (g - 1)).astype(int), 0, g - 2)
        share = f * (g - 1) - cell
        used, which = np.unique(np.r_[cell, cell + 1], return_inverse=True)
        j = used[:, None]  # a row per grid point in use: its weight at every grid point k, itself and its two images
        weights = (table[k + g // 2 - j + 2 * g] + np.where(j >= 1, table[k + g // 2 + j + 2 * g], 0.0)
                   + np.where(j <= g - 2, table[k + g // 2 + j - 2 * (g - 1) + 2 * g], 0.0))
        n = len(f)
        w = (1 - share)[:, None] * weights[which[:n]] + share[:, None] * weights[which[n:]]  # n × g
        smoothed_r, smoothed_1 = r @ w, w.sum(axis=0)
        x = np.linspace(0, 1, max(round(10 / sigma), 200))
        pos = x * (g - 1)
        left = np.clip(pos.astype(int), 0, g - 2)
        a = pos - left

        def at(s):
            return s[left] * (1 - a) + s[left + 1] * a

        density = at(smoothed_1) + 1e-4
        return np.sum(np.abs(at(smoothed_r))) / np.sum(density)

    values = {}

    def fits(sigma):
        if sigma < eps:
            return True
        values[sigma] = ece(sigma)
        return sigma < values[sigma]

    hi, lo = 1.0, 0.0
    if not fits(hi):
        for _ in range(10):
            mid = (hi + lo) / 2
            if fits(mid):
                lo = mid
            else:
                hi = mid
    return values[hi] if hi in values else ece(hi)


@pytest.mark.parametrize("name,y,p", CASES, ids=[c[0] for c in CASES])
def test_smece_equals_relplot(name, y, p):
    relplot = _relplot()
    theirs = float(relplot.smECE(p, y))  # as upstream calls it: (predictions, outcomes)
    ours = metrics.smece(y, p)
    assert ours == pytest.approx(theirs, rel=1e-12, abs=1e-15), name


def test_smece_equals_the_direct_sum():
    for name, y, p in CASES:
        if len(p) > 1000:  # the direct sum is n × grid per bandwidth
            continue
        assert metrics.smece(y, p) == pytest.approx(_direct(y, p), rel=1e-12, abs=1e-15), name


def test_smece_by_hand():
    # every prediction 0.7, 60% recalled: the smoothed residual is 0.1 times the smoothed density everywhere, so
    # smECE = 0.1 · Σ density / Σ (density + 1e-4): 0.1 up to the density floor (relative ~1e-7 for 1,000 reviews)
    y = np.r_[np.ones(600, dtype=np.int64), np.zeros(400, dtype=np.int64)]
    assert metrics.smece(y, np.full(1000, 0.7)) == pytest.approx(0.1, rel=1e-6)
    assert metrics.smece(y, np.full(1000, 0.6)) == pytest.approx(0.0, abs=1e-12)  # Σ residuals: 0 up to rounding
    # predictions equal to the outcomes: no residual at all
    assert metrics.smece(np.array([0, 1, 1, 0]), np.array([0.0, 1.0, 1.0, 0.0])) == 0.0
    # a shift of calibrated predictions by 0.05 away from the ends (no reflection reaches them): ~0.05
    rng = np.random.default_rng(3)
    p = rng.uniform(0.3, 0.7, 20_000)
    y = (rng.uniform(0, 1, 20_000) < p).astype(np.int64)
    assert 0.04 < metrics.smece(y, p + 0.05) < 0.06 and metrics.smece(y, p) < 0.015


def test_smece_is_nan_for_non_finite_predictions():
    assert math.isnan(metrics.smece(np.array([1, 0]), np.array([0.5, np.nan])))


def test_result_line_key_order_and_the_other_metrics_unchanged():
    rng = np.random.default_rng(5)
    n = 3000
    p = rng.beta(18, 2, n)
    y = (rng.uniform(0, 1, n) < p).astype(np.int64)
    rows = pd.DataFrame({"elapsed_days": rng.integers(0, 800, n), "i": rng.integers(1, 60, n),
                         "rmse_bins_lapse": rng.integers(0, 12, n)})
    m = metrics.evaluate(y, p, rows)
    # upstream's order with "smECE" after "RMSE(bins)"; the others keep this repo's order
    assert list(m) == ["RMSE", "LogLoss", "RMSE(bins)", "smECE", "AUC", "ICI", "precision@90", "recall@90", "MBE"]
    assert m["smECE"] == round(metrics.smece(y, p), 6)
    assert m["RMSE(bins)"] == round(metrics.rmse_bins(y, p, rows.elapsed_days, rows.i, rows.rmse_bins_lapse), 6)
    assert m["ICI"] == round(metrics.ici(y, p), 6) and m["AUC"] == round(metrics.auc(y, p), 6)
    assert m["LogLoss"] == round(metrics.log_loss(y, p), 6)
