"""--causal (split.causal_folds, features.OutlierInputs): each fold's outlier rule and continuity cut fixed from the
reviews before its test block. Hand-built revlogs where a future review changes the whole-history rule, with the
exact train/test review sets worked out by hand; the training rows checked against the whole-history pipeline run
on the past alone (an independent route to the same rows); --causal without anything to drop is the plain split."""

from __future__ import annotations

import numpy as np
import pytest

from config import EMBEDDED_DATA, RunConfig, build_parser, config_from_args
from data_loader import DataError, load_revlogs
from features import FEATURE_COLUMNS, FeatureConfig, NotEnoughData, build_features
from pipeline import prepare_user
from revlog_factory import make_revlog, write_user
from split import causal_folds, time_series_folds


def review_th_of(revlog, pairs):
    """review_th (1-based file position) of each (card, day) review of the input revlog."""
    at = {(int(c), int(d)): k + 1 for k, (c, d) in enumerate(zip(revlog["card_id"], revlog["day_offset"]))}
    return sorted(at[p] for p in pairs)


def flip_user():
    """All first ratings Good (one outlier group). Cell A = first interval 1 day, cell B = 2 days.

    Past (days 0-6): 15 A cards (0-14: days 0, 1, 5) and 8 B cards (15-22: days 0, 2, 6): 46 targets.
    Future (days 20-60): 10 more B cards (23-32: days 20, 22, 30, 40, 50) and a day-60 review of A cards 0-5: 46
    targets. With n_splits = 1 the candidates' single test block starts at index 46: the first future review.

    Whole history: A 15, B 18, threshold max(5% of 33, 20) = 20. Smallest count first: A, 0 + 15 < 20, dropped
    (with every later review of its cards: the continuity cut); B, 15 + 18 >= 20, kept.
    The past alone: B 8, A 15. B first: 0 + 8 < 20, dropped; A: 8 + 15 >= 20, kept. The future B reviews never
    change the test fold's rule: the future B cards are dropped from the test block, A's day-60 reviews kept."""
    cards = [[(0, 3), (1, 3), (5, 3)] + ([(60, 3)] if k < 6 else []) for k in range(15)]
    cards += [[(0, 3), (2, 3), (6, 3)] for _ in range(8)]
    cards += [[(20, 3), (22, 3), (30, 3), (40, 3), (50, 3)] for _ in range(10)]
    return make_revlog(cards)


A_PAST = [(c, d) for c in range(15) for d in (1, 5)]
B_PAST = [(c, d) for c in range(15, 23) for d in (2, 6)]
B_FUTURE = [(c, d) for c in range(23, 33) for d in (22, 30, 40, 50)]
A_FUTURE = [(c, 60) for c in range(6)]


def folds_as_review_th(revlog, fcfg, n_splits):
    inputs = {}
    data = build_features(revlog, fcfg, causal_inputs=inputs)
    rt = data.rows["review_th"].to_numpy()
    return rt, [(rt[tr].tolist(), rt[te].tolist()) for tr, te in causal_folds(inputs["rule"], rt, n_splits)]


@pytest.mark.parametrize("short", [False, True])
def test_a_future_review_flips_which_training_reviews_survive(short):
    revlog = flip_user()
    # without --causal: the whole history's rule keeps B only (16 past + 40 future targets), split 28 / 28
    whole = build_features(revlog, FeatureConfig(short=short)).rows["review_th"].to_numpy()
    assert whole.tolist() == review_th_of(revlog, B_PAST + B_FUTURE)
    (tr, te), = time_series_folds(len(whole), 1)
    assert len(tr) == len(te) == 28
    assert whole[tr].tolist() == review_th_of(revlog, B_PAST + [(c, 22) for c in range(23, 33)]
                                              + [(23, 30), (24, 30)])
    # with --causal: the candidates are all 92 targets; the fold's rule from the 46 before its test block
    rt, folds = folds_as_review_th(revlog, FeatureConfig(short=short, causal=True), 1)
    assert rt.tolist() == review_th_of(revlog, A_PAST + B_PAST + B_FUTURE + A_FUTURE)
    (train, test), = folds
    assert train == review_th_of(revlog, A_PAST)  # A's training reviews kept, B's dropped: the reverse of whole
    assert test == review_th_of(revlog, A_FUTURE)
    # the training reviews dropped without --causal and kept with it, and the reverse
    assert set(train) - set(whole[tr]) == set(review_th_of(revlog, A_PAST))
    assert set(whole[tr]) - set(train) >= set(review_th_of(revlog, B_PAST))


def unseen_user():
    """25 Good cards with a 1-day first interval (days 0, 1; cards 0-20 again on day 40) before the test block;
    in it, card 25 (days 10, 17, 30: a 7-day first interval the past has never seen) and card 26 (days 10, 160,
    200: 150 days, above the 100-day limit). n_splits = 1: 25 candidates before, 25 in the block."""
    cards = [[(0, 3), (1, 3)] + ([(40, 3)] if k < 21 else []) for k in range(25)]
    cards += [[(10, 3), (17, 3), (30, 3)], [(10, 3), (160, 3), (200, 3)]]
    return make_revlog(cards)


