"""FSRS v2 (14 parameters, spec models.md §1.9) on the shared engine.

State (S, D). Curve R = 0.9^{t/S}. First review (grade G):
  S = w0·(w1·(G−1) + 1)             D = clamp(w2·(w3·(G−4) + 1), 1, 10)
Later review (elapsed t, R = 0.9^{t/S}); the NEW difficulty is computed first and used by the stability update:
  D' = clamp(w5·w2·(1 − w3) + (1−w5)·(D + w4·(G−3)), 1, 10)     (reversion towards D0 of a Good first review)
  recall (G > 1): S' = S·(1 + e^{w6}·D'^{w7}·S^{w8}·(e^{w9(1−R)} − 1))
  lapse  (G = 1): S' = w10·D'^{w11}·S^{w12}·(e^{w13(1−R)} − 1)
S (at the first review too) is clamped to [0.01, 36500].

Upstream: srs-benchmark models/fsrs_v2.py@0c5f44bd / @24ac3c3a and the monolithic other.py of January 2025 (the
code behind data/upstream-check): same first-review detection, clamps and training as FSRS v3 (see fsrs_v3.py),
including the 4-decimal rounding of the trained weights before prediction.

The equations are written once, as the torch functions below: the compiled engine runs the plug-in engine/traced.py
generates from them (`FSRSv2.traced`; scalar steps, VJPs and lanes; S's lower clamp the run-time option RUN_OPTIONS,
as fsrs_v3.py's), the upstream-style trainer steps them in torch.
"""

from __future__ import annotations

from models.fsrs_v3 import RUN_OPTIONS, S_MAX, S_MIN, FSRSLegacy, torch_exp_curve  # noqa: F401 (RUN_OPTIONS: v3's)
from models.fsrs_v3 import torch_curve  # noqa: F401 (v3's curve)


def torch_init(w, g, t):
    s = (w[0] * (w[1] * (g - 1) + 1)).clamp(S_MIN, S_MAX)
    d = (w[2] * (w[3] * (g - 4) + 1)).clamp(1, 10)
    return s, d


def torch_step(w, state, t, g):
    import torch  # the upstream-style trainer only: a default run does not import torch

    s, d = state
    r = torch_exp_curve(t, s)
    nd = (w[5] * (w[2] * (1 - w[3])) + (1 - w[5]) * (d + w[4] * (g - 3))).clamp(1, 10)
    s_recall = s * (1 + torch.exp(w[6]) * nd.pow(w[7]) * s.pow(w[8]) * (torch.exp((1 - r) * w[9]) - 1))
    s_lapse = w[10] * nd.pow(w[11]) * s.pow(w[12]) * (torch.exp((1 - r) * w[13]) - 1)
    return torch.where(g > 1, s_recall, s_lapse).clamp(S_MIN, S_MAX), nd


class FSRSv2(FSRSLegacy):
    name = "FSRSv2"
    kernels = "models.fsrs_v2"
    traced = True  # the compiled engine runs the plug-in generated from torch_init / torch_step / torch_curve
    default_w = [1, 1, 1, -1, -1, 0.2, 3, -0.8, -0.2, 1.3, 2.6, -0.2, 0.6, 1.5]
    lower = [0.1, 0.01, 1, -10, -10, 0, 0, -2, -2, 0.01, 0, -2, 0.01, 0.01]
    upper = [10, 10, 10, -0.01, -0.01, 1, 5, -0.01, -0.01, 2, 5, -0.01, 1, 2]
