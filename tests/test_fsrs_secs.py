"""upstream's --secs mode for the FSRS family (issue #38, the "With same-day reviews" table): fractional intervals
and same-day targets (features.py), s_min = 1e-4 for S after every step and for w0..w3 (upstream config.py:
`0.0001 if use_secs_intervals`, in place of 0.01 and FSRS-6's 0.001), the S0 fit without recall smoothing or L1
pull (models/fsrs_init.py), and every row running end to end.

The FSRS-6 reference below is a few lines of torch written from the equations (spec models.md §1.2), float64,
with torch's clamp/minimum gradients; the S0 optimum is solved by hand."""

import math

import numpy as np
import pytest

from config import ACCEPTS_SECS, RunConfig
from features import FeatureConfig, build_features
from revlog_factory import make_revlog, write_user

SECS = FeatureConfig(short=True, secs=True)
SECS_S_MIN = 1e-4
# FSRS-6 weights with w0 (S after a first Again) below day mode's 0.001: same-day Agains shrink S further
W6 = [0.0005, 1.2931, 2.3065, 8.2956, 6.4133, 0.8334, 3.0194, 0.001, 1.8722, 0.1666, 0.796, 1.4835, 0.0614,
      0.2629, 1.6483, 0.6014, 1.8729, 0.5425, 0.0912, 0.0658, 0.1542]


def revlog():
    """Card 0: a first Again and four same-day Agains (make_revlog: 60·k s after the previous review), then days 1
    and 3; cards 1-3 mix same-day and long-term reviews."""
    return make_revlog([[(0, 1), (0, 1), (0, 1), (0, 1), (0, 1), (1, 3), (3, 3)],
                        [(0, 3), (0, 3), (2, 3), (2, 2), (6, 1), (6, 3), (9, 4)],
                        [(0, 2), (1, 1), (1, 3), (4, 3)],
                        [(0, 4), (5, 3), (5, 1), (7, 3)]])


def test_secs_targets_and_fractional_intervals():
    data = build_features(revlog(), SECS)
    c0 = data.rows[data.rows.card_id == 0]
    # every later review is a target; the same-day ones 60·k seconds after the previous review
    assert np.allclose(c0.delta_t, [60 / 86400, 120 / 86400, 180 / 86400, 240 / 86400, 1 + 300 / 86400,
                                    2 + 360 / 86400])
    assert list(c0.y) == [0, 0, 0, 0, 1, 1] and list(c0.i) == [1, 1, 1, 1, 2, 3]
    c1 = data.rows[data.rows.card_id == 1]
    assert np.allclose(c1.delta_t, [60 / 86400, 2 + 120 / 86400, 180 / 86400, 4 + 240 / 86400, 300 / 86400,
                                    3 + 360 / 86400])
    assert list(c1.elapsed_days) == [0, 2, 0, 4, 0, 3]
    assert len(data) == 6 + 6 + 3 + 3
    # the FSRS rows of the secs table take this pipeline: FSRS-5/6 always short, the others with --short
    for algo in ("FSRS-6", "FSRS-5"):
        assert FeatureConfig.from_run(RunConfig(algo=algo, secs=True)) == SECS
    for algo in ("FSRS-4.5", "FSRSv4", "FSRSv3", "FSRSv2", "FSRSv1"):
        assert FeatureConfig.from_run(RunConfig(algo=algo, short=True, secs=True)) == SECS
        assert algo in ACCEPTS_SECS


# ------------------------------------------------------------------------------------- FSRS-6, s_min = 1e-4

def torch_reference(w_list, data, s_min):
    """(predictions, Σ BCE, its gradient) of FSRS-6 over data's targets, written out from the equations."""
    import torch

    w = torch.tensor(w_list, dtype=torch.float64, requires_grad=True)
    preds, loss, states = [], 0.0, []
    for k in range(len(data)):
        t_hist, g_hist = data.history(k)
        g0 = int(g_hist[0])
        s = w[g0 - 1].clamp(s_min, 36500.0)
        d = (w[4] - torch.exp(w[5] * (g0 - 1)) + 1).clamp(1, 10)
        factor = 0.9 ** (-1 / w[20]) - 1
        for t, g in zip(t_hist[1:], g_hist[1:]):
            t, g = float(t), int(g)
            r = (1 + factor * t / s) ** (-w[20])
            if t < 1:
                sinc = torch.exp(w[17] * (g - 3 + w[18])) * s ** (-w[19])
                ns = s * (sinc.clamp(min=1) if g >= 3 else sinc)
            elif g > 1:
                hb = w[15] if g == 2 else (w[16] if g == 4 else 1.0)
                ns = s * (1 + torch.exp(w[8]) * (11 - d) * s ** (-w[9]) * (torch.exp(w[10] * (1 - r)) - 1) * hb)
            else:
                ns = torch.minimum(w[11] * d ** (-w[12]) * ((s + 1) ** w[13] - 1) * torch.exp(w[14] * (1 - r)),
                                   s / torch.exp(w[17] * w[18]))
            nd = w[7] * (w[4] - torch.exp(3 * w[5]) + 1) + (1 - w[7]) * (d - w[6] * (g - 3) * (10 - d) / 9)
            s, d = ns.clamp(s_min, 36500.0), nd.clamp(1, 10)
            states.append(float(s.detach()))
        p = (1 + factor * float(data.rows.delta_t.iat[k]) / s) ** (-w[20])
        y = int(data.rows.y.iat[k])
        loss = loss - (torch.log(p) if y else torch.log(1 - p))
        preds.append(float(p.detach()))
    loss.backward()
    return np.array(preds), float(loss.detach()), w.grad.numpy().copy(), states


