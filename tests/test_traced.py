"""engine/traced.py: torch model files compiled into compiled-engine plug-ins, held to the autograd engine (torch's
own autograd on the same functions, an independent implementation) on a real user, in training, on the clip hook,
and on hand-built graphs at the points where torch's derivative rules have ties and boundaries."""

from __future__ import annotations

import importlib
import math
import sys
import types

import numpy as np
import pytest
import torch

import models
from check_users import check_features
from config import RunConfig
from engine.autograd_engine import AutogradEngine, Recipe
from engine.own_model import load, model_class
from engine.seq_engine import SeqEngine
from engine.traced import CompiledOwnEngine, TraceError, compile_module, engine_for


def _fsrs6():
    mod = importlib.import_module("models.fsrs6")
    return mod, list(mod.DEFAULT_W), list(mod.CLIP_LO), list(mod.CLIP_HI), True


def _fsrs7():
    mod = importlib.import_module("models.fsrs7")
    return mod, list(mod.DEFAULT_W), list(mod.LOWER), list(mod.UPPER), True


def _exp4():
    mod = load("examples/exp4.py")
    return mod, list(mod.DEFAULT_W), list(mod.LOWER), list(mod.UPPER), False


def _hlr():
    model = models.model_class("HLR")(RunConfig(algo="HLR"))
    return importlib.import_module(model.kernels), list(model.default_w), list(model.lower), list(model.upper), False


def _sbd():  # logaddexp, softplus, nan_to_num; no clip box
    mod = importlib.import_module("models.sbd")
    n = len(mod.DEFAULT_W)
    return mod, list(mod.DEFAULT_W), [-np.inf] * n, [np.inf] * n, False


MODELS = {"FSRS-6": _fsrs6, "FSRS-7": _fsrs7, "EXP-4": _exp4, "HLR": _hlr, "SBD": _sbd}


def _random_weights(default, lower, upper, rng) -> np.ndarray:
    lo, hi = np.array(lower, float), np.array(upper, float)
    lo = np.where(np.isfinite(lo), lo, np.array(default) - 1.0)
    hi = np.where(np.isfinite(hi), np.minimum(hi, lo + 20), np.array(default) + 1.0)
    return lo + (hi - lo) * rng.uniform(0.05, 0.95, len(lo))


def _engines(name):
    mod, default, lower, upper, short = MODELS[name]()
    plugin = compile_module(mod, n_w=len(default))
    return mod, default, lower, upper, short, SeqEngine(plugin, lower, upper), AutogradEngine(mod, lower, upper)


@pytest.mark.parametrize("name", list(MODELS))
def test_generated_plugin_equals_the_autograd_engine(name):
    """Upstream-check user 8, at the defaults and at random in-box weights, with random row weights."""
    mod, default, lower, upper, short, seq, auto = _engines(name)
    data = check_features(8, short)
    rng = np.random.default_rng(5)
    weights = rng.uniform(0.5, 1.5, len(data))
    for w in (np.array(default, float), _random_weights(default, lower, upper, rng)):
        p, p_auto = seq.predict(w, data), auto.predict(w, data)
        assert (np.isnan(p) == np.isnan(p_auto)).all() and np.isfinite(p).sum() > 4000
        np.testing.assert_allclose(p, p_auto, rtol=0, atol=1e-12)
        loss, grad = seq.loss_and_grad(w, data, weights=weights)
        loss_auto, grad_auto = auto.loss_and_grad(w, data, weights=weights)
        assert loss == pytest.approx(loss_auto, rel=1e-12)
        assert np.abs(grad_auto).max() > 0
        np.testing.assert_allclose(grad, grad_auto, rtol=0, atol=1e-9 * np.abs(grad_auto).max())


