"""Upstream's `--short --secs` rows of the non-FSRS models ("With same-day reviews" table, issue #38): DASH,
DASH[MCM], DASH[ACT-R], ACT-R, HLR, AVG, Ebisu-v2, RMSE-BINS-EXPLOIT, MOVING-AVG, GRU, GRU-P.

Hand-built revlogs with same-day reviews (elapsed_seconds given): the fractional intervals the models see, and the
features / predictions computed by hand here (DASH's window counts, DASH[ACT-R]'s 0.1-day clamp quirk, HLR's counts
with same-day reviews, ACT-R's fractional cumulative times, AVG / MOVING-AVG over same-day targets); then each row
end to end on a tiny data set."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

import models
from config import ACCEPTS_SECS, RunConfig
from features import FeatureConfig, NotEnoughData, build_features
from revlog_factory import write_user
from split import time_series_folds

DAY = 86400
ROWS = ["DASH", "DASH[MCM]", "DASH[ACT-R]", "ACT-R", "HLR", "AVG", "Ebisu-v2", "RMSE-BINS-EXPLOIT", "MOVING-AVG",
        "GRU", "GRU-P"]


def secs_revlog(cards: list[list[tuple[int, int]]]) -> pd.DataFrame:
    """cards[k] = [(time in seconds, rating), ...]; rows in time order, elapsed_days from the review days
    (day = time // 86400), elapsed_seconds from the times (first review: −1 for both)."""
    rows = []
    for cid, reviews in enumerate(cards):
        prev = None
        for ts, rating in reviews:
            rows.append({"card_id": cid, "rating": rating, "_ts": ts,
                         "elapsed_days": -1 if prev is None else ts // DAY - prev // DAY,
                         "elapsed_seconds": -1 if prev is None else ts - prev, "duration": 1000, "state": 2})
            prev = ts
    df = pd.DataFrame(rows).sort_values(["_ts", "card_id"], kind="stable")
    return df.drop(columns="_ts").reset_index(drop=True)


# card 0 (DASH): Good at 0, Again 0.05 d later, Good at 0.5 d, Good at 3 d, Good at 8.2 d
CARD_DASH = [(0, 3), (4320, 1), (43200, 3), (3 * DAY, 3), (708480, 3)]
# card 1 (DASH[ACT-R], HLR): Good at 0, Good 0.1 d later (8640 s), Again at 0.15 d, Good at 2.15 d
CARD_ACTR = [(10 * DAY, 3), (10 * DAY + 8640, 3), (10 * DAY + 12960, 1), (12 * DAY + 12960, 3)]
# card 2 (ACT-R): binary fractions of a day, exact in float32: 0, 0.125, 0.375, 1.375 d
CARD_ACT = [(20 * DAY, 3), (20 * DAY + 10800, 3), (20 * DAY + 32400, 2), (21 * DAY + 32400, 1)]
# fillers: whole-day and same-day reviews, failures too
FILLERS = [[(30 * DAY + 100 * k, 3), (30 * DAY + 100 * k + 600, 1 + (k % 3 == 0)), (32 * DAY + 50 * k, 3),
            (32 * DAY + 50 * k + 900, 3 - (k % 2)), (40 * DAY + 7 * k, 4 - (k % 4 == 1) * 3)] for k in range(6)]
CARDS = [CARD_DASH, CARD_ACTR, CARD_ACT] + FILLERS


def secs_data():
    return build_features(secs_revlog(CARDS), FeatureConfig.from_run(RunConfig(algo="DASH", short=True, secs=True)))


def card_targets(data, card):
    """(row index, target interval, history intervals, history ratings) of each target of `card`, in order."""
    out = []
    for k in np.flatnonzero(data.rows["card_id"].to_numpy() == card):
        dt, g = data.history(k)
        out.append((k, float(data.rows["delta_t"].iat[k]), list(dt), list(g)))
    return out


def sigmoid(z):
    return 1 / (1 + math.exp(-z))


def predict_default(name, data):
    return models.create(RunConfig(algo=name, short=True, secs=True)).predict(data)


# --------------------------------------------------------------------------------------- the secs pipeline

@pytest.mark.parametrize("name", ROWS)
def test_rows_accept_secs_and_see_fractional_intervals(name):
    cfg = RunConfig(algo=name, short=True, secs=True)
    assert name in ACCEPTS_SECS and models.model_class(name).accepts_secs
    assert cfg.secs_mode and cfg.include_short and cfg.name == f"{name}-short-secs"
    fcfg = FeatureConfig.from_run(cfg)
    assert fcfg.secs and fcfg.short and not fcfg.equalize
    data = build_features(secs_revlog(CARDS), fcfg)
    # every non-first review is a target, same-day ones included, with its interval in fractional days
    assert [(t[1], t[2]) for t in card_targets(data, 0)] == [
        (0.05, [0.0]), (0.45, [0.0, 0.05]), (2.5, [0.0, 0.05, 0.45]), (5.2, [0.0, 0.05, 0.45, 2.5])]
    assert [t[1] for t in card_targets(data, 1)] == [0.1, 0.05, 2.0]
    assert len(data) == sum(len(c) - 1 for c in CARDS)
    assert (data.rows["elapsed_days"] == 0).sum() == 2 + 2 + 2 + 2 * len(FILLERS)  # same-day targets
    # day mode (--short) keeps none of them as targets
    # (here the day-mode outlier filter removes every first long-term review of these few cards)
    with pytest.raises(NotEnoughData):
        build_features(secs_revlog(CARDS), FeatureConfig.from_run(RunConfig(algo=name, short=True)))


# ------------------------------------------------------------------------------------------- by hand

def test_dash_window_counts_over_fractional_intervals():
    data = secs_data()
    w = [-0.1766, 0.4483, -0.3618, 0.5953, -0.5104, 0.8609, -0.3643, 0.6447, 1.2815]  # DASH-short's init
    # Δ from each earlier review to the target, and x = [n_1, c_1, n_7, c_7, n_30, c_30, n_∞, c_∞]
    expected_x = [
        [1, 1, 1, 1, 1, 1, 1, 1],  # 0.05 d after a Good
        [2, 1, 2, 1, 2, 1, 2, 1],  # Δ 0.5 (Good), 0.45 (Again)
        [0, 0, 3, 2, 3, 2, 3, 2],  # Δ 3, 2.95, 2.5
        [0, 0, 1, 1, 4, 3, 4, 3],  # Δ 8.2, 8.15, 7.7, 5.2
    ]
    p = predict_default("DASH", data)
    for (k, *_), x in zip(card_targets(data, 0), expected_x):
        assert p[k] == pytest.approx(sigmoid(sum(wi * math.log1p(xi) for wi, xi in zip(w, x)) + w[8]), abs=1e-12)
    # DASH[MCM]: each counted review weighs e^{−Δ/τ_W}; with --short it starts from DASH-short's init as well
    tau = [0.2434, 1.9739, 16.0090, 129.8426]
    k, *_ = card_targets(data, 0)[1]
    deltas, succ = [0.5, 0.45], [True, False]
    x = []
    for t in tau:
        x += [sum(math.exp(-d / t) for d in deltas), sum(math.exp(-d / t) for d, s in zip(deltas, succ) if s)]
    assert predict_default("DASH[MCM]", data)[k] == pytest.approx(
        sigmoid(sum(wi * math.log1p(xi) for wi, xi in zip(w, x)) + w[8]), abs=1e-12)


def test_dash_actr_clamp_drops_genuine_deltas_up_to_a_tenth_of_a_day():
    data = secs_data()
    w0, w1, w2, w3, w4 = 1.4164, 0.516, -0.0564, 1.9223, 1.0549
    p = predict_default("DASH[ACT-R]", data)
    (k1, *_), (k2, *_), (k3, *_) = card_targets(data, 1)
    # the review 0.1 d (8640 s) after a Good: its one Δ equals the clamp value and is dropped (upstream's quirk:
    # padding and genuine Δ <= 0.1 alike), so the sum is empty
    assert p[k1] == pytest.approx(sigmoid(w4), abs=1e-12)
    # 0.15 d after the first review (kept), 0.05 d after the second (dropped)
    assert p[k2] == pytest.approx(sigmoid(w0 * math.log1p(max(0.0, 0.15 ** -w1 * w3)) + w4), rel=1e-6)
    # 2.15, 2.05 (Good) and 2.0 (Again) days: all counted
    s = 2.15 ** -w1 * w3 + 2.05 ** -w1 * w3 + 2.0 ** -w1 * w2
    assert p[k3] == pytest.approx(sigmoid(w0 * math.log1p(max(0.0, s)) + w4), rel=1e-6)


def test_dash_actr_deltas_are_upstreams_float32_ones():
    """Δ = sp − cumsum(sp) + cumsum(sp)[−1] in float32 (torch's cumsum sums float32 in double): a same-day review
    late in a long history has its Δ quantized to float32's spacing of the total time."""
    from models.dash import actr_float32_deltas

    rng = np.random.default_rng(3)
    seq = np.concatenate([[0.0], rng.integers(1, 2000 * DAY, 40) / DAY, [75 / DAY, 300 / DAY]])
    t_dt = 200 / DAY
    out = np.empty(len(seq), dtype=np.float32)
    actr_float32_deltas(seq, 0, len(seq), t_dt, out)
    sp = np.concatenate([seq[1:], [t_dt]]).astype(np.float32)
    cs = np.cumsum(sp.astype(np.float64)).astype(np.float32)
    expected = ((sp - cs) + cs[-1]).astype(np.float32)
    assert np.array_equal(out, expected)
    assert abs(float(out[-1]) - t_dt) > 1e-7  # the quantization is real at this scale


def test_hlr_counts_same_day_reviews():
    data = secs_data()
    t1, t2, b = 2.5819, -0.8674, 2.7245
    p = predict_default("HLR", data)
    expected = [(1, 0, 0.1), (2, 0, 0.05), (2, 1, 2.0)]  # (#G>1, #G=1, t) of card 1's targets
    for (k, *_), (ns, nf, t) in zip(card_targets(data, 1), expected):
        h = 2 ** (t1 * math.sqrt(ns) + t2 * math.sqrt(nf) + b)
        assert p[k] == pytest.approx(0.5 ** (t / h), rel=1e-12)


def test_act_r_fractional_cumulative_times():
    data = secs_data()
    a, c, s, thr, h = [round(x, 4) for x in (0.176786766570677, 0.216967308403809, 0.254893976981164,
                                             -0.704205679427144, 0.025)]
    tau = [0.0, 0.125, 0.375, 1.375]
    p = predict_default("ACT-R", data)

    def activation(k, m):
        return math.log(sum(max(1.0, (tau[k] - tau[j]) * 86400 * h) ** -(c * math.exp(m[j]) + a) for j in range(k)))

    for K, (row, *_) in zip(range(1, 4), card_targets(data, 2)):
        m = [-math.inf]
        for k in range(1, K):
            m.append(activation(k, m))
        assert p[row] == pytest.approx(1 / (1 + math.exp((thr - activation(K, m)) / s)), rel=1e-9)


def by_hand_labels():
    """y of every target in time order: every non-first review (same-day ones included), from the card lists."""
    reviews = sorted((ts, cid, r) for cid, card in enumerate(CARDS) for ts, r in card[1:])
    return [int(r > 1) for _, _, r in reviews]


def test_avg_and_moving_avg_over_same_day_targets():
    data = secs_data()
    y = by_hand_labels()
    assert data.rows["y"].tolist() == y
    cfg = RunConfig(algo="AVG", short=True, secs=True)
    folds = time_series_folds(len(y))
    first = folds[0][1][0]
    x, ma = 1.2, []
    for i, yi in enumerate(y):
        ma.append(1 / (1 + math.exp(-x)))
        x = x + 0.3 * (1 - 1 / (1 + math.exp(-x))) if yi else x - 0.3 / (1 + math.exp(-x))
    for tr, te in folds:
        train, test = data.subset(tr), data.subset(te)
        avg = models.create(cfg).fit(train).predict(test)
        assert np.allclose(avg, sum(y[:len(tr)]) / len(tr), rtol=0, atol=1e-15)
        mv = models.create(RunConfig(algo="MOVING-AVG", short=True, secs=True)).fit(train).predict(test)
        assert np.allclose(mv, ma[te[0]:te[-1] + 1], rtol=0, atol=1e-12)
    assert first > 0


def test_rmse_bins_exploit_bins_fractional_intervals():
    """Upstream's get_bin bins the fractional delta_t: round(2.48·3.62^⌊log_3.62 t⌋, 2), so sub-day intervals get
    their own bins, and the ones below ~0.004 d round to the same 0.0 bin."""
    from models.baselines import bin_keys

    rows = pd.DataFrame({"rmse_bins_lapse": [0] * 6, "i": [2] * 6,
                         "delta_t": [0.0005, 0.001, 0.01, 0.05, 0.5, 2.0]})
    by_hand = [round(2.48 * 3.62 ** math.floor(math.log(t) / math.log(3.62)), 2) for t in rows["delta_t"]]
    assert by_hand == [0.0, 0.0, 0.01, 0.05, 0.69, 2.48]
    keys = bin_keys(rows)
    assert keys[0] == keys[1] and len(set(keys.tolist())) == 5


# ----------------------------------------------------------------------------------------- end to end

def tiny_users(root):
    rng = np.random.default_rng(7)
    for user in (1, 2):
        cards = []
        for cid in range(40):
            # first review Good, same-day steps, then 2 days later (one outlier-filter cell for day mode), then a mix
            t0 = int(rng.integers(0, 5)) * DAY + int(rng.integers(0, 40000))
            reviews = [(t0, 3)] + [(t0 + 600 * (k + 1), 3) for k in range(int(rng.integers(0, 3)))]
            t = t0 + 2 * DAY
            reviews.append((t, int(rng.choice([1, 3, 3, 3, 4]))))
            for _ in range(int(rng.integers(1, 5))):
                t += int(rng.choice([int(rng.integers(60, 3600)), int(rng.integers(1, 20)) * DAY + 3600]))
                reviews.append((t, int(rng.choice([1, 3, 3, 3, 4]))))
            cards.append(reviews)
        # user 1's cards table lacks card 0: upstream's day-mode Ebisu-v2 path drops it (join + dropna), its secs
        # path keeps it
        listed = range(1 if user == 1 else 0, len(cards))
        write_user(root, user, secs_revlog(cards),
                   cards=pd.DataFrame({"card_id": list(listed), "note_id": list(listed), "deck_id": [1] * len(listed)}),
                   decks=pd.DataFrame({"deck_id": [1], "parent_id": [0], "preset_id": [1]}))


@pytest.fixture(scope="module")
def tiny_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("secs_rows")
    tiny_users(root)
    return root


def test_each_row_end_to_end(tiny_root, tmp_path):
    from runner import run

    sizes = {}
    for name in ROWS + ["day"]:
        cfg = RunConfig(algo="DASH" if name == "day" else name, short=True, secs=name != "day", data=tiny_root,
                        processes=1, quiet=True, result_dir=tmp_path)
        summary = run(cfg)
        assert summary.exit_code == 0 and summary.done == 2, (name, summary)
        lines = [json.loads(x) for x in (tmp_path / f"{cfg.name}.jsonl").read_text().splitlines()]
        assert all(0 < line["metrics"]["LogLoss"] < 50 for line in lines), name  # the exploit: ~4.6
        sizes[name] = {line["user"]: line["size"] for line in lines}
    day = sizes.pop("day")
    # every row of the table evaluates the same reviews of a user, more than the day-mode rows
    assert all(s == sizes["DASH"] for s in sizes.values()), sizes
    assert all(sizes["DASH"][u] > day[u] for u in day)


def test_ebisu_card_join_is_day_mode_only(tiny_root):
    """Upstream's cards/decks join drops cards through the dropna of create_features' day-mode branch only."""
    from pipeline import prepare_user

    def n_targets(algo, secs):
        return len(prepare_user(1, RunConfig(algo=algo, short=True, secs=secs), tiny_root).data)

    assert n_targets("Ebisu-v2", True) == n_targets("DASH", True)
    assert n_targets("Ebisu-v2", False) < n_targets("DASH", False)


def test_act_r_cumulative_times_are_upstreams_float32_ones():
    """ACT-R's τ: torch.cumsum of the card's float32 intervals (partial sums in double, each rounded to float32),
    Δ = τ_K − τ_i a float32 subtraction; at ~1,500 days the same-day gaps (75 s, 300 s) move by seconds."""
    from models.act_r import target_inputs

    rng = np.random.default_rng(5)
    seq = np.concatenate([[0.0], rng.integers(1, 400 * DAY, 6) / DAY, [75 / DAY]])
    t_dt = np.array([300 / DAY])
    lnd, hist, tgt = target_inputs(seq, np.full(len(seq), 3, np.int8), np.array([0]), np.array([0]), np.array([1]),
                                   np.array([len(seq)]), t_dt)
    tau = np.cumsum(seq.astype(np.float32).astype(np.float64)).astype(np.float32)
    now = np.float32(np.cumsum(np.concatenate([seq, t_dt]).astype(np.float32).astype(np.float64))[-1])
    expected = np.log((now - tau).astype(np.float32).astype(np.float64))
    got = lnd[tgt[0]:tgt[0] + len(seq)]
    assert np.array_equal(got[:-1], expected[:-1]) and got[-1] == expected[-1]
    assert abs(math.exp(got[-1]) - 300 / DAY) * DAY > 0.5  # the 300 s gap, as upstream's float32 sees it
