"""engine/lbfgs.py against torch.optim.LBFGS itself (strong-Wolfe line search; an independent implementation):
the same trial points in the same order, hence the same iteration and evaluation counts, and the same result, to
rounding (torch's small dot products and sums run in another order), on a quadratic, Rosenbrock's function and
with stops by max_iter, max_eval and the gradient tolerance."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.lbfgs import _cubic_interpolate, minimize


def _torch_run(fg, x0, **kw):
    """torch.optim.LBFGS's trial points, its iteration and evaluation counters and its result."""
    x = torch.tensor(np.asarray(x0, dtype=np.float64), requires_grad=True)
    opt = torch.optim.LBFGS([x], line_search_fn="strong_wolfe", **kw)
    points = []

    def closure():
        opt.zero_grad()
        p = x.detach().numpy().copy()
        points.append(p)
        f, g = fg(p)
        x.grad = torch.tensor(g)
        return torch.tensor(f, dtype=torch.float64)

    opt.step(closure)
    state = opt.state[x]
    return np.array(points), state["n_iter"], state["func_evals"], x.detach().numpy().copy()


def _ours(fg, x0, **kw):
    points = []

    def wrapped(p):
        points.append(p.copy())
        return fg(p)

    x, info = minimize(wrapped, x0, **kw)
    return np.array(points), info["iterations"], info["evaluations"], x


def _quadratic():
    rng = np.random.default_rng(7)
    m = rng.normal(size=(7, 7))
    a = m @ m.T + 0.5 * np.eye(7)  # symmetric positive definite, condition number in the hundreds
    b = rng.normal(size=7)
    return (lambda x: (0.5 * float(x @ a @ x) - float(b @ x), a @ x - b)), np.zeros(7), np.linalg.solve(a, b)


def _rosenbrock(n=4):
    def fg(x):
        f = float(np.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2))
        g = np.zeros_like(x)
        g[:-1] = -400.0 * x[:-1] * (x[1:] - x[:-1] ** 2) - 2.0 * (1.0 - x[:-1])
        g[1:] += 200.0 * (x[1:] - x[:-1] ** 2)
        return f, g
    return fg, np.array([-1.2, 1.0] * (n // 2)), np.ones(n)


SBD_LIKE = dict(lr=1.0, max_iter=200, history_size=20, tolerance_grad=1e-7, tolerance_change=1e-9)


@pytest.mark.parametrize("problem, kw", [
    (_quadratic, SBD_LIKE),
    (_rosenbrock, SBD_LIKE),
    (_rosenbrock, dict(SBD_LIKE, history_size=3)),  # the history's oldest pair dropped
    (_rosenbrock, dict(SBD_LIKE, max_iter=7)),  # stops by max_iter
    (_rosenbrock, dict(SBD_LIKE, max_iter=40, max_eval=30)),  # stops by max_eval (the line search shortened)
    (_rosenbrock, dict(SBD_LIKE, lr=0.3, tolerance_grad=1e-3)),
])
def test_same_steps_as_torch(problem, kw):
    fg, x0, solution = problem()
    ref_points, ref_iter, ref_evals, ref_x = _torch_run(fg, x0, **kw)
    points, n_iter, evals, x = _ours(fg, x0, **kw)
    assert (n_iter, evals) == (ref_iter, ref_evals) and len(points) == len(ref_points) == evals
    # rounding differences (~1e-16) stay there on the quadratic; Rosenbrock's curved valley amplifies them along
    # its 30-100 trial points (measured: at most 2e-10 on a point, 7e-12 on the result)
    tol = 1e-14 if problem is _quadratic else 1e-9
    np.testing.assert_allclose(points, ref_points, rtol=0, atol=tol)
    np.testing.assert_allclose(x, ref_x, rtol=0, atol=tol / 10)
    if kw is SBD_LIKE:
        np.testing.assert_allclose(x, solution, atol=1e-4)  # it converged


def test_at_a_stationary_point_one_evaluation():
    fg, _, solution = _quadratic()
    x, info = minimize(fg, solution + 0.0, **SBD_LIKE)
    assert info["evaluations"] == 1 and info["iterations"] == 0 and np.array_equal(x, solution)


def test_cubic_interpolation_by_hand():
    # f(x) = (x − 1)² sampled at 0 and 3 (f 1 and 4, f' −2 and 4): the cubic is that parabola, minimum at 1
    assert _cubic_interpolate(0.0, 1.0, -2.0, 3.0, 4.0, 4.0) == pytest.approx(1.0, abs=1e-15)
    assert _cubic_interpolate(3.0, 4.0, 4.0, 0.0, 1.0, -2.0) == pytest.approx(1.0, abs=1e-15)
    assert _cubic_interpolate(0.0, 1.0, -2.0, 3.0, 4.0, 4.0, bounds=(2.0, 5.0)) == 2.0  # clamped to the bounds
    # no real minimiser (d1² < g1·g2): the bounds' midpoint
    assert _cubic_interpolate(0.0, 0.0, 1.0, 1.0, 5.0 / 3.0, 4.0) == 0.5  # d1 = 1 + 4 − 3·(5/3) = 0 < g1·g2


def _fit(loss_grad, w0, w_init, lower, upper, revert=True):
    from engine.autograd_engine import Recipe, lbfgs_fit

    recipe = Recipe(optimizer="lbfgs", lr=1.0, max_iter=200, history_size=20, prior_weight=0.0,
                    revert_if_worse=revert)
    n = len(w0)
    return lbfgs_fit(np.array(w0, float), None, 1.0, 10, np.array(w_init, float), np.zeros(n), np.ones(n), lower,
                     upper, recipe, loss_grad=loss_grad)


def test_lbfgs_fit_numpy_path_start_end_objectives_and_revert():
    """lbfgs_fit with a numpy loss_grad: no pass beyond the optimizer's own unless the box clip moves the end point
    (then one, at the clipped point); the revert rule on that end objective; a never-finite loss keeps w_init."""
    calls = []

    def parabola(w):  # (w − 3)², minimum at 3
        calls.append(w.copy())
        return float((w[0] - 3.0) ** 2), np.array([2.0 * (w[0] - 3.0)])

    out = _fit(parabola, [0.0], [0.0], [-10.0], [10.0])
    assert abs(out[0] - 3.0) < 1e-6 and np.array_equal(calls[-1], out)  # the end point was the last evaluated
    n_free = len(calls)
    calls.clear()
    assert _fit(parabola, [0.0], [0.0], [-10.0], [2.0])[0] == 2.0  # clipped: f(2) = 1 < f(0) = 9, kept
    assert len(calls) == n_free + 1 and calls[-1][0] == 2.0
    # clipped to −1 from a start of 0: f(−1) = 16 > f(0) = 9, so w_init (clipped into the box) comes back
    assert _fit(parabola, [0.0], [-3.0], [-5.0], [-1.0])[0] == -3.0
    assert _fit(parabola, [0.0], [-3.0], [-5.0], [-1.0], revert=False)[0] == -1.0
    never = _fit(lambda w: (float("nan"), np.zeros(len(w))), [0.5, 0.5], [0.25, 1.0], [-9, -9], [9, 9])
    np.testing.assert_array_equal(never, [0.25, 1.0])
