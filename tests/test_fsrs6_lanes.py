"""FSRS-6's lane kernel (lane_kernels/fsrs6_lanes.py, cards side by side) and the vectorisable log / log1p it uses
(engine/vec_math.py): the functions against the C library's in ulps, the lane loss and gradient against the scalar
plug-in (models/fsrs6_kernels.py, itself checked against torch autograd in tests/test_fsrs6_fast.py) and against
central differences, the layout fallback, and the engine's trainer with and without the lanes."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from numba import njit

from models import fsrs6 as ff
from models import fsrs6_kernels as fk
from lane_kernels import fsrs6_lanes as fl
from engine.seq_engine import LR, SEED, Cards, SeqEngine
from engine.vec_math import log1, log1p1
from tests.test_fsrs6_fast import CLAMPED, random_data, random_w
from lane_code import (assert_gradient_is_central_differences, assert_hand_lanes_equal_generated, fresh_compile,
                       lane_code, scalar_plugin)
from engine.lanes import card_items


@njit(error_model="numpy")
def _log_vec(x, out):
    for i in range(len(x)):
        out[i] = log1(x[i])


@njit(error_model="numpy")
def _log1p_vec(x, out):
    for i in range(len(x)):
        out[i] = log1p1(x[i])


def _ulps(got: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """|got − ref| in units of ref's last place (0 where both are equal, infinities and zeros included)."""
    same = got == ref
    spacing = np.spacing(np.abs(np.where(np.isfinite(ref), ref, 1.0)))
    return np.where(same, 0.0, np.abs(got - ref) / spacing)


def _wide_positive(rng) -> np.ndarray:
    """Positive doubles over the whole range: log-uniform normals, subnormals, values near 1, edges."""
    return np.concatenate([
        np.exp(rng.uniform(-745.0, 709.7, 200_000)),
        np.exp(rng.uniform(-1e-3, 1e-3, 20_000)),
        rng.uniform(0.5, 2.0, 50_000),
        rng.uniform(0.0, 1.0, 5_000) * 2.2250738585072014e-308,  # subnormals
        np.array([5e-324, 1e-320, 2.2250738585072014e-308, np.nextafter(2.2250738585072014e-308, 0.0), 1.0,
                  np.nextafter(1.0, 2.0), np.nextafter(1.0, 0.0), 2.0, 0.5, math.sqrt(2.0), math.sqrt(0.5),
                  1.7976931348623157e308, 1e300, 36500.0, 0.001]),
    ])


def test_log_within_one_ulp_of_libm():
    x = _wide_positive(np.random.default_rng(0))
    got = np.empty_like(x)
    _log_vec(x, got)
    ref = np.array([math.log(v) for v in x])
    assert _ulps(got, ref).max() <= 1.0
    assert (got == ref).mean() > 0.95  # mostly the same double
    assert log1(1.0) == 0.0


def test_log_edges_follow_libm():
    x = np.array([0.0, -0.0, -1.0, -5e-324, math.inf, -math.inf, math.nan])
    got = np.empty_like(x)
    _log_vec(x, got)
    assert got[0] == -math.inf and got[1] == -math.inf
    assert np.isnan(got[2]) and np.isnan(got[3]) and np.isnan(got[5]) and np.isnan(got[6])
    assert got[4] == math.inf


def test_log1p_within_one_ulp_of_libm():
    rng = np.random.default_rng(1)
    x = np.concatenate([_wide_positive(rng), rng.uniform(-1.0, 1.0, 50_000), -np.exp(rng.uniform(-745, -1e-9, 20_000)),
                        np.array([1e-17, 2.0 ** -53, 2.0 ** -52, 2.0 ** 53, -0.5, np.nextafter(-1.0, 0.0)])])
    x = x[x > -1.0]
    got = np.empty_like(x)
    _log1p_vec(x, got)
    ref = np.array([math.log1p(v) for v in x])
    assert _ulps(got, ref).max() <= 1.0
    edges = np.array([-1.0, -2.0, math.inf, math.nan, 0.0])
    got = np.empty_like(edges)
    _log1p_vec(edges, got)
    assert got[0] == -math.inf and np.isnan(got[1]) and got[2] == math.inf and np.isnan(got[3]) and got[4] == 0.0


# ------------------------------------------------------------------------------------------------ the lane kernel

def lane_loss_grad(w, data, weights=None, floor_grade=3, want_loss=True, want_grad=True):
    """(loss, gradient of w) of the lane kernel over all of data's cards in one batch (no prior)."""
    cards = Cards(data, weights)
    wc = fk.precompute(np.asarray(w, dtype=np.float64), np.array([float(floor_grade)]))
    gwc = np.zeros(len(wc))
    items = card_items(cards.c_start, cards.c_n, cards.c_tb, cards.c_te)
    loss = fl.lanes_loss_grad(wc, cards.seq_dt, cards.seq_g, cards.c_start, cards.t_pos, cards.t_dt, cards.t_y,
                              cards.t_wt, items, np.arange(len(items)), cards.max_n, gwc, want_loss, want_grad)
    return loss, gwc[:21]


