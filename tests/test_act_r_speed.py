"""ACT-R's faster training (models/act_r.py, seq_engine.share_card_prefixes): upstream's length batches with a
card's targets in one batch replayed together cover exactly the same targets and give the same fit as one replay
per target; the whole-day logarithm table agrees with torch's log on intervals that miss it (fractions of a day,
intervals past the table)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from check_users import engine_vs_torch
from config import RunConfig
from models.act_r import ACTR, N_LOG_DAYS
from models.base import ReviewData
from upstream.history_torch import ACTRNet
from engine.seq_engine import Cards, SeqEngine, time_order, training_cards


def test_shared_items_cover_the_same_targets_per_batch(user8):
    engine = SeqEngine("models.act_r", ACTR.lower, ACTR.upper)
    cards = training_cards(user8, None, 63, None)
    items, orders, bounds, n_batches = engine._length_batches(cards, 3, 64, "quicksort")
    assert (items[:, 2] == items[:, 1] + 1).all()  # one item per target
    m_items, m_orders, m_bounds, m_n = engine._length_batches(cards, 3, 64, "quicksort", share=True)
    assert (m_n == n_batches).all() and len(m_items) < len(items)
    card_of = np.repeat(np.arange(len(cards.c_start)), cards.c_te - cards.c_tb)
    for e in range(orders.shape[0]):
        for b in range(n_batches[e]):
            before = sorted(items[orders[e, bounds[e, b]:bounds[e, b + 1]], 1])
            after = []
            for it in m_orders[e, m_bounds[e, b]:m_bounds[e, b + 1]]:
                c, tb, te, n = m_items[it]
                assert (card_of[tb:te] == c).all()  # one card per item
                assert n == cards.t_pos[te - 1] == cards.t_pos[tb:te].max()  # replayed up to its longest target
                after.extend(range(tb, te))
            assert after == before  # the same targets, each once, in the same batch


def test_shared_fit_equals_one_replay_per_target(user8):
    """The same batches, so the same Adam steps: only the order of each batch's gradient sum differs."""
    train = user8.subset(np.arange(3000))
    model = ACTR(RunConfig(algo="ACT-R"))
    cfg = RunConfig(algo="ACT-R", max_seq_len=63)
    fits = [model.engine.fit(model.default_w, train, cfg, batching=b, sort_kind="quicksort", check_every_epoch=True)
            for b in ("length", "length-shared")]
    assert not np.allclose(fits[0], model.default_w)
    np.testing.assert_allclose(fits[1], fits[0], rtol=1e-10, atol=1e-12)


def test_time_order_is_the_stable_argsort():
    """seq_engine.time_order (a scatter) against numpy's stable argsort: distinct sparse row numbers, an empty
    array, and repeated numbers (where it falls back to the sort)."""
    rng = np.random.default_rng(3)
    for n in (0, 1, 7, 500):
        rows = rng.choice(5 * n + 1, size=n, replace=False)
        np.testing.assert_array_equal(time_order(rows), np.argsort(rows, kind="stable"))
    rows = np.array([4, 2, 4, 0, 2])
    np.testing.assert_array_equal(time_order(rows), np.argsort(rows, kind="stable"))


def test_exp_table_within_one_ulp_of_libm():
    """vec_math.exp_table (ACT-R's per-pair exp) against the C library's exp: within 1 ulp over ACT-R's range
    (−d·ln(Δ·86400·h) <= 0), the whole normal range and near 0; the edges (0 below ~−745, inf, NaN) as libm."""
    import math

    from numba import njit

    from engine.vec_math import exp_table

    @njit
    def both(x, a, b):
        for i in range(len(x)):
            a[i] = exp_table(x[i])
            b[i] = math.exp(x[i])

    rng = np.random.default_rng(5)
    x = np.concatenate([rng.uniform(-60.0, 0.0, 200_000), rng.uniform(-708.0, 709.0, 200_000),
                        rng.uniform(-1e-3, 1e-3, 10_000), [0.0, -0.0, -707.9, 708.9, -708.0, -720.0, -745.2, -800.0,
                                                          709.5, 800.0, np.inf, -np.inf, np.nan]])
    a, b = np.empty_like(x), np.empty_like(x)
    both(x, a, b)
    normal = np.isfinite(b) & (b >= np.finfo(float).tiny)
    assert (np.abs(a[normal] - b[normal]) <= np.spacing(b[normal])).all()
    np.testing.assert_array_equal(a[~normal], b[~normal])
    assert a[-13] == 1.0 and a[-12] == 1.0


