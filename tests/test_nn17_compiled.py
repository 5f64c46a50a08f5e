"""NN-17 compiled (neural/nn17_kernels.py) against its torch reference path, NN17Net.forward_batch run upstream's
way (each target's own padded history): predictions, gradients (also where every clamp bites) and the whole
compiled fine-tune against the same recipe stepped by torch.optim.Adam."""

from __future__ import annotations

import collections
import linecache
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from neural import neural_seq
from models.base import ReviewData
from engine.kernel_math import mish, mish_and_grad, softplus, softplus_grad
from neural.nn17_torch import NN17Net
from neural.nn17_kernels import N_PARAMS
from test_neural import fit_in_torch, per_target, seeded_net

torch.set_num_threads(1)

F64 = torch.float64


def stretched(data: ReviewData) -> ReviewData:
    """The same reviews with intervals cycled through ×0 (same day), ×1000, ×1e5, ...: R_t and S_r hit their
    clamps."""
    f = np.array([0.0, 1.0, 1e3, 1e5, 1.0, 30.0, 0.5])
    rows = data.rows.copy()
    rows["delta_t"] = rows["delta_t"].to_numpy() * f[::-1][np.arange(len(rows)) % len(f)]
    return ReviewData(rows, data.seq_delta_t * f[np.arange(len(data.seq_delta_t)) % len(f)], data.seq_rating)


def clamp_net(seed=5) -> NN17Net:
    """Weights that put every clamp to work: S0 below, exactly at and above first()'s box (float64, so 0.01 is the
    bound itself), rw's output stretched so exp(−softplus) leaves [1e−4, 0.9999] both ways, PLS below s_min."""
    net = seeded_net(NN17Net, seed=seed)
    with torch.no_grad():
        net.S0.copy_(torch.tensor([0.005, 2.0, 0.01, 5e4], dtype=F64))
        net.D0.copy_(torch.tensor([0.0, 1.0, 0.5, 1.0], dtype=F64))
        net.sinc_w.copy_(torch.tensor([5.0, 1.0, -5.0], dtype=F64))
        net.rw[0].weight[0, 1] = 0.5
        net.rw[2].weight.fill_(3.0)
        net.rw[2].bias.fill_(-10.0)
        net.pls[2].bias.fill_(-6.0)
    return net


def clamp_hits(net: NN17Net, data: ReviewData) -> collections.Counter:
    """How many values each Tensor.clamp call of the torch path (keyed by its source line) found below / exactly at /
    above its box."""
    hits = collections.Counter()
    orig = torch.Tensor.clamp

    def spy(x, lo=None, hi=None):
        caller = sys._getframe(1)
        line = linecache.getline(caller.f_code.co_filename, caller.f_lineno).strip()
        hits[line, "below"] += int((x < lo).sum())
        hits[line, "at"] += int(((x == lo) | (x == hi)).sum())
        hits[line, "above"] += int((x > hi).sum())
        return orig(x, lo, hi)

    torch.Tensor.clamp = spy
    try:
        with torch.no_grad():
            for b in per_target(net, data, 64, 512):
                net.forward_batch(b)
    finally:
        torch.Tensor.clamp = orig
    return hits


def per_target_p(net, data) -> np.ndarray:
    p = np.full(len(data), np.nan)
    with torch.no_grad():
        for b in per_target(net, data):
            p[b.rows] = net.forward_batch(b).numpy()
    return p


def compiled_grad(net, data, keep) -> tuple[float, list[np.ndarray]]:
    total, grads = 0.0, [np.zeros(p.shape) for p in net.parameters()]
    for b in neural_seq.card_batches(net, data, 512, keep):
        loss, g = net.loss_and_grad(b)
        total += loss
        for acc, x in zip(grads, g):
            acc += x
    return total, grads


def autograd_grad(net, data) -> tuple[float, list[np.ndarray]]:
    net.zero_grad()
    loss = sum(F.binary_cross_entropy(net.forward_batch(b), b.y, reduction="sum")
               for b in per_target(net, data, 64, 512))
    loss.backward()
    return float(loss.detach()), [p.grad.numpy().copy() for p in net.parameters()]


# ----------------------------------------------------------------------------------------------- pieces

def test_activations_match_torch():
    x = torch.tensor([-800, -50, -20.5, -20, -3, -0.3, 0, 0.2, 1.7, 19.9, 20, 20.1, 35, 800], dtype=F64,
                     requires_grad=True)
    for fn, ours in ((F.softplus, lambda v: (softplus(v), softplus_grad(v))), (F.mish, mish_and_grad)):
        y = fn(x)
        (g,) = torch.autograd.grad(y.sum(), x)
        got = np.array([ours(v) for v in x.tolist()])
        np.testing.assert_allclose(got[:, 0], y.detach().numpy(), rtol=1e-15, atol=1e-300)
        np.testing.assert_allclose(got[:, 1], g.numpy(), rtol=0, atol=4e-16)
    np.testing.assert_array_equal([mish(v) for v in x.tolist()], [mish_and_grad(v)[0] for v in x.tolist()])


def test_flat_layout_and_bounds_follow_parameters():
    net = NN17Net()
    assert len(net.theta()) == N_PARAMS == 39
    with torch.no_grad():
        for p in net.parameters():
            p.uniform_(-200, 200)
    lower, upper = net.param_bounds()
    theta = np.clip(net.theta(), lower, upper)
    net.clip_params_()
    np.testing.assert_allclose(theta, net.theta(), rtol=1e-7)  # clip_params_ (float32) = the box on theta


# ----------------------------------------------------------------------------------------------- equal to torch

CASES = ["user8", "user12_short", "user8_clamps", "user12_short_clamps"]


