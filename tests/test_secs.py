"""upstream's --secs and --equalize_test_with_non_secs on hand-made revlogs (spec pipeline.md §2 steps 5, 8, 11, 12
and the equalize paragraph): fractional intervals, same-day targets, no outlier filter, the lapse count of
RMSE(bins), and equalized folds whose test rows are the day-mode test rows."""

import numpy as np
import pytest

from config import RunConfig
from features import FeatureConfig, build_features
from revlog_factory import make_revlog
from split import equalized_folds, time_series_folds

SHORT = FeatureConfig(short=True)
SECS = FeatureConfig(short=True, secs=True)
SECS_EQ = FeatureConfig(short=True, secs=True, equalize=True)


def user(n_filler=25):
    """Card 0: first review (Good), same-day Again 1 minute later, then days 1 and 3 (make_revlog adds 60·k s to
    each elapsed_seconds). Filler cards (first interval 1 day) keep card 0 through the day-mode outlier rule; card
    1 has a rare first interval (40 days) that the day-mode filter removes."""
    cards = [[(0, 3), (0, 1), (1, 3), (3, 3)], [(0, 3), (40, 3), (45, 1), (46, 3)]]
    cards += [[(0, 3), (1, 3), (5, 3)] for _ in range(n_filler)]
    return make_revlog(cards)


def card_rows(data, card):
    return data.rows[data.rows.card_id == card].reset_index(drop=True)


def test_secs_intervals_are_fractional_days_and_same_day_reviews_are_targets():
    df = user()
    s = card_rows(build_features(df, SECS), 0)
    # targets: the same-day Again (60 s after the first review), day 1 (1 day + 120 s), day 3 (2 days + 180 s)
    assert np.allclose(s.delta_t, [60 / 86400, 1 + 120 / 86400, 2 + 180 / 86400])
    assert list(s.elapsed_days) == [0, 1, 2]  # RMSE(bins) still bins whole days
    assert list(s.y) == [0, 1, 1]
    assert list(s.i) == [1, 2, 3]  # 1 + long-term reviews so far: the same-day target keeps i = 1
    assert list(s.seq_pos) == [1, 2, 3]
    # histories read fractional intervals too
    d = build_features(df, SECS)
    k = int(np.flatnonzero(d.rows.card_id == 0)[2])
    t, r = d.history(k)
    assert np.allclose(t, [0, 60 / 86400, 1 + 120 / 86400]) and list(r) == [3, 1, 3]
    # day mode: the same-day review is only history
    day = card_rows(build_features(df, SHORT), 0)
    assert list(day.delta_t) == [1, 2] and list(day.i) == [2, 3]


def test_secs_lapse_count_follows_the_printed_interval():
    df = user()
    # --secs: every earlier Again counts (upstream tests str(delta_t) != "0" and a float never prints as "0"), here
    # the same-day Again of card 0; also under --equalize_test_with_non_secs (delta_t is the float there too)
    assert list(card_rows(build_features(df, SECS), 0).rmse_bins_lapse) == [0, 1, 1]
    assert list(card_rows(build_features(df, SECS_EQ), 0).rmse_bins_lapse) == [0, 1, 1]
    # day mode: a same-day Again is no lapse
    assert list(card_rows(build_features(df, SHORT), 0).rmse_bins_lapse) == [0, 0]
    # an Again after a long-term interval counts in every mode (card 1's day-45 review, for its day-46 target)
    assert list(card_rows(build_features(df, SECS), 1).rmse_bins_lapse) == [0, 0, 1]
    # the first review's Again counts with --secs only
    first_again = make_revlog([[(0, 1), (2, 3), (5, 3)]] + [[(0, 1), (2, 3), (5, 3)]] * 25)
    assert list(card_rows(build_features(first_again, SECS), 0).rmse_bins_lapse) == [1, 1]
    assert list(card_rows(build_features(first_again, SHORT), 0).rmse_bins_lapse) == [0, 0]