def test_a_data_only_state_computed_once_equals_the_card_replayed():
    """HLR's state (success and failure counts) reads no weight, so its plug-in computes the state before every
    target once per fit (target_inputs) and a target costs its curve (traced_codegen.data_only_state). Held to the
    plug-in that replays each target's card (data_state=False), on user 8 of upstream-check with random row weights,
    at the defaults and at weights far from them, and in a short fit in upstream's length-shared batches, as HLR's
    fast trainer runs it. Predictions are the same code on the same state: bit-identical."""
    mod, default, lower, upper, short, once, _ = _engines("HLR")
    assert hasattr(sys.modules[once.model_module], "target_inputs")
    assert not hasattr(sys.modules[once.model_module], "LANE_KERNELS")
    replay = SeqEngine(compile_module(mod, n_w=len(default), data_state=False), lower, upper)
    assert not hasattr(sys.modules[replay.model_module], "target_inputs")
    data = check_features(8, short)
    rng = np.random.default_rng(23)
    weights = rng.uniform(0.5, 1.5, len(data))
    for w in (np.array(default, float), np.array([0.9, -2.0, 4.0]), np.array([3.5, 0.4, 1.0])):
        p = once.predict(w, data)
        assert len(p) > 4000 and np.isfinite(p).all() and np.ptp(p) > 0.5
        np.testing.assert_array_equal(p, replay.predict(w, data))
        loss, grad = once.loss_and_grad(w, data, weights=weights)
        loss_replay, grad_replay = replay.loss_and_grad(w, data, weights=weights)
        assert loss == pytest.approx(loss_replay, rel=1e-13)
        assert np.abs(grad).min() > 1e-3  # every weight moves the loss
        np.testing.assert_allclose(grad, grad_replay, rtol=1e-12, atol=0)
    train, cfg = data.subset(np.arange(2000)), RunConfig(n_epoch=2, batch_size=256)
    w0 = np.array(default, float)
    fits = [engine.fit(w0, train, cfg, lr=1e-2, batching="length-shared", equal_lengths=True,
                       check_every_epoch=True) for engine in (once, replay)]
    assert np.abs(fits[0] - w0).max() > 1e-2  # training moved the weights
    np.testing.assert_allclose(fits[0], fits[1], rtol=1e-12, atol=0)


@pytest.mark.parametrize("name", ["FSRS-7", "SBD"])
def test_targets_off_the_next_steps_time_equal_the_autograd_engine(name):
    """The plug-in's card loop fuses a target with the step that starts from the same state when both read the same
    elapsed time (step_target): a card's last target and a target whose delta_t is not the next review's go
    through target_loss_vjp instead. Both kinds mixed within cards give autograd's loss and gradient."""
    from engine.seq_engine import Cards

    mod, default, lower, upper, short, seq, auto = _engines(name)
    data = check_features(8, short)
    rows = data.rows.copy()
    odd = (np.arange(len(rows)) % 3 == 1) & (rows["seq_pos"].to_numpy() >= 1)
    rows.loc[odd, "delta_t"] = rows.loc[odd, "delta_t"] * 1.5 + 0.25  # no longer the next review's elapsed time
    data = type(data)(rows, data.seq_delta_t, data.seq_rating)
    cards = Cards(data)
    nxt = cards.c_start[np.repeat(np.arange(len(cards.c_start)), cards.c_te - cards.c_tb)] + cards.t_pos
    last = np.zeros(len(cards.t_pos), dtype=bool)
    last[cards.c_te - 1] = True
    inside = ~last & (nxt < len(cards.seq_dt))
    same = np.zeros(len(cards.t_pos), dtype=bool)
    same[inside] = cards.t_dt[inside] == cards.seq_dt[nxt[inside]]
    assert same.sum() > 500 and (inside & ~same).sum() > 500 and last.sum() > 100  # every path taken, often
    rng = np.random.default_rng(11)
    weights = rng.uniform(0.5, 1.5, len(data))
    for w in (np.array(default, float), _random_weights(default, lower, upper, rng)):
        loss, grad = seq.loss_and_grad(w, data, weights=weights)
        loss_auto, grad_auto = auto.loss_and_grad(w, data, weights=weights)
        assert loss == pytest.approx(loss_auto, rel=1e-12)
        np.testing.assert_allclose(grad, grad_auto, rtol=0, atol=1e-9 * np.abs(grad_auto).max())
        np.testing.assert_allclose(seq.predict(w, data), auto.predict(w, data), rtol=0, atol=1e-12)


