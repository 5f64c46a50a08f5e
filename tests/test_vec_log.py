"""vec_math.log_vec (the LSTM heads' vectorised logarithm) against the C library's log (math.log): within 1 ulp on
values spread over the whole normal range and around its reduction's edges (powers of two, √2), and math.log's own
results at the edges (0, negatives, subnormals, inf, NaN)."""

from __future__ import annotations

import math

import numpy as np

from engine.vec_math import log_vec


def libm_log(x: float) -> float:
    if x == 0.0:
        return -math.inf
    if x < 0.0 or math.isnan(x):
        return math.nan
    return math.log(x)


def test_log_vec_within_one_ulp_of_libm():
    rng = np.random.default_rng(7)
    sqrt2 = math.sqrt(2.0)
    x = np.concatenate([
        np.exp(rng.uniform(-708.0, 709.0, 200_000)),  # the whole normal range
        rng.uniform(0.5, 2.0, 200_000),  # around 1, where ln x is small
        1.0 + rng.uniform(0.0, 1e-9, 10_000),
        1.0 - rng.uniform(0.0, 1e-9, 10_000),
        [np.nextafter(sqrt2, 0.0) * 2.0 ** e for e in range(-20, 21)],  # either side of the √2 split
        [sqrt2 * 2.0 ** e for e in range(-20, 21)],
        [2.0 ** e for e in range(-1022, 1024, 7)],  # exact powers of two: ln x = e·ln 2
        [1.0, 2.2250738585072014e-308, 1.7976931348623157e308],
    ])
    out = np.empty_like(x)
    log_vec(x, out)
    ref = np.array([math.log(v) for v in x])
    assert out[x == 1.0].tolist() == [0.0] * int((x == 1.0).sum())
    nz = ref != 0.0
    ulps = np.abs(out[nz] - ref[nz]) / np.spacing(np.abs(ref[nz]))
    assert ulps.max() <= 1.0


def test_log_vec_edges_follow_libm():
    x = np.array([0.0, -0.0, -1.0, 5e-324, 1e-310, 2.225e-308, math.inf, -math.inf, math.nan])
    out = np.empty_like(x)
    log_vec(x, out)
    ref = np.array([libm_log(v) for v in x])
    np.testing.assert_array_equal(out, ref)  # NaN in the same places, the rest equal