def scalar_loss_grad(w, data, weights=None, floor_grade=3):
    """The same through the engine's scalar card loop."""
    eng = ff.engine(floor_grade)
    cards = Cards(data, weights)
    grad = np.zeros(21)
    loss = eng.k.loss_grad_cards(np.asarray(w, dtype=np.float64), eng.opts, *cards.args(), cards.t_y, cards.t_wt,
                                 cards.max_n, grad)
    return loss, grad


def _assert_close_to_scalar(w, data, weights=None, floor_grade=3):
    loss, grad = lane_loss_grad(w, data, weights, floor_grade)
    ref_loss, ref_grad = scalar_loss_grad(w, data, weights, floor_grade)
    assert abs(loss - ref_loss) <= 1e-12 * abs(ref_loss)
    assert np.abs(grad - ref_grad).max() <= 1e-12 * np.abs(ref_grad).max()


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_lanes_equal_scalar_kernel_random(seed):
    rng = np.random.default_rng(seed)
    data = random_data(seed, n_cards=37, max_len=16)  # 37: the last group has fewer than LANES cards
    weights = rng.uniform(0.1, 2.0, len(data)) if seed % 2 else None
    _assert_close_to_scalar(random_w(rng), data, weights, floor_grade=2 + seed % 2)


@pytest.mark.parametrize("case", sorted(CLAMPED))
@pytest.mark.parametrize("floor_grade", [2, 3])
def test_lanes_equal_scalar_kernel_clamped(case, floor_grade):
    """Weights that drive S and D to both ends of their clamps (tests/test_fsrs6_fast.py checks they do)."""
    w = np.array(ff.DEFAULT_W)
    for j, v in CLAMPED[case].items():
        w[j] = v
    _assert_close_to_scalar(w, random_data(7, n_cards=30, max_len=14), floor_grade=floor_grade)


def test_lanes_equal_scalar_kernel_simulated_user():
    from bench.simulate import simulate_user
    from features import FeatureConfig, build_features

    data = build_features(simulate_user(4000, seed=11), FeatureConfig(short=True))
    _assert_close_to_scalar(np.array(ff.DEFAULT_W), data)


def test_lanes_gradient_vs_central_differences():
    rng = np.random.default_rng(5)
    data = random_data(5, n_cards=20, max_len=12)
    assert_gradient_is_central_differences(lambda w, g: lane_loss_grad(w, data, want_grad=g), random_w(rng))


def test_lanes_loss_only_and_gradient_only():
    data = random_data(3, n_cards=12)
    w = np.array(ff.DEFAULT_W)
    loss, grad = lane_loss_grad(w, data)
    loss_only, untouched = lane_loss_grad(w, data, want_grad=False)
    no_loss, grad_only = lane_loss_grad(w, data, want_loss=False)
    assert loss_only == loss and no_loss == 0.0
    np.testing.assert_array_equal(grad_only, grad)
    assert not untouched.any()


def _off_layout_data():
    """A card whose first target's elapsed time is not its next review's (rows edited after the features)."""
    data = random_data(2, n_cards=10)
    rows = data.rows.copy()
    pos, start = rows["seq_pos"].to_numpy(), rows["seq_start"].to_numpy()
    longer = set(start[pos == 2])  # cards whose target at history 1 is not their last
    j = next(i for i in range(len(rows)) if pos[i] == 1 and start[i] in longer)
    rows.loc[rows.index[j], "delta_t"] = rows["delta_t"].iloc[j] + 0.5
    return type(data)(rows, data.seq_delta_t, data.seq_rating)


def test_lanes_refuse_a_target_off_the_layout():
    loss, grad = lane_loss_grad(np.array(ff.DEFAULT_W), _off_layout_data())
    assert math.isnan(loss) and not grad.any()


def test_engine_falls_back_to_cards_off_the_layout():
    """The fallback instance's objective pass (fit_loss) and trainer batches run card by card where the lanes
    refuse; the instance a fit compiles first (LANE-ONLY) reports the refusal instead of adding anything."""
    data = _off_layout_data()
    eng = ff.engine()
    cards = Cards(data)
    w = np.array(ff.DEFAULT_W)
    args = (w, eng.opts, *cards.args(), cards.t_y, cards.t_wt, cards.max_n)
    k = eng.k_fallback
    assert k.fit_loss(*args, eng.lanes) == k.loss_cards(*args)
    items = card_items(cards.c_start, cards.c_n, cards.c_tb, cards.c_te)
    wc = k.precompute(w, eng.opts)
    g_batch, g_cards = np.zeros(len(wc)), np.zeros(len(wc))
    batch_args = (wc, cards.seq_dt, cards.seq_g, cards.c_start, cards.t_pos, cards.t_dt, cards.t_y, cards.t_wt, items,
                  np.arange(len(items)), cards.max_n, k.scratch(cards.max_n))
    assert k.batch_loss_grad(*batch_args, g_batch, eng.lanes)
    k.loss_grad_cards(w, eng.opts, *cards.args(), cards.t_y, cards.t_wt, cards.max_n, g_cards)
    np.testing.assert_array_equal(g_batch[:21], g_cards[:21])
    lean, g_lean = eng.k, np.zeros(len(wc))
    assert math.isnan(lean.fit_loss(*args, eng.lanes))
    assert not lean.batch_loss_grad(*batch_args, g_lean, eng.lanes) and not g_lean.any()


