"""seq_engine.card_order: the engine's (card, history length) order of target rows in linear time, checked against
np.lexsort((seq_pos, seq_start)), the sort it replaces, and its fallback when two rows name one review."""

from __future__ import annotations

import numpy as np

from engine.seq_engine import card_order
from tests.check_users import check_features


def _lexsort(sel, start, pos):
    return sel[np.lexsort((pos[sel], start[sel]))]


def test_hand_built_cards():
    # three cards: sequences [0, 3), [3, 7), [7, 9); rows in time order interleave the cards
    start = np.array([3, 0, 3, 7, 0, 3, 7])
    pos = np.array([1, 1, 2, 1, 2, 3, 0])
    sel = np.arange(7)
    # by hand: card at 0 (rows 1, 4), card at 3 (rows 0, 2, 5), card at 7 (rows 6 with pos 0, then 3)
    assert card_order(sel, start, pos, 9).tolist() == [1, 4, 0, 2, 5, 6, 3]
    assert card_order(sel[::2], start, pos, 9).tolist() == [4, 0, 2, 6]  # a subset: its own rows only
    assert card_order(sel[:0], start, pos, 9).tolist() == []


def test_two_rows_on_one_review_fall_back_to_the_sort():
    start = np.array([0, 0, 0])
    pos = np.array([2, 1, 2])  # rows 0 and 2 are the same review
    sel = np.arange(3)
    assert card_order(sel, start, pos, 3).tolist() == _lexsort(sel, start, pos).tolist() == [1, 0, 2]


def test_equals_lexsort_on_a_real_collection():
    data = check_features(8, True)
    start = data.rows["seq_start"].to_numpy(np.int64)
    pos = data.rows["seq_pos"].to_numpy(np.int64)
    rng = np.random.default_rng(0)
    for sel in (np.arange(len(data)), np.arange(len(data) // 3, len(data)),
                np.sort(rng.choice(len(data), len(data) // 2, replace=False))):
        assert np.array_equal(card_order(sel, start, pos, len(data.seq_delta_t)), _lexsort(sel, start, pos))
