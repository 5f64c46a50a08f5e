"""FSRS v4 / 4.5 / 5's lane kernel (lane_kernels/fsrs_v4_lanes.py, cards side by side): loss and gradient against the
scalar plug-ins' (models/fsrs_v4.py, fsrs_v45.py, fsrs_v5.py, themselves checked against torch autograd in
tests/test_fsrs_v4.py and test_fsrs_v5.py) and against central differences, at weights that drive every clamp and
cap, the engine's hook ("module:function"), the trainer with and without the lanes, and the loops' vector code."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from numba import njit

from lane_kernels import fsrs_v4_lanes as fl
from models.fsrs_v4 import FSRSv4
from models.fsrs_v45 import FSRS45
from models.fsrs_v5 import FSRS5
from engine.lanes import card_items, kernel_address
from engine.seq_engine import Cards, SeqEngine, instantiate, lane_kernel
from tests.test_fsrs6_fast import random_data
from lane_code import (assert_gradient_is_central_differences, assert_hand_lanes_equal_generated, lane_code,
                       scalar_plugin)

MODELS = {"FSRSv4": FSRSv4, "FSRS-4.5": FSRS45, "FSRS-5": FSRS5}
ENTRY = {"FSRSv4": fl.lanes_loss_grad_v4, "FSRS-4.5": fl.lanes_loss_grad_v45, "FSRS-5": fl.lanes_loss_grad_v5}
# Weights that drive S to 0.01 (w0 low, same-day Again, lapses) and 36500, D to 1 and 10 (w6 high; D0 beyond
# 10 or below 1), the lapse caps taking over (FSRS-5's w17 = w18 = 2; 4.5's min(S_f, S) with w11 high); each
# value off the clamps' own boundaries (w17 = w18 = 0.01, not 0: a same-day review of a card at S = 0.01 would
# sit on its clamp's kink), so that the central differences of the reference see no kink
# (test_clamps_and_caps_are_reached checks that they are reached)
CLAMPED = {
    "low_s_saturated_d": {0: 0.0105, 4: 9.9, 5: 0.93, 6: 4.0, 11: 0.6, 17: 2.0, 18: 2.0},
    "huge_s": {3: 99.0, 8: 4.0, 9: 0.0, 10: 2.5, 16: 4.0, 6: 0.1},
    "bounds_mix": {4: 1.05, 5: 3.9, 7: 0.5, 11: 5.0, 12: 0.2, 13: 0.9, 14: 2.0, 15: 1.0, 17: 0.01, 18: 0.01},
}


def _cls(name):
    return MODELS[name]


def _wc(name, w):
    k = instantiate(_cls(name).kernels)
    return k.precompute(np.asarray(w, dtype=np.float64), np.zeros(0))


def clamped_w(name, case) -> np.ndarray:
    w = np.array(_cls(name).default_w, dtype=np.float64)
    for j, v in CLAMPED[case].items():
        if j < len(w):
            w[j] = v
    return w


def lane_loss_grad(name, w, data, weights=None, want_loss=True, want_grad=True):
    """(loss, gradient of w) of the lane kernel over all of data's cards in one batch (no prior)."""
    cards = Cards(data, weights)
    wc = _wc(name, w)
    gwc = np.zeros(len(wc))
    items = card_items(cards.c_start, cards.c_n, cards.c_tb, cards.c_te)
    loss = ENTRY[name](wc, cards.seq_dt, cards.seq_g, cards.c_start, cards.t_pos, cards.t_dt, cards.t_y, cards.t_wt,
                       items, np.arange(len(items)), cards.max_n, gwc, want_loss, want_grad)
    return loss, gwc[:len(w)]


def scalar_loss_grad(name, w, data, weights=None):
    """The same through the engine's scalar card loop."""
    k = instantiate(_cls(name).kernels)
    cards = Cards(data, weights)
    grad = np.zeros(len(w))
    loss = k.loss_grad_cards(np.asarray(w, dtype=np.float64), np.zeros(0), *cards.args(), cards.t_y, cards.t_wt,
                             cards.max_n, grad)
    return loss, grad


# ------------------------------------------------------------------------------------------------ a 100-bit reference

