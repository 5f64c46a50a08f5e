"""torch.optim.LBFGS with line_search_fn="strong_wolfe", step for step, on a float64 numpy vector: the optimizer of
SBD's full-batch fit (autograd_engine.lbfgs_fit) when its loss and gradient come from a compiled pass.

Why: SBD has 7 parameters and ~28 loss evaluations per fold; once the compiled pass ran over the cards' prefix tree
(engine/prefix_tree.py), torch's optimizer bookkeeping (0-dim tensor arithmetic, a clone and a copy per trial
point, the closure's tensor conversions) was about a third of a 45k-review user's fit. The same algorithm on numpy
vectors and Python floats costs a few microseconds per trial point.

The algorithm is torch's (torch/optim/lbfgs.py, itself minFunc's), with its constants, counters and tests:
- first evaluation at x0; stop at once when max|g| <= tolerance_grad;
- each iteration: the first direction is −g; later ones update the history with (y = g − g_prev, s = t·d) when
  y·s > 1e-10 (dropping the oldest beyond history_size; H_diag = y·s / y·y) and apply the two-loop recursion;
  the first step length is min(1, 1/Σ|g|)·lr, later ones lr; stop when g·d > −tolerance_change;
- the strong-Wolfe line search (c1 = 1e-4, c2 = 0.9, at most max_eval − evaluations so far trial points): a
  bracketing phase that extrapolates by cubic interpolation within [t + 0.01(t − t_prev), 10t], then a zoom phase
  that bisects by cubic interpolation, moves a trial point lying within 10% of the bracket's width from an end
  to that distance when progress was insufficient, and stops when |bracket|·max|d| < tolerance_change;
- after the step: stop at max_iter iterations, max_eval evaluations (max_iter·5 // 4), max|g| <= tolerance_grad,
  max|t·d| <= tolerance_change, or |f − f_prev| < tolerance_change.
Arithmetic differs from torch's only in rounding: torch's 7-element dot products and sums run in MKL's or its
vectorised order (and add(alpha=...) may be fused), these in numpy's or a plain loop's. tests/test_lbfgs.py and
tests/test_traced.py hold it to torch.optim.LBFGS itself: the same iterations, evaluations and trial points, to
1e-14 on a quadratic, 1e-11 on SBD's loss, 1e-9 on Rosenbrock's function (whose curved valley amplifies rounding
over 50-100 trial points).
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
from numba import njit


def _div(a: float, b: float) -> float:
    """a / b with IEEE semantics (torch's 0-dim tensors give inf or NaN where Python raises)."""
    if b != 0.0:
        return a / b
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(np.float64(a) / np.float64(b))


def _cubic_interpolate(x1, f1, g1, x2, f2, g2, bounds=None) -> float:
    """The minimiser of the cubic through (x1, f1, g1) and (x2, f2, g2), clamped to `bounds` (default: between the
    two points); the bounds' midpoint when the cubic has no real minimiser (torch's _cubic_interpolate)."""
    if bounds is not None:
        lo, hi = bounds
    else:
        lo, hi = (x1, x2) if x1 <= x2 else (x2, x1)
    d1 = g1 + g2 - _div(3 * (f1 - f2), x1 - x2)
    d2_square = d1 * d1 - g1 * g2
    if d2_square >= 0:
        d2 = math.sqrt(d2_square)
        if x1 <= x2:
            min_pos = x2 - (x2 - x1) * _div(g2 + d2 - d1, g2 - g1 + 2 * d2)
        else:
            min_pos = x1 - (x1 - x2) * _div(g1 + d2 - d1, g1 - g2 + 2 * d2)
        return min(max(min_pos, lo), hi)
    return (lo + hi) / 2.0


@njit(cache=True)
def _two_loop(g, dirs, stps, ro, h_diag):
    """The L-BFGS direction −H·g by the two-loop recursion over the history (rows oldest first: y = dirs,
    s = stps, ro = 1/(y·s)), torch's loop written out (compiled: ~80 numpy calls an iteration at history 20 were
    a third of a small user's fit)."""
    n, k = len(g), len(ro)
    q = -g
    al = np.empty(k)
    for i in range(k - 1, -1, -1):
        acc = 0.0
        for j in range(n):
            acc += stps[i, j] * q[j]
        al[i] = acc * ro[i]
        for j in range(n):
            q[j] += -al[i] * dirs[i, j]
    r = q * h_diag
    for i in range(k):
        acc = 0.0
        for j in range(n):
            acc += dirs[i, j] * r[j]
        be_i = acc * ro[i]
        for j in range(n):
            r[j] += (al[i] - be_i) * stps[i, j]
    return r


class _Evaluator:
    """fg at trial points x + t·d, counted; keeps each point's value and gradient."""

    def __init__(self, fg: Callable[[np.ndarray], tuple[float, np.ndarray]]):
        self.fg = fg
        self.calls = 0

    def at(self, x: np.ndarray, t: float, d: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
        point = x + t * d
        f, g = self.fg(point)
        self.calls += 1
        return float(f), g, point


def _strong_wolfe(ev: _Evaluator, x, t, d, f, g, gtd, c1=1e-4, c2=0.9, tolerance_change=1e-9, max_ls=25):
    """torch's _strong_wolfe: (f, g, t, point, evaluations) of the step it accepts along d from x."""
    d_norm = float(np.max(np.abs(d)))
    f_new, g_new, p_new = ev.at(x, t, d)
    ls_func_evals = 1
    gtd_new = float(g_new @ d)

    t_prev, f_prev, g_prev, gtd_prev, p_prev = 0.0, f, g, gtd, x
    done = False
    ls_iter = 0
    bracket_gtd = None
    while ls_iter < max_ls:
        if f_new > (f + c1 * t * gtd) or (ls_iter > 1 and f_new >= f_prev):
            bracket, bracket_f, bracket_g, bracket_p = [t_prev, t], [f_prev, f_new], [g_prev, g_new], [p_prev, p_new]
            bracket_gtd = [gtd_prev, gtd_new]
            break
        if abs(gtd_new) <= -c2 * gtd:
            bracket, bracket_f, bracket_g, bracket_p = [t], [f_new], [g_new], [p_new]
            done = True
            break
        if gtd_new >= 0:
            bracket, bracket_f, bracket_g, bracket_p = [t_prev, t], [f_prev, f_new], [g_prev, g_new], [p_prev, p_new]
            bracket_gtd = [gtd_prev, gtd_new]
            break
        min_step = t + 0.01 * (t - t_prev)
        max_step = t * 10
        tmp = t
        t = _cubic_interpolate(t_prev, f_prev, gtd_prev, t, f_new, gtd_new, bounds=(min_step, max_step))
        t_prev, f_prev, g_prev, gtd_prev, p_prev = tmp, f_new, g_new, gtd_new, p_new
        f_new, g_new, p_new = ev.at(x, t, d)
        ls_func_evals += 1
        gtd_new = float(g_new @ d)
        ls_iter += 1

    if ls_iter == max_ls:
        bracket, bracket_f, bracket_g, bracket_p = [0.0, t], [f, f_new], [g, g_new], [x, p_new]

    insuf_progress = False
    low_pos, high_pos = (0, 1) if bracket_f[0] <= bracket_f[-1] else (1, 0)
    while not done and ls_iter < max_ls:
        if abs(bracket[1] - bracket[0]) * d_norm < tolerance_change:
            break
        t = _cubic_interpolate(bracket[0], bracket_f[0], bracket_gtd[0], bracket[1], bracket_f[1], bracket_gtd[1])
        hi, lo = max(bracket), min(bracket)
        eps = 0.1 * (hi - lo)
        if min(hi - t, t - lo) < eps:
            if insuf_progress or t >= hi or t <= lo:
                t = hi - eps if abs(t - hi) < abs(t - lo) else lo + eps
                insuf_progress = False
            else:
                insuf_progress = True
        else:
            insuf_progress = False
        f_new, g_new, p_new = ev.at(x, t, d)
        ls_func_evals += 1
        gtd_new = float(g_new @ d)
        ls_iter += 1
        if f_new > (f + c1 * t * gtd) or f_new >= bracket_f[low_pos]:
            bracket[high_pos], bracket_f[high_pos], bracket_g[high_pos] = t, f_new, g_new
            bracket_gtd[high_pos], bracket_p[high_pos] = gtd_new, p_new
            low_pos, high_pos = (0, 1) if bracket_f[0] <= bracket_f[1] else (1, 0)
        else:
            if abs(gtd_new) <= -c2 * gtd:
                done = True
            elif gtd_new * (bracket[high_pos] - bracket[low_pos]) >= 0:
                bracket[high_pos], bracket_f[high_pos], bracket_g[high_pos] = (
                    bracket[low_pos], bracket_f[low_pos], bracket_g[low_pos])
                bracket_gtd[high_pos], bracket_p[high_pos] = bracket_gtd[low_pos], bracket_p[low_pos]
            bracket[low_pos], bracket_f[low_pos], bracket_g[low_pos] = t, f_new, g_new
            bracket_gtd[low_pos], bracket_p[low_pos] = gtd_new, p_new
    return bracket_f[low_pos], bracket_g[low_pos], bracket[low_pos], bracket_p[low_pos], ls_func_evals


def minimize(fg: Callable[[np.ndarray], tuple[float, np.ndarray]], x0, lr: float = 1.0, max_iter: int = 20,
             max_eval: int | None = None, tolerance_grad: float = 1e-7, tolerance_change: float = 1e-9,
             history_size: int = 100) -> tuple[np.ndarray, dict]:
    """One torch.optim.LBFGS(...).step(closure) from x0 with the strong-Wolfe line search: (x, info). fg(x) gives
    (f, gradient) as a float and a float64 array (it must not keep x: the same array may be passed again). info:
    iterations, evaluations, and the first evaluation's (f, g) (the objective at x0)."""
    if max_eval is None:
        max_eval = max_iter * 5 // 4
    ev = _Evaluator(fg)
    x = np.array(x0, dtype=np.float64)
    loss, flat_grad = fg(x)
    loss = float(loss)
    ev.calls = 1
    info = {"first": (loss, flat_grad), "iterations": 0}
    if float(np.max(np.abs(flat_grad))) <= tolerance_grad:
        info["evaluations"] = ev.calls
        return x, info

    d = t = None
    old_dirs, old_stps, ro = [], [], []
    h_diag = 1.0
    prev_flat_grad = None
    n_iter = 0
    current_evals = 1
    while n_iter < max_iter:
        n_iter += 1
        if n_iter == 1:
            d = -flat_grad
        else:
            y = flat_grad - prev_flat_grad
            s = d * t
            ys = float(y @ s)
            if ys > 1e-10:
                if len(old_dirs) == history_size:
                    old_dirs.pop(0)
                    old_stps.pop(0)
                    ro.pop(0)
                old_dirs.append(y)
                old_stps.append(s)
                ro.append(1.0 / ys)
                h_diag = ys / float(y @ y)
            n = len(flat_grad)
            d = _two_loop(flat_grad, np.array(old_dirs).reshape(-1, n), np.array(old_stps).reshape(-1, n),
                          np.array(ro, dtype=np.float64), float(h_diag))
        prev_flat_grad = flat_grad
        prev_loss = loss

        if n_iter == 1:
            total = float(np.sum(np.abs(flat_grad)))
            inv = _div(1.0, total)
            t = (inv if inv < 1.0 else 1.0) * lr
        else:
            t = lr
        gtd = float(flat_grad @ d)
        if gtd > -tolerance_change:
            break

        loss, flat_grad, t, x, ls_func_evals = _strong_wolfe(ev, x, t, d, loss, flat_grad, gtd,
                                                             max_ls=max_eval - current_evals)
        opt_cond = float(np.max(np.abs(flat_grad))) <= tolerance_grad
        current_evals += ls_func_evals

        if n_iter == max_iter or current_evals >= max_eval or opt_cond:
            break
        if float(np.max(np.abs(d * t))) <= tolerance_change:
            break
        if abs(loss - prev_loss) < tolerance_change:
            break
    info["iterations"] = n_iter
    info["evaluations"] = ev.calls
    return x, info


def fit_box(w0, loss_grad: Callable, denom: float, lam: float, w_init, inv_var, mask, lower, upper,
            recipe) -> np.ndarray:
    """autograd_engine.lbfgs_fit with a numpy loss_grad (the compiled engine's): `minimize` on the objective and
    gradient the torch closure forms (the same operations element by element; the prior's 7-term sum in numpy's
    order), then the box clip and the recipe's revert rule. The fit's start and end objectives are the evaluations
    already made at w0 and at the point it ends on (no extra pass unless the box clip moves that point)."""
    anchor = np.asarray(w_init, dtype=np.float64)
    inv_var = np.asarray(inv_var, dtype=np.float64)
    mask = np.asarray(mask, dtype=np.float64)
    lam_inv_var = lam * inv_var
    one_over = 1.0 / denom
    seen: dict[bytes, float] = {}  # the objective at every evaluated point, before the non-finite rule

    def objective(x):
        value, grad = loss_grad(x)
        diff = x - anchor
        return value / denom + lam * float(np.sum(diff ** 2 * inv_var)), grad, diff

    def fg(x):
        f, grad, diff = objective(x)
        seen[x.tobytes()] = f
        if math.isfinite(f):
            g = (one_over * np.asarray(grad, dtype=np.float64) + lam_inv_var * (2 * diff)) * mask
            if np.isfinite(g).all():
                return f, g
        return 1e6, np.zeros(len(x))  # a very bad point: the line search backs off

    x0 = np.asarray(w0, dtype=np.float64)
    x, _ = minimize(fg, x0, lr=recipe.lr, max_iter=recipe.max_iter, history_size=recipe.history_size,
                    tolerance_grad=recipe.tolerance_grad, tolerance_change=recipe.tolerance_change)
    start = seen[x0.tobytes()]
    w_fit = np.minimum(np.maximum(x, lower), upper)
    final = seen.get(w_fit.tobytes())
    if final is None:
        final = objective(w_fit)[0]
    if recipe.revert_if_worse and (not math.isfinite(final) or final > start):
        return np.minimum(np.maximum(np.asarray(w_init, dtype=np.float64), lower), upper)
    return w_fit