def fractional_cards() -> ReviewData:
    """Three cards: whole days, fractions of a day (same-day and sub-second gaps too), and gaps past the table.
    The fractions and their partial sums are exact in float32 (2^−20 day for the sub-second gap), where upstream's
    float32 cumulative times (reproduced by target_inputs for fractional cards) equal the float64 reference's."""
    seqs = [[0.0, 1.0, 3.0, 0.0, 7.0, 30.0], [0.0, 0.25, 1.5, 2.0 ** -20, 2.75, 0.5],
            [0.0, N_LOG_DAYS + 3.0, 2.0, 9000.5]]
    seq_dt, starts, pos = [], [], []
    for s in seqs:
        starts += [len(seq_dt)] * (len(s) - 1)
        pos += list(range(1, len(s)))
        seq_dt += s
    seq_dt, starts, pos = np.array(seq_dt), np.array(starts), np.array(pos)
    rows = pd.DataFrame({"card_id": np.searchsorted(np.unique(starts), starts), "delta_t": seq_dt[starts + pos],
                         "y": np.arange(len(pos)) % 2, "i": pos + 1, "seq_start": starts, "seq_pos": pos})
    return ReviewData(rows, seq_dt, np.full(len(seq_dt), 3, dtype=np.int8))


def test_fractional_and_long_intervals_equal_torch():
    data = fractional_cards()
    model = ACTR(RunConfig(algo="ACT-R"))
    for w in (np.array(model.default_w), np.array([0.3, 0.6, 0.2, -0.5, 0.9])):
        c = engine_vs_torch(model, ACTRNet(w, ACTR.lower, ACTR.upper, dtype=torch.float64), w, data,
                            np.linspace(0.5, 1.5, len(data)))
        np.testing.assert_allclose(c.p, c.p_ref, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(c.grad, c.grad_ref, rtol=1e-9, atol=1e-12 * np.abs(c.grad).max())
    assert len(Cards(data).t_pos) == len(data)


def test_exp_table_entries_are_the_nearest_doubles_to_two_to_the_i_over_128():
    """The table (powers of one 2^(1/128) in 60-digit decimals) against each entry's own 50-digit exp(i·ln2/128)."""
    from decimal import Decimal, localcontext

    from engine.vec_math import _EXP2_TABLE_BITS

    with localcontext() as ctx:
        ctx.prec = 50
        expected = [float((Decimal(2).ln() * i / 128).exp()) for i in range(128)]
    assert _EXP2_TABLE_BITS.view(np.float64).tolist() == expected


def test_shared_items_by_chunk_then_target_as_the_lexsort():
    """share_card_prefixes' ordering (seq_engine._by_chunk_then_target: a scatter and a 16-bit radix sort when the
    targets are all of them once) against np.lexsort((targets, chunk)): a permutation cut into batches of 7, an
    empty one, and a subset with a repeated target (where it falls back to the sort)."""
    from engine.seq_engine import _by_chunk_then_target

    rng = np.random.default_rng(11)
    for n in (0, 1, 50, 3001):
        targets = rng.permutation(n)
        chunk = np.arange(n) // 7
        order = np.lexsort((targets, chunk))
        t_s, b_s = _by_chunk_then_target(targets, chunk, n)
        np.testing.assert_array_equal(t_s, targets[order])
        np.testing.assert_array_equal(b_s, chunk[order])
    targets, chunk = np.array([5, 3, 5, 0]), np.array([0, 0, 1, 1])
    t_s, b_s = _by_chunk_then_target(targets, chunk, 6)
    np.testing.assert_array_equal(t_s, [3, 5, 0, 5])
    np.testing.assert_array_equal(b_s, [0, 0, 1, 1])


def test_batch_permutations_are_torch_randperms_of_one_generator():
    """seq_engine.batch_permutations (cached per size) draws what one torch generator seeded 2023 draws."""
    from engine.seq_engine import batch_permutations

    g = torch.Generator().manual_seed(2023)
    expected = [torch.randperm(13, generator=g).numpy() for _ in range(4)]
    for _ in range(2):  # the second call is the cached tuple
        got = batch_permutations(13, 4)
        assert len(got) == 4
        for a, b in zip(got, expected):
            np.testing.assert_array_equal(a, b)