@pytest.mark.parametrize("name, recipe", [
    ("FSRS-7", None),  # its own RECIPE: betas (0.8, 0.85), lr 2e-2, 8 epochs of 1024, keep last, prior 0.5, clip hook
    ("FSRS-7", "recency"),
    ("EXP-4", dict(n_epoch=2, batch_size=256)),  # keep best
    ("FSRS-6", dict(n_epoch=2, keep="every_epoch")),
    ("HLR", dict(n_epoch=2, batch_size=256, lr=1e-2)),
])
def test_short_fit_equals_the_autograd_engine(name, recipe):
    mod, default, lower, upper, short, _, auto = _engines(name)
    train = check_features(8, short).subset(np.arange(1500))
    compiled = CompiledOwnEngine(mod, lower, upper) if hasattr(mod, "DEFAULT_W") else None
    if compiled is None:  # HLR's plug-in carries no DEFAULT_W
        mod = types.SimpleNamespace(DEFAULT_W=default, **{f: getattr(mod, f"torch_{f}", None) or getattr(mod, f)
                                                          for f in ("init", "step", "curve")})
        compiled = CompiledOwnEngine(mod, lower, upper)
    cfg = RunConfig(n_epoch=2)
    if recipe == "recency":
        cfg, recipe = RunConfig(n_epoch=2, recency=True), dict(mod.RECIPE, n_epoch=2)
    recipe = Recipe.from_dict(recipe if recipe is not None else mod.RECIPE)
    sigma = getattr(mod, "SIGMA", None)
    w0 = np.array(default, float)
    a = compiled.fit(w0, train, cfg, recipe, w_init=w0, sigma=sigma)
    b = auto.fit(w0, train, cfg, recipe, w_init=w0, sigma=sigma)
    assert np.abs(a - w0).max() > 1e-2  # training moved the weights
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-8 * max(1.0, np.abs(b).max()))


def test_fsrs7_projection_equals_the_torch_clip_hook():
    mod = importlib.import_module("models.fsrs7")
    plugin = sys.modules[compile_module(mod)]
    rng = np.random.default_rng(3)
    lo, hi = np.array(mod.LOWER), np.array(mod.UPPER)
    for _ in range(200):
        w = np.minimum(np.maximum(lo + (hi - lo) * rng.uniform(-0.1, 1.1, len(lo)), lo), hi)
        w[[1, 2, 28, 30]] = rng.uniform(0, 1, 4) * w[[1, 2, 28, 30]]  # often below its lower neighbour
        ref = mod.clip(torch.tensor(w)).numpy()
        got = w.copy()
        plugin.project(got)
        np.testing.assert_array_equal(got, ref)
    assert np.array_equal(CompiledOwnEngine(mod).clip(w), AutogradEngine(mod).clip(w))


# ------------------------------------------------------------------------------- torch's rules at ties and bounds
def _plugin_step(step_fn, n_w, n_state=2):
    """A two-component model whose step is `step_fn` (init and curve trivial): its generated plug-in."""
    mod = types.SimpleNamespace(
        DEFAULT_W=[0.0] * n_w,
        init=lambda w, g, t: tuple(w[0] + 0.0 * t for _ in range(n_state)),
        step=step_fn,
        curve=lambda w, s, t: s[0] + 0.0 * t)
    return sys.modules[compile_module(mod)]


