"""engine/prefix_tree.py and seq_engine_kernels.tree_loss_grad: the cards' shared review prefixes computed once.
The tree of a hand-made set of cards is checked node by node; on a real user the tree pass's loss and gradient are
held to the per-card loop's (loss_grad_cards, the engine's tested pass), which sums every target on its own."""

from __future__ import annotations

import importlib
import types

import numpy as np
import pytest

from check_users import check_features
from engine.autograd_engine import Recipe
from engine.prefix_tree import PrefixTree
from engine.seq_engine import training_cards
from engine.traced import CompiledOwnEngine


def _cards(reviews, targets):
    """A Cards-like set: reviews = one list of (elapsed days, grade) per card; targets = one list per card of
    (history length, elapsed days, label, weight)."""
    seq_dt, seq_g, c_start, c_n, rows = [], [], [], [], []
    for c, (card, tg) in enumerate(zip(reviews, targets)):
        c_start.append(len(seq_dt))
        seq_dt += [float(t) for t, _ in card]
        seq_g += [g for _, g in card]
        c_n.append(max(p for p, *_ in tg))
        rows += [(c, *x) for x in tg]
    card = np.array([r[0] for r in rows])
    c_tb = np.searchsorted(card, np.arange(len(reviews)))
    return types.SimpleNamespace(
        seq_dt=np.array(seq_dt), seq_g=np.array(seq_g, dtype=np.int64), c_start=np.array(c_start),
        c_n=np.array(c_n), c_tb=c_tb, c_te=np.append(c_tb[1:], len(rows)), t_pos=np.array([r[1] for r in rows]),
        t_dt=np.array([float(r[2]) for r in rows]), t_y=np.array([float(r[3]) for r in rows]),
        t_wt=np.array([float(r[4]) for r in rows]))


def test_tree_of_three_cards_by_hand():
    """A and B open alike (Good, then Good after 1 day), C opens with Again: two roots, one shared second state.
    A's and B's first targets (1 day, recalled) are one group of weight 0.5 + 0.25, fused into that shared step;
    C's first target has no step at its time (C's history ends there), nor have A's and B's second ones (3 and 4
    days after the shared state): three groups on their own."""
    cards = _cards([[(0, 3), (1, 3), (3, 1)], [(0, 3), (1, 3), (4, 3)], [(0, 1), (1, 2)]],
                   [[(1, 1, 1, 0.5), (2, 3, 0, 1.0)], [(1, 1, 1, 0.25), (2, 4, 1, 2.0)], [(1, 1, 1, 4.0)]])
    tree = PrefixTree(cards)
    # numbered as the cards meet them: A's (0 days, Good) and (1 day, Good), which B shares; C's (0 days, Again)
    assert tree.parent.tolist() == [-1, 0, -1]
    assert tree.node_g.tolist() == [3, 3, 1] and tree.node_t.tolist() == [0.0, 1.0, 0.0]
    assert tree.fused_y.tolist() == [-1.0, 1.0, -1.0] and tree.fused_wt.tolist() == [0.0, 0.75, 0.0]
    left = sorted(zip(tree.grp_node.tolist(), tree.grp_t.tolist(), tree.grp_y.tolist(), tree.grp_wt.tolist()))
    assert left == [(1, 3.0, 0.0, 1.0), (1, 4.0, 1.0, 2.0), (2, 1.0, 1.0, 4.0)]


