"""Anki's SM-2 scheduler turned into a predictor (7 parameters; spec models.md §6.3), rows `Anki` (trained) and
`Anki-default` (`--dry`: upstream's "Anki-SM-2" row, Era A file `Anki-dry-run`).

Upstream: models/anki.py@0e0b0dc9 and @24ac3c3a (identical step), the same class in other.py of January 2025.
w = [graduating ivl 1, easy ivl 4, starting ease 2.5, easy bonus 1.3, hard ivl 1.2, new ivl (lapse multiplier) 0,
interval modifier 1]. State (ivl, ease).
- First review: ivl = w0 if G < 4 (Again included) else w1; ease = w2. No learning steps.
- Later review after t days: days_late = t − ivl.
    Again: ivl' = ivl·w5 (NOT multiplied by w6).
    early (days_late < 0), elapsed = ivl + days_late:
        Hard max(elapsed·w4, ivl·w4/2);  Easy max(elapsed·ease, ivl);  Good max(elapsed·ease, ivl)·(w3 − (w3−1)/2)
    on time / late:
        Hard ivl·w4;  Easy (ivl + days_late/2)·ease;  Good (ivl + days_late)·ease·w3
    every pass multiplied by w6.
    ease' = ease − 0.2 (Again), − 0.15 (Hard), + 0.15 (Easy), unchanged (Good).
- Every review, the first included: ease' clamped to [1.3, 5.5]; ivl' = max(leaky_relu(ivl' − 1) + 1, ivl')
  (slope 0.01: a soft floor near 1 day) clamped to [s_min, s_max] = [0.01, 36500].
- p = 0.9^(t/ivl).
Clipper (Anki 24.11 limits): w0, w1 ∈ [1, 9999], w2 ∈ [1.31, 5], w3 ∈ [1, 5], w4 ∈ [0.5, 1.3], w5 ∈ [0, 1],
w6 ∈ [0.5, 2]. Upstream's trained weights are `state_dict()`, rounded to 4 decimals, and predict with those.

The equations are written once, as torch_init / torch_step below and torch_curve (fsrs_v3.torch_ln_curve; `traced`):
the compiled engine runs the plug-in engine/traced.py generates from them (scalar steps, their VJPs, the lane kernel
of the trainer's batches), and the upstream-style trainer steps them in torch. The gradient follows torch's rules:
torch.where sends it to the selected branch only; clamp passes it when lo <= x <= hi; torch.max of two tensors gives
it to the larger, half to each on a tie (so the soft floor passes 1 for ivl' > 1, 0.01 below 1 and 0.505 at exactly 1,
e.g. w0 = 1 on a first review); leaky_relu's slope at 0 is 0.01; and days_late = t − ivl carries d/d ivl = −1, so that
elapsed = ivl + days_late and ivl + days_late have NO gradient with respect to ivl (autograd sees ivl − ivl), while
ivl + days_late/2 has 1/2. The curve is written exp(ln 0.9 · t/ivl), as the published rows computed 0.9^(t/ivl) (a
last-bit difference from pow reorders near-tied predictions: Anki-default's AUC moved in the 5th decimal). Until 29
Nov 2026 a hand-written numba plug-in ran these equations (step, VJPs, card by card); the generated one gives the same
result lines for Anki and Anki-default on data/embedded and upstream-check, trains on lanes (cards side by side), and
runs at the same speed warm (other.py --model Anki, 1.01x, 5 pairs) and faster from an empty cache (4.93 / 5.00 s
against 5.67 / 5.62 s, 2 processes: its units compile side by side).
"""

from __future__ import annotations

from models.fsrs_v3 import torch_ln_curve as torch_curve  # noqa: F401 (0.9^(t/ivl), the contract's curve)
from engine.seq_model import SeqModel

S_MIN = 0.01
S_MAX = 36500.0
EASE_MIN = 1.3
EASE_MAX = 5.5


# ---------------------------------------------------------------------------------------- the equations (torch)

def _torch_tail(new_ivl, new_ease):
    import torch  # the upstream-style trainer only: a default run does not import torch

    new_ease = new_ease.clamp(EASE_MIN, EASE_MAX)
    new_ivl = torch.max(torch.nn.functional.leaky_relu(new_ivl - 1) + 1, new_ivl).clamp(S_MIN, S_MAX)
    return new_ivl, new_ease


def torch_init(w, g, t):
    import torch

    new_ivl = torch.where(g < 4, w[0], w[1])
    return _torch_tail(new_ivl, torch.ones_like(new_ivl) * w[2])


def torch_step(w, state, t, g):
    import torch

    ivl, ease = state
    days_late = t - ivl
    elapsed = ivl + days_late
    early = torch.where(g == 2, torch.max(elapsed * w[4], ivl * w[4] / 2),
                        torch.where(g == 4, torch.max(elapsed * ease, ivl),
                                    torch.max(elapsed * ease, ivl) * (w[3] - (w[3] - 1) / 2)))
    # [QUIRK] upstream (models/anki.py@0e0b0dc9 / @24ac3c3a, other.py of Jan 2025) swaps Good and Easy relative to
    # Anki's real scheduler: Easy gets (ivl + days_late/2)·ease and Good (ivl + days_late)·ease·bonus (early, Easy
    # max(elapsed·ease, ivl) and Good that times the halved bonus); the published Anki rows come from it
    late = torch.where(g == 2, ivl * w[4],
                       torch.where(g == 4, (ivl + days_late / 2) * ease, (ivl + days_late) * ease * w[3]))
    new_ivl = torch.where(g == 1, ivl * w[5], torch.where(days_late < 0, early, late) * w[6])
    new_ease = torch.where(g == 1, ease - 0.2, torch.where(g == 2, ease - 0.15, torch.where(g == 4, ease + 0.15, ease)))
    return _torch_tail(new_ivl, new_ease)


# ---------------------------------------------------------------------------------------- the model

class Anki(SeqModel):
    name = "Anki"
    kernels = "models.anki"
    traced = True  # the compiled engine runs the plug-in generated from torch_init / torch_step / torch_curve
    default_w = [1.0, 4.0, 2.5, 1.3, 1.2, 0.0, 1.0]
    lower = [1.0, 1.0, 1.31, 1.0, 0.5, 0.0, 0.5]
    upper = [9999.0, 9999.0, 5.0, 5.0, 1.3, 1.0, 2.0]

    def fit(self, train):
        super().fit(train)
        self.w = [round(float(x), 4) for x in self.w]  # upstream predicts with state_dict()'s 4-decimal weights
        return self
