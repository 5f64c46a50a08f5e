"""Each preprocessing rule of spec/pipeline.md §2 on small hand-made revlogs."""

import numpy as np
import pandas as pd
import pytest

from features import FeatureConfig, NotEnoughData, _outlier_mask, build_features
from revlog_factory import make_revlog

DAY = FeatureConfig()
SHORT = FeatureConfig(short=True)


def steady_cards(n_cards, days=(0, 1, 3, 7, 15), rating=3):
    return [[(d, rating) for d in days] for _ in range(n_cards)]


def with_filler(cards, n=25):
    """Append n plain cards per (first rating, first interval) of the test cards, so that the outlier rule
    (which drops any first-interval cell while fewer than 20 reviews were dropped) keeps the test cards."""
    out = list(cards)
    for reviews in cards:
        first_day, first_rating = reviews[0]
        later = [d for d, _ in reviews[1:] if d > first_day]
        if later:
            dt = later[0] - first_day
            out += [[(0, first_rating), (dt, 3), (dt + 4, 3)] for _ in range(n)]
    return out


def test_targets_are_long_term_reviews_with_histories():
    # one card: first review, a same-day repeat, then reviews after 2 and 5 days
    cards = with_filler([[(0, 1), (0, 3), (2, 3), (7, 1), (7, 3), (9, 4)]])
    df = make_revlog(cards)
    d = build_features(df, DAY)
    c0 = d.rows[d.rows.card_id == 0].reset_index(drop=True)
    # day mode: same-day reviews are gone entirely; targets are the reviews on days 2, 7, 9
    assert list(c0.delta_t) == [2, 5, 2]
    assert list(c0.y) == [1, 0, 1]
    assert list(c0.i) == [2, 3, 4]
    assert list(c0.seq_pos) == [1, 2, 3]
    t, r = d.history(int(np.flatnonzero(d.rows.card_id == 0)[2]))
    assert list(t) == [0, 2, 5] and list(r) == [1, 3, 1]
    assert list(c0.first_rating) == [1, 1, 1]
    # lapses: Again on day 7 (interval 5) counts for the day-9 review; the first-review Again never counts
    assert list(c0.rmse_bins_lapse) == [0, 0, 1]
    # last_rating: latest earlier review with interval > 0, else the first rating
    assert list(c0.last_rating) == [1, 3, 1]

    s = build_features(df, SHORT)
    s0 = s.rows[s.rows.card_id == 0].reset_index(drop=True)
    # short: same targets, but histories keep the same-day reviews (interval 0)
    assert list(s0.delta_t) == [2, 5, 2] and list(s0.i) == [2, 3, 4]
    assert list(s0.seq_pos) == [2, 3, 5]
    t, r = s.history(int(np.flatnonzero(s.rows.card_id == 0)[2]))
    assert list(t) == [0, 0, 2, 5, 0] and list(r) == [1, 3, 3, 1, 3]
    # day 9's latest earlier long-term review is day 7's Again (the later same-day Good has interval 0)
    assert list(s0.last_rating) == [1, 3, 1]
    assert len(s) == len(d)


def test_last_rating_picks_latest_long_term_review():
    cards = with_filler([[(0, 3), (3, 2), (3, 1), (5, 4)]])
    s = build_features(make_revlog(cards), SHORT)
    c0 = s.rows[s.rows.card_id == 0]
    # targets: day 3 (Hard), day 5 (Easy). For day 5 the latest earlier review with interval > 0 is day 3's Hard;
    # the same-day Again has interval 0 and is skipped.
    assert list(c0.last_rating) == [3, 2]


def test_rating_filter_and_two_buttons():
    cards = with_filler([[(0, 3), (1, 0), (2, 2), (4, 4), (8, 1)]])
    df = make_revlog(cards)
    d = build_features(df, DAY)
    c0 = d.rows[d.rows.card_id == 0]
    assert list(c0.rating) == [2, 4, 1]  # rating 0 row dropped before anything else
    assert list(c0.delta_t) == [1, 2, 4]  # delta_t comes from elapsed_days of each kept row, not recomputed
    b = build_features(df, FeatureConfig(two_buttons=True))
    assert list(b.rows[b.rows.card_id == 0].rating) == [3, 3, 1]
    assert set(np.unique(b.seq_rating)) <= {1, 3}


def test_cap_counts_first_128_reviews_including_same_day():
    # 1 first review + 10 same-day repeats + 140 daily reviews
    reviews = [(0, 3)] + [(0, 3)] * 10 + [(d, 3) for d in range(1, 141)]
    df = make_revlog(with_filler([reviews]))
    d = build_features(df, DAY)
    # 128 valid reviews kept: 11 on day 0 (same-day ones dropped later), days 1..117 → 117 targets
    assert (d.rows.card_id == 0).sum() == 117
    assert d.rows[d.rows.card_id == 0].delta_t.max() == 1
    d64 = build_features(df, FeatureConfig(max_seq_len=32))
    assert (d64.rows.card_id == 0).sum() == 64 - 11


def test_outlier_rule_drops_rare_and_long_first_intervals():
    # first_rating 3: i==2 cells delta_t 1 x100, 2 x100, 3 x100, 200 x50, 7 x10 → T = max(18, 20) = 20
    cards = []
    for dt, n in ((1, 100), (2, 100), (3, 100), (200, 50), (7, 10)):
        cards += [[(0, 3), (dt, 3), (dt + 10, 3)] for _ in range(n)]
    # first_rating 4: 1 x100, 200 x50, 5 x25 → the 200-day cell survives (limit 365 for Easy)
    for dt, n in ((1, 100), (200, 50), (5, 25)):
        cards += [[(0, 4), (dt, 3), (dt + 10, 3)] for _ in range(n)]
    d = build_features(make_revlog(cards), DAY)
    first = d.rows[d.rows.i == 2]
    kept3 = set(first[first.first_rating == 3].delta_t)
    kept4 = set(first[first.first_rating == 4].delta_t)
    assert kept3 == {1, 2, 3}  # 7 (under the 20-review budget) and 200 (> 100 days) removed
    assert kept4 == {1, 5, 200}
    # a card whose first long-term review was dropped loses its whole history
    assert len(d.rows) == 2 * (300 + 175)


