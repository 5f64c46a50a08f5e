"""FSRS-7's optional scheduling penalties (`--sched_penalties`), upstream's models/fsrs_v7_interval_penalty.py
(the 35-parameter version beside models/fsrs_v7.py@049be719's `batch_process`): two terms that depend on the
weights alone, added to the training loss beside the L2 prior.

Both simulate a card answered Good at every review: S = w2, D = D0(3), then for each of 10 reviews the interval t
at which R(t, S) equals a desired retention, and the state after a Good review t later. The equations are the
penalty file's own (not the model's step): R with the curve's bases and base weights floored at 1e−4, the inner
terms at 1e−9, the weight sum at 1e−9 and R clamped to [0, 1]; SInc's exponent capped at 30; no hard/easy factors;
the long/short blend c clamped to [0, 1]; S' in [1e−4, 36500]; D' = clamp(0.01·clamp(D0(4), 1, 10) + 0.99·D, 1, 10).

- penalty 1 (interval growth, desired retention 0.9): max over i of t[i+1]/t[i] for the t[i] of at least one day,
  squared; 0 if there is none.
- penalty 2 (short intervals, desired retention 0.99): x = mean of the intervals under one day (floored at one
  second), max(1/x, 144) − 144 (144 = one over ten minutes in days); 0 if there is none. (Upstream averages this
  over its list of retentions, which the FSRS-7 row sets to [0.99].)
- Each term is 0 when it is not finite (upstream's guard).

The value and the gradient come from one forward pass of `Dual` numbers (a float and its 35 partial derivatives,
torch's derivative conventions), ~4 ms a call; the same functions run on torch tensors (autograd), which is how the
tests hold the two together.

The interval: 4 Newton steps in u = ln t from u = ln S on plain floats (u and t kept in [1 s, 36500 d]), then one
more step with the gradient on: u* = ln t − (R(t, S, w) − target) / (∂R/∂t·t), the denominator a constant, so that
u*'s gradient is the implicit function theorem's ∂ln t/∂(w, S) (upstream's "IFT lift"); t = exp(clamp(u*)).

In the loss: (0.5·penalty1 + 0.0015·penalty2 + 0.5·L2) × the batch's targets, the same factor as the prior's (the
engine's B/N per batch). Upstream runs this in float32; here float64, like everything else.
"""

from __future__ import annotations

import math

import numpy as np
import torch

WEIGHT_GROWTH = 0.5  # upstream PENALTY_W_1
WEIGHT_SHORT = 0.0015  # upstream PENALTY_W_2
N_REVIEWS = 10
N_NEWTON = 4
GROWTH_RETENTION = 0.9
SHORT_RETENTIONS = (0.99,)
MIN_T = 1.0 / 86400.0  # one second, in days
MAX_T = 36500.0
ONE_DAY = 1.0
INV_TEN_MIN = 86400.0 / 600.0  # 144


class Dual:
    """A float and its gradient with respect to the weights (forward mode), with the torch operations the penalties
    use and torch's derivative conventions: clamp passes the gradient where the value is within its bounds (both
    inclusive), minimum / maximum split it in half on a tie, pow's exponent gradient is result·ln(base)."""

    __slots__ = ("v", "g")

    def __init__(self, v: float, g: np.ndarray):
        self.v, self.g = v, g

    @staticmethod
    def _of(x, like: "Dual") -> "Dual":
        return x if isinstance(x, Dual) else Dual(float(x), np.zeros_like(like.g))

    def __add__(self, o):
        return Dual(self.v + o.v, self.g + o.g) if isinstance(o, Dual) else Dual(self.v + o, self.g)

    __radd__ = __add__

    def __sub__(self, o):
        return Dual(self.v - o.v, self.g - o.g) if isinstance(o, Dual) else Dual(self.v - o, self.g)

    def __rsub__(self, o):
        return Dual(o - self.v, -self.g)

    def __neg__(self):
        return Dual(-self.v, -self.g)

    def __mul__(self, o):
        if isinstance(o, Dual):
            return Dual(self.v * o.v, self.g * o.v + o.g * self.v)
        return Dual(self.v * o, self.g * o)

    __rmul__ = __mul__

    def __truediv__(self, o):
        if isinstance(o, Dual):
            q = self.v / o.v
            return Dual(q, (self.g - o.g * q) / o.v)
        return Dual(self.v / o, self.g / o)

    def __rtruediv__(self, o):
        q = o / self.v
        return Dual(q, self.g * (-q / self.v))

    def pow(self, e):
        if self.v < 0:  # torch: NaN (Python's float power would be complex); never reached with clipped weights
            return Dual(math.nan, np.full_like(self.g, math.nan))
        r = self.v ** (e.v if isinstance(e, Dual) else e)
        if not isinstance(e, Dual):
            return Dual(r, self.g * (e * self.v ** (e - 1.0)))
        g = self.g * (e.v * self.v ** (e.v - 1.0))
        if self.v > 0:
            g = g + e.g * (r * math.log(self.v))
        return Dual(r, g)

    __pow__ = pow

    def __rpow__(self, base):
        r = base ** self.v
        return Dual(r, self.g * (r * math.log(base)))

    def exp(self):
        r = math.exp(self.v)
        return Dual(r, self.g * r)

    def log(self):
        return Dual(math.log(self.v), self.g / self.v)

    def clamp(self, min=None, max=None):  # noqa: A002 -- torch's keywords
        if min is not None and self.v < min:
            return Dual(float(min), np.zeros_like(self.g))
        if max is not None and self.v > max:
            return Dual(float(max), np.zeros_like(self.g))
        return self


