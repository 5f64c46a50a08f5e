"""FSRS-7 (models/fsrs7.py): forward values by hand, the S0 candidate search and log-anchor fill on hand examples,
the clipper's ordered bounds, training on a real user, row names and counts, upstream-check sizes, the embedded run."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from check_users import CHECK, UPSTREAM
from config import RunConfig, build_parser, config_from_args
from models import fsrs7
from engine.autograd_engine import AutogradEngine
from models.base import ReviewData
from models.fsrs7 import DEFAULT_W, FSRS7
from result_store import read_results
from runner import run

W = DEFAULT_W


# ----------------------------------------------------------------------------------------------- by hand

def hand_r(w, t, s):
    d1, d2, b1, b2, a1, a2, p1, p2 = w[27:35]
    r1 = (1 + (b1 ** (-1 / d1) - 1) * t / s) ** (-d1)
    r2 = (1 + (b2 ** (-1 / d2) - 1) * t / s) ** (-d2)
    u1, u2 = a1 * s ** (-p1), a2 * s ** p2
    return (u1 * r1 + u2 * r2) / (u1 + u2)


def hand_block(w, b, s, d, r, g):
    pls = min(s, w[b + 3] * d ** (-w[b + 4]) * ((s + 1) ** w[b + 5] - 1) * math.exp((1 - r) * w[b + 6]))
    if g == 1:
        return pls
    bonus = (w[b + 7] if g == 2 else 1) * (w[b + 8] if g == 4 else 1)
    return max(pls, s * (1 + math.exp(w[b] - 1.5) * (11 - d) * s ** (-w[b + 1]) * (math.exp((1 - r) * w[b + 2]) - 1)
                         * bonus))


def hand_states(w, reviews):
    """(S, D) after each review of [(t, g), ...] in plain floats (the first review's t is 0)."""
    g0 = reviews[0][1]
    s, d = w[g0 - 1], min(max(w[4] - math.exp(w[5] * (g0 - 1)) + 1, 1), 10)
    out = [(s, d)]
    for t, g in reviews[1:]:
        r = hand_r(w, t, s)
        c = 1 - w[26] * math.exp(-w[25] * t)
        s_new = c * hand_block(w, 7, s, d, r, g) + (1 - c) * hand_block(w, 16, s, d, r, g)
        d0_4 = w[4] - math.exp(3 * w[5]) + 1
        d = min(max(0.01 * d0_4 + 0.99 * (d - w[6] * (g - 3) * (10 - d) / 9), 1), 10)
        s = min(max(s_new, 1e-4), 36500)
        out.append((s, d))
    return out


def one_card(reviews, target_t, target_y=1):
    """ReviewData of one card whose only target follows `reviews`."""
    t = np.array([x[0] for x in reviews] + [target_t], dtype=np.float64)
    g = np.array([x[1] for x in reviews] + [3], dtype=np.int8)
    rows = pd.DataFrame({"seq_start": [0], "seq_pos": [len(reviews)], "delta_t": [target_t], "y": [target_y]})
    return ReviewData(rows, t, g)


HISTORY = [(0.0, 3), (0.004, 1), (2.5, 2), (6.0, 4)]  # Good; Again 6 minutes later; Hard; Easy


def test_forward_values_by_hand():
    """A 4-review history (same-day lapse, Hard, Easy) and a target 9.3 days later, step by step against plain math;
    the same-day review leans on the short-term block (c ≈ 0.01), the others on the long-term one."""
    w = torch.tensor(W, dtype=torch.float64)
    state = fsrs7.init(w, torch.tensor([3]), torch.tensor([0.0], dtype=torch.float64))
    expected = hand_states(W, HISTORY)
    assert (float(state[0]), float(state[1])) == pytest.approx(expected[0], rel=1e-12)
    for (t, g), (s_ref, d_ref) in zip(HISTORY[1:], expected[1:]):
        state = fsrs7.step(w, state, torch.tensor([t], dtype=torch.float64), torch.tensor([g]))
        assert float(state[0]) == pytest.approx(s_ref, rel=1e-12)
        assert float(state[1]) == pytest.approx(d_ref, rel=1e-12)
    p = float(fsrs7.curve(w, state, torch.tensor([9.3], dtype=torch.float64)))
    assert p == pytest.approx(hand_r(W, 9.3, expected[-1][0]), rel=1e-12)
    # the card-major predictor reads the same state for the card's target
    got = AutogradEngine(fsrs7).predict(W, one_card(HISTORY, 9.3))
    assert got[0] == pytest.approx(p, rel=1e-12)


def test_card_major_predictions_equal_a_replay_of_each_history(user8_short):
    """Every target of 400 real rows (several per card, padded cards of different lengths in one batch) read the
    state its own history gives when replayed alone in plain python."""
    data = user8_short.subset(np.arange(400))
    w = list(W)
    w[0:4] = [0.3, 1.1, 3.0, 9.0]
    got = AutogradEngine(fsrs7).predict(w, data)
    for k in range(len(data)):
        t, g = data.history(k)
        s, _ = hand_states(w, list(zip(t.tolist(), g.tolist())))[-1]
        p = min(max(hand_r(w, float(data.rows["delta_t"].iat[k]), s), 1e-4), 0.9999)
        assert got[k] == pytest.approx(p, rel=1e-10)


def test_forward_hand_constants():
    """Spot values worked out on paper: R(S, S) of each power curve is its base, so R(S, S) = (W1·b1 + W2·b2)/(W1+W2);
    and D after a first Good is w4 − e^{2·w5} + 1."""
    s = 4.1283
    u1, u2 = W[31] * s ** -W[33], W[32] * s ** W[34]
    assert hand_r(W, s, s) == pytest.approx((u1 * W[29] + u2 * W[30]) / (u1 + u2), rel=1e-12)
    w = torch.tensor(W, dtype=torch.float64)
    assert float(fsrs7.retention(w, torch.tensor(s, dtype=torch.float64), torch.tensor(s, dtype=torch.float64))) == \
        pytest.approx((u1 * W[29] + u2 * W[30]) / (u1 + u2), rel=1e-12)
    _, d = fsrs7.init(w, torch.tensor([3]), torch.tensor([0.0]))
    assert float(d) == pytest.approx(5.6385 - math.exp(2 * 0.4468) + 1, rel=1e-12)


def test_prediction_clamped():
    """The heavy-tailed default curve stays above 1e−4 even 10 years after S = 1e−4 (R ≈ 0.14); steep curves
    (both decays 0.95) reach the floor."""
    w = torch.tensor(W, dtype=torch.float64)
    state = (torch.tensor([1e-4], dtype=torch.float64), torch.tensor([5.0], dtype=torch.float64))
    t = torch.tensor([3650.0], dtype=torch.float64)
    assert float(fsrs7.curve(w, state, t)) == pytest.approx(hand_r(W, 3650.0, 1e-4), rel=1e-12)
    steep = list(W)
    steep[27] = steep[28] = 0.95
    assert float(fsrs7.curve(torch.tensor(steep, dtype=torch.float64), state, t)) == 1e-4
    state = (torch.tensor([36500.0], dtype=torch.float64), torch.tensor([5.0], dtype=torch.float64))
    assert float(fsrs7.curve(w, state, torch.tensor([1e-3], dtype=torch.float64))) == pytest.approx(0.9999)


def test_clip_orders_s0_and_curve_pairs():
    w = torch.tensor(W, dtype=torch.float64)
    w[0], w[1], w[2], w[3] = 80.0, 3.0, 2.0, 200.0  # w0 above 50, w1 and w2 below their predecessors
    w[27], w[28], w[29], w[30] = 0.2, 0.05, 0.8, 0.6
    w.copy_(torch.clamp(w, torch.tensor(fsrs7.LOWER), torch.tensor(fsrs7.UPPER)))
    w = fsrs7.clip(w)
    assert w[:4].tolist() == [50.0, 50.0, 50.0, 100.0]
    assert w[27:31].tolist() == pytest.approx([0.2, 0.2, 0.8, 0.8])


# ----------------------------------------------------------------------------------------------- S0 search

def test_log_anchor_fill_by_hand():
    """Again and Good known: Hard sits (−3.83+8.09)/(−2.5+8.09) of the way from ln S1 to ln S3; Easy is Good·e^1.5."""
    s1, s3 = 0.05, 5.0
    frac = (-3.83 + 8.09) / (-2.5 + 8.09)
    s2 = math.exp(math.log(s1) + frac * (math.log(s3) - math.log(s1)))
    assert fsrs7.fill_log_anchor({1: s1, 3: s3}) == [s1, round(s2, 4), s3, round(s3 * math.exp(1.5), 4)]
    # Good and Easy known: Hard = Good·e^{a2−a3} = Good·e^{−1.33}, Again = Hard·e^{a1−a2} = Hard·e^{−4.26}
    s2 = 5.0 * math.exp(-1.33)
    s1 = s2 * math.exp(-4.26)
    assert fsrs7.fill_log_anchor({3: 5.0, 4: 20.0}) == [round(s1, 4), round(s2, 4), 5.0, 20.0]


def test_bin_interval():
    minute = 1 / 1440
    got = fsrs7.bin_interval(np.array([1 * minute, 25 * minute, 3.5 / 24, 0.99, 1.7, 12.2]))
    assert got.tolist() == pytest.approx([10 * minute, 20 * minute, 2 / 24, 22 / 24, 1.0, 12.0])


def test_secs_first_review_groups_are_binned():
    """With --secs the first long-term reviews group by binned interval: 12 and 17 minutes share the 10-minute bin,
    1.2 and 1.9 days the 1-day bin; i != 2 rows are not used; the smoothing is applied later, per candidate."""
    rows = pd.DataFrame({"i": [2, 2, 2, 2, 3], "first_rating": [3, 3, 3, 3, 3],
                         "delta_t": [12 / 1440, 17 / 1440, 1.2, 1.9, 5.0], "y": [1, 0, 1, 1, 0]})
    t, mean, n = fsrs7.first_review_groups(rows, secs=True)[3]
    assert t.tolist() == pytest.approx([10 / 1440, 1.0]) and mean.tolist() == [0.5, 1.0] and n.tolist() == [2, 2]
    t, _, n = fsrs7.first_review_groups(rows, secs=False)[3]
    assert len(t) == 4 and n.tolist() == [1, 1, 1, 1]


def test_s0_search_picks_the_generating_curve():
    """First long-term reviews after a first Good, with recall exactly candidate 5's curve at S = 3 on 6 intervals
    and a million reviews each (smoothing and the L1 pull vanish): the search must pick candidate 5 and S3 ≈ 3;
    with only Good known the other S0 are the defaults scaled by S3/w2."""
    cp = fsrs7.CURVE_CANDIDATES[5]
    t = np.array([1.0, 2.0, 4.0, 8.0, 15.0, 30.0])
    recall = np.array([hand_r([0.0] * 27 + list(cp), x, 3.0) for x in t])
    n = 1_000_000
    groups = {3: (t, recall, np.full(len(t), float(n)))}
    totals = [fsrs7.fit_s0(groups, float(recall.mean()), c)[0] for c in fsrs7.CURVE_CANDIDATES]
    assert int(np.argmin(totals)) == 5
    _, s = fsrs7.fit_s0(groups, float(recall.mean()), cp)
    assert s[3] == pytest.approx(3.0, rel=1e-3)
    # the whole initialisation on a table of such rows (1,000 per interval): the plumbing (grouping by interval,
    # smoothing toward the mean recall, the lowest total, the one-rating fill) around the same search
    reps = []
    for x, r in zip(t, recall):
        k = int(round(r * 1000))
        reps += [(x, 1)] * k + [(x, 0)] * (1000 - k)
    rows = pd.DataFrame({"i": 2, "first_rating": "3", "delta_t": [a for a, _ in reps], "y": [b for _, b in reps]})
    w = fsrs7.initial_weights(ReviewData(rows, np.zeros(0), np.zeros(0, np.int8)))
    y_bar = rows["y"].mean()
    table = {3: (t, np.array([round(r * 1000) / 1000 for r in recall]), np.full(len(t), 1000.0))}
    fits = [fsrs7.fit_s0(table, y_bar, c) for c in fsrs7.CURVE_CANDIDATES]
    k = int(np.argmin([f[0] for f in fits]))
    assert w[27:] == list(fsrs7.CURVE_CANDIDATES[k])
    assert w[2] == pytest.approx(fits[k][1][3], rel=1e-6) and w[2] == pytest.approx(3.0, rel=0.1)
    assert w[0] / W[0] == pytest.approx(w[2] / W[2]) and w[3] / W[3] == pytest.approx(w[2] / W[2])
    assert w[4:27] == W[4:27]


# ----------------------------------------------------------------------------------------------- training, rows

def test_training_lowers_loss_on_a_real_user(user8_short):
    """The first 1,200 targets of upstream-check user 8: trained weights fit better than the S0-initialised ones."""
    train = user8_short.subset(np.arange(1200))
    model = FSRS7(RunConfig(algo="FSRS-7"))
    w0 = fsrs7.initial_weights(train)

    def logloss(w):
        p = AutogradEngine(fsrs7).predict(w, train)
        y = train.rows["y"].to_numpy()
        return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))

    model.fit(train)
    assert len(model.w) == 35
    assert logloss(model.w) < logloss(w0) - 0.005
    assert model.w[:4] == sorted(model.w[:4]) and model.w[27] <= model.w[28] and model.w[29] <= model.w[30]