def mp_loss(name, w, cards, prec=100):
    """Σ weight·BCE in `prec`-bit arithmetic (mpmath): the spec's equations written out once more, plainly
    (models.md §1.5-1.7): no kept values, no merged branches, R by its power."""
    mp = pytest.importorskip("mpmath")
    mp.mp.prec = prec
    w = [v if isinstance(v, mp.mpf) else mp.mpf(float(v)) for v in w]
    v5 = name == "FSRS-5"
    f, dec = (mp.mpf(1) / 9, mp.mpf(1)) if name == "FSRSv4" else (mp.mpf(19) / 81, mp.mpf(1) / 2)

    def clamp(v, lo, hi):
        return min(max(v, mp.mpf(lo)), mp.mpf(hi))

    total = mp.mpf(0)
    for c in range(len(cards.c_start)):
        st = int(cards.c_start[c])
        g = int(cards.seq_g[st])
        s = clamp(w[g - 1], 0.01, 36500)
        d = clamp(w[4] - mp.exp(w[5] * (g - 1)) + 1 if v5 else w[4] - w[5] * (g - 3), 1, 10)
        states = [(s, d)]
        for i in range(1, int(cards.c_n[c])):
            t = mp.mpf(float(cards.seq_dt[st + i]))
            g = int(cards.seq_g[st + i])
            r = (1 + f * t / s) ** (-dec)
            if v5 and t < 1:
                ns = s * mp.exp(w[17] * (g - 3 + w[18]))
            elif g > 1:
                hb = w[15] if g == 2 else (w[16] if g == 4 else 1)
                ns = s * (1 + mp.exp(w[8]) * (11 - d) * s ** (-w[9]) * (mp.exp(w[10] * (1 - r)) - 1) * hb)
            else:
                ns = w[11] * d ** (-w[12]) * ((s + 1) ** w[13] - 1) * mp.exp(w[14] * (1 - r))
                if v5:
                    ns = min(ns, s / mp.exp(w[17] * w[18]))
                elif name == "FSRS-4.5":
                    ns = min(ns, s)
            if v5:
                nd = w[7] * (w[4] - mp.exp(3 * w[5]) + 1) + (1 - w[7]) * (d - w[6] * (g - 3) * (10 - d) / 9)
            else:
                nd = w[7] * w[4] + (1 - w[7]) * (d - w[6] * (g - 3))
            s, d = clamp(ns, 0.01, 36500), clamp(nd, 1, 10)
            states.append((s, d))
        for j in range(int(cards.c_tb[c]), int(cards.c_te[c])):
            s = states[int(cards.t_pos[j]) - 1][0]
            r = (1 + f * mp.mpf(float(cards.t_dt[j])) / s) ** (-dec)
            total -= mp.mpf(float(cards.t_wt[j])) * (mp.log(r) if cards.t_y[j] > 0.5 else mp.log(1 - r))
    return total


def mp_grad(name, w, cards, prec=100):
    """Central differences of mp_loss with steps of 2^−40·|w_j| in 100-bit arithmetic: truncation error ~1e−24,
    exact wherever no clamp or cap sits within a step of its boundary."""
    mp = pytest.importorskip("mpmath")
    mp.mp.prec = prec
    grad = []
    for j in range(len(w)):
        h = mp.mpf(2) ** -40 * max(abs(float(w[j])), 1e-2)
        wp = [mp.mpf(float(v)) for v in w]
        wm = list(wp)
        wp[j] += h
        wm[j] -= h
        grad.append(float((mp_loss(name, wp, cards, prec) - mp_loss(name, wm, cards, prec)) / (2 * h)))
    return np.array(grad)


def _assert_close_to_reference(name, w, data, weights=None):
    """The lanes within 1e-14 (loss) and 1e-12 (gradient, of its largest component; ~1e-13 measured at the
    clamped weights, the scalar kernel ~4e-12) of the 100-bit reference."""
    loss, grad = lane_loss_grad(name, w, data, weights)
    cards = Cards(data, weights)
    ref_loss, ref_grad = float(mp_loss(name, w, cards)), mp_grad(name, w, cards)
    assert abs(loss - ref_loss) <= 1e-14 * abs(ref_loss)
    assert np.abs(grad - ref_grad).max() <= 1e-12 * np.abs(ref_grad).max()


def _assert_close_to_scalar(name, w, data, weights=None, tol=1e-12):
    loss, grad = lane_loss_grad(name, w, data, weights)
    ref_loss, ref_grad = scalar_loss_grad(name, w, data, weights)
    assert abs(loss - ref_loss) <= tol * abs(ref_loss)
    assert np.abs(grad - ref_grad).max() <= tol * np.abs(ref_grad).max()


