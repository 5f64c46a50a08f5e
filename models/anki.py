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

The reverse pass follows torch's gradient rules exactly: torch.where sends the gradient to the selected branch only;
clamp passes it when lo <= x <= hi; torch.max of two tensors gives it to the larger, half to each on a tie (so the
soft floor passes 1 for ivl' > 1, 0.01 below 1 and 0.505 at exactly 1, e.g. w0 = 1 on a first review);
leaky_relu's slope at 0 is 0.01; and days_late = t − ivl carries d/d ivl = −1, so that elapsed = ivl + days_late
and ivl + days_late have NO gradient with respect to ivl (autograd sees ivl − ivl), while ivl + days_late/2 has 1/2.
"""

from __future__ import annotations

from numba import njit

from models.fsrs_v3 import curve, curve_vjp, torch_curve  # noqa: F401 (the same 0.9^(t/S) prediction)
from engine.jit import inlined
from engine.seq_model import SeqModel

N_STATE = 2
S_MIN = 0.01
S_MAX = 36500.0
EASE_MIN = 1.3
EASE_MAX = 5.5
SLOPE = 0.01  # torch.nn.functional.leaky_relu's default negative slope


# ---------------------------------------------------------------------------------------- numba kernels

@inlined
def _max_split(a, b):
    """(∂max/∂a, ∂max/∂b) as torch.max(a, b) propagates them: all to the larger one, half each on a tie."""
    if a > b:
        return 1.0, 0.0
    if a < b:
        return 0.0, 1.0
    return 0.5, 0.5


@njit(cache=True)
def _pass_interval(w, ivl, ease, t, g):
    """The interval before the multiplier w6 for a passing grade (2, 3, 4).

    [QUIRK] upstream (models/anki.py@0e0b0dc9 / @24ac3c3a, other.py of Jan 2025) swaps Good and Easy relative to
    Anki's real scheduler: here Easy gets (ivl + days_late/2)·ease and Good (ivl + days_late)·ease·bonus (and in
    the early branch Easy gets max(elapsed·ease, ivl), Good that times the halved bonus). The published Anki rows
    come from this code, so it is reproduced as is."""
    days_late = t - ivl
    if days_late < 0.0:
        elapsed = ivl + days_late
        if g == 2:
            return max(elapsed * w[4], ivl * w[4] / 2.0)
        m = max(elapsed * ease, ivl)
        if g == 4:
            return m
        return m * (w[3] - (w[3] - 1.0) / 2.0)
    if g == 2:
        return ivl * w[4]
    if g == 4:
        return (ivl + days_late / 2.0) * ease
    return (ivl + days_late) * ease * w[3]


@njit(cache=True)
def _floor(x):
    """max(leaky_relu(x − 1) + 1, x) clamped to [S_MIN, S_MAX]."""
    u = x - 1.0
    a = (u if u > 0.0 else SLOPE * u) + 1.0
    return min(max(max(a, x), S_MIN), S_MAX)


@njit(cache=True)
def _floor_vjp(x, g_out):
    """d/dx of _floor, times g_out."""
    u = x - 1.0
    a = (u if u > 0.0 else SLOPE * u) + 1.0
    m = max(a, x)
    if not (S_MIN <= m <= S_MAX):
        return 0.0
    ca, cx = _max_split(a, x)
    return g_out * (cx + ca * (1.0 if u > 0.0 else SLOPE))


@njit(cache=True)
def init(w, g, t, out):
    out[0] = _floor(w[0] if g < 4 else w[1])
    out[1] = min(max(w[2], EASE_MIN), EASE_MAX)


@njit(cache=True)
def init_vjp(w, g, t, state, gstate, gw):
    if g < 4:
        gw[0] += _floor_vjp(w[0], gstate[0])
    else:
        gw[1] += _floor_vjp(w[1], gstate[0])
    if EASE_MIN <= w[2] <= EASE_MAX:
        gw[2] += gstate[1]


@njit(cache=True)
def _new_ivl(w, ivl, ease, t, g):
    if g == 1:
        return ivl * w[5]
    return _pass_interval(w, ivl, ease, t, g) * w[6]


@njit(cache=True)
def _ease_delta(g):
    if g == 1:
        return -0.2
    if g == 2:
        return -0.15
    if g == 4:
        return 0.15
    return 0.0


@njit(cache=True)
def step(w, prev, t, g, out):
    ivl = prev[0]
    ease = prev[1]
    out[0] = _floor(_new_ivl(w, ivl, ease, t, g))
    out[1] = min(max(ease + _ease_delta(g), EASE_MIN), EASE_MAX)


@njit(cache=True)
def step_vjp(w, prev, t, g, new, gnew, gprev, gw):
    ivl = prev[0]
    ease = prev[1]
    gprev[0] = 0.0
    gprev[1] = 0.0
    # ease
    e = ease + _ease_delta(g)
    if EASE_MIN <= e <= EASE_MAX:
        gprev[1] += gnew[1]
    # interval
    gx = _floor_vjp(_new_ivl(w, ivl, ease, t, g), gnew[0])
    if gx == 0.0:
        return
    if g == 1:
        gprev[0] += gx * w[5]
        gw[5] += gx * ivl
        return
    gw[6] += gx * _pass_interval(w, ivl, ease, t, g)
    gr = gx * w[6]
    days_late = t - ivl
    if days_late < 0.0:
        elapsed = ivl + days_late  # d elapsed / d ivl = 1 − 1 = 0 under autograd
        if g == 2:
            ca, cb = _max_split(elapsed * w[4], ivl * w[4] / 2.0)
            gw[4] += gr * (ca * elapsed + cb * ivl / 2.0)
            gprev[0] += gr * cb * w[4] / 2.0
        else:
            a = elapsed * ease
            ca, cb = _max_split(a, ivl)
            gm = gr
            if g != 4:  # Good: max(...)·(w3 − (w3 − 1)/2), d/dw3 = 1/2
                gw[3] += gr * max(a, ivl) * 0.5
                gm = gr * (w[3] - (w[3] - 1.0) / 2.0)
            gprev[1] += gm * ca * elapsed
            gprev[0] += gm * cb
    else:
        if g == 2:
            gprev[0] += gr * w[4]
            gw[4] += gr * ivl
        elif g == 4:
            gprev[0] += gr * ease * 0.5  # (ivl + (t − ivl)/2): d/d ivl = 1/2
            gprev[1] += gr * (ivl + days_late / 2.0)
        else:
            base = ivl + days_late  # d/d ivl = 0 under autograd
            gprev[1] += gr * base * w[3]
            gw[3] += gr * base * ease


# ---------------------------------------------------------------------------------------- torch (upstream trainer)

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
    # [QUIRK] Good/Easy swapped as upstream has them (see _pass_interval)
    late = torch.where(g == 2, ivl * w[4],
                       torch.where(g == 4, (ivl + days_late / 2) * ease, (ivl + days_late) * ease * w[3]))
    new_ivl = torch.where(g == 1, ivl * w[5], torch.where(days_late < 0, early, late) * w[6])
    new_ease = torch.where(g == 1, ease - 0.2, torch.where(g == 2, ease - 0.15, torch.where(g == 4, ease + 0.15, ease)))
    return _torch_tail(new_ivl, new_ease)


# ---------------------------------------------------------------------------------------- the model

class Anki(SeqModel):
    name = "Anki"
    kernels = "models.anki"
    default_w = [1.0, 4.0, 2.5, 1.3, 1.2, 0.0, 1.0]
    lower = [1.0, 1.0, 1.31, 1.0, 0.5, 0.0, 0.5]
    upper = [9999.0, 9999.0, 5.0, 5.0, 1.3, 1.0, 2.0]

    def fit(self, train):
        super().fit(train)
        self.w = [round(float(x), 4) for x in self.w]  # upstream predicts with state_dict()'s 4-decimal weights
        return self
