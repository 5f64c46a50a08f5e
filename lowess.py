"""statsmodels' lowess (one pass, no robustness iterations, fitted at the data's own sorted x) compiled with numba,
for the ICI of large users (metrics.ici).

Why: the ICI was the largest metric cost of a user, ~40% of what a model with continuous predictions pays per
review outside its fit. statsmodels' compiled loop (statsmodels/nonparametric/_smoothers_lowess.pyx) clears all n
weights and makes eight numpy calls over the k = 2n/3 neighbourhood for every fitted point; this kernel does the
same arithmetic in two fused passes over the neighbourhood, ~4× faster.

The result is bit-identical to statsmodels', so the result lines do not change (tests/test_split_metrics.py holds
the two to exact equality): every floating-point operation is the one the .pyx does, in the same order
(distance |x_j − xval| / radius, the tricube as t·t·t, 1 − ·, ·³, times the residual weight 1, the weights divided
by their sum, the three regression loops summing left to right), and the weights' sum is numpy's pairwise
summation (`np.sum` of the neighbourhood slice), which `_pairwise_sum` reproduces: blocks of up to 128 summed
with 8 accumulators, larger arrays split in halves rounded down to a multiple of 8. numba compiles without
fast-math (no reassociation, no fused multiply-add), and with numpy's error model (0/0 is NaN, as in C).
"""

from __future__ import annotations

import numpy as np
from numba import njit

PW_BLOCKSIZE = 128  # numpy's pairwise-summation block (numpy/_core/src/umath/loops_utils.h.src)


@njit(cache=True, error_model="numpy")
def _pairwise_sum(a, lo, n):
    """numpy's DOUBLE_pairwise_sum of a[lo:lo + n], operation for operation."""
    if n < 8:
        res = 0.0
        for i in range(n):
            res += a[lo + i]
        return res
    if n <= PW_BLOCKSIZE:
        r0, r1, r2, r3 = a[lo], a[lo + 1], a[lo + 2], a[lo + 3]
        r4, r5, r6, r7 = a[lo + 4], a[lo + 5], a[lo + 6], a[lo + 7]
        i = 8
        while i < n - (n % 8):
            r0 += a[lo + i]
            r1 += a[lo + i + 1]
            r2 += a[lo + i + 2]
            r3 += a[lo + i + 3]
            r4 += a[lo + i + 4]
            r5 += a[lo + i + 5]
            r6 += a[lo + i + 6]
            r7 += a[lo + i + 7]
            i += 8
        res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
        while i < n:
            res += a[lo + i]
            i += 1
        return res
    n2 = n // 2
    n2 -= n2 % 8
    return _pairwise_sum(a, lo, n2) + _pairwise_sum(a, lo + n2, n - n2)


@njit(cache=True, error_model="numpy")
def lowess_sorted(y, x, frac, delta):
    """The fitted values of statsmodels' `lowess(y, x, frac, it=0, delta)` for x sorted ascending (the .pyx's
    `lowess(y, x, x, ones, frac, 0, delta, given_xvals=False)[0][:, 1]`)."""
    n = len(x)
    k = int(frac * n + 1e-10)
    k = min(max(k, 2), n)
    y_fit = np.zeros(n)
    weights = np.empty(n)
    i, last_fit_i, left, right = 0, -1, 0, k
    while True:
        xval = x[i]
        # update_neighborhood: slide the k-window right while xval is past its middle
        while right < n and xval > (x[left] + x[right]) / 2.0:
            left += 1
            right += 1
        radius = max(xval - x[left], x[right - 1] - xval)
        # calculate_weights: tricube of the scaled distance (times the residual weight 1.0: exact)
        nonzero = 0
        for j in range(left, right):
            t = abs(x[j] - xval) / radius
            t = t * t * t
            t = 1.0 - t
            w = t * t * t
            weights[j] = w * 1.0
            nonzero += weights[j] > 1e-12
        if nonzero < 2:
            y_fit[i] = y[i]  # too few positive weights: the point keeps its own y, as the .pyx does
        else:
            total = _pairwise_sum(weights, left, right - left)
            mean_x = 0.0
            for j in range(left, right):
                weights[j] /= total
                mean_x += weights[j] * x[j]
            sqdev = 0.0
            for j in range(left, right):
                sqdev += weights[j] * (x[j] - mean_x) ** 2
            sqdev = max(sqdev, 1e-12)
            fit = 0.0
            for j in range(left, right):
                fit += weights[j] * (1.0 + (xval - mean_x) * (x[j] - mean_x) / sqdev) * y[j]
            y_fit[i] = fit
        # interpolate_skipped_fits
        if last_fit_i < i - 1:
            denom = x[i] - x[last_fit_i]
            for j in range(last_fit_i + 1, i):
                a = (x[j] - x[last_fit_i]) / denom
                y_fit[j] = a * y_fit[i] + (1.0 - a) * y_fit[last_fit_i]
        # update_indices: ties copy the fit; jump to the last point within delta
        last_fit_i = i
        cutpoint = x[i] + delta
        kk = last_fit_i
        for kk in range(last_fit_i + 1, n):
            if x[kk] > cutpoint:
                break
            if x[kk] == x[last_fit_i]:
                y_fit[kk] = y_fit[last_fit_i]
                last_fit_i = kk
        i = max(kk - 1, last_fit_i + 1)
        if last_fit_i >= n - 1:
            return y_fit
