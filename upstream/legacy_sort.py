"""numpy 1.26's argsort(kind="quicksort") tie order, re-implemented: the batch order of upstream's January-2025 runs.

Why: upstream's January-2025 `other.py` batches training rows with fsrs-optimizer's `BatchDataset`, which sorts them
with pandas' `sort_values(by="seq_len")`, i.e. numpy's default *quicksort* argsort, which is not stable. For
DASH, DASH[MCM] and HLR every row has the same "length" (len of an 8- or 2-feature vector), so the sort is a pure
permutation of the time-ordered rows, and that permutation decides which rows share a mini-batch. Upstream pinned
numpy 1.26.4 (pandas 2.2.3); numpy >= 2 leaves an already sorted array in place, so numpy's own argsort here cannot
give upstream's order. This module reproduces numpy 1.26's generic introsort (the routine it runs on CPUs without
AVX-512; with AVX-512, numpy 1.26 hands 64-bit keys to x86-simd-sort, another order: upstream/legacy_sort_avx512.py
reproduces that one, and numpy 2.0-2.2's, the published results' order and the default; `upstream_argsort` picks
one): median-of-three quicksort
partitions while 17 or more elements remain, the larger part pushed on a stack, insertion sort below, heapsort
past a depth limit of 2·floor(log2 n). Checked element for element against numpy 1.26.4 on 128 arrays (equal keys,
n = 0..79 and up to 50,000; random keys with 2 to 1000 distinct values; sorted and reversed ones; n up to 30,000;
tests/test_legacy_sort.py carries some of its outputs) and, through the models that use it, against upstream's own
result files (models/dash.py). The heapsort fallback's tie order was not reached by those arrays (equal keys halve
at every partition, so DASH's and HLR's sorts never get there); it sorts correctly, its ties are unverified.
"""

from __future__ import annotations

import os

import numpy as np
from numba import njit

TIE_ORDER_ENV = "SRS_BENCH_TIE_ORDER"  # which numpy's tie order (upstream_argsort)

SMALL_QUICKSORT = 15  # numpy's cut-over: a range is partitioned while pr − pl > 15 (17 or more elements)


@njit(cache=True)
def _sift_down(v, tosort, lo, i, n):
    """Heapsort's sift-down on tosort[lo .. lo+n−1] (1-based heap positions, as numpy's aheapsort)."""
    tmp = tosort[lo + i - 1]
    j = i * 2
    while j <= n:
        if j < n and v[tosort[lo + j - 1]] < v[tosort[lo + j]]:
            j += 1
        if v[tmp] < v[tosort[lo + j - 1]]:
            tosort[lo + i - 1] = tosort[lo + j - 1]
            i = j
            j += j
        else:
            break
    tosort[lo + i - 1] = tmp


@njit(cache=True)
def _heapsort(v, tosort, lo, n):
    """numpy's aheapsort_ on the n indices tosort[lo:lo+n] (the introsort's fallback past its depth limit)."""
    for i in range(n >> 1, 0, -1):
        _sift_down(v, tosort, lo, i, n)
    while n > 1:
        tmp = tosort[lo + n - 1]
        tosort[lo + n - 1] = tosort[lo]
        tosort[lo] = tmp
        n -= 1
        _sift_down(v, tosort, lo, 1, n)


@njit(cache=True)
def _msb(n):
    depth = 0
    n >>= 1
    while n > 0:
        depth += 1
        n >>= 1
    return depth