def test_secs_has_no_outlier_filter():
    df = user()
    assert len(card_rows(build_features(df, SHORT), 1)) == 0  # the rare 40-day first interval removes card 1
    c1 = card_rows(build_features(df, SECS), 1)
    assert list(c1.elapsed_days) == [40, 5, 1] and list(c1.i) == [2, 3, 4]


def test_equalized_test_rows_are_the_day_mode_test_rows():
    df = user()
    day = build_features(df, SHORT)
    secs = build_features(df, SECS_EQ)
    folds = equalized_folds(secs.rows.review_th.to_numpy(), day.rows.review_th.to_numpy(), 5)
    day_folds = time_series_folds(len(day), 5)
    assert len(folds) == 5
    for (tr, te), (_, dte) in zip(folds, day_folds):
        # test: the same reviews, by review_th, in the same order
        assert list(secs.rows.review_th.iloc[te]) == list(day.rows.review_th.iloc[dte])
        assert list(secs.rows.i.iloc[te]) == list(day.rows.i.iloc[dte])
        assert list(secs.rows.elapsed_days.iloc[te]) == list(day.rows.elapsed_days.iloc[dte])
        # train: every secs row before the fold's first test review (same-day and outlier-card rows included)
        first = day.rows.review_th.iloc[dte[0]]
        expect = secs.rows.index[secs.rows.review_th < first].to_numpy()
        assert np.array_equal(tr, expect)
    sizes = sum(len(te) for _, te in folds)
    assert sizes == 5 * (len(day) // 6)
    # the secs training rows hold targets the day pipeline never has (the same-day Again of card 0)
    same_day = secs.rows.review_th[(secs.rows.card_id == 0) & (secs.rows.elapsed_days == 0)].iloc[0]
    assert same_day in set(secs.rows.review_th.iloc[folds[-1][0]])


def test_equalized_folds_refuse_a_day_target_missing_from_the_secs_rows():
    with pytest.raises(ValueError):
        equalized_folds(np.array([1, 2, 4, 5, 6, 7, 8]), np.array([1, 2, 3, 4, 5, 6]), 5)


def test_result_names_follow_upstreams_suffix_order():
    # FSRS-6's histories always hold same-day reviews: a secs row spells "short" as upstream's `--short --secs` does
    cfg = RunConfig(algo="FSRS-6", secs=True, recency=True, equalize_test_with_non_secs=True)
    assert cfg.name == "FSRS-6-short-secs-recency-equalize_test_with_non_secs"
    assert RunConfig(algo="HLR", short=True, secs=True).name == "HLR-short-secs"
    assert RunConfig(algo="HLR", secs=True).name == "HLR-secs"
    assert RunConfig(algo="LSTM", secs=True, equalize_test_with_non_secs=True).name == "LSTM"
    assert not RunConfig(algo="LSTM", secs=True).secs_mode  # the LSTM's secs inputs are its own


def test_with_same_day_names_the_rows_as_upstreams_same_day_table():
    """--with_same_day is `--short --secs` without a published row's equalized test set; the result file is named
    with every flag spelled, as upstream's command lines spell them."""
    same_day = {"with_same_day": True}
    expected = {("FSRS-7", ()): "FSRS-7-short-secs",
                ("FSRS-7", (("recency", True), ("partitions", "deck"))): "FSRS-7-short-secs-recency-deck",
                ("FSRS-7", (("sched_penalties", True),)): "FSRS-7-sched_penalties-short-secs",
                ("FSRS-7", (("default", True),)): "FSRS-7-default-short-secs",
                ("LSTM", ()): "LSTM-short-secs-duration",
                ("LogisticRegression", ()): "LogisticRegression-short-secs-recency",
                ("FSRS-6", (("two_buttons", True),)): "FSRS-6-binary-short-secs",
                ("FSRS-6", (("S0", True),)): "FSRS-6-S0-short-secs",
                ("DASH", ()): "DASH-short-secs"}
    for (algo, flags), name in expected.items():
        cfg = RunConfig(algo=algo, **dict(flags), **same_day)
        assert cfg.name == name
        assert cfg.short and cfg.secs and not cfg.equalize_mode
    assert RunConfig(algo="FSRS-7").equalize_mode and RunConfig(algo="FSRS-7").name == "FSRS-7"
    assert RunConfig(algo="DASH", with_same_day=True).name == RunConfig(algo="DASH", short=True, secs=True).name


def upstream_secs_rows(revlogs, short: bool):
    """upstream's BaseFeatureEngineer (features/base.py, 2026) in secs mode, written out with pandas row by row of
    its steps: an independent implementation to hold features.build_features to."""
    df = revlogs.copy()
    df["review_th"] = range(1, len(df) + 1)
    df = df.sort_values(["card_id", "review_th"])
    df = df[df["rating"].isin([1, 2, 3, 4])].copy()
    df["i"] = df.groupby("card_id").cumcount() + 1
    df = df[df["i"] <= 128].copy()
    df["delta_t"] = df["elapsed_seconds"].map(lambda x: max(0, x / 86400))
    if not short:
        df = df[df["elapsed_days"] != 0].copy()
        df["i"] = df.groupby("card_id").cumcount() + 1
    df["y"] = (df["rating"] > 1).astype(int)
    lapse = ((df["rating"] == 1) & (df["delta_t"].astype(str) != "0")).astype(int)
    df["rmse_bins_lapse"] = lapse.groupby(df["card_id"]).cumsum() - lapse
    if short:
        df = df[(df["delta_t"] != 0) | (df["i"] == 1)].copy()
    df["i"] = df["elapsed_days"].gt(0).groupby(df["card_id"]).cumsum() + 1
    return df[df["delta_t"] > 0].sort_values("review_th").reset_index(drop=True)


@pytest.mark.parametrize("user", [8, 12])
@pytest.mark.parametrize("short", [True, False])
def test_secs_rows_equal_upstreams_pipeline_on_real_users(user, short):
    from check_users import CHECK
    from data_loader import load_revlogs

    revlogs = load_revlogs(CHECK, user)
    want = upstream_secs_rows(revlogs, short)
    got = build_features(revlogs, FeatureConfig(short=short, secs=True)).rows
    assert len(got) == len(want) > 0
    for col in ("review_th", "i", "rmse_bins_lapse", "y", "elapsed_days", "card_id"):
        assert got[col].tolist() == want[col].tolist(), col
    np.testing.assert_allclose(got["delta_t"], want["delta_t"], rtol=1e-15)
    if short:  # same-day targets are there
        assert (got["elapsed_days"] == 0).sum() > 0


def test_runner_refuses_secs_where_a_model_does_not_accept_it(tmp_path):
    from config import EMBEDDED_DATA
    from data_loader import DataError
    from runner import run

    base = dict(data=EMBEDDED_DATA, users=[3], processes=1, quiet=True, result_dir=tmp_path)
    with pytest.raises(DataError, match="SM2: --secs not implemented"):
        run(RunConfig(algo="SM2", secs=True, **base))
    with pytest.raises(DataError, match="FSRS-6-one-step: --equalize_test_with_non_secs not implemented"):
        run(RunConfig(algo="FSRS-6-one-step", equalize_test_with_non_secs=True, **base))


def test_a_table_row_is_skipped_exactly_where_the_runner_would_refuse_its_secs_flags(tmp_path):
    """rows.skip_reason and runner.run read one rule (RunConfig.refused_secs_flags): a same-day row of a model
    without upstream's secs mode is skipped, and the runner refuses the same flags with its own message."""
    import rows
    from config import EMBEDDED_DATA
    from data_loader import DataError
    from runner import run

    sm2 = rows.Row(name="SM2-short-secs", algo="SM2", flags={"with_same_day": True}, table="same-day")
    assert rows.skip_reason(sm2) == "model SM2 does not run upstream's --secs mode yet"
    with pytest.raises(DataError, match="SM2: --secs not implemented"):
        run(rows.config_for(sm2, RunConfig(data=EMBEDDED_DATA, users=[3], quiet=True, result_dir=tmp_path)))
    for name in ("HLR-short-secs", "LSTM-short-secs-duration", "LSTM", "FSRS-7"):  # built in or accepted
        assert rows.skip_reason(rows.BY_NAME[name]) is None