@pytest.mark.parametrize("flags, name, n_params", [([], "FSRS-7", 35), (["--recency"], "FSRS-7-recency", 35),
                                                   (["--default"], "FSRS-7-default", 0), (["--S0"], "FSRS-7-S0", 12),
                                                   (["--short", "--secs", "--equalize_test_with_non_secs"], "FSRS-7",
                                                    35)])
def test_row_names_and_parameter_counts(flags, name, n_params):
    """The published flags are built in: upstream's command line names the same row."""
    cfg = config_from_args(build_parser("t", "FSRS-6", None).parse_args(["--model", "FSRS-7", *flags]))
    assert cfg.name == name and cfg.include_short and cfg.secs_mode and cfg.equalize_mode
    assert FSRS7(cfg).n_params == n_params


def test_recency_weights():
    w = fsrs7.recency_weights(5)
    assert w.tolist() == pytest.approx([0.0667 + 0.9333 * x ** 11.25 for x in (0, 0.25, 0.5, 0.75, 1)])


def test_upstream_check_sizes(tmp_path):
    """Same targets as the other same-day-history rows (FSRS-6) on the upstream-check users (default weights: the
    size does not depend on training)."""
    cfg = RunConfig(algo="FSRS-7", data=CHECK, processes=1, result_dir=tmp_path, quiet=True, default=True)
    assert run(cfg).exit_code == 0
    lines, _ = read_results(tmp_path / "FSRS-7-default.jsonl")
    assert {line["user"]: line["size"] for line in lines} == {
        int(u): ref["size"] for u, ref in UPSTREAM["FSRS-6"].items()}