def test_fsrs6_secs_clamps_s_at_1e4():
    from models import fsrs6

    data = build_features(revlog(), SECS)
    p_ref, loss_ref, grad_ref, states = torch_reference(W6, data, SECS_S_MIN)
    # the case is what it is for: S of card 0 goes below day mode's 0.001 and reaches the secs clamp
    assert min(states) == SECS_S_MIN and any(SECS_S_MIN < s < 0.001 for s in states)
    eng = fsrs6.engine(s_min=SECS_S_MIN)
    assert np.allclose(eng.predict(W6, data), p_ref, rtol=1e-12, atol=0)
    loss, grad = eng.loss_and_grad(W6, data)
    assert loss == pytest.approx(loss_ref, rel=1e-12)
    assert np.allclose(grad, grad_ref, rtol=1e-9, atol=1e-9)
    # the trainer's lane kernel, on the same batch
    from lane_code import lane_loss_grad

    lane_loss, lane_grad, _ = lane_loss_grad(fsrs6.plugin(), W6, data, np.array([3.0, SECS_S_MIN]))
    assert lane_loss == pytest.approx(loss_ref, rel=1e-12)
    assert np.allclose(lane_grad, grad_ref, rtol=1e-9, atol=1e-9)
    # day mode clamps at 0.001 (the reference agrees), so card 0's predictions differ
    p_day = fsrs6.engine().predict(W6, data)
    assert np.allclose(p_day, torch_reference(W6, data, 0.001)[0], rtol=1e-12, atol=0)
    assert not np.allclose(p_day, p_ref)
    # the model's run: s_min and the box of w0..w3 follow --secs
    model = fsrs6.FSRS6(RunConfig(algo="FSRS-6", secs=True))
    assert model.s_min == SECS_S_MIN
    assert fsrs6.engine(s_min=model.s_min).lower[:4].tolist() == [SECS_S_MIN] * 4
    assert fsrs6.FSRS6(RunConfig(algo="FSRS-6")).s_min == 0.001


@pytest.mark.parametrize("algo,curve_factor,decay", [("FSRS-5", 19 / 81, 0.5), ("FSRSv4", 1 / 9, 1.0)])
def test_other_versions_clamp_at_1e4(algo, curve_factor, decay):
    """FSRS-5 and v4 (their S after a lapse far below 0.01 at these weights) predict with S clamped at 1e-4 with
    --secs and at 0.01 without: the first state of a card whose first rating's S0 is 0.0002."""
    import models

    data = build_features(revlog(), SECS)
    for secs, s_min in ((True, SECS_S_MIN), (False, 0.01)):
        model = models.create(RunConfig(algo=algo, short=True, secs=secs))
        assert model.s_min == s_min and model.engine.lower[0] == s_min
        w = list(model.default_w)
        w[0] = 0.00002  # below both clamps: the first Again's S is s_min
        p = model.engine.predict(w, data)
        k = int(np.flatnonzero(data.rows.card_id == 0)[0])  # card 0's first target reads S after its first review
        t = float(data.rows.delta_t.iat[k])
        assert p[k] == pytest.approx((1 + curve_factor * t / s_min) ** -decay, rel=1e-12)


def test_fsrs45_secs_defaults():
    from models.fsrs_v45 import FSRS45

    secs = FSRS45(RunConfig(algo="FSRS-4.5", short=True, secs=True))
    assert secs.default_w[:4] == [0.0012, 0.0826, 0.8382, 26.2146] and secs.w == secs.default_w
    assert FSRS45(RunConfig(algo="FSRS-4.5")).default_w[:4] == [0.4872, 1.4003, 3.7145, 13.8206]


# ------------------------------------------------------------------------------------- the S0 fit

