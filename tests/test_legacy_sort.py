"""models/legacy_sort.py: numpy 1.26's quicksort argsort order, which upstream's January-2025 batches came from.

The expected permutations below are numpy 1.26.4's own np.argsort(..., kind="quicksort") outputs (run in upstream's
environment, a CPU without AVX-512: the generic introsort), plus one traced by hand: an independent implementation,
not this module's output."""

from __future__ import annotations

import numpy as np
import pytest

from models import legacy_sort
from models.legacy_sort import argsort_numpy126
from models.seq_engine import NUMPY126, argsort


def test_small_arrays_are_insertion_sorted_in_place():
    """Up to 16 elements numpy only insertion-sorts, which keeps equal keys in their order."""
    for n in range(17):
        assert argsort_numpy126(np.full(n, 8, dtype=np.int64)).tolist() == list(range(n))


def test_seventeen_equal_keys_by_hand():
    """n = 17 is the first partition: pivot index 8 (middle), moved to slot 15; the scans from 1 and 14 stop at
    every equal key and swap (1,14), (2,13), …, (7,8), meet at 8, and the pivot goes back to slot 8; both halves
    (8 elements each) are then insertion-sorted, which leaves them as they are."""
    assert argsort_numpy126(np.full(17, 8, dtype=np.int64)).tolist() == \
        [0, 14, 13, 12, 11, 10, 9, 15, 8, 6, 5, 4, 3, 2, 1, 7, 16]


NUMPY_1_26_4 = {  # np.argsort(np.full(n, key), kind="quicksort") under numpy 1.26.4
    24: [0, 21, 20, 19, 18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 22, 23],
    42: [0, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 22, 21, 20, 19, 1, 2, 3, 4, 5, 6, 7,
         8, 40, 9, 11, 12, 13, 14, 15, 16, 17, 18, 10, 41],
    100: [0, 72, 71, 70, 69, 68, 67, 66, 65, 64, 63, 62, 61, 60, 59, 58, 57, 56, 55, 54, 53, 52, 73, 51, 74, 76, 97,
          96, 95, 94, 93, 92, 91, 90, 89, 88, 87, 86, 85, 84, 83, 82, 81, 80, 79, 78, 77, 75, 50, 49, 48, 21, 20, 19,
          18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 22, 23, 24, 25, 47, 46, 45, 44, 43, 42, 41,
          40, 39, 38, 98, 37, 35, 34, 33, 32, 31, 30, 29, 28, 27, 26, 36, 99],
}


@pytest.mark.parametrize("n", sorted(NUMPY_1_26_4))
def test_equal_keys_as_numpy_1_26(n):
    assert argsort_numpy126(np.full(n, 8, dtype=np.int64)).tolist() == NUMPY_1_26_4[n]


def test_keys_with_ties_as_numpy_1_26():
    keys = np.array([3, 1, 2, 3, 3, 1, 2, 2, 3, 1, 1, 3, 2, 3, 1, 2, 3, 3, 2, 1, 1, 2, 3, 1, 2], dtype=np.int64)
    assert argsort_numpy126(keys).tolist() == \
        [1, 20, 19, 5, 14, 9, 10, 23, 12, 21, 18, 15, 24, 7, 6, 2, 13, 8, 16, 17, 4, 3, 22, 11, 0]


def test_sorts_and_permutes():
    """Whatever the tie order, the result is a permutation that sorts the keys (large n: deep partitions)."""
    rng = np.random.default_rng(3)
    for n, hi in ((5000, 3), (20000, 1000), (3000, 1)):
        keys = rng.integers(0, hi, n).astype(np.int64)
        order = argsort_numpy126(keys)
        assert sorted(order.tolist()) == list(range(n))
        assert (np.diff(keys[order]) >= 0).all()


def test_heapsort_fallback_sorts():
    """The introsort's depth-limit fallback (not reached by equal keys) on its own: a sorting permutation."""
    from models.legacy_sort import _heapsort

    keys = np.random.default_rng(5).integers(0, 50, 1000).astype(np.int64)
    order = np.arange(1000)
    _heapsort(keys, order, 0, 1000)
    assert sorted(order.tolist()) == list(range(1000)) and (np.diff(keys[order]) >= 0).all()


def test_engine_argsort_dispatch():
    keys = np.zeros(42, dtype=np.int64)
    assert argsort(keys, NUMPY126).tolist() == NUMPY_1_26_4[42]
    assert argsort(keys, "stable").tolist() == list(range(42))


def test_upstream_argsort_follows_the_cpu_unless_pinned(monkeypatch):
    """numpy 1.26 ran x86-simd-sort where the CPU has AVX-512 (numpy's own argsort there gives that order) and the
    generic introsort elsewhere; SRS_BENCH_TIE_ORDER=generic pins the introsort on every CPU."""
    keys = np.zeros(42, dtype=np.int64)
    native = np.argsort(keys, kind="quicksort").tolist()
    monkeypatch.setattr(legacy_sort, "numpy_sorts_with_avx512", lambda: True)
    monkeypatch.setenv(legacy_sort.TIE_ORDER_ENV, "cpu")
    assert legacy_sort.upstream_argsort(keys).tolist() == native
    monkeypatch.setenv(legacy_sort.TIE_ORDER_ENV, "generic")
    assert legacy_sort.upstream_argsort(keys).tolist() == NUMPY_1_26_4[42]
    monkeypatch.setattr(legacy_sort, "numpy_sorts_with_avx512", lambda: False)
    monkeypatch.setenv(legacy_sort.TIE_ORDER_ENV, "cpu")
    assert legacy_sort.upstream_argsort(keys).tolist() == NUMPY_1_26_4[42]
    monkeypatch.setenv(legacy_sort.TIE_ORDER_ENV, "avx512")
    with pytest.raises(ValueError, match="SRS_BENCH_TIE_ORDER"):
        legacy_sort.upstream_argsort(keys)
