"""engine/traced_lanes.py: the lane form of a traced plug-in (LANES cards side by side) against the scalar
generated kernel it is derived from (itself held to torch autograd in tests/test_traced.py): loss and gradient
within 1e-12, the batches it must refuse (pow off its exp(y·ln x) domain, a target off the layout) refused with
nothing added, the engine's batches and objective passes falling back to the cards there, and its lane loops
compiled to vector code without libm calls."""

from __future__ import annotations

import importlib
import math
import re
import sys
import types

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from numba import njit

from engine.seq_engine import Cards, SeqEngine
from engine.traced import compile_module
from tests.test_fsrs6_fast import random_data
from lane_code import lane_code
from engine.lanes import card_items


def _lanes(plugin: str):
    return importlib.import_module(sys.modules[plugin].LANE_KERNELS)


def lane_loss_grad(plugin: str, w, data, weights=None, want_loss=True, want_grad=True, gwc=None):
    """(loss, gradient of w, gwc) of the lane kernel over all of data's cards in one batch (no prior)."""
    pm, lm = sys.modules[plugin], _lanes(plugin)
    cards = Cards(data, weights)
    w = np.asarray(w, dtype=np.float64)
    wc = pm.precompute(w, np.zeros(0))
    gwc = np.zeros(len(wc)) if gwc is None else gwc
    items = card_items(cards.c_start, cards.c_n, cards.c_tb, cards.c_te)
    loss = lm.lanes_loss_grad(wc, cards.seq_dt, cards.seq_g, cards.c_start, cards.t_pos, cards.t_dt, cards.t_y,
                              cards.t_wt, items, np.arange(len(items)), cards.max_n, gwc, want_loss, want_grad)
    gw = np.zeros(len(w))
    pm.precompute_vjp(w, np.zeros(0), wc, gwc, gw)
    return loss, gw, gwc


def scalar_loss_grad(engine: SeqEngine, w, data, weights=None):
    """The same through the engine's scalar card loop (the generated step_target / step_target_vjp)."""
    cards = Cards(data, weights)
    grad = np.zeros(len(w))
    loss = engine.k.loss_grad_cards(np.asarray(w, dtype=np.float64), engine.opts, *cards.args(), cards.t_y,
                                    cards.t_wt, cards.max_n, grad)
    return loss, grad


def _assert_close(plugin, engine, w, data, weights=None):
    loss, grad, _ = lane_loss_grad(plugin, w, data, weights)
    ref_loss, ref_grad = scalar_loss_grad(engine, w, data, weights)
    assert math.isfinite(loss)
    assert abs(loss - ref_loss) <= 1e-12 * abs(ref_loss)
    assert np.abs(grad - ref_grad).max() <= 1e-12 * np.abs(ref_grad).max()


def _model(name):
    mod = importlib.import_module(f"models.{name}")
    n = len(mod.DEFAULT_W)
    lower = getattr(mod, "LOWER", [-np.inf] * n)
    upper = getattr(mod, "UPPER", [np.inf] * n)
    plugin = compile_module(mod)
    return mod, plugin, SeqEngine(plugin, lower, upper), np.array(lower, float), np.array(upper, float)


