"""Card resampling (resample.py) against an independent computation: every resample rebuilt as an explicit list of
reviews (each drawn card's reviews repeated as often as it was drawn) and scored by scikit-learn and metrics.py."""

import numpy as np
import pytest
from sklearn.metrics import log_loss, roc_auc_score

import metrics
import resample

# 5 cards, 14 reviews: card index, recalled, prediction, interval (days), review count i, lapses
CARD = np.array([0, 0, 0, 1, 1, 2, 2, 2, 2, 3, 3, 4, 4, 4])
Y = np.array([1, 1, 0, 1, 0, 1, 1, 1, 0, 1, 1, 0, 1, 1])
P = np.array([0.9, 0.8, 0.7, 0.95, 0.6, 0.9, 0.9, 0.85, 0.5, 0.99, 0.97, 0.4, 0.7, 0.9])
DAYS = np.array([1, 3, 9, 2, 5, 1, 4, 12, 30, 1, 2, 1, 3, 8])
I = np.array([2, 3, 4, 2, 3, 2, 3, 4, 5, 2, 3, 2, 3, 4])
LAPSES = np.array([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1])


def explicit(w_row):
    """The reviews of one resample, written out."""
    idx = np.concatenate([np.flatnonzero(CARD == c).repeat(int(k)) for c, k in enumerate(w_row)])
    return idx


def test_every_resample_equals_the_explicit_review_list():
    W = np.concatenate(list(resample.card_multiplicities(5, 60, seed=3)))
    assert W.shape == (60, 5) and (W.sum(axis=1) == 5).all()
    ll = resample.log_loss(W, CARD, Y, P)
    rb = resample.rmse_bins(W, CARD, Y, P, DAYS, I, LAPSES)
    au = resample.auc(W, CARD, Y, P)
    for b, row in enumerate(W):
        idx = explicit(row)
        y, p = Y[idx], P[idx]
        assert ll[b] == pytest.approx(log_loss(y, p, labels=[0, 1]), rel=1e-12)
        assert rb[b] == pytest.approx(metrics.rmse_bins(y, p, DAYS[idx], I[idx], LAPSES[idx]), rel=1e-12, abs=1e-15)
        if len(set(y)) == 2:
            assert au[b] == pytest.approx(roc_auc_score(y, p), rel=1e-12)
        else:
            assert np.isnan(au[b])


def test_one_resample_by_hand():
    """Cards 0 (twice) and 2 (once), 3 more draws of nothing else: W row = [2, 0, 1, 0, 0] on 3 cards' worth."""
    W = np.array([[2.0, 0, 1, 0, 0]])
    # reviews: card 0 twice (y 1,1,0 / p .9,.8,.7), card 2 once (y 1,1,1,0 / p .9,.9,.85,.5)
    losses = 2 * -(np.log(0.9) + np.log(0.8) + np.log(0.3)) - (2 * np.log(0.9) + np.log(0.85) + np.log(0.5))
    assert resample.log_loss(W, CARD, Y, P)[0] == pytest.approx(losses / 10, rel=1e-14)
    # AUC: positives (weight): .9 x2, .8 x2, .9 x2 (card 2's two .9), .85 x1; negatives: .7 x2, .5 x1
    # every positive (7 weight) is above every negative (3 weight): AUC 1
    assert resample.auc(W, CARD, Y, P)[0] == 1.0


def test_chunks_do_not_change_the_draws():
    a = np.concatenate(list(resample.card_multiplicities(7, 100, seed=5, chunk=250)))
    b = np.concatenate(list(resample.card_multiplicities(7, 100, seed=5, chunk=9)))
    assert (a == b).all()


def test_head_to_head_shares_sum_to_100_and_read_by_hand():
    W = np.concatenate(list(resample.card_multiplicities(5, 400, seed=1)))
    good = P + (Y - P) * 0.5  # every prediction halfway to the outcome
    ll = np.stack([resample.log_loss(W, CARD, Y, p) for p in (good, P, P.copy())], axis=1)
    share = resample.head_to_head(ll)
    off = ~np.eye(3, dtype=bool)
    assert np.allclose((share + share.T)[off], 100)
    assert share[0, 1] == 100 and share[1, 0] == 0  # better on every review, so in every resample
    assert share[1, 2] == 50 and share[2, 1] == 50  # identical predictions tie in every resample


def test_percentile_interval():
    values = np.arange(1001, dtype=float)  # 0..1000: the 0.5th and 99.5th percentiles are 5 and 995
    assert resample.interval(values) == pytest.approx((5.0, 995.0), rel=1e-12)
    assert resample.interval(np.array([np.nan, 1.0, 1.0])) == (1.0, 1.0)
