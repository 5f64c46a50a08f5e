"""FSRS-rs (models/fsrs_rs.py): items handed to fsrs-rs-python's benchmark(), sizes, prediction path, training,
fallback to defaults, and the `--rust` flag."""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import log_loss

import models
import pipeline
import runner
from config import ALWAYS_SHORT, RunConfig, build_parser, config_from_args
from data_loader import load_revlogs
from features import FeatureConfig, build_features
from models import fsrs_rs
from models.base import InadequateData, ReviewData
from models.fsrs6 import DEFAULT_W, FSRS6, forgetting_curve
from models.fsrs_rs import FSRSRs, item_reviews, training_items
from split import time_series_folds

from check_users import CHECK, UPSTREAM


def rs_cfg(**kw) -> RunConfig:
    return RunConfig(algo="FSRS-rs", **kw)


@pytest.fixture(scope="module")
def users():
    """Features of both upstream-check users, built the way the runner builds them for FSRS-rs."""
    cfg = rs_cfg()
    return {u: build_features(load_revlogs(CHECK, u), FeatureConfig.from_run(cfg)) for u in (8, 12)}


# ------------------------------------------------------------------------------------------------- items by hand
def hand_data() -> ReviewData:
    """Three cards whose reviews interleave in time, same-day reviews (delta_t 0) kept in the sequences.

    time:   1  2  3  4  5  6  7  8  9  10 11
    card A: 3        3     3        2          (delta_t 0, 0, 2, 5)
    card B:    1  3     1     3              3 (delta_t 0, 0, 1, 0, 3)
    card C:                      4     4       (delta_t 0, 4)
    Targets (delta_t > 0), in time order: B@5, A@6, A@9, C@10, B@11.
    """
    # card -> [(delta_t, rating, time)], time = position in the user's file
    cards = {
        "A": [(0, 3, 1), (0, 3, 4), (2, 3, 6), (5, 2, 9)],
        "B": [(0, 1, 2), (0, 3, 3), (1, 1, 5), (0, 3, 7), (3, 3, 11)],
        "C": [(0, 4, 8), (4, 4, 10)],
    }
    seq_dt, seq_r, rows = [], [], []
    for cid, (name, reviews) in enumerate(cards.items()):
        start = len(seq_dt)
        for k, (dt, g, t) in enumerate(reviews):
            if dt > 0:
                rows.append({"card_id": cid, "review_th": t, "delta_t": float(dt), "y": int(g > 1), "rating": g,
                             "seq_start": start, "seq_pos": k})
        seq_dt += [float(dt) for dt, _, _ in reviews]
        seq_r += [g for _, g, _ in reviews]
    df = pd.DataFrame(rows).sort_values("review_th", kind="stable").reset_index(drop=True)
    return ReviewData(df, np.array(seq_dt), np.array(seq_r, dtype=np.int8))


def parse_item(item) -> list[tuple[int, int]]:
    """(rating, delta_t) pairs from an FSRSItem's repr (the binding exposes no review attributes)."""
    return [(int(r), int(t)) for r, t in re.findall(r"rating: (\d+), delta_t: (\d+)", repr(item))]


def test_items_of_a_three_card_history_by_hand():
    data = hand_data()
    # one item per target, in time order; each = the card's whole review list up to and including the target
    expected = [
        [(1, 0), (3, 0), (1, 1)],  # B at time 5
        [(3, 0), (3, 0), (3, 2)],  # A at time 6
        [(3, 0), (3, 0), (3, 2), (2, 5)],  # A at time 9
        [(4, 0), (4, 4)],  # C at time 10
        [(1, 0), (3, 0), (1, 1), (3, 0), (3, 3)],  # B at time 11 (the same-day review at time 7 is inside)
    ]
    assert item_reviews(data) == expected
    assert [parse_item(it) for it in training_items(data)] == expected
    # rows given out of time order still give items in time order
    shuffled = data.subset(np.array([4, 2, 0, 3, 1]))
    assert item_reviews(shuffled) == expected


def test_item_delta_t_is_integer_days():
    data = hand_data()
    data = ReviewData(data.rows, data.seq_delta_t + np.where(data.seq_delta_t > 0, 0.7, 0.0), data.seq_rating)
    assert item_reviews(data)[0] == [(1, 0), (3, 0), (1, 1)]  # 1.7 → 1, as upstream's int()


# ------------------------------------------------------------------------------------------------- pipeline
def test_fsrs_rs_uses_the_same_day_pipeline_without_a_suffix():
    assert "FSRS-rs" in ALWAYS_SHORT
    cfg = rs_cfg()
    assert cfg.include_short and cfg.name == "FSRS-rs"
    assert rs_cfg(short=True).name == "FSRS-rs"


def test_rust_flag_selects_fsrs_rs():
    parser = build_parser("x", "FSRS-6", sorted(models.REGISTRY))
    assert config_from_args(parser.parse_args(["--rust"])).algo == "FSRS-rs"
    assert config_from_args(parser.parse_args([])).algo == "FSRS-6"
    assert "FSRS-rs" in parser.format_help() and "--rust" in parser.format_help()
    assert isinstance(models.create(rs_cfg()), FSRSRs)


def test_sizes_equal_fsrs6_sizes_on_upstream_check(users):
    published = UPSTREAM["FSRS-6"]
    for user, data in users.items():
        six = build_features(load_revlogs(CHECK, user), FeatureConfig.from_run(RunConfig(algo="FSRS-6")))
        pd.testing.assert_frame_equal(data.rows, six.rows)
        size = sum(len(test) for _, test in time_series_folds(len(data), 5))
        assert size == published[str(user)]["size"] == {8: 3705, 12: 3055}[user]


