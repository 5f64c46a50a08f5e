"""FSRS-6: the recurrence by hand, agreement with the peer packages, S0 initialisation, one-pass prediction."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from config import RunConfig
from models import fsrs_init
from models.base import InadequateData, ReviewData
from upstream.training import pad_histories
from models.fsrs6 import CLIP_HI, CLIP_LO, DEFAULT_W, FSRS6, forgetting_curve
from models import fsrs6
from models.fsrs6 import first_state
from upstream.fsrs6_torch import stability_sequence

W = [0.212, 1.2931, 2.3065, 8.2956, 6.4133, 0.8334, 3.0194, 0.001, 1.8722, 0.1666, 0.796, 1.4835, 0.0614, 0.2629,
     1.6483, 0.6014, 1.8729, 0.5425, 0.0912, 0.0658, 0.1542]
# A learner who differs from the defaults (so training has something to find).
W_OTHER = list(W)
W_OTHER[8], W_OTHER[9], W_OTHER[11], W_OTHER[17], W_OTHER[19], W_OTHER[20] = 2.3, 0.3, 2.2, 0.8, 0.3, 0.3


# ------------------------------------------------------------------------------------------------------ helpers
def make_data(cards, times=None) -> ReviewData:
    """cards[c] = [(delta_t, rating), ...] (first delta_t 0); one target per review with delta_t > 0.

    `times[c][k]` (optional) orders the targets of all cards in time; default: card by card."""
    seq_dt, seq_r, rows = [], [], []
    for c, reviews in enumerate(cards):
        start = len(seq_dt)
        n_long = 1
        for k, (dt, g) in enumerate(reviews):
            if k > 0 and dt > 0:
                n_long += 1
                rows.append({"card_id": c, "review_th": 0 if times is None else times[c][k], "delta_t": float(dt),
                             "y": int(g > 1), "rating": int(g), "i": n_long, "first_rating": int(reviews[0][1]),
                             "seq_start": start, "seq_pos": k})
        seq_dt.extend(float(dt) for dt, _ in reviews)
        seq_r.extend(int(g) for _, g in reviews)
    df = pd.DataFrame(rows)
    if times is not None:
        df = df.sort_values(["review_th", "card_id"], kind="stable").reset_index(drop=True)
    df["review_th"] = np.arange(1, len(df) + 1)
    return ReviewData(df, np.array(seq_dt, dtype=np.float64), np.array(seq_r, dtype=np.int8))


def simulate(n_cards: int, seed: int = 0, max_reviews: int = 30, same_day_hard: bool = False,
             first_ratings=(1, 2, 3, 4), w_true=None):
    """Cards reviewed by a learner following FSRS-6 with `w_true`; returns (cards, times) for make_data."""
    rng = np.random.default_rng(seed)
    w_true = np.array(W if w_true is None else w_true, dtype=np.float64)
    wt = torch.tensor(w_true)
    cards, times = [], []
    for _ in range(n_cards):
        day = float(rng.integers(0, 200))
        g0 = int(rng.choice(first_ratings))
        reviews, stamps = [(0, g0)], [day * 10]
        s, d = first_state(wt, torch.tensor([float(g0)], dtype=torch.float64))
        while len(reviews) < max_reviews and day < 500:
            if rng.random() < 0.15:  # a same-day repeat
                dt = 0
                g = int(rng.choice([1, 2, 3], p=[0.3, 0.2, 0.5]) if same_day_hard else rng.choice([1, 3], p=[0.3, 0.7]))
            else:
                dt = int(max(1, round(float(s[0]) * rng.uniform(0.3, 3.0))))
                r = forgetting_curve(dt, float(s[0]), w_true[20])
                g = int(rng.choice([2, 3, 4], p=[0.15, 0.75, 0.1])) if rng.random() < r else 1
            s, d = fsrs6.torch_step(wt, (s, d), torch.tensor([float(dt)], dtype=torch.float64),
                                    torch.tensor([float(g)], dtype=torch.float64))
            day += dt
            reviews.append((dt, g))
            stamps.append(day * 10 + len(reviews) / 100)
        cards.append(reviews)
        times.append(stamps)
    return cards, times


def r_fsrs_rs(w, data: ReviewData) -> np.ndarray:
    rs = pytest.importorskip("fsrs_rs_python")
    model = rs.FSRS(list(w))
    out = np.empty(len(data))
    for k in range(len(data)):
        t, g = data.history(k)
        item = rs.FSRSItem([rs.FSRSReview(int(gg), int(tt)) for tt, gg in zip(t, g)])
        s = model.memory_state(item).stability
        out[k] = (1 + (0.9 ** (-1 / w[20]) - 1) * data.rows["delta_t"].iat[k] / s) ** (-w[20])
    return out


def opt_frame(data: ReviewData) -> pd.DataFrame:
    """The fsrs-optimizer view of the targets: t_history / r_history strings, delta_t, y, i, tensor."""
    fo = pytest.importorskip("fsrs_optimizer")
    t_hist, r_hist = [], []
    for k in range(len(data)):
        t, g = data.history(k)
        t_hist.append(",".join(str(int(x)) for x in t))
        r_hist.append(",".join(str(int(x)) for x in g))
    df = pd.DataFrame({"card_id": data.rows["card_id"], "review_time": data.rows["review_th"],
                       "t_history": t_hist, "r_history": r_hist, "delta_t": data.rows["delta_t"].astype(int),
                       "y": data.rows["y"], "i": data.rows["i"]})
    df["tensor"] = [fo.lineToTensor((t, r)) for t, r in zip(t_hist, r_hist)]
    return df


def has_same_day_hard(data: ReviewData) -> np.ndarray:
    """Per target: does its history contain a same-day (t = 0, not first) Hard review?"""
    out = np.zeros(len(data), dtype=bool)
    for k in range(len(data)):
        t, g = data.history(k)
        out[k] = bool(np.any((t[1:] == 0) & (g[1:] == 2)))
    return out


# ------------------------------------------------------------------------------------------------- defaults
def test_default_weights_match_spec_and_peers():
    assert DEFAULT_W == W
    rs = pytest.importorskip("fsrs_rs_python")
    np.testing.assert_allclose(rs.DEFAULT_PARAMETERS, W, rtol=1e-6, atol=1e-7)
    fo = pytest.importorskip("fsrs_optimizer")
    assert list(fo.DEFAULT_PARAMETER) == W


def test_n_params_and_default_mode():
    assert FSRS6(RunConfig()).n_params == 21
    assert FSRS6(RunConfig(two_buttons=True)).n_params == 17
    assert FSRS6(RunConfig(S0=True)).n_params == 4
    assert FSRS6(RunConfig(default=True)).n_params == 0
    m = FSRS6(RunConfig(default=True)).fit(make_data([[(0, 3), (2, 3)]]))
    assert m.parameters() == W


# ------------------------------------------------------------------------------------------------ by hand
def _hand_R(history, t_now, w=W):
    """FSRS-6 written out in plain float64 Python, short-term floor for G >= 3 only."""
    decay = w[20]
    F = 0.9 ** (-1 / decay) - 1

    def R(t, s):
        return (1 + F * t / s) ** (-decay)

    def d0(g):
        return w[4] - math.exp(w[5] * (g - 1)) + 1

    g0 = history[0][1]
    s, d = w[g0 - 1], min(max(d0(g0), 1), 10)
    for t, g in history[1:]:
        r = R(t, s)
        if t < 1:
            sinc = math.exp(w[17] * (g - 3 + w[18])) * s ** (-w[19])
            s_new = s * (max(sinc, 1) if g >= 3 else sinc)
        elif g > 1:
            h = w[15] if g == 2 else 1
            b = w[16] if g == 4 else 1
            s_new = s * (1 + math.exp(w[8]) * (11 - d) * s ** (-w[9]) * (math.exp(w[10] * (1 - r)) - 1) * h * b)
        else:
            s_new = min(w[11] * d ** (-w[12]) * ((s + 1) ** w[13] - 1) * math.exp(w[14] * (1 - r)),
                        s / math.exp(w[17] * w[18]))
        d_new = d + (-w[6] * (g - 3)) * (10 - d) / 9
        d_new = w[7] * d0(4) + (1 - w[7]) * d_new
        s, d = min(max(s_new, 0.001), 36500), min(max(d_new, 1), 10)  # S from the OLD d (used above)
    return R(t_now, s), s, d


def test_forward_matches_hand_computation():
    # Card A: Good, Good after 3 days, lapse after 8, same-day Good, Good after 2; target 5 days later.
    # Card B: Hard, same-day Hard (growth factor < 1 is NOT floored: G >= 3 rule), Easy after 4; target after 10.
    # Card C: Easy, same-day Good (floored at 1), Again after 20 (lapse with the S/e^(w17 w18) cap); target after 1.
    cards = [[(0, 3), (3, 3), (8, 1), (0, 3), (2, 3), (5, 3)],
             [(0, 2), (0, 2), (4, 4), (10, 2)],
             [(0, 4), (0, 3), (20, 1), (1, 3)]]
    data = make_data(cards)
    p = FSRS6(RunConfig(default=True)).predict(data)
    expected = [_hand_R(cards[c][:k], cards[c][k][0])[0] for c in range(3) for k in range(1, len(cards[c]))
                if cards[c][k][0] > 0]
    np.testing.assert_allclose(p, expected, atol=1e-6, rtol=0)
    # Spot-check the hand formula itself on the simplest step: S after one Good review is w2.
    r, s, d = _hand_R([(0, 3)], 0)
    assert s == W[2] and d == pytest.approx(W[4] - math.exp(2 * W[5]) + 1)
    # The same-day Hard step really shrinks S (the case where peers using G >= 2 differ).
    _, s_hard, _ = _hand_R([(0, 2), (0, 2)], 0)
    assert s_hard < W[1]


# ------------------------------------------------------------------------------------------------ peers
@pytest.fixture(scope="module")
def random_data():
    cards, times = simulate(150, seed=1, same_day_hard=True)
    return make_data(cards, times)


def test_default_R_matches_fsrs_rs(random_data):
    # fsrs-rs 0.9.x floors the same-day growth for G >= 2 (newer FSRS-6); the published run floors only G >= 3,
    # so histories with a same-day Hard review are compared separately (they must differ somewhere).
    ref = r_fsrs_rs(W, random_data)
    p = FSRS6(RunConfig(default=True)).predict(random_data)
    hard = has_same_day_hard(random_data)
    assert (~hard).sum() > 500 and hard.sum() > 20
    np.testing.assert_allclose(p[~hard], ref[~hard], atol=1e-5, rtol=0)
    assert np.abs(p[hard] - ref[hard]).max() > 1e-3


def test_default_R_matches_fsrs_optimizer(random_data):
    fo = pytest.importorskip("fsrs_optimizer")
    df = opt_frame(random_data)
    s, _ = fo.Collection(W).batch_predict(df)
    ref = fo.power_forgetting_curve(df["delta_t"].to_numpy(np.float64), np.array(s), -W[20])
    p = FSRS6(RunConfig(default=True)).predict(random_data)
    hard = has_same_day_hard(random_data)  # fsrs-optimizer 6.5 also floors G >= 2; see above
    np.testing.assert_allclose(p[~hard], ref[~hard], atol=1e-5, rtol=0)


def test_trained_weights_follow_fsrs_optimizer_trainer():
    """Same data, same post-S0 start: our upstream trainer and fsrs-optimizer's Trainer land on the same weights.
    (No same-day Hard in the data, and w19 stays above fsrs-optimizer's newer 0.01 floor.)"""
    fo = pytest.importorskip("fsrs_optimizer")
    cards, times = simulate(160, seed=3, w_true=W_OTHER)
    data = make_data(cards, times)
    cfg = RunConfig(trainer="upstream")
    ours = FSRS6(cfg).fit(data)
    opt = fo.Optimizer()
    opt.define_model()
    opt.initialize_parameters(dataset=opt_frame(data), verbose=False)
    np.testing.assert_allclose(ours.w_init[:4], opt.init_w[:4], rtol=1e-3)
    trainer = fo.Trainer(opt_frame(data), None, list(ours.w_init), n_epoch=5, lr=4e-2, gamma=1,
                         batch_size=512, max_seq_len=64)
    w_ref = trainer.train(verbose=False).tolist()
    assert min(w_ref[19], ours.w[19]) > 0.01
    np.testing.assert_allclose(ours.w, w_ref, atol=1e-5, rtol=0)
    np.testing.assert_allclose(ours.train_result.eval_losses, [float(x) for x in trainer.avg_train_losses], rtol=1e-5)
    assert np.abs(np.array(ours.w) - np.array(ours.w_init)).max() > 0.01  # it did move


# ------------------------------------------------------------------------------------------------ S0 init
def _s0_curve(t, s):
    return forgetting_curve(t, s, W[20])


@pytest.mark.parametrize("first_ratings", [(1, 2, 3, 4), (1, 3), (3, 4), (2, 3, 4), (3,)])
def test_s0_matches_fsrs_optimizer(first_ratings):
    fo = pytest.importorskip("fsrs_optimizer")
    cards, times = simulate(400, seed=5, max_reviews=3, first_ratings=first_ratings)
    data = make_data(cards, times)
    opt = fo.Optimizer()
    opt.define_model()
    opt.initialize_parameters(dataset=opt_frame(data), verbose=False)
    ours = fsrs_init.initialize_s0(data.rows, _s0_curve, W[:4], 0.001)
    np.testing.assert_allclose(ours, opt.init_w[:4], rtol=1e-3)


def test_s0_needs_first_long_term_reviews():
    with pytest.raises(InadequateData):
        fsrs_init.initialize_s0(make_data([[(0, 3), (2, 3)]]).rows.iloc[:0], _s0_curve, W[:4], 0.001)
    rows = make_data([[(0, 3), (2, 3), (5, 3)]]).rows
    with pytest.raises(InadequateData):
        fsrs_init.initialize_s0(rows[rows["i"] > 2], _s0_curve, W[:4], 0.001)
    with pytest.raises(InadequateData):
        FSRS6(RunConfig(S0=True)).fit(ReviewData(rows.iloc[:0], np.zeros(0), np.zeros(0, dtype=np.int8)))


def test_s0_fit_recovers_a_known_stability():
    # Many Good cards whose first interval recall follows the curve with S = 6: the fit lands near 6
    # (the smoothing and the L1 pull only nudge it).
    rng = np.random.default_rng(0)
    cards = []
    for dt in (1, 3, 6, 10, 20):
        r = float(_s0_curve(dt, 6.0))
        cards += [[(0, 3), (dt, 3 if rng.random() < r else 1)] for _ in range(400)]
    s0 = fsrs_init.initialize_s0(make_data(cards).rows, _s0_curve, W[:4], 0.001)
    assert s0[2] == pytest.approx(6.0, rel=0.15)
    assert s0 == pytest.approx([x * s0[2] / W[2] for x in W[:4]])  # one rating known: defaults scaled


def _eq1(s):  # ln S2 = w1 ln S1 + (1 - w1) ln S3
    return math.log(s[1]) - (0.41 * math.log(s[0]) + 0.59 * math.log(s[2]))


def _eq2(s):  # ln S3 = (1 - w2) ln S2 + w2 ln S4
    return math.log(s[2]) - (0.46 * math.log(s[1]) + 0.54 * math.log(s[3]))


@pytest.mark.parametrize("known", [(3, 4), (2, 4), (2, 3), (1, 4), (1, 3), (1, 2)])
def test_fill_two_known(known):
    given = {1: 0.5, 2: 1.7, 3: 3.1, 4: 12.0}
    s = fsrs_init.fill_missing({g: given[g] for g in known}, W[:4])
    for g in known:
        assert s[g - 1] == given[g]
    # Both interpolation equations hold for the filled vector.
    assert abs(_eq1(s)) < 1e-12 and abs(_eq2(s)) < 1e-12


def test_fill_formulas_written_out():
    w1, w2 = 0.41, 0.54
    s = fsrs_init.fill_missing({3: 3.0, 4: 10.0}, W[:4])
    s2 = 3.0 ** (1 / (1 - w2)) * 10.0 ** (1 - 1 / (1 - w2))
    assert s == pytest.approx([s2 ** (1 / w1) * 3.0 ** (1 - 1 / w1), s2, 3.0, 10.0], rel=1e-12)
    c = w1 + w2 - w1 * w2
    s = fsrs_init.fill_missing({1: 0.4, 4: 9.0}, W[:4])
    assert s == pytest.approx([0.4, 0.4 ** (w1 / c) * 9.0 ** (1 - w1 / c), 0.4 ** (1 - w2 / c) * 9.0 ** (w2 / c), 9.0],
                              rel=1e-12)


@pytest.mark.parametrize("missing", [1, 2, 3, 4])
def test_fill_three_known(missing):
    given = {1: 0.5, 2: 1.7, 3: 3.1, 4: 12.0}
    known = {g: v for g, v in given.items() if g != missing}
    s = fsrs_init.fill_missing(known, W[:4])
    expected = {1: 1.7 ** (1 / 0.41) * 3.1 ** (1 - 1 / 0.41), 2: 0.5 ** 0.41 * 3.1 ** 0.59,
                3: 1.7 ** 0.46 * 12.0 ** 0.54, 4: 1.7 ** (1 - 1 / 0.54) * 3.1 ** (1 / 0.54)}[missing]
    assert s[missing - 1] == pytest.approx(expected, rel=1e-12)
    assert [s[g - 1] for g in known] == list(known.values())


def test_fill_one_known_and_none():
    assert fsrs_init.fill_missing({2: 2.0}, W[:4]) == pytest.approx([x * 2.0 / W[1] for x in W[:4]])
    with pytest.raises(InadequateData):
        fsrs_init.fill_missing({}, W[:4])


def test_repair_order():
    # 2 > 3: rating 3 has more reviews, so rating 2 takes its value; then 1 > 2 (1 has more) → 2 := 1's value...
    s = fsrs_init.repair_order({1: 1.0, 2: 5.0, 3: 4.0, 4: 20.0}, {1: 10, 2: 5, 3: 50, 4: 3})
    assert s == {1: 1.0, 2: 4.0, 3: 4.0, 4: 20.0}
    s = fsrs_init.repair_order({1: 3.0, 2: 2.0}, {1: 9, 2: 1})  # the side with more samples wins
    assert s == {1: 3.0, 2: 3.0}
    s = fsrs_init.repair_order({3: 9.0, 4: 2.0}, {3: 1, 4: 1})  # tie: the smaller rating takes the bigger's value
    assert s == {3: 2.0, 4: 2.0}


def test_s0_mode_changes_only_initial_stabilities():
    cards, times = simulate(300, seed=7, max_reviews=4)
    m = FSRS6(RunConfig(S0=True)).fit(make_data(cards, times))
    w = m.parameters()
    assert w[4:] == W[4:]
    assert w[:4] != W[:4]
    assert all(0.001 <= x <= 100 for x in w[:4])


# ------------------------------------------------------------------------------------------------ predict
def test_one_pass_prediction_equals_per_row_recomputation():
    cards, times = simulate(150, seed=11, same_day_hard=True)
    data = make_data(cards, times)
    model = FSRS6(RunConfig(default=True))
    rng = np.random.default_rng(0)
    model.w = list(np.clip(np.array(W) * rng.uniform(0.7, 1.3, 21), CLIP_LO, CLIP_HI))
    p = model.predict(data)
    w = torch.tensor(model.w, dtype=torch.float64)
    # Every row on its own: its history padded alone (no sharing between rows of a card), all rows at once ...
    lengths = data.rows["seq_pos"].to_numpy()
    t, g = pad_histories(data.seq_delta_t, data.seq_rating, data.rows["seq_start"].to_numpy(), lengths)
    s_all = stability_sequence(fsrs6, w, torch.tensor(t.T, dtype=torch.float64), torch.tensor(g.T, dtype=torch.float64))
    s = s_all[torch.tensor(lengths) - 1, torch.arange(len(data))]
    naive = forgetting_curve(torch.tensor(data.rows["delta_t"].to_numpy(), dtype=torch.float64), s, w[20]).numpy()
    # ... and, for some rows, a loop with one row at a time.
    for k in range(0, len(data), 17):
        th, gh = data.history(k)
        s_k = stability_sequence(fsrs6, w, torch.tensor(th, dtype=torch.float64)[:, None],
                                 torch.tensor(gh, dtype=torch.float64)[:, None])[-1, 0]
        r_k = float(forgetting_curve(torch.tensor(data.rows["delta_t"].iat[k], dtype=torch.float64), s_k, w[20]))
        assert abs(r_k - naive[k]) < 1e-12
    assert p.dtype == np.float64
    np.testing.assert_allclose(p, naive, atol=1e-12, rtol=0)
    # Upstream's model runs in float32: within ~1e-6 of these float64 predictions.
    w32 = torch.tensor(model.w, dtype=torch.float32)
    s32 = stability_sequence(fsrs6, w32, torch.tensor(t.T, dtype=torch.float32), torch.tensor(g.T, dtype=torch.float32))
    s32 = s32[torch.tensor(lengths) - 1, torch.arange(len(data))]
    p32 = forgetting_curve(torch.tensor(data.rows["delta_t"].to_numpy(), dtype=torch.float32), s32, w32[20]).numpy()
    np.testing.assert_allclose(p, p32, atol=5e-6, rtol=0)
    # Row order does not matter: a shuffled subset gives the same values.
    perm = rng.permutation(len(data))[: len(data) // 2]
    np.testing.assert_allclose(model.predict(data.subset(perm)), p[perm], atol=1e-14, rtol=0)


def test_fast_trainer_is_called_with_post_s0_weights_and_sigma(monkeypatch):
    from models import fsrs6
    from models.fsrs6 import SIGMA

    calls = []
    fake = lambda w_init, sigma, train, cfg, s_min: calls.append((list(w_init), list(sigma), len(train), s_min)) or np.full(21, 0.5)  # noqa: E731,E501
    monkeypatch.setattr(fsrs6, "fit", fake)
    cards, times = simulate(50, seed=2, max_reviews=4)
    data = make_data(cards, times)
    m = FSRS6(RunConfig(trainer="fast")).fit(data)
    assert m.parameters() == [0.5] * 21
    (w_init, sigma, n, s_min), = calls
    assert w_init == m.w_init and w_init[4:] == W[4:] and sigma == SIGMA and n == len(data) and s_min == 0.001