def test_two_labels_at_one_time():
    """Targets of both labels at one node and time are two groups; the i-th child taken at that time (any grade:
    a target's curve does not read the grade) carries the i-th group (in the order the targets meet them), and a
    group without a child is computed on its own. A −0 elapsed time is not +0's step (the card loop's
    same_time)."""
    cards = _cards([[(0, 3), (2, 1), (5, 3)], [(0, 3), (2, 3), (5, 3)], [(0, 3), (2, 3), (6, 3)],
                    [(0, 3), (-0.0, 3), (1, 3)], [(0, 2), (3, 3), (1, 3)], [(0, 2), (3, 1)]],
                   [[(1, 2, 0, 1.0), (2, 5, 1, 1.0)], [(1, 2, 1, 1.0), (2, 5, 1, 1.0)], [(1, 2, 1, 3.0), (2, 6, 1, 1.0)],
                    [(1, 0.0, 1, 1.0), (2, 1, 1, 1.0)], [(1, 3, 1, 1.0), (2, 1, 1, 1.0)], [(1, 3, 0, 2.0)]])
    tree = PrefixTree(cards)
    # A: (0, Good), (2, Again); B, C: (2, Good); D: (−0, Good); E, F: (0, Hard), (3, Good)
    assert tree.parent.tolist() == [-1, 0, 0, 0, -1, 4]
    assert tree.node_g.tolist() == [3, 1, 3, 3, 2, 3] and np.signbit(tree.node_t[3])
    # at (root, 2 days) A's forgotten target came first: the first child, (2, Again); B's and C's the second one;
    # at (E's root, 3 days) E's recalled target takes the only child, F's forgotten one stays alone
    assert tree.fused_y.tolist() == [-1.0, 0.0, 1.0, -1.0, -1.0, 1.0]
    assert tree.fused_wt.tolist() == [0.0, 1.0, 4.0, 0.0, 0.0, 1.0]
    left = sorted(zip(tree.grp_node.tolist(), tree.grp_t.tolist(), tree.grp_y.tolist(), tree.grp_wt.tolist()))
    assert left == [(0, 0.0, 1.0, 1.0), (1, 5.0, 1.0, 1.0), (2, 5.0, 1.0, 1.0), (2, 6.0, 1.0, 1.0),
                    (3, 1.0, 1.0, 1.0), (4, 3.0, 0.0, 2.0), (5, 1.0, 1.0, 1.0)]
    assert not np.signbit(tree.grp_t[tree.grp_node == 0][0])  # the +0 target: no step at +0 days


def test_nan_elapsed_time_is_never_fused():
    cards = _cards([[(0, 3), (np.nan, 3)], [(0, 3), (np.nan, 3)]], [[(1, np.nan, 1, 1.0), (2, 1, 1, 1.0)],
                                                                  [(1, np.nan, 1, 2.0), (2, 1, 1, 1.0)]])
    tree = PrefixTree(cards)
    assert tree.parent.tolist() == [-1, 0] and tree.fused_y.tolist() == [-1.0, -1.0]
    assert len(tree.grp_node) == 2 and tree.grp_wt.tolist() == [3.0, 2.0]


@pytest.mark.parametrize("name", ["models.sbd", "models.fsrs7"])
def test_tree_pass_equals_the_card_loop_on_a_real_user(name):
    mod = importlib.import_module(name)
    n = len(mod.DEFAULT_W)
    engine = CompiledOwnEngine(mod, getattr(mod, "LOWER", [-np.inf] * n), getattr(mod, "UPPER", [np.inf] * n))
    seq = engine.seq
    data = check_features(8, False)
    cfg = types.SimpleNamespace(recency=True)
    cards = training_cards(data, Recipe(recency=True).row_weights(cfg, len(data)), 64, None)
    tree = PrefixTree(cards)
    assert len(tree.parent) < 0.7 * cards.c_n.sum()  # shared prefixes: fewer states than the cards hold
    rng = np.random.default_rng(3)
    for w in (np.array(mod.DEFAULT_W), engine.clip(np.array(mod.DEFAULT_W) * (1 + rng.normal(0, 0.05, n)))):
        g_cards, g_tree = np.zeros(n), np.zeros(n)
        loss = seq.k.loss_grad_cards(w, seq.opts, *cards.args(), cards.t_y, cards.t_wt, cards.max_n, g_cards)
        loss_tree = seq.k.tree_loss_grad(w, seq.opts, *tree.args(), g_tree)
        assert loss_tree == pytest.approx(loss, rel=1e-12)
        np.testing.assert_allclose(g_tree, g_cards, rtol=1e-10, atol=1e-10 * np.abs(g_cards).max())