def _exp(x):
    return x.exp()


def _pick(a, b, first_wins: bool):
    """torch.minimum / maximum of two Duals: the winner's gradient, half of each on a tie."""
    if a.v == b.v:
        return Dual(a.v, 0.5 * (a.g + b.g))
    return a if first_wins else b


def _minimum(a, b):
    if isinstance(a, torch.Tensor):
        return torch.minimum(a, b)
    return _pick(a, b, a.v < b.v)


def _maximum(a, b):
    if isinstance(a, torch.Tensor):
        return torch.maximum(a, b)
    return _pick(a, b, a.v > b.v)


def _value(x) -> float:
    return float(x.detach()) if isinstance(x, torch.Tensor) else x.v


def _constant(like, value: float):
    """A constant (no gradient) of the same kind as `like`."""
    if isinstance(like, torch.Tensor):
        return like.new_tensor(value)
    return Dual(value, np.zeros_like(like.g))


def _largest(items):
    """max over items (torch's full reduction: the gradient split evenly among tied maxima)."""
    if isinstance(items[0], torch.Tensor):
        return torch.stack(items).max()
    top = max(x.v for x in items)
    tied = [x for x in items if x.v == top]
    return Dual(top, sum(x.g for x in tied) / len(tied))


def _curve_and_slope(t, s, w):
    """(R(t, S), ∂R/∂t) with the penalty file's guards."""
    e1, e2 = -w[27], -w[28]  # the curve exponents (the decays negated)
    b1, b2 = w[29].clamp(min=1e-4), w[30].clamp(min=1e-4)
    a1, a2 = w[31].clamp(min=1e-4), w[32].clamp(min=1e-4)
    k1, k2 = b1 ** (1.0 / e1) - 1.0, b2 ** (1.0 / e2) - 1.0
    x = t / s
    in1, in2 = (1.0 + k1 * x).clamp(min=1e-9), (1.0 + k2 * x).clamp(min=1e-9)
    m1, m2 = a1 * s.pow(-w[33]), a2 * s.pow(w[34])
    total = (m1 + m2).clamp(min=1e-9)
    r = ((m1 * in1 ** e1 + m2 * in2 ** e2) / total).clamp(0.0, 1.0)
    slope = ((m1 * e1 * in1.pow(e1 - 1.0) * (k1 / s) + m2 * e2 * in2.pow(e2 - 1.0) * (k2 / s)) / total).clamp(max=0.0)
    return r, slope


def _newton_interval(s: float, w: list[float], target: float) -> float:
    """The root of R(t, S) = target by N_NEWTON steps in ln t, plain floats, no guards on the weights."""
    e1, e2 = -w[27], -w[28]
    k1, k2 = w[29] ** (1.0 / e1) - 1.0, w[30] ** (1.0 / e2) - 1.0
    m1, m2 = w[31] * s ** (-w[33]), w[32] * s ** w[34]
    total = m1 + m2
    u = math.log(max(s, 1e-10))
    lo, hi = math.log(MIN_T), math.log(MAX_T)
    for _ in range(N_NEWTON):
        u = max(lo, min(u, hi))
        t = max(MIN_T, min(math.exp(u), MAX_T))
        x = t / s
        in1, in2 = max(1.0 + k1 * x, 1e-9), max(1.0 + k2 * x, 1e-9)
        r = (m1 * in1 ** e1 + m2 * in2 ** e2) / total
        slope = (m1 * e1 * in1 ** (e1 - 1.0) * k1 / s + m2 * e2 * in2 ** (e2 - 1.0) * k2 / s) / total
        u -= (r - target) / min(slope * t, -1e-12)
    return max(MIN_T, min(math.exp(u), MAX_T))