def random_w(name, rng) -> np.ndarray:
    cls = _cls(name)
    lo, hi = np.array(cls.lower, float), np.array(cls.upper, float)
    return lo + (hi - lo) * rng.uniform(0.02, 0.98, len(lo))


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_lanes_equal_scalar_kernel_random(name, seed):
    rng = np.random.default_rng(seed)
    data = random_data(seed, n_cards=37, max_len=16)  # 37: the last group has fewer than LANES cards
    weights = rng.uniform(0.1, 2.0, len(data)) if seed % 2 else None
    _assert_close_to_scalar(name, random_w(name, rng), data, weights)


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("seed", [0, 1])
def test_lanes_equal_reference_random(name, seed):
    rng = np.random.default_rng(seed)
    data = random_data(seed, n_cards=37, max_len=16)
    weights = rng.uniform(0.1, 2.0, len(data)) if seed % 2 else None
    _assert_close_to_reference(name, random_w(name, rng), data, weights)


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("case", sorted(CLAMPED))
def test_lanes_equal_reference_clamped(name, case):
    """At the clamps the scalar kernel is the less accurate one (up to ~4e−12 of its largest gradient component
    from the reference: forgotten targets with R within 3e−6 of 1, whose 1/(1 − R) magnifies R's last-bit
    rounding; its log(R) of a rounded R near 1), so the lanes are held to the reference here, and to the scalar
    kernel within 1e−11."""
    w = clamped_w(name, case)
    data = random_data(7, n_cards=30, max_len=14)
    _assert_close_to_reference(name, w, data)
    _assert_close_to_scalar(name, w, data, tol=1e-11)


def test_clamps_and_caps_are_reached():
    """The clamped cases above reach what they are for (in the scalar forward pass): S at 0.01 and 36500, D at
    1 and 10 (FSRS-5's D never exceeds 10 below w4 = 10: D0 ≤ w4, D0(4) ≤ w4, and the (10 − D)/9 damping stops
    short of 10), and the lapse cap taking over (4.5: S; 5: S/e^{w17 w18})."""
    cards = Cards(random_data(7, n_cards=30, max_len=14))
    seen = set()
    for name, cls in MODELS.items():
        k = instantiate(cls.kernels)
        for case in CLAMPED:
            w = clamped_w(name, case)
            wc = k.precompute(w, np.zeros(0))
            cap = math.exp(w[17] * w[18]) if name == "FSRS-5" else 1.0
            for c in range(len(cards.c_start)):
                st = np.zeros(k.N_STATE)
                k.init(wc, int(cards.seq_g[cards.c_start[c]]), 0.0, st)
                for i in range(1, cards.c_n[c]):
                    prev = st.copy()
                    t, g = cards.seq_dt[cards.c_start[c] + i], int(cards.seq_g[cards.c_start[c] + i])
                    k.step(wc, prev, t, g, st)
                    seen |= {(what, name) for what, hit in (("s_min", st[0] == 0.01), ("s_max", st[0] == 36500.0),
                                                            ("d1", st[1] == 1.0), ("d10", st[1] == 10.0)) if hit}
                    lapse = g == 1 and (t >= 1 or name != "FSRS-5")
                    if lapse and name != "FSRSv4" and 0.01 < st[0] < 36500 and st[0] == prev[0] / cap:
                        seen.add(("cap", name))
    for name in MODELS:
        wanted = ("s_min", "s_max", "d1") + (("d10",) if name != "FSRS-5" else ()) + (("cap",) if name != "FSRSv4" else ())
        for what in wanted:
            assert (what, name) in seen, (what, name)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_lanes_equal_scalar_kernel_simulated_user(name):
    from bench.simulate import simulate_user
    from features import FeatureConfig, build_features

    data = build_features(simulate_user(4000, seed=11), FeatureConfig(short=name == "FSRS-5"))
    _assert_close_to_scalar(name, np.array(_cls(name).default_w), data)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_lanes_gradient_vs_central_differences(name):
    rng = np.random.default_rng(5)
    data = random_data(5, n_cards=20, max_len=12)
    assert_gradient_is_central_differences(lambda w, g: lane_loss_grad(name, w, data, want_grad=g),
                                           random_w(name, rng))