def test_s0_fit_secs_has_no_smoothing_and_no_l1():
    """One first rating (Good) with data: 40 first long-term reviews 0.5 days after the first, 30 recalled.
    Without smoothing or L1 the fit solves R(0.5, S) = 3/4 exactly: S = F·0.5/((3/4)^(−1/d) − 1); the other
    ratings are the defaults scaled by S/S_default(Good)."""
    import pandas as pd

    from models.fsrs6 import DEFAULT_W, forgetting_curve
    from models.fsrs_init import initialize_s0

    d = DEFAULT_W[20]
    rows = pd.DataFrame({"i": [2] * 40 + [3, 3], "first_rating": [3] * 42, "delta_t": [0.5] * 40 + [2.0, 2.0],
                         "y": [1] * 30 + [0] * 10 + [0, 0]})
    factor = 0.9 ** (-1 / d) - 1
    s_star = factor * 0.5 / (0.75 ** (-1 / d) - 1)
    curve = lambda t, s: forgetting_curve(t, s, d)  # noqa: E731
    s0 = initialize_s0(rows, curve, DEFAULT_W[:4], SECS_S_MIN, secs=True)
    assert s0[2] == pytest.approx(s_star, rel=1e-3)  # L-BFGS-B's tolerance
    assert s0 == pytest.approx([x * s0[2] / DEFAULT_W[2] for x in DEFAULT_W[:4]], rel=1e-12)
    # day mode's fit (recall (30 + ȳ)/41 with ȳ = 30/42, and the L1 pull |S − 2.3065|/16) lands elsewhere
    assert abs(initialize_s0(rows, curve, DEFAULT_W[:4], 0.001)[2] / s0[2] - 1) > 3e-3
    # an optimum below 0.001 stays (bounds [1e-4, 100]): recall 0.85 at 0.0005 days
    rows2 = rows.assign(delta_t=[0.0005] * 40 + [2.0, 2.0], y=[1] * 34 + [0] * 8)
    s_low = factor * 0.0005 / (0.85 ** (-1 / d) - 1)
    assert SECS_S_MIN < s_low < 0.001
    assert initialize_s0(rows2, curve, DEFAULT_W[:4], SECS_S_MIN, secs=True)[2] == pytest.approx(s_low, rel=1e-3)


# ------------------------------------------------------------------------------------- every row, end to end

ROWS = [("FSRS-6", {}), ("FSRS-6", {"recency": True}), ("FSRS-6", {"two_buttons": True}),
        ("FSRS-6", {"partitions": "preset"}), ("FSRS-6", {"partitions": "deck"}), ("FSRS-6", {"S0": True}),
        ("FSRS-6", {"default": True}), ("FSRS-5", {}), ("FSRS-4.5", {"short": True}), ("FSRSv4", {"short": True}),
        ("FSRSv3", {"short": True}), ("FSRSv2", {"short": True}), ("FSRSv1", {"short": True})]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """One user with same-day reviews, in the anki-revlogs-10k layout (cards and decks for the partitions)."""
    import pandas as pd

    root = tmp_path_factory.mktemp("secs_data")
    rng = np.random.default_rng(5)
    cards = []
    for _ in range(40):
        day, reviews = 0, [(0, int(rng.integers(1, 5)))]
        for _ in range(int(rng.integers(3, 8))):
            day += int(rng.choice([0, 0, 1, 2, 4, 7]))
            reviews.append((day, int(rng.choice([1, 2, 3, 3, 3, 4]))))
        cards.append(reviews)
    df = make_revlog(cards)
    n = df.card_id.max() + 1
    write_user(root, 1, df, cards=pd.DataFrame({"card_id": np.arange(n), "note_id": np.arange(n),
                                                "deck_id": np.arange(n) % 2}),
               decks=pd.DataFrame({"deck_id": [0, 1], "parent_id": [-1, -1], "preset_id": [0, 0]}))
    return root, df


@pytest.mark.parametrize("algo,flags", ROWS)
def test_every_secs_row_runs(tiny, tmp_path, algo, flags):
    import json

    import runner
    from split import time_series_folds

    root, df = tiny
    cfg = RunConfig(algo=algo, secs=True, data=root, processes=1, quiet=True, result_dir=tmp_path / "result",
                    **flags)
    assert runner.run(cfg).exit_code == 0
    lines = [json.loads(x) for x in (tmp_path / "result" / f"{cfg.name}.jsonl").read_text().splitlines()]
    assert len(lines) == 1 and "-secs" in cfg.name
    # the size: the test targets of the secs pipeline's 5 folds, same-day ones included
    data = build_features(df, SECS)
    assert lines[0]["size"] == sum(len(te) for _, te in time_series_folds(len(data), 5))
    assert (data.rows.elapsed_days == 0).sum() > 10
    assert math.isfinite(lines[0]["metrics"]["LogLoss"])


def test_secs_refuses_the_torch_trainers(tiny, tmp_path):
    import runner
    from data_loader import DataError

    for algo in ("FSRS-6", "FSRSv3"):
        cfg = RunConfig(algo=algo, secs=True, short=True, trainer="upstream", data=tiny[0], processes=1, quiet=True,
                        result_dir=tmp_path)
        with pytest.raises(DataError, match="fast trainer only"):
            runner.run(cfg)
