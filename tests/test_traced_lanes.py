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

from engine.seq_engine import Cards, SeqEngine
from engine.traced import compile_module
from tests.test_fsrs6_fast import random_data
import lane_code
from lane_code import fresh_compile, plugin_lanes
from engine.lanes import card_items


def lane_loss_grad(plugin: str, w, data, weights=None, want_loss=True, want_grad=True, gwc=None):
    """(loss, gradient of w, gwc) of the lane kernel over all of data's cards in one batch (no prior; no options)."""
    return lane_code.lane_loss_grad(plugin, w, data, np.zeros(0), weights, want_loss, want_grad, gwc)


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
    fresh = fresh_compile(plugin_lanes(plugin), error_model="numpy", fastmath={"contract"})
    cards = Cards(random_data(1, n_cards=9))
    w = np.array(mod.DEFAULT_W, float)
    wc = sys.modules[plugin].precompute(w, np.zeros(0))
    items = card_items(cards.c_start, cards.c_n, cards.c_tb, cards.c_te)
    llvm_ir, asm = lane_code.lane_code(fresh, wc, cards, items)
    assert not re.findall(r"@(?:exp|log|log1p|expm1|pow)\b", llvm_ir)


# ---------------------------------------------------------------------------- one exp / log for a where's two sides
def _step_loop(source: str) -> str:
    """The generated group_forward's loop over positions 1.. (the fused step and target)."""
    forward = source[source.index("def group_forward"):source.index("def group_reverse")]
    return forward[forward.index("for k in range(1, n_pos)"):]


def test_a_wheres_two_sides_share_their_exp_log_and_pow():
    """FSRS v4's step (models/fsrs_v4.py torch_step) computes, for a recall, ln S for S^−w9 and e^{w10(1−R)}, and
    for a lapse ln D for D^−w12, ln(S+1) for (S+1)^w13 and e^{w14(1−R)}: 3 logs and 4 exps if both sides are
    computed; paired across the where (S^−w9 with D^−w12, e^{w10(1−R)} with e^{w14(1−R)}), the lane loop computes
    the lapse side's count, 2 logs and 3 exps. The lanes still equal the scalar generated kernel (its own, unfused
    step) within 1e-12."""
    import models
    import models.fsrs_v4 as v4
    from engine.traced import trace_model
    from engine.traced_lanes import generate_lanes

    w = np.array(models.model_class("FSRSv4").default_w, float)
    n_w = len(w)
    traces = trace_model(v4.torch_init, v4.torch_step, v4.torch_curve, n_w)
    loop = _step_loop(generate_lanes(traces))
    assert (loop.count("log1("), loop.count("exp1(")) == (2, 3)
    plugin = compile_module(v4, n_w=n_w, use_clip=False)
    engine = SeqEngine(plugin, [-np.inf] * n_w, [np.inf] * n_w)
    for seed in (0, 1):
        _assert_close(plugin, engine, w, random_data(seed, n_cards=29, max_len=14))


def _overflow_model():
    """A step whose where takes e^{w2·t/30} on a recall and e^{w3·ln x} = x^{w3} on a lapse (paired into one exp):
    with w2 = 2, a 20,000-day gap overflows the recall side's exp."""
    def init(w, g, t):
        return (w[0] + 0.0 * t,)

    def step(w, s, t, g):
        (x,) = s
        e = torch.where(g > 1, torch.exp(w[2] * t / 30.0), torch.exp(w[3] * torch.log(x)))
        return ((x * (1.0 + w[1] / 2.0 * e)).clamp(0.01, 100.0),)  # w1/2: a hoisted value

    def curve(w, s, t):
        return (1.0 + t / s[0]) ** -1.0

    return types.SimpleNamespace(DEFAULT_W=[2.0, 0.05, 0.01, 0.5], init=init, step=step, curve=curve,
                                 __name__="overflow_where")


