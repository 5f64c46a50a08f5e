"""FSRS v3 (13 parameters, spec models.md §1.8) on the shared engine, plus what v1–v3 share (`FSRSLegacy`).

State (S, D). Curve R = 0.9^{t/S}. First review (grade G):
  S = w0 + w1·(G−1)                 D = clamp(w2 + w3·(G−3), 1, 10)
Later review (elapsed t, R = 0.9^{t/S}); the NEW difficulty is computed first and used by the stability update:
  D' = clamp(w5·w2 + (1−w5)·(D + w4·(G−3)), 1, 10)
  recall (G > 1): S' = S·(1 + e^{w6}·(11 − D')·S^{w7}·(e^{w8(1−R)} − 1))
  lapse  (G = 1): S' = w9·D'^{w10}·S^{w11}·e^{w12(1−R)}
S (at the first review too) is clamped to [0.01, 36500].

Upstream (srs-benchmark models/fsrs_v3.py@24ac3c3a, and the monolithic other.py of January 2025 that produced
data/upstream-check): `FSRS3.step` treats an all-zero batch state as "first review" (always and only the first
step, since S ≥ 0.01 afterwards), clamps D inside both branches and S after them, with s_min = 0.01,
s_max = 36500. Training: no S0 initialisation, every row, Adam 4e-2 with cosine schedule, 5 epochs, batch 512,
no L2 prior (weight decay is ignored by plain Adam).

The equations are written once, as torch_init / torch_step / torch_curve below (`FSRSv3.traced`): the compiled
engine runs the plug-in engine/traced.py generates from them (scalar steps, their VJPs, and the lane kernel its
trainer's batches run on, 8 cards side by side), the lower clamp of S a run-time option (RUN_OPTIONS: 0.01, upstream's
--secs 1e-4); the upstream-style trainer steps the same functions in torch. Until 29 Nov 2026 v2 and v3 had
hand-written numba steps, VJPs and lanes (lane_kernels/fsrs_legacy_lanes.py, one kernel for v1-v3); the generated
ones give the same result lines on data/embedded and upstream-check (day mode and --secs) at the same speed
(generated / hand lane kernel 0.99x, bench/bench_generated_lanes.py); so does v1 (fsrs_v1.py).

Upstream quirk reproduced (all three versions): the trained weights are returned through the model's
`state_dict()`, which rounds every weight to 4 decimals, and the test predictions use those rounded weights
(`FSRSLegacy.ROUND_DIGITS`). The checkpoint is still chosen on the unrounded weights' training loss.
"""

from __future__ import annotations

import math


from models.fsrs_init import SECS_S_MIN
from engine.kernel_math import LEGACY_S_MIN
from engine.seq_model import SeqModel

S_MIN = LEGACY_S_MIN  # 0.01; upstream's --secs: 1e-4 (the plug-in's run-time option)
RUN_OPTIONS = ("S_MIN",)  # the generated plug-in's run-time options (engine/traced.py): FSRSLegacy.engine_opts
S_MAX = 36500.0
LN09 = math.log(0.9)


# ---------------------------------------------------------------------------------------- torch (upstream trainer)

def torch_exp_curve(t, s):
    return 0.9 ** (t / s)


def torch_ln_curve(w, state, t):
    """0.9^(t/S) written exp(ln 0.9 · t/S), as the published Anki and SM2-trainable rows computed it (pow's last bit
    reorders near-tied predictions: Anki-default's AUC moved in the 5th decimal): their torch_curve."""
    import torch

    return torch.exp(LN09 * t / state[0])


def torch_init(w, g, t):
    s = (w[0] + w[1] * (g - 1)).clamp(S_MIN, S_MAX)
    d = (w[2] + w[3] * (g - 3)).clamp(1, 10)
    return s, d


def torch_step(w, state, t, g):
    import torch  # the upstream-style trainer only: a default run does not import torch

    s, d = state
    r = torch_exp_curve(t, s)
    nd = (w[5] * w[2] + (1 - w[5]) * (d + w[4] * (g - 3))).clamp(1, 10)
    s_recall = s * (1 + torch.exp(w[6]) * (11 - nd) * s.pow(w[7]) * (torch.exp((1 - r) * w[8]) - 1))
    s_lapse = w[9] * nd.pow(w[10]) * s.pow(w[11]) * torch.exp((1 - r) * w[12])
    return torch.where(g > 1, s_recall, s_lapse).clamp(S_MIN, S_MAX), nd


def torch_curve(w, state, t):
    return torch_exp_curve(t, state[0])


# ---------------------------------------------------------------------------------------- the models

class FSRSLegacy(SeqModel):
    """FSRS v1–v3: defaults as the starting point, every training row, no prior, no frozen parameters; the trained
    weights are rounded to ROUND_DIGITS decimals as upstream's state_dict() does before they predict."""

    ROUND_DIGITS = 4  # --secs too: upstream's FSRS1/FSRS3 state_dict() override rounds to 4 in either mode
    accepts_secs = True  # config.ACCEPTS_SECS: upstream's --secs, S clamped at s_min = 1e-4 (w0's box is 0.1 up)

    def __init__(self, cfg=None):
        self.secs = bool(getattr(cfg, "secs_mode", False))
        self.s_min = SECS_S_MIN if self.secs else S_MIN
        super().__init__(cfg)

    def engine_opts(self) -> tuple:
        return (self.s_min,)

    def fit(self, train):
        super().fit(train)
        if not self.cfg.default:
            self.w = [round(x, self.ROUND_DIGITS) for x in self.w]
        return self


class FSRSv3(FSRSLegacy):
    name = "FSRSv3"
    kernels = "models.fsrs_v3"
    traced = True  # the compiled engine runs the plug-in generated from torch_init / torch_step / torch_curve
    default_w = [0.9605, 1.7234, 4.8527, -1.1917, -1.2956, 0.0573, 1.7352, -0.1673, 1.065, 1.8907, -0.3832, 0.5867,
                 1.0721]
    lower = [0.1, 0.1, 1, -5, -5, 0.05, 0, -0.8, 0.01, 0.5, -2, 0.01, 0.01]
    upper = [10, 5, 10, -0.1, -0.1, 0.5, 2, -0.15, 1.5, 5, -0.01, 0.9, 2]
