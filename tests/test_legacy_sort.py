"""upstream/legacy_sort.py: numpy 1.26's quicksort argsort order, which upstream's January-2025 batches came from.

The expected permutations below are numpy 1.26.4's own np.argsort(..., kind="quicksort") outputs (run in upstream's
environment, a CPU without AVX-512: the generic introsort), plus one traced by hand, and for upstream/legacy_sort_avx512.py
numpy 1.26.4's and 2.2.6's outputs on an AVX-512 CPU (tests/fixtures/numpy-avx512): an independent implementation, not this
project's output."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bench.tie_order_fixture import case_keys, digest
from upstream import legacy_sort
from upstream.legacy_sort import argsort_numpy126
from upstream.legacy_sort_avx512 import argsort_numpy22_avx512, argsort_numpy126_avx512
from engine.seq_engine import NUMPY126, argsort


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
    from upstream.legacy_sort import _heapsort

    keys = np.random.default_rng(5).integers(0, 50, 1000).astype(np.int64)
    order = np.arange(1000)
    _heapsort(keys, order, 0, 1000)
    assert sorted(order.tolist()) == list(range(1000)) and (np.diff(keys[order]) >= 0).all()


def test_engine_argsort_dispatch(monkeypatch):
    monkeypatch.setenv(legacy_sort.TIE_ORDER_ENV, "generic")
    keys = np.zeros(42, dtype=np.int64)
    assert argsort(keys, NUMPY126).tolist() == NUMPY_1_26_4[42]
    assert argsort(keys, "stable").tolist() == list(range(42))


def test_upstream_argsort_orders(monkeypatch):
    """The default is the published results' order (numpy 2.2, AVX-512) on every CPU; "cpu" is numpy 1.26 as it
    runs on this CPU; "generic" and "numpy1.26-avx512" pin one of numpy 1.26's two."""
    keys = np.zeros(100, dtype=np.int64)
    generic, avx512_126, avx512_22 = NUMPY_1_26_4[100], AVX512["1.26"][100], AVX512["2.2"][100]
    assert avx512_22 == list(range(100)) and len({tuple(generic), tuple(avx512_126), tuple(avx512_22)}) == 3
    monkeypatch.delenv(legacy_sort.TIE_ORDER_ENV, raising=False)
    for cpu_has_avx512 in (True, False):
        monkeypatch.setattr(legacy_sort, "numpy_sorts_with_avx512", lambda: cpu_has_avx512)
        assert legacy_sort.upstream_argsort(keys).tolist() == avx512_22
    for cpu_has_avx512, setting, expected in ((True, "cpu", avx512_126), (False, "cpu", generic),
                                              (True, "generic", generic), (False, "numpy1.26-avx512", avx512_126),
                                              (False, "published", avx512_22)):
        monkeypatch.setattr(legacy_sort, "numpy_sorts_with_avx512", lambda: cpu_has_avx512)
        monkeypatch.setenv(legacy_sort.TIE_ORDER_ENV, setting)
        assert legacy_sort.upstream_argsort(keys).tolist() == expected, (cpu_has_avx512, setting)
    monkeypatch.setenv(legacy_sort.TIE_ORDER_ENV, "native")
    with pytest.raises(ValueError, match="SRS_BENCH_TIE_ORDER"):
        legacy_sort.upstream_argsort(keys)


# numpy 1.26.4's and numpy 2.2.6's np.argsort(keys, kind="quicksort") on an AVX-512 CPU (x86-simd-sort), written
# by bench/tie_order_fixture.py under those numpy versions: an independent implementation.
FIXTURES = {version: json.loads((Path(__file__).parent / "fixtures" / "numpy-avx512" /
                                 f"argsort-numpy{version}.json").read_text()) for version in ("1.26", "2.2")}
AVX512 = {version: {row["case"][1]: row["order"] for row in fixture["cases"] if "order" in row}
          for version, fixture in FIXTURES.items()}
EMULATION = {"1.26": argsort_numpy126_avx512, "2.2": argsort_numpy22_avx512}


@pytest.mark.parametrize("version", ["1.26", "2.2"])
def test_avx512_order_of_equal_keys_in_full(version):
    """Up to 64 (numpy 1.26) or 256 (numpy 2.2) keys the bitonic networks keep equal keys in place; beyond, the
    vector partition permutes them (the pivot equals every key, so nothing is sorted again)."""
    limit = 64 if version == "1.26" else 256
    assert EMULATION[version](np.zeros(limit, dtype=np.int64)).tolist() == list(range(limit))
    assert EMULATION[version](np.zeros(limit + 1, dtype=np.int64)).tolist() != list(range(limit + 1))
    for n, order in AVX512[version].items():
        assert EMULATION[version](np.zeros(n, dtype=np.int64)).tolist() == order


@pytest.mark.parametrize("version", ["1.26", "2.2"])
def test_avx512_order_as_numpy_on_every_fixture_case(version):
    """190 arrays (equal keys, 2 to 5000 distinct values, history-like lengths, sorted, reversed and cyclic runs;
    n up to 200,000, deep enough for the std::sort fallback past 2·floor(log2 n) levels): the same permutation."""
    assert FIXTURES[version]["numpy"].startswith(version)
    wrong = []
    for row in FIXTURES[version]["cases"]:
        if digest(EMULATION[version](case_keys(*row["case"]))) != row["sha256"]:
            wrong.append(row["case"])
    assert not wrong, wrong


def test_avx512_orders_sort():
    rng = np.random.default_rng(8)
    for n, hi in ((70, 3), (300, 2), (5000, 3), (20000, 1000), (3000, 1), (100000, 40)):
        keys = rng.integers(0, hi, n).astype(np.int64)
        for emulation in EMULATION.values():
            order = emulation(keys)
            assert sorted(order.tolist()) == list(range(n))
            assert (np.diff(keys[order]) >= 0).all()