def test_cells_the_past_has_never_seen_are_kept_unless_above_the_interval_limit():
    revlog = unseen_user()
    rt, ((train, test),) = folds_as_review_th(revlog, FeatureConfig(causal=True), 1)
    assert len(rt) == 50
    assert train == review_th_of(revlog, [(c, 1) for c in range(25)])  # one cell of 25 >= 20: kept
    # card 25's new 7-day cell kept (both its targets), card 26's 150-day one dropped (and its later review cut)
    assert test == review_th_of(revlog, [(25, 17), (25, 30)] + [(c, 40) for c in range(21)])
    # the whole history drops both new cells: the count-1 cells come first, 1 + 1 < 20
    whole = build_features(revlog, FeatureConfig()).rows["review_th"].to_numpy()
    assert whole.tolist() == review_th_of(revlog, [(c, 1) for c in range(25)] + [(c, 40) for c in range(21)])


def test_a_card_without_a_first_review_loses_only_its_dropped_review():
    """Card 25 starts with a long-term review (its first review cut off: no i = 1 row). Its 9-day cell (count 1)
    is dropped; its later review stays, as in the whole history (the gap cut does not fire at a card's start)."""
    revlog = make_revlog([[(0, 3), (1, 3), (3, 3)] for _ in range(25)] + [[(0, 3), (9, 3), (12, 3)]])
    revlog = revlog[~((revlog["card_id"] == 25) & (revlog["day_offset"] == 0))].reset_index(drop=True)
    whole = build_features(revlog, FeatureConfig()).rows
    assert whole["review_th"].tolist() == review_th_of(revlog, [(c, d) for c in range(25) for d in (1, 3)]
                                                       + [(25, 12)])
    inputs = {}
    data = build_features(revlog, FeatureConfig(causal=True), causal_inputs=inputs)
    r = inputs["rule"]
    mine = data.rows["card_id"].to_numpy() == 25
    assert r.is_i2[mine].tolist() == [True, False] and r.affected[mine].tolist() == [True, False]
    assert r.delta_t[mine].tolist() == [9, 9]  # both carry the card's i = 2 cell
    dropped = r.dropped_before(int(data.rows["review_th"].max()) + 1)  # the whole history as the past
    assert data.rows["review_th"][~dropped].tolist() == whole["review_th"].tolist()


@pytest.mark.parametrize("fcfg", [FeatureConfig(), FeatureConfig(short=True),
                                  FeatureConfig(short=True, two_buttons=True, outliers_by_recorded_rating=True)])
@pytest.mark.parametrize("user", [1, 2, 3])
def test_training_rows_are_the_whole_history_pipeline_run_on_the_past_alone(fcfg, user):
    # an independent route to each fold's training rows: build_features (whole-history rule) on the revlog cut
    # before the fold's first test review
    revlog = load_revlogs(EMBEDDED_DATA, user, FEATURE_COLUMNS)
    inputs = {}
    data = build_features(revlog, FeatureConfig(**{**fcfg.__dict__, "causal": True}), causal_inputs=inputs)
    rt = data.rows["review_th"].to_numpy()
    folds = causal_folds(inputs["rule"], rt, 5)
    assert len(folds) == 5
    for (train, test), (_, block) in zip(folds, time_series_folds(len(rt), 5)):
        start = rt[block[0]]
        try:
            past = build_features(revlog.iloc[:start - 1], fcfg).rows["review_th"].tolist()
        except NotEnoughData:  # fewer than 6: the whole-history pipeline skips; --causal trains on them
            past = None
        if past is not None:
            assert rt[train].tolist() == past
        assert set(test) <= set(block) and rt[test].min() >= start


def test_nothing_to_drop_gives_the_plain_split():
    # 60 Good cards, one every 2 days, first interval 1 day, then 3 days: one cell, kept by every past with 20 or
    # more of them (the first block of 60 starts after ~30). No rule drops anything: TimeSeriesSplit's folds
    revlog = make_revlog([[(k, 3), (k + 1, 3), (k + 4, 3)] for k in range(0, 120, 2)])
    whole = build_features(revlog, FeatureConfig()).rows["review_th"].to_numpy()
    rt, folds = folds_as_review_th(revlog, FeatureConfig(causal=True), 2)
    assert rt.tolist() == whole.tolist()
    plain = [(whole[tr].tolist(), whole[te].tolist()) for tr, te in time_series_folds(len(whole), 2)]
    assert len(whole) == 120 and folds == plain


