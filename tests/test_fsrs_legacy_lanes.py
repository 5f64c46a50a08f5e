"""FSRS v1 / v2 / v3's lane kernel (lane_kernels/fsrs_legacy_lanes.py, cards side by side): loss and gradient against torch
autograd of the modules' upstream-style torch steps (torch's BCE: its log floor and gradient floor, which these
curves reach), against a 100-bit reference (mpmath), against the scalar plug-ins and central differences, at
weights that drive every clamp; the engine's hook, the trainer with and without the lanes, the loops' vector
code."""

from __future__ import annotations

import importlib
import math
import re

import numpy as np
import pandas as pd
import pytest
import torch
from numba import njit

import upstream.training as training
from lane_kernels import fsrs_legacy_lanes as fl
from models.base import ReviewData
from models.fsrs_v1 import FSRSv1
from models.fsrs_v2 import FSRSv2
from models.fsrs_v3 import FSRSv3
from engine.lanes import card_items, kernel_address
from engine.seq_engine import Cards, SeqEngine, instantiate, lane_kernel
from engine.seq_model import TorchSeqNet
from tests.test_fsrs6_fast import random_data
from lane_code import (assert_gradient_is_central_differences, assert_hand_lanes_equal_generated, lane_code,
                       scalar_plugin)

MODELS = {"FSRSv1": FSRSv1, "FSRSv2": FSRSv2, "FSRSv3": FSRSv3}
ENTRY = {"FSRSv1": fl.lanes_loss_grad_v1, "FSRSv2": fl.lanes_loss_grad_v2, "FSRSv3": fl.lanes_loss_grad_v3}
# Weights (over the defaults) that drive S to 0.01 and 36500, D to 1 and 10 (v2, v3) and v1's D' to its relu's 0
# on random_data(7) (test_clamps_are_reached checks it)
CLAMPED = {
    "FSRSv1": {"low": {0: 0.1, 6: -1.0, 1: 1.0}, "high": {2: 10.0, 5: 10.0, 4: -0.01, 1: 10.0}},
    "FSRSv2": {"low": {10: 0.01, 12: 0.9, 4: -10.0, 2: 10.0, 3: -0.01, 5: 0.0},
               "high": {6: 5.0, 9: 2.0, 8: -0.01, 2: 1.0, 3: -10.0, 5: 0.0}},
    "FSRSv3": {"low": {9: 0.5, 10: -2.0, 11: 0.9, 4: -5.0, 5: 0.05, 2: 10.0},
               "high": {6: 2.0, 8: 1.5, 7: -0.15, 4: -0.1, 2: 1.0, 3: -5.0}},
}


def clamped_w(name, case) -> np.ndarray:
    w = np.array(MODELS[name].default_w, dtype=np.float64)
    for j, v in CLAMPED[name][case].items():
        w[j] = v
    return w


def random_w(name, rng) -> np.ndarray:
    cls = MODELS[name]
    lo, hi = np.array(cls.lower, float), np.array(cls.upper, float)
    return lo + (hi - lo) * rng.uniform(0.02, 0.98, len(lo))


def lane_loss_grad(name, w, data, weights=None, want_loss=True, want_grad=True):
    """(loss, gradient) of the lane kernel over all of data's cards in one batch (wc: the plug-in's precompute, the
    weights then s_min)."""
    cards = Cards(data, weights)
    wc = _wc(name, w)
    gw = np.zeros(len(wc))
    items = card_items(cards.c_start, cards.c_n, cards.c_tb, cards.c_te)
    loss = ENTRY[name](wc, cards.seq_dt, cards.seq_g, cards.c_start, cards.t_pos,
                       cards.t_dt, cards.t_y, cards.t_wt, items, np.arange(len(items)), cards.max_n, gw, want_loss,
                       want_grad)
    assert gw[len(w):].sum() == 0.0  # s_min has no adjoint
    return loss, gw[:len(w)]


def _wc(name, w):
    """The precomputed vector of the plug-in: w followed by s_min (default: day mode's 0.01)."""
    return instantiate(MODELS[name].kernels).precompute(np.asarray(w, dtype=np.float64), np.zeros(0))


def scalar_loss_grad(name, w, data, weights=None):
    """The same through the engine's scalar card loop."""
    k = instantiate(MODELS[name].kernels)
    cards = Cards(data, weights)
    grad = np.zeros(len(w))
    loss = k.loss_grad_cards(np.asarray(w, dtype=np.float64), np.zeros(0), *cards.args(), cards.t_y, cards.t_wt,
                             cards.max_n, grad)
    return loss, grad