def interval(s, w, target: float):
    """t with R(t, S) = target, differentiable in w and S (the IFT step above)."""
    t = _constant(s, _newton_interval(_value(s), [_value(x) for x in w], target))
    r, slope = _curve_and_slope(t, s, w)
    u = t.log() - (r - target) / _constant(s, min(_value(slope) * _value(t), -1e-9))
    return u.clamp(math.log(MIN_T), math.log(MAX_T)).exp()


def _d0(w, g: int):
    return (w[4] - _exp(w[5] * (g - 1)) + 1.0).clamp(1.0, 10.0)


def _good_stability(w, s, d, t):
    """S after a Good review t days after the last one (the penalty file's form of the two blocks and the blend)."""
    r = _curve_and_slope(t, s, w)[0]

    def block(b):
        fail = _minimum(s, w[b + 3] * d.pow(-w[b + 4]) * ((s + 1.0).pow(w[b + 5]) - 1.0)
                        * _exp((1.0 - r) * w[b + 6]))
        grow = 1.0 + _exp(w[b] - 1.5) * (11.0 - d) * s.pow(-w[b + 1]) * (
            _exp(((1.0 - r) * w[b + 2]).clamp(max=30.0)) - 1.0)
        return _maximum(fail, s * grow)

    c = (1.0 - w[26] * _exp(-w[25] * t)).clamp(0.0, 1.0)
    return (c * block(7) + (1.0 - c) * block(16)).clamp(1e-4, 36500.0)


def good_intervals(w, target: float) -> list:
    """The N_REVIEWS intervals of a card answered Good every time, scheduled at desired retention `target`."""
    s, d = w[2], _d0(w, 3)
    d04 = _d0(w, 4)
    out = []
    for _ in range(N_REVIEWS):
        t = interval(s, w, target)
        out.append(t)
        s = _good_stability(w, s, d, t)
        d = (0.01 * d04 + 0.99 * d).clamp(1.0, 10.0)
    return out


def growth_penalty(w):
    """Penalty 1: the largest growth ratio after an interval of at least a day, squared (0 if none)."""
    t = good_intervals(w, GROWTH_RETENTION)
    ratios = [t[i + 1] / t[i] for i in range(len(t) - 1) if _value(t[i]) >= ONE_DAY]
    return _largest(ratios) ** 2 if ratios else _constant(w[0], 0.0)


def short_penalty(w):
    """Penalty 2: max(1/x, 144) − 144 for x the mean sub-day interval, averaged over SHORT_RETENTIONS that have one."""
    terms = []
    for target in SHORT_RETENTIONS:
        short = [x for x in good_intervals(w, target) if _value(x) < ONE_DAY]
        if short:
            mean = sum(short[1:], short[0]) / len(short)
            terms.append((1.0 / mean.clamp(min=MIN_T)).clamp(min=INV_TEN_MIN) - INV_TEN_MIN)
    return sum(terms[1:], terms[0]) / len(terms) if terms else _constant(w[0], 0.0)


def penalties(w):
    """(penalty 1, penalty 2) of the weights (a torch tensor, or a list of Duals), each 0 where it fails or is not
    finite (upstream's guards)."""
    out = []
    for term in (growth_penalty, short_penalty):
        try:
            p = term(w)
        except Exception:  # noqa: BLE001 -- upstream's guard: a failed penalty is 0, training goes on
            p = _constant(w[0], 0.0)
        out.append(p if math.isfinite(_value(p)) else _constant(w[0], 0.0))
    return tuple(out)


def sched_penalty(w) -> tuple[float, np.ndarray]:
    """0.5·penalty1 + 0.0015·penalty2 of numpy weights and its gradient (forward mode, Dual): the term the trainer
    adds per batch, scaled like the L2 prior (engine/autograd_engine.Recipe.penalty)."""
    w = np.asarray(w, dtype=np.float64)
    eye = np.eye(len(w))
    p1, p2 = penalties([Dual(float(x), eye[i]) for i, x in enumerate(w)])
    total = WEIGHT_GROWTH * p1 + WEIGHT_SHORT * p2
    return total.v, total.g.copy()