def test_outlier_tie_break_prefers_dropping_longer_interval():
    cards = []
    for dt, n in ((10, 12), (20, 12), (1, 100)):
        cards += [[(0, 3), (dt, 3), (dt + 5, 3)] for _ in range(n)]
    d = build_features(make_revlog(cards), DAY)
    assert set(d.rows[d.rows.i == 2].delta_t) == {1, 10}


def test_card_without_first_review_loses_only_its_first_long_term_row():
    df = make_revlog(steady_cards(30))
    # a card whose history starts mid-way (elapsed_days > 0 on its first row) and has a rare interval 77
    extra = pd.DataFrame({"card_id": [99] * 3, "day_offset": [100, 177, 190], "rating": [3, 3, 3],
                          "state": [2, 2, 2], "duration": [1000] * 3, "elapsed_days": [23, 77, 13],
                          "elapsed_seconds": [23 * 86400, 77 * 86400, 13 * 86400]})
    df = pd.concat([df, extra], ignore_index=True)
    d = build_features(df, DAY)
    c = d.rows[d.rows.card_id == 99]
    # i = 2, 3, 4; the i == 2 row (interval 23, a rare cell) is an outlier, the later rows stay (no gap in i)
    assert list(c.i) == [3, 4] and list(c.delta_t) == [77, 13]


def test_outlier_rule_matches_fsrs_optimizer_on_random_cells():
    fo = pytest.importorskip("fsrs_optimizer")
    rng = np.random.default_rng(7)
    for trial in range(30):
        n = int(rng.integers(20, 600))
        fr = rng.choice([1, 2, 3, 4], size=n, p=[0.2, 0.1, 0.6, 0.1])
        dt = np.minimum(rng.geometric(0.08, size=n) * rng.choice([1, 1, 1, 30], size=n), 500)
        mine = ~_outlier_mask(fr, dt.astype(np.int64), np.ones(n, dtype=bool))
        frame = pd.DataFrame({"first_rating": fr.astype(str), "delta_t": dt, "y": rng.integers(0, 2, n)})
        # group by a copy of the key so the group keeps its first_rating column (pandas 3 drops grouping columns)
        kept = frame.groupby(frame["first_rating"].to_numpy(), group_keys=False).apply(fo.remove_outliers)
        assert sorted(kept.index) == sorted(np.flatnonzero(mine)), f"trial {trial}"


def test_too_few_rows_is_a_skip():
    with pytest.raises(NotEnoughData):
        build_features(make_revlog([[(0, 3), (1, 3)]]), DAY)


def test_upstream_check_sizes():
    """Upstream's own evaluated-review counts on two real collections (tests/fixtures/upstream-check)."""
    from check_users import CHECK, UPSTREAM
    from data_loader import load_revlogs
    from split import evaluated_size

    for user, res in UPSTREAM["FSRS-6"].items():
        df = load_revlogs(CHECK, int(user))
        for fcfg in (DAY, SHORT):
            assert evaluated_size(len(build_features(df, fcfg))) == res["size"]


@pytest.mark.parametrize("fcfg", [DAY, SHORT], ids=["day", "short"])
def test_accounting_names_where_every_review_went(fcfg):
    """25 plain cards (first interval 2 days), card A with a same-day repeat, card B whose rare first interval (50
    days) the outlier rule drops, so its next review is cut at the gap, and one manual entry (rating 0)."""
    plain = [[(0, 3), (2, 3), (6, 3)] for _ in range(25)]
    card_a = [(0, 3), (0, 3), (2, 3), (6, 1)]
    card_b = [(0, 3), (50, 3), (55, 3)]
    df = make_revlog(plain + [card_a, card_b])
    manual = df.iloc[[-1]].assign(rating=0, day_offset=100)
    df = pd.concat([df, manual], ignore_index=True)
    counts = {}
    data = build_features(df, fcfg, accounting=counts)
    assert counts == {"rating": 1, "cap": 0, "same_day": 1, "first": 27, "outlier": 1, "gap": 1,
                      "targets": 25 * 2 + 2}
    assert counts["targets"] == len(data) and sum(counts.values()) == len(df)


def test_subset_takes_the_same_rows_by_slice_or_take():
    """ReviewData.subset's slice path (one block of rows) and take path give pandas' own selection."""
    from models.base import ReviewData

    rows = pd.DataFrame({"a": np.arange(10) * 3, "b": np.linspace(0, 1, 10)})
    data = ReviewData(rows, np.zeros(1), np.zeros(1, dtype=np.int8))
    mask = np.zeros(10, dtype=bool)
    mask[[2, 3, 7]] = True
    cases = [(np.arange(10), rows), (np.arange(3, 8), rows.iloc[3:8]), (np.array([1, 4, 5]), rows.iloc[[1, 4, 5]]),
             (np.array([], dtype=np.int64), rows.iloc[[]]), (np.ones(10, dtype=bool), rows),
             (mask, rows[mask]), (np.arange(10) == 0, rows.iloc[[0]]), (pd.Series(mask), rows[mask])]
    for selector, expected in cases:
        got = data.subset(selector).rows
        pd.testing.assert_frame_equal(got, expected.reset_index(drop=True))
