"""numpy 1.26's argsort(kind="quicksort") of int64 keys on a CPU with AVX-512, re-implemented lane by lane.

Why: on such a CPU numpy 1.26 (upstream's pin) hands 64-bit argsort to x86-simd-sort's AVX-512 quicksort, whose tie
order differs from both numpy 1.26's generic introsort (upstream/legacy_sort.py) and numpy >= 2's own AVX-512 argsort
(a later x86-simd-sort: the orders part at 65 equal keys). DASH, DASH[MCM] and HLR sort rows that all share one key,
so that order alone decides their mini-batches: with numpy 2.4's argsort their Log Loss was up to 4e-3 per user
off upstream's code run on the same AVX-512 CPU (36 simulated users, 24 Nov 2026). This module gives that order on
any CPU, in scalar code, for int64 keys (what pandas' sort_values(by="seq_len") sorts).

The algorithm (x86-simd-sort as numpy 1.26.4 bundled it; written here from its description, element for element):
- a range of more than 64 keys is split around a pivot, the 5th smallest of 8 keys sampled at left + k·(n−1)//8,
  k = 1..8; the split first moves (n mod 32, or n mod 8 for n ≤ 256) keys one by one from the left (a key ≥ pivot is
  swapped with the last unprocessed one), then partitions 8 keys at a time as vectors, loading from whichever side
  has fewer keys stored, compress-storing a vector's keys < pivot (in lane order) at the left store point and its
  keys ≥ pivot at the right one, the first and last 8 (or 32) keys last; the part < pivot is sorted again unless
  the pivot is the range's minimum, the part ≥ pivot unless it is its maximum;
- 64 keys or fewer are sorted by bitonic networks over up to eight 8-lane vectors (padding lanes hold the largest
  key), where a compare-exchange keeps each lane's own index when the keys are equal;
- past 2·floor(log2 n) levels a range goes to libstdc++'s std::sort (introsort, median of three, insertion sort
  below 16, heapsort past its own depth limit) on the key order alone.
Checked element for element against numpy 1.26.4 run on an AVX-512 CPU (tests/test_legacy_sort.py and its fixture).
"""

from __future__ import annotations

import numpy as np
from numba import njit

LANES = 8
NET_LIMIT_126 = 64  # ranges of at most this many keys go to the bitonic networks: numpy 1.26's x86-simd-sort
NET_LIMIT_22 = 256  # ... and numpy 2.0-2.2's
UNROLL = 4  # vectors per step of the unrolled partition (ranges over 8·UNROLL·LANES keys)
KEY_PAD = np.iinfo(np.int64).max  # the key of a masked-off lane
STD_THRESHOLD = 16  # libstdc++'s _S_threshold

# Lane maps of the networks' permutes (out[l] = in[map[l]]): swap neighbours, reverse each half, reverse all,
# swap pairs within each half, swap the halves.
P_SWAP1 = np.array([1, 0, 3, 2, 5, 4, 7, 6], dtype=np.int64)
P_REVHALF = np.array([3, 2, 1, 0, 7, 6, 5, 4], dtype=np.int64)
P_REV = np.array([7, 6, 5, 4, 3, 2, 1, 0], dtype=np.int64)
P_SWAP2 = np.array([2, 3, 0, 1, 6, 7, 4, 5], dtype=np.int64)
P_SWAP4 = np.array([4, 5, 6, 7, 0, 1, 2, 3], dtype=np.int64)


@njit(cache=True)
def _cmp_merge(k, ix, lane_map, max_mask):
    """One network layer within a vector: lane l meets lane lane_map[l] and keeps the max where bit l of max_mask is
    set, else the min; its index stays unless its key changed."""
    k2 = np.empty(LANES, dtype=k.dtype)
    i2 = np.empty(LANES, dtype=ix.dtype)
    for lane in range(LANES):
        k2[lane] = k[lane_map[lane]]
        i2[lane] = ix[lane_map[lane]]
    for lane in range(LANES):
        new = max(k[lane], k2[lane]) if (max_mask >> lane) & 1 else min(k[lane], k2[lane])
        if new != k[lane]:
            ix[lane] = i2[lane]
        k[lane] = new