# ------------------------------------------------------------------------------------------------- prediction
def test_default_predictions_equal_fsrs6_defaults(users):
    data = users[12]
    p_rs = FSRSRs(rs_cfg(default=True)).predict(data)
    p_six = FSRS6(RunConfig(default=True)).predict(data)
    np.testing.assert_allclose(p_rs, p_six, atol=1e-5, rtol=0)
    # The Rust memory state agrees with our FSRS-6 except after a same-day Hard review (fsrs-rs floors the
    # same-day growth for G >= 2, the published Python model for G >= 3); upstream predicts with the latter.
    model = FSRSRs(rs_cfg(default=True))
    r_rust = forgetting_curve(data.rows["delta_t"].to_numpy(), model.rust_stabilities(data), DEFAULT_W[20])
    hard = np.array([np.any((t == 0)[1:] & (g == 2)[1:]) for t, g in (data.history(k) for k in range(len(data)))])
    assert (~hard).sum() > 1000
    np.testing.assert_allclose(p_rs[~hard], r_rust[~hard], atol=1e-5, rtol=0)


# ------------------------------------------------------------------------------------------------- training
def test_training_lowers_the_training_log_loss(users):
    data = users[12]
    trained = FSRSRs(rs_cfg()).fit(data)
    assert len(trained.parameters()) == trained.n_params == 21
    assert trained.w != list(DEFAULT_W)
    assert all(round(x, 4) == x for x in trained.w)  # upstream rounds benchmark()'s weights to 4 decimals
    y = data.rows["y"].to_numpy()
    default = log_loss(y, FSRSRs(rs_cfg()).predict(data), labels=[0, 1])
    fitted = log_loss(y, trained.predict(data), labels=[0, 1])
    assert fitted < default - 0.002


def test_benchmark_gets_the_items_and_max_seq_len_64(monkeypatch):
    """Items longer than max_seq_len are left to benchmark() itself (fsrs-rs ≤ 6.4 hard-coded 64 there; 0.9.3
    defaults to 256, so the 64 must be passed); recency weighting is benchmark()'s own, nothing else is sent."""
    seen = {}
    real = fsrs_rs._fsrs_rs()

    class FakeFSRS:
        def __init__(self, parameters):
            seen["parameters"] = parameters

        def benchmark(self, items, **kw):
            seen["items"], seen["kw"] = items, kw
            return [x + 0.123456 for x in DEFAULT_W]

    class Module:
        FSRS = FakeFSRS
        FSRSItem, FSRSReview, TrainingConfig = real.FSRSItem, real.FSRSReview, real.TrainingConfig

    monkeypatch.setattr(fsrs_rs, "_fsrs_rs", lambda: Module)
    model = FSRSRs(rs_cfg()).fit(hand_data())
    assert seen["parameters"] == []
    assert [parse_item(it) for it in seen["items"]] == item_reviews(hand_data())
    assert set(seen["kw"]) == {"training_config"} and seen["kw"]["training_config"].max_seq_len == 64
    assert model.w == [round(x + 0.123456, 4) for x in DEFAULT_W]


def test_inadequate_training_data_falls_back_to_defaults():
    data = hand_data()
    no_s0 = data.subset(np.array([2, 4]))  # only targets with 2+ long-term reviews: nothing to initialise S0 from
    with pytest.raises(InadequateData):
        FSRSRs(rs_cfg()).fit(no_s0)
    with pytest.raises(InadequateData):
        FSRSRs(rs_cfg()).fit(data.subset(np.array([], dtype=np.int64)))
    model = pipeline._fit_partition(rs_cfg(), no_s0, no_s0)
    assert model.w == list(DEFAULT_W)


def test_default_mode_and_pretrain():
    model = FSRSRs(rs_cfg(default=True)).fit(hand_data())
    assert model.n_params == 0 and model.parameters() == [round(x, 6) for x in DEFAULT_W]
    with pytest.raises(ValueError, match="pretrain"):
        FSRSRs(rs_cfg(S0=True))


def test_runner_writes_fsrs_rs_lines(tmp_path):
    cfg = rs_cfg(data=CHECK, processes=1, result_dir=tmp_path / "result", quiet=True)
    assert runner.run(cfg).exit_code == 0
    lines = [json.loads(x) for x in (tmp_path / "result" / "FSRS-rs.jsonl").read_text().splitlines()]
    assert [(o["user"], o["size"]) for o in lines] == [(8, 3705), (12, 3055)]
    for o in lines:
        assert len(o["parameters"]["0"]) == 21
        assert 0.05 < o["metrics"]["LogLoss"] < 0.2


def test_workers_cap_the_rust_thread_pool(monkeypatch):
    """fsrs-rs-python links rayon, whose pool would take every core in each worker: workers set its size."""
    import sys

    import threadpoolctl

    import local_pool

    monkeypatch.setattr(threadpoolctl, "threadpool_limits", lambda n: None)  # no lasting effect on this process
    if "torch" in sys.modules:
        monkeypatch.setattr(sys.modules["torch"], "set_num_threads", lambda n: None)
    monkeypatch.delenv("RAYON_NUM_THREADS", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    local_pool.init_worker(1)
    assert os.environ["RAYON_NUM_THREADS"] == "1" and os.environ["OMP_NUM_THREADS"] == "1"