def torch_loss_grad(name, w, data, weights=None):
    """Σ weight·BCE and its autograd gradient: the module's torch_init / torch_step over upstream's per-target
    padded histories, float64, torch's binary_cross_entropy (logs floored at −100, p(1 − p) at 1e−12)."""
    cls = MODELS[name]
    weights = np.ones(len(data)) if weights is None else weights
    net = TorchSeqNet(importlib.import_module(cls.kernels), w, cls.lower, cls.upper, dtype=torch.float64)
    batch = training.make_batches(data, weights, 10 ** 6, 10 ** 6, torch.float64)[0]
    p = net.forward_batch(batch)
    loss = (torch.nn.functional.binary_cross_entropy(p, batch.y, reduction="none") * batch.weight).sum()
    loss.backward()
    return float(loss.detach()), net.w.grad.numpy().copy(), p.detach().numpy()


def _assert_close(got, ref, tol_loss, tol_grad):
    (loss, grad), (ref_loss, ref_grad) = got, ref
    assert abs(loss - ref_loss) <= tol_loss * abs(ref_loss)
    assert np.abs(grad - ref_grad).max() <= tol_grad * np.abs(ref_grad).max()


# ------------------------------------------------------------------------------------------------ a 100-bit reference

def calm_data(seed, n_cards=37, max_len=16) -> ReviewData:
    """As random_data (same-day reviews, lapses, any row order) with gaps of at most 2 days: no target's R comes
    near torch's BCE floors (at S = 0.01, R ≥ 0.9^200), so central differences of the loss are its gradient
    (random_data's 1000- and 20000-day gaps reach them: test_lanes_equal_torch_*; with gaps up to 30 days, v2's
    random weights reached R ~ 1e−23)."""
    rng = np.random.default_rng(seed)
    seq_dt, seq_g, rows = [], [], []
    for c in range(n_cards):
        start = len(seq_dt)
        for k in range(int(rng.integers(2, max_len))):
            dt = 0.0 if k == 0 else float(rng.choice([0, 1, 1, 2]))
            g = int(rng.choice([1, 2, 3, 4], p=[0.25, 0.15, 0.45, 0.15]))
            seq_dt.append(dt)
            seq_g.append(g)
            if k > 0 and dt > 0:
                rows.append({"card_id": c, "delta_t": dt, "y": int(g > 1), "seq_start": start, "seq_pos": k})
    rows = pd.DataFrame(rows).sample(frac=1.0, random_state=seed).reset_index(drop=True)
    return ReviewData(rows, np.array(seq_dt), np.array(seq_g, dtype=np.int8))


def mp_loss(name, w, cards, prec=100):
    """Σ weight·BCE in `prec`-bit arithmetic (mpmath): the spec's equations (models.md §1.8-1.10, the modules'
    docstrings) written out once more, plainly; asserts that no target reaches torch's BCE floors."""
    mp = pytest.importorskip("mpmath")
    mp.mp.prec = prec
    w = [v if isinstance(v, mp.mpf) else mp.mpf(float(v)) for v in w]

    def clamp(v, lo, hi):
        return min(max(v, mp.mpf(lo)), mp.mpf(hi))

    total = mp.mpf(0)
    for c in range(len(cards.c_start)):
        st = int(cards.c_start[c])
        g = int(cards.seq_g[st])
        lapses = 0
        if name == "FSRSv1":
            s, d, lapses = clamp(w[0] * mp.mpf(2) ** (g - 1) / 4, 0.01, 36500), w[1] - g + 3, int(g == 1)
        elif name == "FSRSv2":
            s, d = clamp(w[0] * (w[1] * (g - 1) + 1), 0.01, 36500), clamp(w[2] * (w[3] * (g - 4) + 1), 1, 10)
        else:
            s, d = clamp(w[0] + w[1] * (g - 1), 0.01, 36500), clamp(w[2] + w[3] * (g - 3), 1, 10)
        states = [s]
        for i in range(1, int(cards.c_n[c])):
            t = mp.mpf(float(cards.seq_dt[st + i]))
            g = int(cards.seq_g[st + i])
            r = mp.mpf("0.9") ** (t / s)
            if name == "FSRSv1":
                d = max(d + r - mp.mpf(2) ** (g - 1) / 4 + mp.mpf("0.1"), 0)
                if g > 1:
                    s = s * (1 + mp.exp(w[2]) * (d + mp.mpf("0.1")) ** w[3] * s ** w[4] * (mp.exp(w[5] * (1 - r)) - 1))
                else:
                    s = w[0] * mp.exp(w[6] * lapses)
                lapses += int(g == 1)
            elif name == "FSRSv2":
                d = clamp(w[5] * w[2] * (1 - w[3]) + (1 - w[5]) * (d + w[4] * (g - 3)), 1, 10)
                if g > 1:
                    s = s * (1 + mp.exp(w[6]) * d ** w[7] * s ** w[8] * (mp.exp(w[9] * (1 - r)) - 1))
                else:
                    s = w[10] * d ** w[11] * s ** w[12] * (mp.exp(w[13] * (1 - r)) - 1)
            else:
                d = clamp(w[5] * w[2] + (1 - w[5]) * (d + w[4] * (g - 3)), 1, 10)
                if g > 1:
                    s = s * (1 + mp.exp(w[6]) * (11 - d) * s ** w[7] * (mp.exp(w[8] * (1 - r)) - 1))
                else:
                    s = w[9] * d ** w[10] * s ** w[11] * mp.exp(w[12] * (1 - r))
            s = clamp(s, 0.01, 36500)
            states.append(s)
        for j in range(int(cards.c_tb[c]), int(cards.c_te[c])):
            r = mp.mpf("0.9") ** (mp.mpf(float(cards.t_dt[j])) / states[int(cards.t_pos[j]) - 1])
            assert r * (1 - r) > mp.mpf("1e-12") and mp.log(r) > -100 and mp.log(1 - r) > -100
            total -= mp.mpf(float(cards.t_wt[j])) * (mp.log(r) if cards.t_y[j] > 0.5 else mp.log(1 - r))
    return total


