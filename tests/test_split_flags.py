"""upstream's split flags --no_test_same_day, --no_train_same_day, --train_equals_test (other.py `process`:
applied to each TimeSeriesSplit fold after its train and test sets are chosen; split.protocol_folds)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from config import EMBEDDED_DATA, RunConfig, build_parser, config_from_args
from features import FeatureConfig, build_features
from pipeline import prepare_user
from revlog_factory import make_revlog, write_user
from split import protocol_folds, time_series_folds

SECS = FeatureConfig(short=True, secs=True)


def two_cards():
    """Card 0: day 0 Good, day 0 Again (same day), day 1 Good, day 3 Good; card 1: day 0 Good, day 1 Good, day 1
    Good (same day), day 4 Again. In time order the revlog rows (review_th 1-8) are c0 d0, c0 d0, c1 d0, c0 d1,
    c1 d1, c1 d1, c0 d3, c1 d4; the secs targets (same-day reviews included) are review_th 2 (elapsed_days 0),
    4 (1), 5 (1), 6 (0), 7 (2), 8 (3)."""
    return make_revlog([[(0, 3), (0, 1), (1, 3), (3, 3)], [(0, 3), (1, 3), (1, 3), (4, 1)]])


def folds_as_review_th(flags, n_splits=2):
    rows = build_features(two_cards(), SECS).rows
    rt, e = rows["review_th"].to_numpy(), rows["elapsed_days"].to_numpy()
    assert rt.tolist() == [2, 4, 5, 6, 7, 8] and e.tolist() == [0, 1, 1, 0, 2, 3]
    folds = protocol_folds(time_series_folds(len(rows), n_splits), rt, e, n_splits, **flags)
    return [(rt[tr].tolist(), rt[te].tolist()) for tr, te in folds]


def test_no_flag_is_the_plain_split():
    # TimeSeriesSplit(2) of 6 rows: blocks of 2, fold 0 trains on rows 0-1 and tests 2-3, fold 1 trains on 0-3
    assert folds_as_review_th({}) == [([2, 4], [5, 6]), ([2, 4, 5, 6], [7, 8])]


def test_no_test_same_day_drops_same_day_reviews_from_the_test_blocks_only():
    assert folds_as_review_th({"no_test_same_day": True}) == [([2, 4], [5]), ([2, 4, 5, 6], [7, 8])]


def test_no_train_same_day_drops_same_day_reviews_from_the_training_sets_only():
    assert folds_as_review_th({"no_train_same_day": True}) == [([4], [5, 6]), ([4, 5], [7, 8])]


def test_train_equals_test_is_one_fold_on_all_rows_tested_from_the_first_test_block_on():
    assert folds_as_review_th({"train_equals_test": True}) == [([2, 4, 5, 6, 7, 8], [5, 6, 7, 8])]
    assert folds_as_review_th({"train_equals_test": True, "no_test_same_day": True,
                               "no_train_same_day": True}) == [([4, 5, 7, 8], [5, 7, 8])]
    # n_splits 5: blocks of 1 after the first (6 // 6), the first test block is review_th 4
    assert folds_as_review_th({"train_equals_test": True}, 5) == [([2, 4, 5, 6, 7, 8], [4, 5, 6, 7, 8])]


def test_day_mode_targets_have_no_same_day_review():
    # without --secs a same-day review is never a target: the flags leave the folds as they are
    rows = build_features(secs_user(), FeatureConfig(short=True)).rows
    assert len(rows) >= 6 and (rows["elapsed_days"] > 0).all()
    assert (build_features(secs_user(), SECS).rows["elapsed_days"] == 0).sum() == 2
    folds = time_series_folds(len(rows), 2)
    got = protocol_folds(folds, rows["review_th"].to_numpy(), rows["elapsed_days"].to_numpy(), 2,
                         no_test_same_day=True, no_train_same_day=True)
    assert all(np.array_equal(a, c) and np.array_equal(b, d) for (a, b), (c, d) in zip(folds, got))


def test_result_names_follow_upstreams_suffix_order():
    cfg = RunConfig(algo="FSRS-6", default=True, S0=True, two_buttons=True, short=True, recency=True,
                    no_test_same_day=True, no_train_same_day=True, train_equals_test=True, partitions="deck")
    assert cfg.name == "FSRS-6-default-S0-binary-recency-no_test_same_day-no_train_same_day-train_equals_test-deck"
    cfg = RunConfig(algo="FSRS-7", secs=True, sched_penalties=True, no_train_same_day=True,
                    equalize_test_with_non_secs=True, train_equals_test=True, partitions="preset")
    assert cfg.name == "FSRS-7-sched_penalties-no_train_same_day-train_equals_test-preset"
    cfg = RunConfig(algo="HLR", short=True, recency=True, no_test_same_day=True)
    assert cfg.name == "HLR-short-recency-no_test_same_day"
    args = build_parser("t", "FSRS-6", None).parse_args(["--algo", "GRU", "--secs", "--no_test_same_day",
                                                         "--no_train_same_day", "--train_equals_test",
                                                         "--n_splits", "3"])
    cfg = config_from_args(args)
    assert (cfg.no_test_same_day, cfg.no_train_same_day, cfg.train_equals_test, cfg.n_splits) == (True,) * 3 + (3,)
    assert cfg.name == "GRU-secs-no_test_same_day-no_train_same_day-train_equals_test"
    assert RunConfig(algo="FSRS-6").name == "FSRS-6"


def secs_user():
    """Two cards with same-day targets plus 30 filler cards (day 0 Good, day 1 Good, day 5 Good) that keep the
    day-mode outlier rule from removing them."""
    cards = [[(0, 3), (0, 1), (1, 3), (3, 3)], [(0, 3), (1, 3), (1, 3), (4, 1)]]
    cards += [[(0, 3), (1, 3), (5, 3)] for _ in range(30)]
    return make_revlog(cards)


@pytest.mark.parametrize("flags", [{"no_test_same_day": True}, {"no_train_same_day": True},
                                   {"train_equals_test": True},
                                   {"no_test_same_day": True, "no_train_same_day": True, "train_equals_test": True}])
def test_prepare_user_applies_the_flags_to_its_folds(tmp_path, flags):
    # FSRS-7's row has --secs --short and the equalized folds built in: the flags act on those folds
    write_user(tmp_path, 1, secs_user())
    base = prepare_user(1, RunConfig(algo="FSRS-7", n_splits=3), tmp_path)
    got = prepare_user(1, RunConfig(algo="FSRS-7", n_splits=3, **flags), tmp_path)
    rows = base.data.rows
    e, rt = rows["elapsed_days"].to_numpy(), rows["review_th"].to_numpy()
    assert (e == 0).sum() == 2  # the two same-day targets (review_th 2 and 6)
    if flags.get("train_equals_test"):
        first = rt[time_series_folds(len(rows), 3)[0][1]].min()  # the plain split's, not the equalized folds'
        want = [(np.arange(len(rows)), np.flatnonzero(rt >= first))]
    else:
        want = base.folds
    keep = e > 0
    want = [(tr[keep[tr]] if flags.get("no_train_same_day") else tr, te[keep[te]] if flags.get("no_test_same_day")
             else te) for tr, te in want]
    assert len(got.folds) == len(want)
    for (a, b), (c, d) in zip(got.folds, want):
        assert a.tolist() == c.tolist() and b.tolist() == d.tolist()
    if flags.get("no_train_same_day"):
        assert all((e[tr] > 0).all() for tr, _ in got.folds)
        assert any((e[tr] == 0).any() for tr, _ in base.folds)


def test_runs_write_the_flagged_rows(tmp_path):
    from runner import run

    base = dict(data=EMBEDDED_DATA, users=[3], processes=1, quiet=True, result_dir=tmp_path)
    run(RunConfig(algo="FSRS-7", **base))
    run(RunConfig(algo="FSRS-7", train_equals_test=True, no_train_same_day=True, **base))
    plain = json.loads((tmp_path / "FSRS-7.jsonl").read_text().splitlines()[0])
    probe = json.loads((tmp_path / "FSRS-7-no_train_same_day-train_equals_test.jsonl").read_text().splitlines()[0])
    assert plain["user"] == probe["user"] == 3
    # the equalized folds test the day-mode test blocks (5 of 6); train_equals_test the secs rows from the first
    # test block on, same-day targets included: more rows
    assert probe["size"] > plain["size"]


def test_runner_refuses_the_flags_for_models_upstream_runs_outside_its_fold_loop(tmp_path):
    from data_loader import DataError
    from runner import run

    base = dict(data=EMBEDDED_DATA, users=[3], processes=1, quiet=True, result_dir=tmp_path)
    for algo in ("SM2", "AVG", "FSRS-6-one-step"):
        with pytest.raises(DataError, match=f"--train_equals_test not implemented"):
            run(RunConfig(algo=algo, train_equals_test=True, **base))