@njit(cache=True)
def argsort_numpy126(v):
    """The indices numpy 1.26's np.argsort(v, kind="quicksort") returns on a CPU without AVX-512 (v: int64 or
    float64 without NaN)."""
    num = len(v)
    tosort = np.arange(num)
    if num < 2:
        return tosort
    stack = np.empty(256, dtype=np.int64)
    depths = np.empty(128, dtype=np.int64)
    sp = 0
    dp = 0
    pl = 0
    pr = num - 1
    cdepth = _msb(num) * 2
    while True:
        if cdepth < 0:
            _heapsort(v, tosort, pl, pr - pl + 1)
        else:
            while pr - pl > SMALL_QUICKSORT:
                pm = pl + ((pr - pl) >> 1)  # median of three, ordered in place
                if v[tosort[pm]] < v[tosort[pl]]:
                    tosort[pm], tosort[pl] = tosort[pl], tosort[pm]
                if v[tosort[pr]] < v[tosort[pm]]:
                    tosort[pr], tosort[pm] = tosort[pm], tosort[pr]
                if v[tosort[pm]] < v[tosort[pl]]:
                    tosort[pm], tosort[pl] = tosort[pl], tosort[pm]
                vp = v[tosort[pm]]
                pi = pl
                pj = pr - 1
                tosort[pm], tosort[pj] = tosort[pj], tosort[pm]
                while True:  # Hoare partition; equal keys stop both scans and are swapped
                    pi += 1
                    while v[tosort[pi]] < vp:
                        pi += 1
                    pj -= 1
                    while vp < v[tosort[pj]]:
                        pj -= 1
                    if pi >= pj:
                        break
                    tosort[pi], tosort[pj] = tosort[pj], tosort[pi]
                pk = pr - 1
                tosort[pi], tosort[pk] = tosort[pk], tosort[pi]
                if pi - pl < pr - pi:  # the larger part waits on the stack, the smaller is sorted first
                    stack[sp] = pi + 1
                    stack[sp + 1] = pr
                    pr = pi - 1
                else:
                    stack[sp] = pl
                    stack[sp + 1] = pi - 1
                    pl = pi + 1
                sp += 2
                cdepth -= 1
                depths[dp] = cdepth
                dp += 1
            for pi in range(pl + 1, pr + 1):  # insertion sort of the small part (stable among equal keys)
                vi = tosort[pi]
                vv = v[vi]
                pj = pi
                while pj > pl and vv < v[tosort[pj - 1]]:
                    tosort[pj] = tosort[pj - 1]
                    pj -= 1
                tosort[pj] = vi
        if sp == 0:
            break
        sp -= 2
        pl = stack[sp]
        pr = stack[sp + 1]
        dp -= 1
        cdepth = depths[dp]
    return tosort


def numpy_sorts_with_avx512() -> bool:
    """Whether numpy 1.26 hands 64-bit argsort to x86-simd-sort's AVX-512 routine on this CPU (numpy >= 1.25 does
    where the CPU has AVX512_SKX)."""
    return bool(np._core._multiarray_umath.__cpu_features__.get("AVX512_SKX", False))


TIE_ORDERS = ("published", "cpu", "generic", "numpy1.26-avx512")


def upstream_argsort(key: np.ndarray) -> np.ndarray:
    """Upstream's np.argsort(key, kind="quicksort") of its training rows' lengths, in the tie order chosen by
    SRS_BENCH_TIE_ORDER:
    - "published" (default, on every CPU): numpy 2.0–2.2 on a CPU with AVX-512 (x86-simd-sort; models/
      legacy_sort_avx512.argsort_numpy22_avx512), the environment behind upstream's published results: with it
      the trainers that replay upstream's batches equal the published upstream-check numbers to the 6th decimal;
    - "generic": numpy 1.26 on a CPU without AVX-512 (argsort_numpy126, its introsort);
    - "numpy1.26-avx512": numpy 1.26 on a CPU with AVX-512 (x86-simd-sort's older networks);
    - "cpu": numpy 1.26 as it runs on this CPU (one of the two above), to compare with upstream's code run here in
      a numpy-1.26 environment (bench/bench_side_by_side.py).
    Every order is checked against the numpy version itself (tests/test_legacy_sort.py)."""
    choice = os.environ.get(TIE_ORDER_ENV, "published")
    if choice not in TIE_ORDERS:
        raise ValueError(f"{TIE_ORDER_ENV}={choice!r}: expected one of {', '.join(TIE_ORDERS)}")
    key = np.ascontiguousarray(key, dtype=np.int64)
    if choice == "cpu":
        choice = "numpy1.26-avx512" if numpy_sorts_with_avx512() else "generic"
    if choice == "generic":
        return argsort_numpy126(key)
    import upstream.legacy_sort_avx512 as legacy_sort_avx512

    if choice == "published":
        return legacy_sort_avx512.argsort_numpy22_avx512(key)
    return legacy_sort_avx512.argsort_numpy126_avx512(key)
