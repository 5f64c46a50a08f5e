"""Upstream's constants of the whole-history models, below both of their halves: the compiled kernels
(models/dash.py, models/act_r.py) and the torch modules of `--trainer upstream` (upstream/history_torch.py)."""

from __future__ import annotations

import math

WINDOWS = (1.0, 7.0, 30.0, math.inf)  # DASH's time windows (days)
MCM_TAU = (0.2434, 1.9739, 16.0090, 129.8426)  # DASH[MCM]'s decay time of each window (days)
ACTR_MIN_DELTA = 0.1  # upstream's clamp value; entries equal to it (after the clamp) are dropped
SECONDS_PER_DAY = 86400.0  # ACT-R's times are in seconds