def test_prepare_user_without_causal_is_unchanged_and_with_it_uses_causal_folds(tmp_path):
    revlog = flip_user()
    write_user(tmp_path, 1, revlog)
    plain = prepare_user(1, RunConfig(algo="FSRS-6", n_splits=1), tmp_path)
    whole = build_features(revlog, FeatureConfig(short=True)).rows["review_th"].to_numpy()
    assert plain.data.rows["review_th"].tolist() == whole.tolist()
    assert [(a.tolist(), b.tolist()) for a, b in plain.folds] == \
        [(a.tolist(), b.tolist()) for a, b in time_series_folds(len(whole), 1)]
    causal = prepare_user(1, RunConfig(algo="FSRS-6", n_splits=1, causal=True), tmp_path)
    rt = causal.data.rows["review_th"].to_numpy()
    (tr, te), = causal.folds
    assert rt[tr].tolist() == review_th_of(revlog, A_PAST) and rt[te].tolist() == review_th_of(revlog, A_FUTURE)


def test_equalize_mode_trains_on_every_secs_row_before_the_block(tmp_path):
    # FSRS-7 (secs, equalized test rows built in): the block boundary and the rule come from the day-mode
    # candidates; the test rows are the block's day-mode reviews the past's rule keeps; training takes every secs
    # row before the block (the secs pipeline has no outlier filter): B's past reviews included
    revlog = flip_user()
    write_user(tmp_path, 1, revlog)
    got = prepare_user(1, RunConfig(algo="FSRS-7", n_splits=1, causal=True), tmp_path)
    rt = got.data.rows["review_th"].to_numpy()
    (tr, te), = got.folds
    assert rt[tr].tolist() == review_th_of(revlog, A_PAST + B_PAST)
    assert rt[te].tolist() == review_th_of(revlog, A_FUTURE)


def test_flag_name_and_refusals(tmp_path):
    args = build_parser("t", "FSRS-6", None).parse_args(["--algo", "FSRS-5", "--binary", "--partitions", "deck",
                                                         "--disable_short_term", "--causal"])
    cfg = config_from_args(args)
    assert cfg.causal and cfg.name == "FSRS-5-binary-deck-disable_short_term-causal"
    assert RunConfig(algo="FSRS-6").name == "FSRS-6"
    assert RunConfig(algo="LSTM", causal=True).name == "LSTM-causal"
    from runner import run

    base = dict(data=EMBEDDED_DATA, users=[3], processes=1, quiet=True, result_dir=tmp_path)
    with pytest.raises(DataError, match="RMSE-BINS-EXPLOIT: --causal not implemented"):
        run(RunConfig(algo="RMSE-BINS-EXPLOIT", causal=True, **base))
    with pytest.raises(DataError, match="--causal with --train_equals_test"):
        run(RunConfig(algo="FSRS-6", causal=True, train_equals_test=True, **base))


def test_a_causal_run_of_the_online_and_untrained_baselines(tmp_path):
    # the models upstream runs outside its fold loop run here through it with the causal folds
    import json

    from runner import run

    base = dict(data=EMBEDDED_DATA, users=[2], processes=1, quiet=True, result_dir=tmp_path, causal=True)
    sizes = {}
    for algo in ("AVG", "MOVING-AVG", "90%"):
        assert run(RunConfig(algo=algo, **base)).exit_code == 0
        line = json.loads((tmp_path / f"{algo}-causal.jsonl").read_text().splitlines()[0])
        sizes[algo] = line["size"]
    prep = prepare_user(2, RunConfig(algo="AVG", causal=True), EMBEDDED_DATA)
    assert set(sizes.values()) == {sum(len(te) for _, te in prep.folds)}
    y = prep.data.rows["y"].to_numpy()
    # AVG predicts each fold's training mean: its log loss, recomputed here by hand
    p = np.concatenate([np.full(len(te), y[tr].mean()) for tr, te in prep.folds])
    yt = np.concatenate([y[te] for _, te in prep.folds])
    ll = -np.mean(yt * np.log(p) + (1 - yt) * np.log(1 - p))
    got = json.loads((tmp_path / "AVG-causal.jsonl").read_text().splitlines()[0])["metrics"]["LogLoss"]
    assert got == pytest.approx(ll, abs=1e-6)


def test_run_table_passes_causal_through(tmp_path, capsys):
    import json

    import run_table

    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- tables:start -->\nold\n<!-- tables:end -->\n", encoding="utf-8")
    code = run_table.main(["--data", str(EMBEDDED_DATA), "--users", "2,4", "--result-dir", str(tmp_path / "result"),
                           "--readme", str(readme), "--processes", "1", "--quiet", "--causal",
                           "--rows", "AVG,RMSE-BINS-EXPLOIT"])
    err = capsys.readouterr().err
    assert code == 0
    assert "row RMSE-BINS-EXPLOIT: skipped (RMSE-BINS-EXPLOIT refuses --causal)" in err
    assert "AVG-causal: python other.py --model AVG --causal" in err
    # user 4: skipped by the whole-history rule (no first rating with 20 first long-term reviews), evaluated here
    assert [json.loads(l)["user"] for l in (tmp_path / "result" / "AVG-causal.jsonl").read_text().splitlines()] == [2, 4]
    assert not (tmp_path / "result" / "AVG.jsonl").exists()
    assert "old" in readme.read_text(encoding="utf-8")  # the README's tables are upstream's protocol: untouched