def case(name, request):
    data = request.getfixturevalue(name.removesuffix("_clamps"))
    if name.endswith("_clamps"):
        return clamp_net(), stretched(data)
    return seeded_net(NN17Net, seed=7), data


@pytest.mark.parametrize("name", CASES)
def test_predictions_equal_per_target(name, request):
    net, data = case(name, request)
    got = neural_seq.predict_cards(net, data)
    assert not np.isnan(got).any()
    np.testing.assert_allclose(got, per_target_p(net, data), rtol=0, atol=1e-9)


@pytest.mark.parametrize("name", CASES)
def test_gradients_equal_autograd_per_target(name, request):
    net, data = case(name, request)
    keep = data.rows["seq_pos"].to_numpy() <= 64
    loss, grads = compiled_grad(net, data, keep)
    ref_loss, ref = autograd_grad(net, data)
    assert loss == pytest.approx(ref_loss, rel=1e-10)
    for a, b in zip(grads, ref):
        assert np.abs(a - b).max() <= 1e-6 * np.abs(b).max()


def test_clamp_case_puts_every_clamp_to_work(user8):
    """The `_clamps` cases above are only worth something if the torch path clamps there: every box of NN17Net
    (first's S0, R_t, ExpActivation's r_w, S_r, PLS, S') is left on each side it can be left, and S0 = 0.01 sits
    exactly on first()'s bound (where torch's inclusive clamp passes the gradient)."""
    hits = clamp_hits(clamp_net(), stretched(user8))
    exp_act = "return torch.exp(-x).clamp(0.0001, 0.9999)"
    first = "return self.S0[idx].clamp(S_MIN, S_MAX), self.D0[idx]"
    rt = "rt = torch.pow(0.9, t / s).clamp(0.0001, 0.9999)"
    sr = "sr = (LOG_09 / torch.log(rw) * t).clamp(S_MIN, S_MAX)"
    pls = "pls = self.pls(torch.stack([rw, lapses], dim=1)).squeeze(1).clamp(S_MIN, S_MAX)"
    ns = "ns = torch.where(g > 1, sr * best, pls).clamp(S_MIN, S_MAX)"
    for line, side in ((exp_act, "below"), (exp_act, "above"), (first, "below"), (first, "at"), (first, "above"),
                       (rt, "below"), (rt, "above"), (sr, "below"), (sr, "above"), (pls, "below"), (ns, "above")):
        assert hits[line, side] > 0, (line, side)


# ----------------------------------------------------------------------------------------------- the whole fit

def test_compiled_fit_equals_torch_adam_loop(user8):
    """NN-17's whole fine-tune in one compiled call equals fit_cards's recipe stepped in torch: the same groups of
    whole cards per epoch (randperm on a generator seeded 2023), torch.optim.Adam (no weight decay) and
    CosineAnnealingLR stepped per group, clip_params_ after every step, gradients from autograd through upstream's
    per-target forward_batch of each group's targets. Starting on the box's edges makes the clip bite."""
    train = user8.subset(np.arange(1200))
    n_epoch, batch_size = 3, 256

    def start():
        net = seeded_net(NN17Net, seed=11, scale=0.1)
        with torch.no_grad():
            net.S0[0] = 0.01
            net.D0[0], net.D0[2] = 1.0, 0.0
            net.sinc_w[1] = 0.0
        return net

    net, ref = start(), start()
    n_groups = neural_seq.fit_cards(net, train, n_epoch=n_epoch, batch_size=batch_size)
    clipped = []

    def clip():
        before = ref.theta()
        ref.clip_params_()
        clipped.append(int((ref.theta() != before).sum()))

    fit_in_torch(ref, train, torch.optim.Adam(ref.parameters(), lr=ref.lr, foreach=False), n_epoch, batch_size,
                 n_groups * n_epoch, clip)
    assert sum(clipped) > 0
    np.testing.assert_allclose(net.theta(), ref.theta(), rtol=0, atol=1e-8)
    assert not np.array_equal(net.theta(), start().theta())


def test_mish_parts_equal_tanh_softplus_and_sigmoid():
    """One exp for Mish's factor and its derivative's sigmoid, against libm's tanh(log1p(exp(a))) and 1/(1 + e^−a),
    over the range an MLP meets (past the softplus threshold 20 and far below zero too)."""
    import math

    from neural.nn17_kernels import mish_parts

    for a in np.r_[np.linspace(-40.0, 40.0, 4001), [-800.0, -1e-300, 0.0, 19.999, 20.0, 20.001, 700.0]]:
        tsp, sig = mish_parts(float(a))
        ref_t = 1.0 if a > 20.0 else math.tanh(math.log1p(math.exp(a)))
        ref_s = 1.0 / (1.0 + math.exp(-a)) if a > -700 else 0.0
        assert tsp == pytest.approx(ref_t, rel=1e-14, abs=1e-300)
        assert sig == pytest.approx(ref_s, rel=1e-14, abs=1e-300)


def test_softplus_parts_equal_libm():
    """softplus, its derivative and e^{−softplus} from one exp, against torch's formulas through libm."""
    import math

    from neural.nn17_kernels import softplus_parts

    for z in np.r_[np.linspace(-40.0, 40.0, 4001), [-800.0, 0.0, 19.999, 20.0, 20.001, 700.0]]:
        sp, sg, e = softplus_parts(float(z))
        ref_sp = z if z > 20.0 else math.log1p(math.exp(z))
        ref_sg = 1.0 if z > 20.0 else (1.0 / (1.0 + math.exp(-z)) if z > -700 else 0.0)
        assert sp == pytest.approx(ref_sp, rel=1e-15, abs=1e-300)
        assert sg == pytest.approx(ref_sg, rel=1e-14, abs=1e-300)
        assert e == pytest.approx(math.exp(-ref_sp), rel=1e-14, abs=1e-300)