def _vjp_vs_torch(step_fn, w, prev, t, g, gnew, rtol=0.0):
    """The generated step and step_vjp against torch.autograd on the same step function (one card); `rtol`: the
    step's values to rounding (a pow written exp(y·ln x)) instead of to the bit."""
    plugin = _plugin_step(step_fn, len(w), len(prev))
    opts = np.zeros(0)
    w_np = np.array(w, float)
    wc = plugin.precompute(w_np, opts) if hasattr(plugin, "precompute") else w_np  # weight-only values hoisted
    out = np.zeros(plugin.N_STATE)  # the state, then the values the step keeps for its VJP
    plugin.step(wc, np.array(prev, float), float(t), int(g), out)
    gprev, gwc = np.full(len(prev), 7.0), np.zeros(len(wc))
    plugin.step_vjp(wc, np.array(prev, float), float(t), int(g), out, np.array(gnew, float), gprev, gwc)
    gw = gwc
    if hasattr(plugin, "precompute"):
        gw = np.zeros(len(w))
        plugin.precompute_vjp(w_np, opts, wc, gwc, gw)
    wt = torch.tensor(w, dtype=torch.float64, requires_grad=True)
    pt = [torch.tensor([x], dtype=torch.float64, requires_grad=True) for x in prev]
    new = step_fn(wt, tuple(pt), torch.tensor([float(t)], dtype=torch.float64), torch.tensor([int(g)]))
    total = sum((n * c).sum() for n, c in zip(new, gnew))
    grads = torch.autograd.grad(total, [wt] + pt, allow_unused=True)
    ref_w = np.zeros(len(w)) if grads[0] is None else grads[0].numpy()
    ref_prev = np.array([0.0 if x is None else float(x[0]) for x in grads[1:]])
    np.testing.assert_allclose(out[:len(prev)], np.array([float(x.detach().reshape(-1)[0]) for x in new]),
                               rtol=rtol, atol=0)
    # the same terms, summed in another order (weight-only terms reach gw through precompute_vjp): a few ulps
    np.testing.assert_allclose(gw, ref_w, rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(gprev, ref_prev, rtol=1e-13, atol=1e-14)


@pytest.mark.parametrize("prev", [[1.0, 2.0], [0.5, 2.0], [2.0, 2.0], [3.0, 0.0], [0.0, 0.0], [-1.0, 0.5]])
@pytest.mark.parametrize("w", [[0.5, 2.0, 0.0], [1.0, 1.0, 2.0], [0.0, 3.0, 1.0]])
def test_tie_and_boundary_rules_equal_torch_autograd(prev, w):
    """clamp at its bounds (Python and tensor bounds), minimum/maximum ties, pow at 0 and with exponent 0, where,
    abs at 0, an integer-indexed weight read."""
    def step(w, s, t, g):
        x, y = s
        a = x.clamp(0.5, 2.0) + x.clamp(min=w[0]) * 2 + x.clamp(max=w[1]) * 3 + torch.clamp(y, w[0], w[1]) * 5
        b = torch.minimum(x, y) + 2 * torch.maximum(x, w[0]) + 3 * torch.minimum(y, w[1])
        c = torch.where(x > 1, y * y, x) + abs(y - 2) + torch.abs(x - w[0])
        d = y ** w[2] + x.pow(w[0]) + 2.0 ** (x * w[2]) + (x * w[1]) ** 2 + torch.pow(y, 0.5 * w[2])
        e = w[(g.long() - 1).clamp(0, 2)] * x + w[:2][(g - 1).clamp(0, 1)]
        return a + b + c + e, d
    for g in (1, 2, 3):
        _vjp_vs_torch(step, w, prev, 0.5, g, [1.0, 0.75])


def test_a_clamp_of_a_clamp_with_the_same_bounds_is_one_node():
    """clamp(clamp(x, lo, hi), lo, hi) with constant bounds is traced as the inner clamp (so that a model that clamps
    again inside a helper shares the value with its other uses): torch's values and gradients, NaN and bounds too."""
    def step(w, s, t, g):
        x, y = s
        return (x * w[0]).clamp(min=0.0).clamp(min=0.0) + (y.clamp(0.5, 2.0).clamp(0.5, 2.0) * w[1]), \
            (x * w[1]).clamp(max=1.0).clamp(max=1.0).clamp(min=0.0) + y.clamp(2.0, 0.5).clamp(2.0, 0.5)
    for prev in ([1.0, 2.0], [-1.0, 0.5], [0.0, 3.0], [float("nan"), 1.0], [2.0, float("nan")]):
        _vjp_vs_torch(step, [1.5, 0.5], prev, 0.0, 3, [1.0, 0.75])
    from engine.traced import Graph, _clamp
    g = Graph()
    x = g.add("in", (), "s0", "f8", 2)
    once = _clamp(x, 0.0, None)
    assert _clamp(once, 0.0, None).id == once.id and _clamp(once, 1.0, None).id != once.id


def test_pow_with_base_and_exponent_zero_equals_torch():
    def step(w, s, t, g):
        x, y = s
        return x ** y, (0.0 ** (w[0] * y)) + y.clamp(w[1], w[0])
    for prev in ([0.0, 0.0], [0.0, 2.0], [2.0, 0.0], [0.0, -1.0]):
        _vjp_vs_torch(step, [0.0, 0.0], prev, 0.0, 3, [1.0, 1.0])
        _vjp_vs_torch(step, [1.0, 2.0], prev, 0.0, 3, [1.0, 1.0])


@pytest.mark.parametrize("prev", [[1.5, 2.0], [2.0, 2.0], [3.0, -1.0], [0.0, 1.0], [-2.0, 0.5], [-1.0, 40.0]])
@pytest.mark.parametrize("w", [[0.5, 2.0, 3.0], [-1.5, 0.25, 1.0], [2.0, -3.0, 0.0]])
def test_shared_log_and_exp_rewrites_equal_torch_autograd(prev, w):
    """The generator's cheaper forms at their edges: pows of one base sharing ln x (x = 0, x < 0 with an integer
    exponent, exponent 0), pow's x^(y−1) as x^y / x, logaddexp's two sides from one e^{−|x−y|} (ties, far
    apart), softplus below and above its threshold."""
    def step(w, s, t, g):
        x, y = s
        a = x ** w[0] + 2 * x ** w[1] + (x * x) ** w[2] + torch.pow(y, w[2]) * y ** w[0]
        b = torch.logaddexp(x, y) + 3 * torch.logaddexp(x * w[0], y) + torch.logaddexp(w[1], y)
        c = torch.nn.functional.softplus(x * w[1]) + torch.nn.functional.softplus(y * w[0], beta=2.0, threshold=5.0)
        return a + c, b
    for g in (1, 3):
        _vjp_vs_torch(step, w, prev, 0.5, g, [1.0, 0.75], rtol=1e-14)


@pytest.mark.parametrize("prev", [[1.5, 2.0], [1.0, 1.0], [0.25, 3.0], [-2.0, -2.0], [2.0, 0.5]])
@pytest.mark.parametrize("w", [[0.5, 2.0, 1.0], [2.0, 0.5, -1.0], [1.0, 1.0, 0.0]])
def test_leaky_relu_and_max_of_two_tensors_equal_torch_autograd(prev, w):
    """leaky_relu (its default slope and another, x at 0, below and above) and torch.max / torch.min of two tensors,
    ties included (the gradient split in halves), as Anki's interval floor uses them (models/anki.py)."""
    def step(w, s, t, g):
        x, y = s
        a = torch.max(torch.nn.functional.leaky_relu(x - 1) + 1, x * w[0])
        b = torch.min(torch.nn.functional.leaky_relu(y * w[1] - 1, negative_slope=0.2), x) + w[2] * y
        return a, b
    for g in (1, 3):
        _vjp_vs_torch(step, w, prev, 0.5, g, [1.0, 0.75], rtol=1e-14)


# ------------------------------------------------------------------------------- refusals and the fallback
@pytest.mark.parametrize("body, op", [
    ("return (torch.cumsum(w[0] * t, 0),)", "cumsum"),
    ("return (w[0] * float(state[0].mean()) + t,)", "mean"),
    ("return (state[0] if bool(g > 2) else w[0] * t,)", "control flow"),
    ("return (state[0] + g * 0.5,)", "float32"),
    ("return (state[0] * torch.where(g > 1, 1.0, 0.3),)", "float32"),
    ("return (w[0] * g.float() + state[0],)", "float32"),
    ("return (state[0] + torch.zeros_like(g, dtype=torch.float32),)", "float32"),
])
def test_untraceable_ops_raise_trace_error_naming_the_op(body, op):
    src = f"def step(w, state, t, g):\n    {body}\n"
    space = {"torch": torch}
    exec(src, space)
    mod = types.SimpleNamespace(DEFAULT_W=[1.0], init=lambda w, g, t: (w[0] + t,), step=space["step"],
                                curve=lambda w, s, t: torch.exp(-t / s[0]))
    with pytest.raises(TraceError, match=op):
        compile_module(mod)


def test_a_file_that_does_not_trace_falls_back_to_the_autograd_engine(tmp_path, capsys):
    path = tmp_path / "odd.py"
    path.write_text(open("examples/exp4.py").read().replace("s_fail = w[3] * s", "s_fail = w[3] * s.cumsum(0)"))
    model = model_class(str(path))(RunConfig(n_epoch=1))
    assert isinstance(model.engine, AutogradEngine)
    assert "EXP-4: trained on the autograd engine" in capsys.readouterr().err
    data = check_features(8, False).subset(np.arange(800))
    p = model.fit(data).predict(data)
    assert np.isfinite(p).sum() > 700


def test_sbd_lbfgs_on_the_compiled_loss_equals_the_autograd_engine():
    """SBD's recipe (full-batch L-BFGS, prior weight 2/N, recency weights, revert if worse) on the compiled loss and
    gradient: the autograd engine's trained weights, on 1,500 targets of a real user."""
    mod, default, lower, upper, _ = _sbd()
    data = check_features(8, False).subset(np.arange(1500))
    cfg, recipe = RunConfig(algo="SBD"), Recipe.from_dict(mod.RECIPE)
    fits = [engine.fit(default, data, cfg, recipe, w_init=default, sigma=mod.SIGMA)
            for engine in (CompiledOwnEngine(mod, lower, upper), AutogradEngine(mod, lower, upper))]
    assert np.abs(fits[1] - np.array(default)).max() > 0.05  # it trained
    np.testing.assert_allclose(fits[0], fits[1], rtol=0, atol=1e-7)
    assert isinstance(model_class(mod, "SBD")(RunConfig(algo="SBD")).engine, CompiledOwnEngine)


@pytest.mark.parametrize("mask", [None, [1, 1, 0, 1, 1, 0, 1]])
def test_lbfgs_with_a_numpy_gradient_takes_the_torch_optimizers_steps(mask):
    """lbfgs_fit(loss_grad=...) (the compiled engines' path: engine/lbfgs.py on numpy, the objective formed in
    numpy) against lbfgs_fit through torch.optim.LBFGS and autograd over NumpyLoss: the same trial points to
    rounding, hence the same result, with the non-finite rule exercised (the loss turns NaN at the 3rd and 9th
    evaluation: the line search backs off). The torch path evaluates twice more: the start and the end objective,
    which the numpy path takes from its evaluations at those points."""
    from engine.autograd_engine import NumpyLoss, lbfgs_fit

    mod, default, lower, upper, _ = _sbd()
    data = check_features(8, False).subset(np.arange(1200))
    seq = CompiledOwnEngine(mod, lower, upper).seq
    calls, skip = [], [0]

    def loss_grad(w):
        loss, grad = seq.loss_and_grad(w, data)
        calls.append(w.copy())
        if len(calls) - skip[0] in (3, 9):  # L-BFGS's 3rd and 9th evaluation: a point to back off from
            loss = math.nan
        return loss, grad

    recipe = Recipe.from_dict(mod.RECIPE)
    w0 = np.array(default)
    inv_var = 1.0 / np.array(mod.SIGMA) ** 2
    mask = np.ones(len(w0)) if mask is None else np.array(mask, float)
    runs = []
    for direct in (False, True):
        calls.clear()
        skip[0] = 0 if direct else 1  # the torch path's first call is its start objective
        fitted = lbfgs_fit(w0, lambda w: NumpyLoss.apply(w, loss_grad), 1234.5, len(data), w0, inv_var, mask,
                           lower, upper, recipe, loss_grad=loss_grad if direct else None)
        runs.append((fitted, np.array(calls)))
    (ref, ref_calls), (fitted, direct_calls) = runs
    assert len(direct_calls) > 10 and np.abs(ref - w0).max() > 0.01
    assert len(ref_calls) == len(direct_calls) + 2
    assert np.array_equal(ref_calls[0], w0) and np.array_equal(ref_calls[-1], ref)  # start, end objectives
    np.testing.assert_allclose(direct_calls, ref_calls[1:-1], rtol=0, atol=1e-11)
    np.testing.assert_allclose(fitted, ref, rtol=0, atol=1e-13)


def test_recipes_and_trainer_choose_the_engine():
    exp4 = load("examples/exp4.py")
    assert isinstance(engine_for(exp4, recipe=Recipe()), CompiledOwnEngine)
    assert isinstance(engine_for(exp4, recipe=Recipe(optimizer="adamw", weight_decay=0.1)), AutogradEngine)
    assert isinstance(engine_for(exp4, recipe=Recipe(optimizer="lbfgs")), CompiledOwnEngine)
    assert isinstance(engine_for(exp4, recipe=Recipe(prior_weight=lambda n: 1.0)), AutogradEngine)
    assert isinstance(engine_for(exp4, recipe=Recipe(), trainer="autograd"), AutogradEngine)
    assert isinstance(model_class("examples/exp4.py")(RunConfig()).engine, CompiledOwnEngine)
    assert isinstance(model_class("examples/exp4.py")(RunConfig(trainer="autograd")).engine, AutogradEngine)


def test_the_project_hook_leaves_an_existing_models_fit_bit_identical(tmp_path, monkeypatch):
    """FSRS-5's fit with the kernels as they are (project(w), the stub's no-op, after every clip) and with the
    project line cut out of the template: the same weights bit for bit."""
    from engine import seq_engine

    model = models.model_class("FSRS-5")(RunConfig(algo="FSRS-5", n_epoch=2))
    train = check_features(8, True).subset(np.arange(1500))
    w_init = model.initial_weights(train)
    a = model.engine.fit(w_init, train, model.cfg, w_init=w_init, sigma=model.sigma)
    source = seq_engine._TEMPLATE.read_text(encoding="utf-8")
    assert "            project(w)\n" in source
    template = tmp_path / "seq_engine_kernels.py"
    template.write_text(source.replace("            project(w)\n", ""), encoding="utf-8")
    monkeypatch.setattr(seq_engine, "_TEMPLATE", template)
    monkeypatch.setattr(seq_engine, "_INSTANCES", {})
    b = model.engine.fit(w_init, train, model.cfg, w_init=w_init, sigma=model.sigma)
    assert "project(w)" not in open(model.engine.k.__file__, encoding="utf-8").read().split("def adam_fit")[1]
    assert np.abs(a - np.array(w_init)).max() > 1e-2
    assert np.array_equal(a, b)


def test_a_whole_run_of_a_model_file_equals_its_autograd_run(tmp_path):
    """`other.py --model examples/exp4.py` (the traced plug-in) vs `--trainer autograd` on upstream-check user 12:
    the same size, metrics and parameters in the result lines."""
    from check_users import CHECK
    from runner import read_results, run

    lines = {}
    for trainer in ("fast", "autograd"):
        cfg = RunConfig(algo="examples/exp4.py", data=CHECK, users=[12], processes=1, result_dir=tmp_path,
                        quiet=True, trainer=trainer)
        assert run(cfg).exit_code == 0
        lines[trainer] = read_results(tmp_path / f"{cfg.name}.jsonl")[0][0]
    fast, auto = lines["fast"], lines["autograd"]
    assert fast["size"] == auto["size"] == 3055
    assert fast["metrics"] == auto["metrics"]
    np.testing.assert_allclose(fast["parameters"]["0"], auto["parameters"]["0"], rtol=0, atol=2e-6)


def test_fsrs7_trains_on_its_traced_plugin_unless_told_otherwise():
    f7 = importlib.import_module("models.fsrs7")
    assert isinstance(f7._engine(RunConfig(algo="FSRS-7")), CompiledOwnEngine)
    assert isinstance(f7._engine(RunConfig(algo="FSRS-7", trainer="autograd")), AutogradEngine)


@pytest.mark.parametrize("row", ["FSRS-6", "FSRS-7", "Anki", "FSRSv3"])
def test_step_value_is_the_steps_state_to_the_bit_and_skips_the_untaken_side(row):
    """step_value, the predictions' step, computes only the side of a where its condition takes; its new state is
    step's bit for bit, over every grade, same-day and long intervals and states at and past the clamps; and for
    FSRS-6 it has an `if` per lazy where (same-day / recall / lapse) while step has none."""
    import inspect

    import models

    module = importlib.import_module(models.REGISTRY[row].partition(":")[0])
    if row in ("FSRS-6", "FSRS-7"):
        pm = sys.modules[module.plugin() if row == "FSRS-6" else compile_module(module)]
        w = np.array(module.DEFAULT_W, dtype=np.float64)
    else:
        model = models.create(RunConfig(algo=row))
        pm, w = sys.modules[model.plugin()], np.array(model.default_w, dtype=np.float64)
    n = pm.N_ADJ
    rng = np.random.default_rng(5)
    wc = pm.precompute(w, np.zeros(0)) if hasattr(pm, "precompute") else w
    for _ in range(400):
        prev = np.zeros(pm.N_STATE)
        prev[:n] = rng.choice([0.001, 0.01, 0.5, 1.0, 3.0, 9.9, 50.0, 36500.0], n)
        t = float(rng.choice([0.0, 0.3, 1.0, 4.0, 365.0, 20000.0]))
        g = int(rng.integers(1, 5))
        a, b = np.zeros(pm.N_STATE), np.zeros(pm.N_STATE)
        pm.step(wc, prev, t, g, a)
        pm.step_value(wc, prev, t, g, b)
        assert a[:n].tobytes() == b[:n].tobytes(), (prev, t, g)
    if row == "FSRS-6":
        assert inspect.getsource(pm.step_value.py_func).count(" if v") >= 2
        assert " if v" not in inspect.getsource(pm.step.py_func).replace(" if (", "")