@pytest.mark.parametrize("name", ["fsrs7", "sbd"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_lanes_equal_the_scalar_generated_kernel(name, seed):
    """FSRS-7 and SBD, default and random weights, with and without row weights; 37 cards (the last group has
    fewer than LANES), every grade, same-day reviews and long gaps."""
    mod, plugin, engine, lower, upper = _model(name)
    rng = np.random.default_rng(seed)
    w = np.array(mod.DEFAULT_W, float)
    if seed:
        lo = np.where(np.isfinite(lower), lower, w - 1.0)
        hi = np.where(np.isfinite(upper), np.minimum(upper, lo + 20), w + 1.0)
        w = lo + (hi - lo) * rng.uniform(0.05, 0.95, len(w))
    data = random_data(seed, n_cards=37, max_len=16)
    weights = rng.uniform(0.1, 2.0, len(data)) if seed == 1 else None
    _assert_close(plugin, engine, w, data, weights)


def test_loss_only_and_gradient_only_passes():
    mod, plugin, engine, _, _ = _model("fsrs7")
    data = random_data(5, n_cards=20)
    w = np.array(mod.DEFAULT_W, float)
    both, g_both, _ = lane_loss_grad(plugin, w, data)
    loss, g_none, _ = lane_loss_grad(plugin, w, data, want_grad=False)
    zero, g_only, _ = lane_loss_grad(plugin, w, data, want_loss=False)
    assert loss == both and zero == 0.0
    assert not g_none.any() and np.array_equal(g_only, g_both)


# ---------------------------------------------------------------------------- every op of the lane dialect
def _dialect_model(shift: float):
    """A two-component model using every op the lane dialect rewrites (pow sharing ln x, a constant power, a
    number to a traced power, sigmoid, tanh, log1p, sqrt, logaddexp, softplus, nan_to_num, where, a gather); its
    pow max(y − w9, 0)^w10 has the base 0 wherever y <= w9 (libm's pow in the scalar code, and finite)."""
    def init(w, g, t):
        return (w[0] + 0.0 * t) * w[(g.long() - 1).clamp(0, 3)], w[1] + 0.0 * t

    def step(w, s, t, g):
        x, y = s
        r = (1 + t / x) ** (-w[2])
        a = torch.sigmoid(w[3] * (y - 1)) + torch.tanh(w[4] * r)
        b = torch.log1p(x * w[5]) + torch.sqrt(y + 1) + (y + 1) ** 1.7 + 2.0 ** (w[6] * r) + x ** w[2]
        c = torch.where(g > 2, w[7], w[8]) * w[(g.long() - 1).clamp(0, 3)] + (y - w[9]).clamp(min=0.0) ** w[10]
        nx = (x * (1 + a * c)).clamp(0.01, 100.0)
        ny = (torch.logaddexp(y, b) - F.softplus(x - 2, beta=2.0, threshold=5.0)).clamp(0.1, 50.0)
        return nx, ny

    def curve(w, s, t):
        return torch.nan_to_num((1 + t / s[0]) ** (-w[2]), nan=0.5).clamp(1e-4, 0.9999)

    return types.SimpleNamespace(DEFAULT_W=[1.5, 2.0, 0.4, 0.8, 0.6, 0.3, 0.2, 0.5, 0.25, shift, 2.0],
                                 init=init, step=step, curve=curve, __name__=f"dialect_{shift}")


@pytest.fixture(scope="module")
def dialect():
    mod = _dialect_model(0.0)
    plugin = compile_module(mod)
    n = len(mod.DEFAULT_W)
    return mod, plugin, SeqEngine(plugin, [-np.inf] * n, [np.inf] * n)


def test_every_op_of_the_dialect_equals_the_scalar_kernel(dialect):
    mod, plugin, engine = dialect
    for seed in (0, 1):
        _assert_close(plugin, engine, mod.DEFAULT_W, random_data(seed, n_cards=19, max_len=10))


def test_a_pow_off_its_domain_refuses_the_batch_and_the_engine_runs_the_cards(dialect):
    """y <= w9: the scalar code's pow(0, 2.0); the lanes add nothing and return NaN, and the engine's
    batches and objective pass on the fallback instance (seq_engine_kernels' LANE-BATCH section) give the card
    loop's values."""
    mod, plugin, engine = dialect
    w = np.array(mod.DEFAULT_W, float)
    w[9] = 3.0  # y starts at w1 = 2
    data = random_data(3, n_cards=19, max_len=10)
    gwc = np.full(len(sys.modules[plugin].precompute(w, np.zeros(0))), 7.0)
    loss, _, gwc = lane_loss_grad(plugin, w, data, gwc=gwc)
    assert math.isnan(loss) and np.all(gwc == 7.0)
    ref_loss, ref_grad = scalar_loss_grad(engine, w, data)
    assert math.isfinite(ref_loss) and np.all(np.isfinite(ref_grad))
    cards = Cards(data)
    k = engine.k_fallback
    items = card_items(cards.c_start, cards.c_n, cards.c_tb, cards.c_te)
    wc = k.precompute(w, engine.opts)
    gwc = np.zeros(len(wc))
    assert k.batch_loss_grad(wc, cards.seq_dt, cards.seq_g, cards.c_start, cards.t_pos, cards.t_dt, cards.t_y,
                             cards.t_wt, items, np.arange(len(items)), cards.max_n, k.scratch(cards.max_n), gwc,
                             engine.lanes)
    grad = np.zeros(len(w))
    k.precompute_vjp(w, engine.opts, wc, gwc, grad)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-13, atol=1e-13 * np.abs(ref_grad).max())
    fit_loss = k.fit_loss(w, engine.opts, *cards.args(), cards.t_y, cards.t_wt, cards.max_n, engine.lanes)
    assert abs(fit_loss - ref_loss) <= 1e-13 * abs(ref_loss)


def test_lane_loops_vectorise_without_libm_calls():
    """FSRS-7's lane loops compile to AVX2 vector code with no call to exp, log or pow (a fresh, uncached compile:
    numba shows no assembly for cached code)."""
    mod, plugin, engine, _, _ = _model("fsrs7")
    lm = _lanes(plugin)
    fresh = njit(error_model="numpy", fastmath={"contract"})(lm.lanes_loss_grad.py_func)
    cards = Cards(random_data(1, n_cards=9))
    w = np.array(mod.DEFAULT_W, float)
    wc = sys.modules[plugin].precompute(w, np.zeros(0))
    items = card_items(cards.c_start, cards.c_n, cards.c_tb, cards.c_te)
    llvm_ir, asm = lane_code(fresh, wc, cards, items)
    assert not re.findall(r"@(?:exp|log|log1p|expm1|pow)\b", llvm_ir)