def test_lanes_loss_only_and_gradient_only():
    data = random_data(3, n_cards=12)
    w = np.array(FSRS5.default_w)
    loss, grad = lane_loss_grad("FSRS-5", w, data)
    loss_only, untouched = lane_loss_grad("FSRS-5", w, data, want_grad=False)
    no_loss, grad_only = lane_loss_grad("FSRS-5", w, data, want_loss=False)
    assert loss_only == loss and no_loss == 0.0
    np.testing.assert_array_equal(grad_only, grad)
    assert not untouched.any()


@pytest.mark.parametrize("name", sorted(MODELS))
def test_engine_binds_each_version_to_its_entry_point(name):
    """LANE_KERNELS "module:function": the trainer's lane kernel is the version's own entry point, compiled."""
    assert lane_kernel(_cls(name).kernels) == kernel_address(ENTRY[name]) != 0


@pytest.mark.parametrize("name", sorted(MODELS))
def test_fit_with_lanes_follows_the_scalar_fit(name, tmp_path, monkeypatch):
    """The engine's Adam on the lanes and on a copy of the plug-in without LANE_KERNELS: the same weights up to
    the rounding of the gradient sums (mini-batches summed in another order)."""
    from bench.simulate import simulate_user
    from features import FeatureConfig, build_features

    cls = _cls(name)
    plugin = scalar_plugin(tmp_path, monkeypatch, cls.kernels, f"scalar_plugin_{name.replace('-', '').replace('.', '')}",
                           "N_ADJ, N_STATE" + (", precompute, precompute_vjp" if name == "FSRS-5" else ""))
    data = build_features(simulate_user(3000, seed=4), FeatureConfig(short=name == "FSRS-5"))
    w0 = np.array(cls.default_w, dtype=np.float64)
    sigma = getattr(cls, "sigma", None)
    lanes = SeqEngine(cls.kernels, cls.lower, cls.upper).fit(w0, data, None, w_init=w0, sigma=sigma)
    scalar = SeqEngine(plugin, cls.lower, cls.upper).fit(w0, data, None, w_init=w0, sigma=sigma)
    assert not np.array_equal(lanes, w0)
    np.testing.assert_allclose(lanes, scalar, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_lane_loops_vectorise_without_libm_calls(name):
    """The forward and reverse lane loops compile to AVX2 (or AVX-512) vector code with no call to exp, log or pow (a fresh,
    uncached compile: numba shows no assembly for cached code)."""
    fresh = njit(error_model="numpy", fastmath={"contract"})(ENTRY[name].py_func)
    data = random_data(1, n_cards=9)
    cards = Cards(data)
    w = np.array(_cls(name).default_w, dtype=np.float64)
    wc = _wc(name, w)
    items = card_items(cards.c_start, cards.c_n, cards.c_tb, cards.c_te)
    llvm_ir, asm = lane_code(fresh, wc, cards, items)
    assert len(re.findall(r"vdivpd", asm)) >= 8
    # v4 and 4.5 compute their one e^{w8} by libm (as the scalar step): no call inside a loop is what matters
    calls = re.findall(r"@(?:exp|log|log1p|expm1|pow)\b", llvm_ir)
    assert len(calls) <= (0 if name == "FSRS-5" else 1)
    if name != "FSRSv4":
        assert re.search(r"llvm\.sqrt\.v[48]f64", llvm_ir)  # 4 doubles (AVX2) or 8 (AVX-512)


def test_lanes_refuse_a_target_off_the_layout():
    from tests.test_fsrs6_lanes import _off_layout_data

    loss, grad = lane_loss_grad("FSRS-4.5", np.array(FSRS45.default_w), _off_layout_data())
    assert math.isnan(loss) and not grad.any()


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("case", ["default"] + sorted(CLAMPED))
def test_the_hand_kernel_equals_the_one_generated_from_the_torch_equations(name, case):
    """The hand kernel stays because the generated one is slower (module docstring); it is held to it: the lane
    kernel engine/traced.py generates from the same module's torch_init / torch_step / torch_curve gives the same
    loss and gradient within 1e-12 over one batch of all cards at the default weights, and within 1e-11 of the
    largest gradient component at the clamped ones (forgotten targets with R near 1 magnify last-bit rounding, as
    in test_lanes_equal_reference_clamped)."""
    assert_hand_lanes_equal_generated(name, random_data(np.random.default_rng(7), 400), CLAMPED.get(case),
                                      1e-11 if case in CLAMPED else 1e-12)
