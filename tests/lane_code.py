"""Shared by the lane-kernel tests: the code a lanes_loss_grad compiles to, checked for AVX2 or AVX-512 vectors; a
copy of a plug-in without its lanes; a lane gradient against central differences of the lane loss; a hand lane
kernel against the one generated from its module's torch equations; the loss-only and gradient-only calls; a fit
on the lanes against the same fit card by card."""

from __future__ import annotations

import sys

import numpy as np
import pytest


def scalar_plugin(tmp_path, monkeypatch, kernels: str, name: str, names: str = "N_ADJ, N_STATE") -> str:
    """The module name of a copy of the plug-in `kernels` without LANE_KERNELS (the engine then trains card by
    card), written under tmp_path and importable for this test; `names`: what `import *` must also carry."""
    (tmp_path / f"{name}.py").write_text(f"from {kernels} import *  # noqa: F401,F403\n"
                                         f"from {kernels} import {names}  # noqa: F401\n"
                                         "del LANE_KERNELS  # noqa: F821\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop(name, None)
    return name


_PLUGINS: dict[type, str] = {}


def model_plugin(cls) -> str:
    """The compiled engine's plug-in of a model class (SeqModel.plugin: its hand-written module, or the one generated
    from its torch equations), once per class."""
    if cls not in _PLUGINS:
        _PLUGINS[cls] = cls().plugin()
    return _PLUGINS[cls]


def plugin_lanes(plugin: str):
    """The plug-in's lane kernel (its LANE_KERNELS)."""
    import importlib

    from engine.seq_engine import lane_function

    return lane_function(importlib.import_module(plugin).LANE_KERNELS)


def lane_loss_grad(plugin: str, w, data, opts, weights=None, want_loss=True, want_grad=True, gwc=None):
    """(loss, gradient of w, gwc) of the plug-in's lane kernel over all of data's cards in one batch (no prior; wc:
    its precompute at the run-time options `opts`, wc's adjoint folded into w's by its precompute_vjp)."""
    from engine.lanes import card_items
    from engine.seq_engine import Cards

    pm = sys.modules[plugin]
    cards = Cards(data, weights)
    w = np.asarray(w, dtype=np.float64)
    wc = pm.precompute(w, opts)
    gwc = np.zeros(len(wc)) if gwc is None else gwc
    items = card_items(cards.c_start, cards.c_n, cards.c_tb, cards.c_te)
    loss = plugin_lanes(plugin)(wc, cards.seq_dt, cards.seq_g, cards.c_start, cards.t_pos, cards.t_dt, cards.t_y,
                                cards.t_wt, items, np.arange(len(items)), cards.max_n, gwc, want_loss, want_grad)
    gw = np.zeros(len(w))
    pm.precompute_vjp(w, opts, wc, gwc, gw)
    return loss, gw, gwc


def scalar_loss_grad(plugin: str, w, data, opts, weights=None):
    """The same loss and gradient through the engine's scalar card loop on the plug-in."""
    from engine.seq_engine import Cards, instantiate

    cards = Cards(data, weights)
    grad = np.zeros(len(w))
    loss = instantiate(plugin).loss_grad_cards(np.asarray(w, dtype=np.float64), opts, *cards.args(), cards.t_y,
                                               cards.t_wt, cards.max_n, grad)
    return loss, grad


def assert_gradient_is_central_differences(loss_grad, w) -> None:
    """loss_grad(w, want_grad) -> (loss, gradient): every gradient component equals the central difference of the
    loss at a step of 1e-6 of the weight (at least 1e-8)."""
    _, grad = loss_grad(w, True)
    for j in range(len(grad)):
        h = 1e-6 * max(abs(w[j]), 1e-2)
        wp, wm = w.copy(), w.copy()
        wp[j] += h
        wm[j] -= h
        fd = (loss_grad(wp, False)[0] - loss_grad(wm, False)[0]) / (2 * h)
        assert fd == pytest.approx(grad[j], rel=1e-5, abs=1e-6 * np.abs(grad).max())


def fresh_compile(dispatcher, **options):
    """A new, uncached njit compile of `dispatcher`'s Python function (numba shows no assembly for cached code),
    under its own name: a copy compiled under the same name would take over the symbol, so that the original's
    machine-code address (engine/lanes.kernel_address, which the engine caches) would then resolve to the copy."""
    import types

    from numba import njit

    f = dispatcher.py_func
    copy = types.FunctionType(f.__code__, f.__globals__, f"fresh_{f.__name__}", f.__defaults__, f.__closure__)
    copy.__qualname__ = f"fresh_{f.__qualname__}"
    return njit(**options)(copy)


def lane_code(fresh, wc, cards, items) -> tuple[str, str]:
    """Run `fresh` (a lanes_loss_grad compiled afresh: numba shows no assembly for cached code) on every work item
    of `cards` and return its LLVM IR and assembly, having checked the loops use vectors of 4 doubles (AVX2) or 8
    (AVX-512: LLVM's choice on e.g. AMD Zen 4) (skips on a CPU without AVX2)."""
    fresh(wc, cards.seq_dt, cards.seq_g, cards.c_start, cards.t_pos, cards.t_dt, cards.t_y, cards.t_wt, items,
          np.arange(len(items)), cards.max_n, np.zeros(len(wc)), True, True)
    llvm_ir = "".join(fresh.inspect_llvm().values())
    asm = "".join(fresh.inspect_asm().values())
    if "ymm" not in asm and "zmm" not in asm:
        pytest.skip("no AVX2 on this CPU")
    assert "<4 x double>" in llvm_ir or "<8 x double>" in llvm_ir
    return llvm_ir, asm


def assert_hand_lanes_equal_generated(row: str, data, changes: dict | None = None, grad_tol: float = 1e-12) -> None:
    """The registered row's hand lane kernel and the one engine/traced.py generates from the same module's torch
    equations (bench/bench_generated_lanes.py), over one batch of all of data's cards at the model's default
    weights with `changes` ({index: value}, indices past its weights ignored): loss within 1e-12, gradient within
    grad_tol of its largest component."""
    import math

    from bench.bench_generated_lanes import Batch, plugins

    hand, generated, w = plugins(row)
    for i, v in (changes or {}).items():
        if i < len(w):
            w[i] = v
    batch = Batch(data)
    (lh, gh), (lg, gg) = batch.kernel(hand, w)(), batch.kernel(generated, w)()
    assert sys.modules[generated].LANE_KERNELS != sys.modules[hand].LANE_KERNELS
    assert math.isfinite(lh) and abs(lg - lh) <= 1e-12 * abs(lh)
    assert np.abs(gg - gh).max() <= grad_tol * np.abs(gh).max()


def assert_loss_only_and_gradient_only(loss_grad) -> None:
    """loss_grad(want_loss, want_grad) -> (loss, gradient) of one lane kernel on one batch: the loss alone is the
    same loss and adds nothing to the gradient; the gradient alone is the same gradient and reports a loss of 0."""
    loss, grad = loss_grad(True, True)
    loss_only, untouched = loss_grad(True, False)
    no_loss, grad_only = loss_grad(False, True)
    assert loss_only == loss and no_loss == 0.0
    np.testing.assert_array_equal(grad_only, grad)
    assert not untouched.any()


def assert_lane_fit_follows_scalar_fit(plugin: str, without: str, cls, data, opts) -> None:
    """The engine's Adam on the plug-in's lanes and on `without` (a copy of it without LANE_KERNELS: card by card)
    from the class's default weights (its prior when it has `sigma`): the same weights up to the rounding of the
    gradient sums (mini-batches summed in another order)."""
    from engine.seq_engine import SeqEngine

    w0 = np.array(cls.default_w, dtype=np.float64)
    sigma = getattr(cls, "sigma", None)
    lanes = SeqEngine(plugin, cls.lower, cls.upper, opts=opts).fit(w0, data, None, w_init=w0, sigma=sigma)
    scalar = SeqEngine(without, cls.lower, cls.upper, opts=opts).fit(w0, data, None, w_init=w0, sigma=sigma)
    assert not np.array_equal(lanes, w0)
    np.testing.assert_allclose(lanes, scalar, rtol=1e-9, atol=1e-12)
