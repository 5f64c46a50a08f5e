"""SM-2 with trainable constants (6 parameters; spec models.md §6.2), row `SM2-trainable`.

Upstream: models/sm2_trainable.py@0e0b0dc9 (the same class sits in other.py of January 2025). The state is
(ivl, EF, reps), starting at (0, w2, 0) BEFORE the card's first review, and every review, the first included, goes
through the same step with q = G + 1:
    reps' = reps + 1 if G > 1 else 1
    ivl'  = w0 if reps' == 1, w1 if reps' == 2, else ivl·EF        (the OLD EF; a lapse and a first success give w0)
    EF'   = EF − w3·(q − w4)² + w5                                    (defaults reproduce SM-2's EF rule)
    ivl' clamped to [s_min, 36500] = [0.01, 36500], EF' to [1.3, 10]; no rounding.
p = 0.9^(t/ivl). init [1, 6, 2.5, 0.02, 7, 0.18].
Clipper after every step: w0, w1 ∈ [s_min, init_s_max] = [0.01, 100] [VERSION: other.py of Jan 2025 used
[0.01, 36500]; unreachable with lr 4e-2 over 5 epochs from 1 and 6], w2 ∈ [1.3, 10], w3 ≥ 0, w4 ≥ 5, w5 free.
Upstream's trained weights are `state_dict()`, which rounds every weight to 4 decimals, and those rounded weights
predict the test split: `SM2Trainable.fit` rounds the same way.

The equations are written once, as torch_init / torch_step below and torch_curve (fsrs_v3.torch_ln_curve; `traced`):
the compiled engine runs the plug-in engine/traced.py generates from them (scalar steps, their VJPs, the lane kernel
of the trainer's batches), and the upstream-style trainer steps them in torch; the curve is written exp(ln 0.9 ·
t/ivl), as the published row computed 0.9^(t/ivl). Until 29 Nov 2026 a hand-written numba plug-in ran them; the
generated one gives the same result lines on data/embedded and upstream-check, other.py --model SM2-trainable warm
0.98x (5 pairs) and from an empty cache 4.73 / 4.57 s against 4.84 / 5.02 s (2 processes).
"""

from __future__ import annotations

import math

from models.fsrs_v3 import torch_ln_curve as torch_curve  # noqa: F401 (0.9^(t/ivl), the contract's curve)
from engine.seq_model import SeqModel

S_MIN = 0.01
S_MAX = 36500.0
EF_MIN = 1.3
EF_MAX = 10.0


# ---------------------------------------------------------------------------------------- the equations (torch)

def torch_step(w, state, t, g):
    import torch  # the upstream-style trainer only: a default run does not import torch

    ivl, ef, reps = state
    new_reps = torch.where(g > 1, reps + 1, torch.ones_like(reps))
    new_ivl = torch.where(new_reps == 1, w[0] * torch.ones_like(ivl),
                          torch.where(new_reps == 2, w[1] * torch.ones_like(ivl), ivl * ef))
    q = g + 1
    new_ef = ef - w[3] * (q - w[4]) ** 2 + w[5]
    return new_ivl.clamp(S_MIN, S_MAX), new_ef.clamp(EF_MIN, EF_MAX), new_reps


def torch_init(w, g, t):
    import torch  # the upstream-style trainer only: a default run does not import torch

    zeros = torch.zeros_like(g, dtype=w.dtype)
    return torch_step(w, (zeros, w[2] * torch.ones_like(zeros), zeros), t, g)


# ---------------------------------------------------------------------------------------- the model

class SM2Trainable(SeqModel):
    name = "SM2-trainable"
    kernels = "models.sm2_trainable"
    traced = True  # the compiled engine runs the plug-in generated from torch_init / torch_step / torch_curve
    default_w = [1.0, 6.0, 2.5, 0.02, 7.0, 0.18]
    lower = [S_MIN, S_MIN, 1.3, 0.0, 5.0, -math.inf]
    upper = [100.0, 100.0, 10.0, math.inf, math.inf, math.inf]

    def fit(self, train):
        super().fit(train)
        self.w = [round(float(x), 4) for x in self.w]  # upstream predicts with state_dict()'s 4-decimal weights
        return self