def test_runs_on_embedded_data(tmp_path):
    cfg = RunConfig(algo="FSRS-7", processes=1, users=[3], result_dir=tmp_path, quiet=True, recency=True)
    summary = run(cfg)
    assert summary.done == 1 and not summary.failed
    lines, _ = read_results(tmp_path / "FSRS-7-recency.jsonl")
    assert 0 < lines[0]["metrics"]["LogLoss"] < 1 and len(lines[0]["parameters"]["0"]) == 35


def test_s0_fit_equals_upstreams_minimize_call(user8_short):
    """The candidate search's per-rating fits (scipy's L-BFGS-B driven directly, models/fsrs_init.fit_one_rating)
    give exactly what upstream's `minimize` call gives, S0 and the loss that ranks the candidates, on the first
    fold's training rows of a real user, every candidate, day and secs grouping."""
    train = user8_short.subset(np.arange(len(user8_short) // 6))
    avg = float(train.rows["y"].mean())
    for secs in (False, True):
        groups = fsrs7.first_review_groups(train.rows, secs)
        first = train.rows.loc[train.rows["i"] == 2, ["first_rating", "delta_t", "y"]].copy()  # upstream's groupby
        first["first_rating"] = first["first_rating"].astype(int)
        if secs:
            first["delta_t"] = fsrs7.bin_interval(first["delta_t"].to_numpy())
        agg = first.groupby(["first_rating", "delta_t"], sort=True)["y"].agg(["mean", "count"]).reset_index()
        assert sorted(groups) == sorted(agg["first_rating"].unique())
        for g, part in agg.groupby("first_rating"):
            for got, col in zip(groups[g], ("delta_t", "mean", "count")):
                assert got.tolist() == part[col].astype(float).tolist()
        reference = [fsrs7.fit_s0(groups, avg, cp, reference=True) for cp in fsrs7.CURVE_CANDIDATES]
        for cp, ref in zip(fsrs7.CURVE_CANDIDATES, reference):
            assert fsrs7.fit_s0(groups, avg, cp) == ref
        assert fsrs7.fit_s0_all(groups, avg) == reference  # the search's lockstep form, bit for bit


def test_s0_search_in_lockstep_equals_one_candidate_at_a_time(user8_short):
    """fit_s0_all (all 16 candidates' L-BFGS-B runs stepped together, one numpy evaluation per round) gives the
    very floats of fit_s0 run candidate by candidate, on two more folds' training rows of a real user (the first is
    in the test above), day and secs grouping, smoothed toward the mean recall or toward 0.5."""
    n = len(user8_short)
    for end, avg in ((n // 2, None), (5 * n // 6, 0.5)):
        rows = user8_short.subset(np.arange(end)).rows
        avg = float(rows["y"].mean()) if avg is None else avg
        for secs in (False, True):
            groups = fsrs7.first_review_groups(rows, secs)
            one = [fsrs7.fit_s0(groups, avg, cp) for cp in fsrs7.CURVE_CANDIDATES]
            assert fsrs7.fit_s0_all(groups, avg) == one
