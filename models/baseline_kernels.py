"""The compiled loops of MOVING-AVG and RMSE-BINS-EXPLOIT (models/baselines.py), apart so that the rows that need
no loop (90%) do not import numba (~0.3 s of a run that otherwise takes about a second)."""

from __future__ import annotations

import math

import numpy as np
from numba import njit

MA_LR = 0.3  # MOVING-AVG's step size


@njit(cache=True)
def _moving_avg(x, y, record):
    """Run the online logit over labels y; returns (final x, p before each row if record)."""
    out = np.empty(len(y) if record else 0)
    for i in range(len(y)):
        if record:
            out[i] = 1 / (math.e ** -x + 1)
        # same expressions as upstream (pow of e), so x is bit-identical
        if y[i] == 1:
            x += MA_LR / (math.e ** x + 1)
        else:
            x -= MA_LR * (math.e ** x) / (math.e ** x + 1)
    return x, out


@njit(cache=True)
def _exploit(bin_id, y, n_bins, n_skip):
    """Online exploit over rows in order; returns the predictions for rows n_skip.. (earlier rows only update)."""
    pred_sum = np.zeros(n_bins)
    truth_sum = np.zeros(n_bins)
    succ = 0.0
    seen = 0
    out = np.empty(len(y) - n_skip)
    for i in range(len(y)):
        b = bin_id[i]
        if seen == 0:
            p = 0.5  # upstream returns before touching the bin
        else:
            p = truth_sum[b] + succ / seen - pred_sum[b]
            p = min(max(p, 0.0), 1.0)
            pred_sum[b] += p
        truth_sum[b] += y[i]
        succ += y[i]
        seen += 1
        if i >= n_skip:
            out[i - n_skip] = p
    return out
