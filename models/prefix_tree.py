"""The training cards as a prefix tree of their review sequences, so that a full-batch loss pass computes every
distinct state once (seq_engine_kernels.tree_loss_grad).

Why: a model's state after a card's first k reviews depends on those reviews' (elapsed time, grade) only (the
contract: cards are independent and a step is a function of the previous state, the time and the grade). Cards
that start alike share those states: every card whose first review is Good starts from the same state, and in
real collections whole early schedules repeat (1, 3, 7 days ...). The per-card loop computes them once per card.
Counted on the last fold's training cards: 24,849 states but 9,863 distinct prefixes on a 45k-review simulated
user (2.5×), 3,709 / 822 (4.5×) and 3,057 / 1,026 (3.0×) on the two large embedded users, 592 / 211 (2.8×) on a
sim36 user. SBD's full-batch L-BFGS makes ~28 such passes per fold, so it runs them on this tree.

Nodes are keyed by (parent node, elapsed time as its float64 bits, grade): identical inputs, identical state, bit
for bit. A target reads its card's state before its review at its own elapsed time; targets with the same
(state node, elapsed time, label) are one group whose loss is the summed weight times one BCE (the same value up
to rounding: Σ wᵢ·BCE = (Σ wᵢ)·BCE, summed in another order). As the card loop fuses a target into the step taken
at the target's own elapsed time (step_target), a group is fused into a child of its node taken at the group's
elapsed time; a child carries at most one group (the y = 0 and y = 1 groups at the same time take two children
when there are two, else one of them is computed on its own by target_loss_vjp).
"""

from __future__ import annotations

import numpy as np


def _bits(x: np.ndarray) -> np.ndarray:
    """float64 values as their int64 bit patterns: equal keys exactly when the floats are the same bits (so +0 and
    −0 differ, as the card loop's same_time has them)."""
    return np.ascontiguousarray(x, dtype=np.float64).view(np.int64)


def _group(*keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(group id of each row, the first row of each group) for rows keyed by the tuple of `keys` (int64 arrays);
    groups are numbered in key order, rows of a group keep their order."""
    order = np.lexsort(keys[::-1])
    new = np.zeros(len(order), dtype=bool)
    if len(order):
        new[0] = True
    for key in keys:
        k = key[order]
        new[1:] |= k[1:] != k[:-1]
    gid = np.empty(len(order), dtype=np.int64)
    gid[order] = np.cumsum(new) - 1
    return gid, order[new]


def _rank_in_block(*keys: np.ndarray) -> np.ndarray:
    """For rows keyed by `keys` (the last one a tie-break), each row's rank among the rows sharing the other keys."""
    order = np.lexsort(keys[::-1])
    n = len(order)
    start = np.zeros(n, dtype=bool)
    if n:
        start[0] = True
    for key in keys[:-1]:
        k = key[order]
        start[1:] |= k[1:] != k[:-1]
    pos = np.arange(n)
    block = np.maximum.accumulate(np.where(start, pos, 0))
    rank = np.empty(n, dtype=np.int64)
    rank[order] = pos - block
    return rank


class PrefixTree:
    """Nodes (parent, elapsed time, grade; topological order: level by level), fused target groups per node and the
    other target groups, built from seq_engine.Cards; `args()` are tree_loss_grad's data arguments."""

    __slots__ = ("parent", "node_t", "node_g", "fused_y", "fused_wt", "grp_node", "grp_t", "grp_y", "grp_wt")

    def __init__(self, cards):
        start, n = cards.c_start, cards.c_n
        node_of = np.full(len(cards.seq_dt), -1, dtype=np.int64)  # the node of each sequence slot a card uses
        parents, times, grades = [], [], []
        count, k = 0, 0
        active = np.arange(len(start))
        while len(active):
            idx = start[active] + k
            t, g = cards.seq_dt[idx], cards.seq_g[idx]
            par = np.full(len(active), -1, dtype=np.int64) if k == 0 else node_of[idx - 1]
            gid, first = _group(par, _bits(t), g.astype(np.int64))
            node_of[idx] = gid + count
            parents.append(par[first])
            times.append(t[first])
            grades.append(g[first])
            count += len(first)
            k += 1
            active = active[n[active] > k]
        self.parent = np.concatenate(parents) if parents else np.zeros(0, dtype=np.int64)
        self.node_t = np.concatenate(times) if times else np.zeros(0)
        self.node_g = np.concatenate(grades).astype(np.int64) if grades else np.zeros(0, dtype=np.int64)

        # target groups: (node of the state read, elapsed time, label), weights summed
        card = cards.card_of()
        node = node_of[start[card] + cards.t_pos - 1]
        gid, first = _group(node, _bits(cards.t_dt), _bits(cards.t_y))
        g_node, g_t, g_y = node[first], cards.t_dt[first], cards.t_y[first]
        g_wt = np.bincount(gid, weights=cards.t_wt, minlength=len(first))

        # fuse a group into a child of its node taken at its elapsed time: the i-th child of each (node, time)
        # carries the i-th group of that (node, time)
        child = np.flatnonzero(self.parent >= 0)
        c_key = (self.parent[child], _bits(self.node_t[child]))
        c_rank = _rank_in_block(*c_key, child)
        can = np.flatnonzero(~np.isnan(g_t))
        q_key = (g_node[can], _bits(g_t[can]))
        q_rank = _rank_in_block(*q_key, _bits(g_y[can]))
        kind = np.concatenate([np.zeros(len(child), dtype=np.int64), np.ones(len(can), dtype=np.int64)])
        who = np.concatenate([child, can])
        keys = [np.concatenate([a, b]) for a, b in zip(c_key + (c_rank,), q_key + (q_rank,))]
        order = np.lexsort((kind, keys[2], keys[1], keys[0]))
        same = np.ones(max(len(order) - 1, 0), dtype=bool)
        for key in keys:
            k_s = key[order]
            same &= k_s[1:] == k_s[:-1]
        pair = np.flatnonzero(same & (kind[order][:-1] == 0) & (kind[order][1:] == 1))
        nodes, groups = who[order][pair], who[order][pair + 1]
        self.fused_y = np.full(count, -1.0)
        self.fused_wt = np.zeros(count)
        self.fused_y[nodes] = g_y[groups]
        self.fused_wt[nodes] = g_wt[groups]
        rest = np.ones(len(first), dtype=bool)
        rest[groups] = False
        self.grp_node, self.grp_t, self.grp_y, self.grp_wt = g_node[rest], g_t[rest], g_y[rest], g_wt[rest]

    def args(self) -> tuple:
        return (self.parent, self.node_t, self.node_g, self.fused_y, self.fused_wt, self.grp_node, self.grp_t,
                self.grp_y, self.grp_wt)