def _lapse_at_long_gaps(seed: int, n_cards: int = 23):
    """Histories (as random_data's) whose 20,000-day gaps are all lapses and never a card's last target (whose own
    review the lanes step with a padding grade 3: each card ends on a review after a gap): a long gap only ever
    reaches a where's lapse side."""
    import pandas as pd

    from models.base import ReviewData

    rng = np.random.default_rng(seed)
    seq_dt, seq_g, rows = [], [], []
    for c in range(n_cards):
        start, n = len(seq_dt), int(rng.integers(3, 10))
        for k in range(n):
            dt = 0.0 if k == 0 else float(rng.choice([1, 5, 20, 100] if k == n - 1 else [0, 1, 5, 20, 100, 20000]))
            g = 1 if dt == 20000.0 else int(rng.choice([1, 2, 3, 4], p=[0.25, 0.15, 0.45, 0.15]))
            seq_dt.append(dt)
            seq_g.append(g)
            if k > 0 and dt > 0:
                rows.append({"card_id": c, "delta_t": dt, "y": int(g > 1), "seq_start": start, "seq_pos": k})
    return ReviewData(pd.DataFrame(rows), np.array(seq_dt), np.array(seq_g, dtype=np.int8))


def test_an_untaken_side_that_overflows_refuses_the_batch():
    """The lanes no longer compute the untaken side's exp, so they check its operand instead (its guard): with a
    20,000-day gap on a lapse, the scalar code computes the recall side's e^{w2·t/30} = inf and, through where's
    zero adjoint, a NaN gradient (torch's own where); the lanes must refuse that batch (NaN, nothing added) rather
    than return the lapse side's finite gradient. At w2 = 0.01 no side overflows and the two agree."""
    mod = _overflow_model()
    plugin = compile_module(mod)
    engine = SeqEngine(plugin, [-np.inf] * 4, [np.inf] * 4)
    data = _lapse_at_long_gaps(4)
    assert (data.seq_delta_t == 20000.0).any()
    w = np.array(mod.DEFAULT_W, float)
    _assert_close(plugin, engine, w, data)
    w[2] = 2.0
    ref_loss, ref_grad = scalar_loss_grad(engine, w, data)
    assert math.isfinite(ref_loss) and np.isnan(ref_grad[2])
    gwc = np.full(len(sys.modules[plugin].precompute(w, np.zeros(0))), 7.0)
    loss, _, gwc = lane_loss_grad(plugin, w, data, gwc=gwc)
    assert math.isnan(loss) and np.all(gwc == 7.0)


def test_prune_dead_drops_only_definitions_nothing_reads():
    """A generated body keeps every store and flag and each value they read, directly or through other values; the
    definitions of values nothing reads go (a clamp's two lines together). (A body left empty is written as
    `pass`: the HLR example's lane reverse of init, tests/test_traced.py.)"""
    from engine.traced_codegen import prune_dead

    body = ["    v1 = X[k, 0, lane]", "    m2 = 0.0 if v1 < 0.0 else v1", "    v2 = 1.0 if m2 > 1.0 else m2",
            "    v3 = v1 * 2.0", "    e4 = exp1(v3)", "    nbad += 0 if v1 > 0.0 else 1", "    a5 = 0.0 + (e4)",
            "    A[0, lane] += a5"]
    assert prune_dead(body) == [body[0], body[3], body[4], body[5], body[6], body[7]]
    assert prune_dead(["    v1 = w[0]", "    v2 = v1 + 1.0"]) == []


def test_select_is_the_conditional_expression_bit_for_bit():
    """engine/kernel_math.select, which the generated code writes for every float where, clamp and gated gradient,
    gives what `a if c else b` gives for the values that tell a select from arithmetic (NaN, infinities, signed
    zeros), integer operands as floats, and refuses a condition that is not a boolean."""
    from numba import njit
    from numba.core.errors import TypingError

    from engine.kernel_math import select

    @njit
    def picks(c, a, b):
        return select(c, a, b), select(c, 1, b)

    values = [0.0, -0.0, 1.5, -2.0, math.inf, -math.inf, math.nan, 5e-324]
    for c in (True, False):
        for a in values:
            for b in values:
                got, with_int = picks(c, a, b)
                want = a if c else b
                assert np.float64(got).tobytes() == np.float64(want).tobytes()
                assert with_int == (1.0 if c else b) or (math.isnan(b) and not c and math.isnan(with_int))
    with pytest.raises(TypingError):
        njit(lambda c, a, b: select(c, a, b))(1.0, 2.0, 3.0)