def test_a_fit_the_lanes_refuse_is_the_fallback_instances_fit():
    """SeqEngine.fit runs a fit whose passes the lane kernel refuses again on the fallback instance: its weights are
    that instance's adam_fit's, as if it had run alone."""
    data = _off_layout_data()
    eng = ff.engine()
    w0 = np.array(ff.DEFAULT_W)
    got = eng.fit(w0, data, None, w_init=w0, sigma=ff.SIGMA)
    cards = Cards(data)
    items, orders, bounds, n_batches = eng._card_batches(cards, 5, 512, SEED)
    inv_var = 1.0 / np.asarray(ff.SIGMA) ** 2
    args = (eng.clip(w0), eng.opts, w0, inv_var, np.ones(len(w0)), eng.lower, eng.upper, *cards.args(), cards.t_y,
            cards.t_wt, cards.max_n, items, orders, bounds, n_batches, LR, np.array([0.9, 0.999]), False, False,
            eng.lanes)
    assert eng.k.adam_fit(*args)[2] is False
    want, _, done = eng.k_fallback.adam_fit(*args)
    assert done and not np.array_equal(want, w0)
    np.testing.assert_array_equal(got, eng.clip(want))


def test_fit_with_lanes_follows_the_scalar_fit(tmp_path, monkeypatch):
    """The engine's Adam on the lanes and on a copy of the plug-in without LANE_KERNELS: the same weights up to
    the rounding of the gradient sums (mini-batches summed in another order)."""
    from bench.simulate import simulate_user
    from features import FeatureConfig, build_features

    plugin = scalar_plugin(tmp_path, monkeypatch, "models.fsrs6_kernels", "fsrs6_scalar_plugin",
                           "N_ADJ, precompute, precompute_vjp")
    data = build_features(simulate_user(3000, seed=4), FeatureConfig(short=True))
    w0 = np.array(ff.DEFAULT_W)
    lanes = ff.engine().fit(w0, data, None, w_init=w0, sigma=ff.SIGMA)
    scalar = SeqEngine(plugin, ff.LOWER, ff.UPPER, opts=[3.0]).fit(w0, data, None, w_init=w0,
                                                                                  sigma=ff.SIGMA)
    assert not np.array_equal(lanes, w0)
    np.testing.assert_allclose(lanes, scalar, rtol=1e-9, atol=1e-12)


def test_lane_loops_vectorise_without_libm_calls():
    """The forward and reverse lane loops compile to AVX2 vector code (divisions as vdivpd) with no call to exp or
    log (a fresh, uncached compile: numba shows no assembly for cached code)."""
    fresh = fresh_compile(fl.lanes_loss_grad, error_model="numpy")
    data = random_data(1, n_cards=9)
    cards = Cards(data)
    wc = fk.precompute(np.array(ff.DEFAULT_W), np.array([3.0]))
    items = card_items(cards.c_start, cards.c_n, cards.c_tb, cards.c_te)
    llvm_ir, asm = lane_code(fresh, wc, cards, items)
    assert len(re.findall(r"vdivpd", asm)) >= 15  # the forward's and the reverse's divisions, 4 lanes each
    assert not re.findall(r"@(?:exp|log|log1p|expm1|pow)\b", llvm_ir)


@pytest.mark.parametrize("case", ["default"] + sorted(CLAMPED))
def test_the_hand_kernel_equals_the_one_generated_from_the_torch_equations(case):
    """The hand kernel stays for the reasons in lane_kernels/fsrs6_lanes.py's docstring; it is held to the lane
    kernel engine/traced.py generates from FSRS-6's torch equations (upstream/fsrs6_torch.TorchSteps, models.fsrs6's
    TORCH_EQUATIONS): the same loss and gradient over one batch of all cards, within 1e-12 at the default weights
    and 1e-11 of the largest gradient component at the clamped ones (tests/test_fsrs6_fast.CLAMPED)."""
    assert_hand_lanes_equal_generated("FSRS-6", random_data(np.random.default_rng(7), 400), CLAMPED.get(case),
                                      1e-12 if case == "default" else 1e-11)
