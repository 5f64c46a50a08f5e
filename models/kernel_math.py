"""Numba helpers shared by every compiled kernel (the engine's, the DASH/ACT-R card kernels, the neural ones)."""

from __future__ import annotations

import math

from numba import njit

BCE_LOG_FLOOR = -100.0  # torch's binary_cross_entropy clamps its logs here
BCE_GRAD_EPS = 1e-12  # ... and the denominator p(1-p) of its gradient here


@njit(cache=True, inline="always")
def bce(p, y, wt):
    """(weighted BCE, d/dp) with torch's clamping, so the compiled trainers follow the torch ones exactly."""
    if y > 0.5:
        loss = -wt * max(math.log(p), BCE_LOG_FLOOR) if p > 0.0 else -wt * BCE_LOG_FLOOR
    else:
        loss = -wt * max(math.log1p(-p), BCE_LOG_FLOOR) if p < 1.0 else -wt * BCE_LOG_FLOOR
    return loss, wt * (p - y) / max(p * (1.0 - p), BCE_GRAD_EPS)