def mp_grad(name, w, cards, prec=100):
    """Central differences of mp_loss with steps of 2^−40·|w_j| in 100-bit arithmetic (exact wherever no clamp
    sits within a step of its boundary: random weights)."""
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


# ------------------------------------------------------------------------------------------------ the tests

@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("seed", [0, 1])
def test_lanes_equal_reference_random(name, seed):
    """Within 1e−14 (loss) and 1e−12 (gradient, of its largest component) of the 100-bit reference."""
    rng = np.random.default_rng(seed)
    data = calm_data(seed)
    weights = rng.uniform(0.1, 2.0, len(data)) if seed % 2 else None
    w = random_w(name, rng)
    cards = Cards(data, weights)
    _assert_close(lane_loss_grad(name, w, data, weights), (float(mp_loss(name, w, cards)), mp_grad(name, w, cards)),
                  1e-14, 1e-12)


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_lanes_equal_torch_random(name, seed):
    """random_data's long gaps take R below 1e−12 and ln R below −100 (asserted): torch's floors, kept. Torch's
    float64 gradient is the least accurate of the three here (up to ~1e−9 of its largest component from the scalar
    kernel's and the lanes', which agree within ~1e−15: its pow's backward, R near 1 magnified by 1/(1 − R)), as
    tests/test_fsrs_v123.py's engine-vs-torch tolerance (1e−7) allows; an ignored floor moves the loss by ~1e2 and
    the gradient by orders of magnitude."""
    rng = np.random.default_rng(seed)
    data = random_data(seed, n_cards=37, max_len=16)  # 37: the last group has fewer than LANES cards
    weights = rng.uniform(0.1, 2.0, len(data)) if seed % 2 else None
    w = random_w(name, rng)
    ref_loss, ref_grad, p = torch_loss_grad(name, w, data, weights)
    assert (p * (1 - p) < 1e-12).any() and (p < math.exp(-100)).any()
    _assert_close(lane_loss_grad(name, w, data, weights), (ref_loss, ref_grad), 1e-13, 1e-8)


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("case", ["low", "high"])
def test_lanes_equal_torch_clamped(name, case):
    w = clamped_w(name, case)
    data = random_data(7, n_cards=30, max_len=14)
    ref_loss, ref_grad, _ = torch_loss_grad(name, w, data)
    _assert_close(lane_loss_grad(name, w, data), (ref_loss, ref_grad), 1e-13, 1e-8)
    _assert_close(lane_loss_grad(name, w, data), scalar_loss_grad(name, w, data), 1e-13, 1e-12)


def test_clamps_are_reached():
    """The clamped cases reach what they are for (in the scalar forward pass): S at 0.01 and 36500, D at 1 and 10
    (v2, v3), v1's D' at its relu's 0."""
    cards = Cards(random_data(7, n_cards=30, max_len=14))
    for name, cls in MODELS.items():
        k = instantiate(cls.kernels)
        seen = set()
        for case in CLAMPED[name]:
            w = clamped_w(name, case)
            for c in range(len(cards.c_start)):
                st = np.zeros(k.N_STATE)
                wc = _wc(name, w)
                k.init(wc, int(cards.seq_g[cards.c_start[c]]), 0.0, st)
                for i in range(1, cards.c_n[c]):
                    k.step(wc, st.copy(), cards.seq_dt[cards.c_start[c] + i], int(cards.seq_g[cards.c_start[c] + i]),
                           st)
                    seen |= {what for what, hit in (("s_min", st[0] == 0.01), ("s_max", st[0] == 36500.0),
                                                    ("d1", st[1] == 1.0), ("d10", st[1] == 10.0),
                                                    ("d0", st[1] == 0.0)) if hit}
        wanted = {"s_min", "s_max"} | ({"d0"} if name == "FSRSv1" else {"d1", "d10"})
        assert wanted <= seen, (name, wanted - seen)


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("seed", [0, 1])
def test_lanes_equal_scalar_kernel(name, seed):
    rng = np.random.default_rng(seed)
    data = random_data(seed, n_cards=37, max_len=16)
    weights = rng.uniform(0.1, 2.0, len(data)) if seed % 2 else None
    w = random_w(name, rng)
    _assert_close(lane_loss_grad(name, w, data, weights), scalar_loss_grad(name, w, data, weights), 1e-13, 1e-12)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_lanes_equal_scalar_kernel_simulated_user(name):
    from bench.simulate import simulate_user
    from features import FeatureConfig, build_features

    data = build_features(simulate_user(4000, seed=11), FeatureConfig())
    w = np.array(MODELS[name].default_w, dtype=np.float64)
    _assert_close(lane_loss_grad(name, w, data), scalar_loss_grad(name, w, data), 1e-13, 1e-12)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_lanes_gradient_vs_central_differences(name):
    rng = np.random.default_rng(5)
    data = calm_data(5, n_cards=20, max_len=12)
    assert_gradient_is_central_differences(lambda w, g: lane_loss_grad(name, w, data, want_grad=g),
                                           random_w(name, rng))


