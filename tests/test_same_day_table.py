"""The "With same-day reviews" table: every row of a user evaluates the same reviews, and more of them than the
table without same-day reviews (upstream's `--short --secs` runs; rows.py, `--with_same_day`).

Checked on the folds every row's run is built from (pipeline.prepare_user: features, the model's target hook, the
split): a row's `size` is the number of test rows over its folds. Ebisu-v2 and SM-2 drop cards that are missing from
the cards/decks tables (upstream's own code path for them, models/sm2.py), so a user whose revlog names a deleted
card evaluates fewer reviews there: upstream's tables carry the same difference. The user here has every card in its
tables.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import rows as table_rows
from config import RunConfig
from pipeline import PreparedUser, prepare_user
from revlog_factory import make_revlog, write_user

# Four card histories, 31 reviews, with same-day repeats (make_revlog: elapsed_seconds = whole days + 60 s per earlier
# review of the card, so a same-day repeat is 60·k seconds: > 0, a target in secs mode), twelve cards of each (the
# day-mode outlier rule drops up to 20 first long-term reviews per first rating: it keeps the 24 cards first rated
# Good): 48 cards, 372 reviews. Every review but each card's first is a secs target: 372 − 48 = 324;
# TimeSeriesSplit(5) tests the last 5·(324 // 6) = 270 of them in time order.
PATTERNS = [[(0, 1), (0, 3), (1, 3), (2, 1), (2, 3), (4, 3), (9, 3), (20, 3)],
         [(0, 3), (1, 3), (3, 3), (5, 1), (5, 3), (6, 3), (12, 4), (25, 3)],
         [(1, 2), (1, 3), (2, 3), (5, 3), (11, 3), (11, 1), (12, 3), (30, 3)],
         [(2, 3), (3, 3), (6, 2), (6, 3), (10, 3), (21, 3), (40, 3)]]
CARDS = PATTERNS * 12


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    path = tmp_path_factory.mktemp("same_day_user")
    revlog = make_revlog(CARDS)
    cards = pd.DataFrame({"card_id": np.arange(len(CARDS)), "note_id": np.arange(len(CARDS)), "deck_id": 0})
    decks = pd.DataFrame({"deck_id": [0], "parent_id": [-1], "preset_id": [0]})
    write_user(path, 1, revlog, cards, decks)
    return path


def expected_test_review_th() -> list[int]:
    """By hand from the revlog's time order: every review that is not its card's first, the last 270 of them."""
    revlog = make_revlog(CARDS)
    first = ~revlog["card_id"].duplicated()
    targets = (np.flatnonzero(~first.to_numpy()) + 1).tolist()  # review_th counts revlog rows from 1
    assert len(targets) == 324
    return targets[-270:]


def _tested(cfg: RunConfig, root) -> list[int]:
    prep = prepare_user(1, cfg, root)
    assert isinstance(prep, PreparedUser), getattr(prep, "error", None) or getattr(prep, "skipped", None)
    review_th = prep.data.rows["review_th"].to_numpy()
    return sorted(int(x) for _, te in prep.folds for x in review_th[te])


# the LSTM's same-day row tests whole-day intervals only (upstream's; the test after the next)
SAME_DAY = [r for r in table_rows.ROWS if r.table == "same-day" and r.algo != "LSTM"]
DAY = [r for r in table_rows.ROWS if r.table == "day" and r.algo in {"FSRS-6", "FSRS-7", "DASH", "HLR", "AVG"}]


@pytest.mark.parametrize("row", SAME_DAY, ids=[r.name for r in SAME_DAY])
def test_every_same_day_row_tests_every_secs_target(row, root):
    if (reason := table_rows.skip_reason(row)) is not None:
        pytest.skip(reason)
    cfg = table_rows.config_for(row, RunConfig(processes=1))
    assert cfg.short and cfg.secs and not cfg.equalize_mode
    assert _tested(cfg, root) == expected_test_review_th()


def test_the_lstm_same_day_row_tests_the_reviews_after_a_days_first(root):
    """upstream's LSTM feeds its forgetting curve elapsed_days, and its delta_t > 0 target filter then runs on whole
    days: every review that is neither its card's first nor a same-day repeat (no outlier rule), the last
    5·(n // 6) of them. By hand, per card: pattern 1 has 8 reviews, minus its first and the repeats on days 0 and 2:
    5; pattern 2: 8 − 1 − 1 (day 5) = 6; pattern 3: 8 − 1 − 2 (days 1 and 11) = 5; pattern 4: 7 − 1 − 1 (day 6) = 5.
    12 × 21 = 252 targets, the last 5·42 = 210 tested: fewer than the other same-day rows' 270."""
    revlog = make_revlog(CARDS)
    first = ~revlog["card_id"].duplicated().to_numpy()
    targets = (np.flatnonzero(~first & (revlog["elapsed_days"].to_numpy() > 0)) + 1).tolist()
    assert len(targets) == 252
    cfg = table_rows.config_for(table_rows.BY_NAME["LSTM-short-secs-duration"], RunConfig(processes=1))
    assert _tested(cfg, root) == targets[-210:]


@pytest.mark.parametrize("row", DAY, ids=[r.name for r in DAY])
def test_day_rows_test_fewer_reviews_and_no_same_day_one(row, root):
    if (reason := table_rows.skip_reason(row)) is not None:
        pytest.skip(reason)
    cfg = table_rows.config_for(row, RunConfig(processes=1))
    got = _tested(cfg, root)
    revlog = make_revlog(CARDS)
    assert 0 < len(got) < len(expected_test_review_th())
    assert all(revlog["elapsed_days"].iat[th - 1] > 0 for th in got)  # never a same-day review