@njit(cache=True)
def _sort_vector(k, ix):
    _cmp_merge(k, ix, P_SWAP1, 0xAA)
    _cmp_merge(k, ix, P_REVHALF, 0xCC)
    _cmp_merge(k, ix, P_SWAP1, 0xAA)
    _cmp_merge(k, ix, P_REV, 0xF0)
    _cmp_merge(k, ix, P_SWAP2, 0xCC)
    _cmp_merge(k, ix, P_SWAP1, 0xAA)


@njit(cache=True)
def _merge_vector(k, ix):
    """Half cleaners of a bitonic vector."""
    _cmp_merge(k, ix, P_SWAP4, 0xF0)
    _cmp_merge(k, ix, P_SWAP2, 0xCC)
    _cmp_merge(k, ix, P_SWAP1, 0xAA)


@njit(cache=True)
def _coex(k, ix, a, b):
    """Vector a gets the lane-wise min, vector b the max; a's index goes with the min where a's key is the min."""
    for lane in range(LANES):
        if k[b, lane] < k[a, lane]:
            k[a, lane], k[b, lane] = k[b, lane], k[a, lane]
            ix[a, lane], ix[b, lane] = ix[b, lane], ix[a, lane]


@njit(cache=True)
def _reverse(k, ix, r):
    """Vector r's lanes reversed (the P_REV permute), swapped in place: no fancy index or row copy, whose shape
    checks and their error messages were ~3 s of a first run's compiling."""
    for lane in range(LANES // 2):
        o = LANES - 1 - lane
        k[r, lane], k[r, o] = k[r, o], k[r, lane]
        ix[r, lane], ix[r, o] = ix[r, o], ix[r, lane]


@njit(cache=True)
def _merge_pairs(k, ix, first, count):
    """Merge the sorted runs of vectors [first, first + count/2) and [first + count/2, first + count): vector
    first + j against vector first + count − 1 − j reversed, the maxima reversed back in place, then (for more than
    two) compare-exchanges at strides count/4 ... 1, and each vector's half cleaners."""
    half = count // 2
    for j in range(half):
        _reverse(k, ix, first + count - 1 - j)
    for j in range(half):
        _coex(k, ix, first + j, first + count - 1 - j)
    for j in range(half):  # the maxima, lanes reversed back in place
        _reverse(k, ix, first + half + j)
    stride = half // 2
    while stride >= 1:
        for base in range(first, first + count, 2 * stride):
            for j in range(stride):
                _coex(k, ix, base + j, base + j + stride)
        stride //= 2
    for r in range(first, first + count):
        _merge_vector(k[r], ix[r])


@njit(cache=True)
def _network_sort(key, arg, lo, n, k_work, ix_work):
    """arg[lo : lo + n] sorted by key through the bitonic networks of the fewest vectors (a power of two) that hold
    n keys (k_work, ix_work: [vectors, LANES] scratch)."""
    regs = 1
    while regs * LANES < n:
        regs *= 2
    k = k_work[:regs]
    ix = ix_work[:regs]
    for r in range(regs):
        for lane in range(LANES):
            k[r, lane] = KEY_PAD
            ix[r, lane] = 0
    for p in range(n):
        ix[p // LANES, p % LANES] = arg[lo + p]
        k[p // LANES, p % LANES] = key[arg[lo + p]]
    for r in range(regs):
        _sort_vector(k[r], ix[r])
    width = np.int64(2)  # not the literal 2, which numba compiled _merge_pairs for a second time (a first run's 0.5 s)
    while width <= regs:
        for first in range(0, regs, width):
            _merge_pairs(k, ix, first, width)
        width *= 2
    for p in range(n):
        arg[lo + p] = ix[p // LANES, p % LANES]


@njit(cache=True)
def _partition_vec(key, arg, vec, store_l, store_r_end, pivot):
    """Compress-store one loaded vector (arg values `vec`): keys < pivot from store_l up, keys ≥ pivot ending at
    store_r_end; returns how many were ≥ pivot."""
    n_ge = 0
    for lane in range(LANES):
        if key[vec[lane]] >= pivot:
            n_ge += 1
    lo = store_l
    hi = store_r_end - n_ge
    for lane in range(LANES):
        if key[vec[lane]] >= pivot:
            arg[hi] = vec[lane]
            hi += 1
        else:
            arg[lo] = vec[lane]
            lo += 1
    return n_ge


@njit(cache=True)
def _partition(key, arg, left, right, pivot, unroll):
    """Split arg[left:right] around pivot as the vector partition does (unroll vectors per step); returns the
    first position of the keys ≥ pivot."""
    for _ in range((right - left) % (unroll * LANES)):
        if key[arg[left]] >= pivot:
            right -= 1
            arg[left], arg[right] = arg[right], arg[left]
        else:
            left += 1
    if left == right:
        return left
    if unroll == 1 and right - left == LANES:
        vec = arg[left:left + LANES].copy()
        return left + LANES - _partition_vec(key, arg, vec, left, left + LANES, pivot)
    block = unroll * LANES
    first = arg[left:left + block].copy()  # partitioned at the end
    last = arg[right - block:right].copy()
    store_r = right - LANES
    store_l = left
    left += block
    right -= block
    while right != left:
        if (store_r + LANES) - right < left - store_l:
            right -= block
            cur = arg[right:right + block].copy()
        else:
            cur = arg[left:left + block].copy()
            left += block
        for u in range(unroll):
            n_ge = _partition_vec(key, arg, cur[u * LANES:(u + 1) * LANES], store_l, store_r + LANES, pivot)
            store_l += LANES - n_ge
            store_r -= n_ge
    for saved in (first, last):
        for u in range(unroll):
            n_ge = _partition_vec(key, arg, saved[u * LANES:(u + 1) * LANES], store_l, store_r + LANES, pivot)
            store_l += LANES - n_ge
            store_r -= n_ge
    return store_l


@njit(cache=True)
def _pivot(key, arg, left, right):
    """The 5th smallest of the keys at arg[left + k·size], k = 1..8, size = (right − left) // 8 (right inclusive)."""
    size = (right - left) // 8
    sample = np.empty(8, dtype=np.int64)
    for k in range(8):  # insertion sort of the 8 values (numba's .sort() cost ~2 s of a first run's compiling)
        v = key[arg[left + (k + 1) * size]]
        j = k
        while j > 0 and sample[j - 1] > v:
            sample[j] = sample[j - 1]
            j -= 1
        sample[j] = v
    return sample[4]


@njit(cache=True)
def _floor_log2(n):
    r = 0
    while n > 1:
        n >>= 1
        r += 1
    return r


# ---- libstdc++'s std::sort on arg[first:last] by key (the fallback past the depth limit)

@njit(cache=True)
def _less(key, a, b):
    return key[a] < key[b]


@njit(cache=True)
def _adjust_heap(key, arg, first, hole, length, value):
    top = hole
    child = hole
    while child < (length - 1) // 2:
        child = 2 * (child + 1)
        if _less(key, arg[first + child], arg[first + child - 1]):
            child -= 1
        arg[first + hole] = arg[first + child]
        hole = child
    if length % 2 == 0 and child == (length - 2) // 2:
        child = 2 * (child + 1)
        arg[first + hole] = arg[first + child - 1]
        hole = child - 1
    parent = (hole - 1) // 2
    while hole > top and _less(key, arg[first + parent], value):
        arg[first + hole] = arg[first + parent]
        hole = parent
        parent = (hole - 1) // 2
    arg[first + hole] = value


@njit(cache=True)
def _heap_sort(key, arg, first, last):
    length = last - first
    if length >= 2:
        parent = (length - 2) // 2
        while True:
            _adjust_heap(key, arg, first, parent, length, arg[first + parent])
            if parent == 0:
                break
            parent -= 1
    while last - first > 1:
        last -= 1
        value = arg[last]
        arg[last] = arg[first]
        _adjust_heap(key, arg, first, np.int64(0), last - first, value)  # (a literal 0: a second compiled version)


@njit(cache=True)
def _median_to_first(key, arg, result, a, b, c):
    if _less(key, arg[a], arg[b]):
        if _less(key, arg[b], arg[c]):
            m = b
        elif _less(key, arg[a], arg[c]):
            m = c
        else:
            m = a
    elif _less(key, arg[a], arg[c]):
        m = a
    elif _less(key, arg[b], arg[c]):
        m = c
    else:
        m = b
    arg[result], arg[m] = arg[m], arg[result]


@njit(cache=True)
def _std_sort(key, arg, first, last):
    if last - first < 2:
        return
    depth = 2 * _floor_log2(last - first)
    stack = np.empty((2 * 64 + 8, 3), dtype=np.int64)
    sp = 0
    stack[sp, 0] = first
    stack[sp, 1] = last
    stack[sp, 2] = depth
    sp += 1
    while sp > 0:  # __introsort_loop: the right part "recursed", the left part looped
        sp -= 1
        lo, hi, depth = stack[sp]
        while hi - lo > STD_THRESHOLD:
            if depth == 0:
                _heap_sort(key, arg, lo, hi)
                break
            depth -= 1
            _median_to_first(key, arg, lo, lo + 1, lo + (hi - lo) // 2, hi - 1)
            f, la, piv = lo + 1, hi, arg[lo]
            while True:
                while _less(key, arg[f], piv):
                    f += 1
                la -= 1
                while _less(key, piv, arg[la]):
                    la -= 1
                if not f < la:
                    break
                arg[f], arg[la] = arg[la], arg[f]
                f += 1
            stack[sp, 0] = f
            stack[sp, 1] = hi
            stack[sp, 2] = depth
            sp += 1
            hi = f
    # __final_insertion_sort
    head = min(last, first + STD_THRESHOLD)
    for i in range(first + 1, head):
        v = arg[i]
        if _less(key, v, arg[first]):
            for j in range(i, first, -1):
                arg[j] = arg[j - 1]
            arg[first] = v
        else:
            j = i
            while _less(key, v, arg[j - 1]):
                arg[j] = arg[j - 1]
                j -= 1
            arg[j] = v
    for i in range(head, last):
        v = arg[i]
        j = i
        while _less(key, v, arg[j - 1]):
            arg[j] = arg[j - 1]
            j -= 1
        arg[j] = v


@njit(cache=True)
def _argsort(key, net_limit):
    n = len(key)
    arg = np.arange(n, dtype=np.int64)
    if n < 2:
        return arg
    k_work = np.empty((net_limit // LANES, LANES), dtype=np.int64)
    ix_work = np.empty((net_limit // LANES, LANES), dtype=np.int64)
    stack = np.empty((4 * 64 + 8, 3), dtype=np.int64)
    sp = 0
    stack[sp, 0] = 0
    stack[sp, 1] = n - 1
    stack[sp, 2] = 2 * _floor_log2(n)
    sp += 1
    while sp > 0:
        sp -= 1
        left, right, iters = stack[sp]
        if iters <= 0:
            _std_sort(key, arg, left, right + 1)
            continue
        if right + 1 - left <= net_limit:
            _network_sort(key, arg, left, right + 1 - left, k_work, ix_work)
            continue
        pivot = _pivot(key, arg, left, right)
        smallest = key[arg[left]]
        biggest = smallest
        for p in range(left, right + 1):
            smallest = min(smallest, key[arg[p]])
            biggest = max(biggest, key[arg[p]])
        unroll = 1 if right + 1 - left <= 8 * UNROLL * LANES else UNROLL
        split = _partition(key, arg, left, right + 1, pivot, unroll)
        if pivot != biggest:
            stack[sp, 0] = split
            stack[sp, 1] = right
            stack[sp, 2] = iters - 1
            sp += 1
        if pivot != smallest:
            stack[sp, 0] = left
            stack[sp, 1] = split - 1
            stack[sp, 2] = iters - 1
            sp += 1
    return arg


def argsort_numpy126_avx512(key: np.ndarray) -> np.ndarray:
    """numpy 1.26's np.argsort(key, kind="quicksort") for int64 keys on an AVX-512 CPU (networks up to 64 keys)."""
    return _argsort(np.ascontiguousarray(key, dtype=np.int64), NET_LIMIT_126)


def argsort_numpy22_avx512(key: np.ndarray) -> np.ndarray:
    """numpy 2.0–2.2's np.argsort(key, kind="quicksort") for int64 keys on an AVX-512 CPU (networks up to 256 keys):
    the order behind the published upstream-check results (module docstring)."""
    return _argsort(np.ascontiguousarray(key, dtype=np.int64), NET_LIMIT_22)