def test_lanes_loss_only_and_gradient_only():
    data = random_data(3, n_cards=12)
    w = np.array(FSRSv2.default_w)
    loss, grad = lane_loss_grad("FSRSv2", w, data)
    loss_only, untouched = lane_loss_grad("FSRSv2", w, data, want_grad=False)
    no_loss, grad_only = lane_loss_grad("FSRSv2", w, data, want_loss=False)
    assert loss_only == loss and no_loss == 0.0
    np.testing.assert_array_equal(grad_only, grad)
    assert not untouched.any()


@pytest.mark.parametrize("name", sorted(MODELS))
def test_engine_binds_each_version_to_its_entry_point(name):
    """LANE_KERNELS "module:function": the trainer's lane kernel is the version's own entry point, compiled."""
    assert lane_kernel(MODELS[name].kernels) == kernel_address(ENTRY[name]) != 0


@pytest.mark.parametrize("name", sorted(MODELS))
def test_fit_with_lanes_follows_the_scalar_fit(name, tmp_path, monkeypatch):
    """The engine's Adam on the lanes and on a copy of the plug-in without LANE_KERNELS: the same weights up to
    the rounding of the gradient sums."""
    from bench.simulate import simulate_user
    from features import FeatureConfig, build_features

    cls = MODELS[name]
    plugin = scalar_plugin(tmp_path, monkeypatch, cls.kernels, f"scalar_plugin_{name}")
    data = build_features(simulate_user(3000, seed=4), FeatureConfig())
    w0 = np.array(cls.default_w, dtype=np.float64)
    lanes = SeqEngine(cls.kernels, cls.lower, cls.upper).fit(w0, data, None, w_init=w0)
    scalar = SeqEngine(plugin, cls.lower, cls.upper).fit(w0, data, None, w_init=w0)
    assert not np.array_equal(lanes, w0)
    np.testing.assert_allclose(lanes, scalar, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_lane_loops_vectorise_without_libm_calls(name):
    """The lane loops compile to vector code with no call to exp, log or pow (v3: its one e^{w6} a call, by libm
    as the scalar step's) (a fresh, uncached compile: numba shows no assembly for cached code)."""
    fresh = njit(error_model="numpy", fastmath={"contract"})(ENTRY[name].py_func)
    cards = Cards(random_data(1, n_cards=9))
    w = np.array(MODELS[name].default_w, dtype=np.float64)
    llvm_ir, asm = lane_code(fresh, _wc(name, w), cards, card_items(cards.c_start, cards.c_n, cards.c_tb, cards.c_te))
    assert len(re.findall(r"vdivpd", asm)) >= 2
    calls = re.findall(r"@(?:exp|log|log1p|expm1|pow)\b", llvm_ir)
    assert len(calls) <= (1 if name == "FSRSv3" else 0)


def test_lanes_refuse_a_target_off_the_layout():
    from tests.test_fsrs6_lanes import _off_layout_data

    loss, grad = lane_loss_grad("FSRSv3", np.array(FSRSv3.default_w), _off_layout_data())
    assert math.isnan(loss) and not grad.any()


@pytest.mark.parametrize("name", ["FSRSv2", "FSRSv3"])
def test_the_hand_kernel_equals_the_one_generated_from_the_torch_equations(name):
    """The hand kernel stays because the generated one is slower (module docstring); it is held to it: the lane
    kernel engine/traced.py generates from the same module's torch equations gives the same loss and gradient within
    1e-12 over one batch of all cards at the model's default weights."""
    assert_hand_lanes_equal_generated(name, random_data(np.random.default_rng(7), 400))
