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
for bit. They are numbered as the cards meet them (card by card, review by review), so a parent comes before its
children. A target reads its card's state before its review at its own elapsed time; targets with the same
(state node, elapsed time, label) are one group whose loss is the summed weight times one BCE (the same value up
to rounding: Σ wᵢ·BCE = (Σ wᵢ)·BCE, summed in another order). As the card loop fuses a target into the step taken
at the target's own elapsed time (step_target), a group is fused into a child of its node taken at the group's
elapsed time (a target's curve does not read the next grade); a child carries at most one group: the i-th group
of a (node, time), in the order the targets meet them, goes to the i-th child of that (node, time), and a group
left without one is computed on its own (target_loss_vjp). An elapsed time of NaN is never fused (NaN ≠ NaN, as
in the card loop's same_time).

The tree is built by one compiled pass over the sequences with open-addressing hash tables, one row (key, value)
per slot so that a probe reads one cache line, two tables of 2-4 slots (32 bytes each) per state at a time
(~1.5-2 ms for the 25k states of the 45k-review user's last fold, ~0.01 s over its 5 folds; ~130 MB at a million
states, while it runs): a numpy build by sorts, level by level, took 15-30 ms a fold there.
"""

from __future__ import annotations

import numpy as np
from numba import njit


_EMPTY = -2  # a free slot's first key (first keys are nodes, or −1 for "no parent")


@njit(cache=True)
def _slot(table, a, b, c):
    """The slot of key (a, b, c) in an open-addressing table (rows a, b, c, value; a power of two of them): its
    own, or the free one where it would go. One row per slot, so a probe touches one cache line."""
    mask = len(table) - 1
    h = a
    for x in (b, c):  # mix, then add the next part: float bits differ in their high bits, the slot is the low ones
        h = (h ^ (h >> 31)) * 0x5851F42D4C957F2D + x
    h = (h ^ (h >> 31)) * 0x5851F42D4C957F2D
    i = (h ^ (h >> 31)) & mask
    while table[i, 0] != _EMPTY and not (table[i, 0] == a and table[i, 1] == b and table[i, 2] == c):
        i = (i + 1) & mask
    return i


@njit(cache=True)
def _table(n):
    cap = 1
    while cap < 2 * n + 2:
        cap *= 2
    return np.full((cap, 4), _EMPTY, dtype=np.int64)


@njit(cache=True)
def _put(table, a, b, c, value):
    """The value of key (a, b, c), stored as `value` when the key is new."""
    i = _slot(table, a, b, c)
    if table[i, 0] == _EMPTY:
        table[i, 0], table[i, 1], table[i, 2], table[i, 3] = a, b, c, value
    return table[i, 3]


@njit(cache=True)
def _get(table, a, b, c):
    i = _slot(table, a, b, c)
    return table[i, 3] if table[i, 0] != _EMPTY else -1


@njit(cache=True)
def _is_nan(bits):
    """A float64's bit pattern is a NaN's (exponent all ones, mantissa not zero)."""
    return (bits & 0x7FF0000000000000) == 0x7FF0000000000000 and (bits & 0x000FFFFFFFFFFFFF) != 0


@njit(cache=True)
def _build(t_bits, seq_g, c_start, c_n, c_tb, c_te, t_pos, dt_bits, y_bits, t_wt):
    """(parent, review index of each node, target groups' (node, first target, summed weight), fused group of
    each node or −1); see the module docstring."""
    n_states = 0
    for c in range(len(c_start)):
        n_states += c_n[c]
    nodes = _table(n_states)
    child_at = _table(n_states)  # (parent, time, rank) -> the rank-th child taken at that time
    parent = np.empty(n_states, dtype=np.int64)
    review = np.empty(n_states, dtype=np.int64)
    node_of = np.empty(len(t_bits), dtype=np.int64)
    count = 0
    for c in range(len(c_start)):
        p = -1
        for k in range(c_n[c]):
            i = c_start[c] + k
            node = _put(nodes, p, t_bits[i], seq_g[i], count)
            if node == count:
                parent[count] = p
                review[count] = i
                count += 1
                if p >= 0:
                    rank = 0
                    while _get(child_at, p, t_bits[i], rank) >= 0:  # a handful at most: one per grade
                        rank += 1
                    _put(child_at, p, t_bits[i], rank, node)
            node_of[i] = node
            p = node
    nodes = _table(0)  # freed: two tables at a time
    n_t = len(t_pos)
    groups = _table(n_t)
    g_node = np.empty(n_t, dtype=np.int64)
    g_first = np.empty(n_t, dtype=np.int64)
    g_wt = np.zeros(n_t)
    n_groups = 0
    for c in range(len(c_start)):
        for j in range(c_tb[c], c_te[c]):
            node = node_of[c_start[c] + t_pos[j] - 1]
            g = _put(groups, node, dt_bits[j], y_bits[j], n_groups)
            if g == n_groups:
                g_node[g] = node
                g_first[g] = j
                n_groups += 1
            g_wt[g] += t_wt[j]
    fused = np.full(count, -1, dtype=np.int64)
    for g in range(n_groups):  # the first child at the group's (node, time) not yet taken: the i-th for the i-th
        j = g_first[g]
        if not _is_nan(dt_bits[j]) and not _is_nan(y_bits[j]):  # (a NaN label would read as "none fused")
            rank = 0
            child = _get(child_at, g_node[g], dt_bits[j], 0)
            while child >= 0 and fused[child] >= 0:
                rank += 1
                child = _get(child_at, g_node[g], dt_bits[j], rank)
            if child >= 0:
                fused[child] = g
    return parent[:count], review[:count], g_node[:n_groups], g_first[:n_groups], g_wt[:n_groups], fused


def _bits(x: np.ndarray) -> np.ndarray:
    """float64 values as their int64 bit patterns: equal keys exactly when the floats are the same bits (so +0 and
    −0 differ, as the card loop's same_time has them)."""
    return np.ascontiguousarray(x, dtype=np.float64).view(np.int64)


class PrefixTree:
    """Nodes (parent, elapsed time, grade; a parent before its children), the target group fused into each node
    and the other target groups, built from seq_engine.Cards; `args()` are tree_loss_grad's data arguments."""

    __slots__ = ("parent", "node_t", "node_g", "fused_y", "fused_wt", "grp_node", "grp_t", "grp_y", "grp_wt")

    def __init__(self, cards):
        parent, review, g_node, g_first, g_wt, fused = _build(
            _bits(cards.seq_dt), np.ascontiguousarray(cards.seq_g, dtype=np.int64), cards.c_start, cards.c_n,
            cards.c_tb, cards.c_te, cards.t_pos, _bits(cards.t_dt), _bits(cards.t_y), cards.t_wt)
        self.parent = parent
        self.node_t = cards.seq_dt[review]
        self.node_g = np.asarray(cards.seq_g[review], dtype=np.int64)
        g_t, g_y = cards.t_dt[g_first], cards.t_y[g_first]
        has = fused >= 0
        self.fused_y = np.full(len(parent), -1.0)
        self.fused_wt = np.zeros(len(parent))
        self.fused_y[has] = g_y[fused[has]]
        self.fused_wt[has] = g_wt[fused[has]]
        rest = np.ones(len(g_node), dtype=bool)
        rest[fused[has]] = False
        self.grp_node, self.grp_t, self.grp_y, self.grp_wt = g_node[rest], g_t[rest], g_y[rest], g_wt[rest]

    def args(self) -> tuple:
        return (self.parent, self.node_t, self.node_g, self.fused_y, self.fused_wt, self.grp_node, self.grp_t,
                self.grp_y, self.grp_wt)
