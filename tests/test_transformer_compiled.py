"""The Transformer's compiled kernel (neural/transformer_kernels.py) against torch: the same masks torch's dropout
draws, the forward and every gradient against autograd of the module in float64, a short fine-tune against the
torch recipe, and training.train's keep="final" rule."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import upstream.training as training
from config import RunConfig
from models.base import InadequateData
from neural import neural_seq
from models.transformer import (Transformer, TransformerFlat, draw_masks, fit_compiled, kernel_batch, kernel_masks,
                                mask_shapes, predict_compiled)
from neural.transformer_torch import TransformerNet, predict_windows, transformer_forward
from upstream.torch_rng import BernoulliStream, portable_bernoulli
from neural.transformer_kernels import N_PARAMS, PARAMS, batch_loss
from neural.transformer_lanes import LANES, LANES_MAX_WINDOW
from engine.vec_math import exp_nonpos
from models.gru_p import DECAY, FACTOR


def _net(seed: int = 0) -> TransformerNet:
    torch.manual_seed(seed)
    net = TransformerNet().double()
    with torch.no_grad():  # weights away from the default init, so no LayerNorm or bias is trivial
        for p in net.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return net


def _replay(masks):
    """A dropout function that applies the given 0/1 masks in turn, as F.dropout does (x · mask / (1 − p))."""
    it = iter(masks)

    def dropout(x, p, training):
        if not training:
            return x
        return x * (torch.from_numpy(next(it)).to(x.dtype) / (1 - p))
    return dropout


def _torch_batch(net, t, g, dt, y, w, masks):
    """Σ weight·BCE and p of a batch by autograd through transformer_forward (float64)."""
    src = torch.stack([torch.as_tensor(t), torch.as_tensor(g)], dim=-1)
    tgt = torch.zeros(1, src.shape[1], 2, dtype=torch.float64)
    out = transformer_forward(net.transformer, src, tgt, masks is not None,
                              _replay(masks) if masks is not None else F.dropout)
    s = torch.exp(net.fc(out[0])).squeeze(-1)
    p = (1 + FACTOR * torch.as_tensor(dt) / s) ** DECAY
    loss = (F.binary_cross_entropy(p, torch.as_tensor(y), reduction="none") * torch.as_tensor(w)).sum()
    return loss, p


def _autograd_grad(net, loss) -> np.ndarray:
    """d loss / d every parameter by torch's autograd, flat in the kernel's PARAMS order."""
    grads = torch.autograd.grad(loss, [net.get_parameter(name) for name, _ in PARAMS])
    return np.concatenate([x.numpy().ravel() for x in grads])


def test_param_layout_is_the_modules():
    assert [(n, tuple(p.shape)) for n, p in TransformerNet().named_parameters()] == PARAMS
    assert N_PARAMS == 127


def test_masks_are_the_draws_of_f_dropout():
    """F.dropout on the CPU = x · empty_like(x).bernoulli_(1 − p) / (1 − p): the same 0/1 pattern from the same
    seed, whatever the dtype (float32 module, uint8 masks)."""
    for dtype in (torch.float32, torch.float64):
        x = torch.rand(3, 5, 7, dtype=dtype) + 1
        torch.manual_seed(7)
        dropped = F.dropout(x, 0.1, True)
        torch.manual_seed(7)
        mask = torch.empty(3, 5, 7, dtype=torch.uint8).bernoulli_(0.9)
        assert torch.equal(dropped, x * (mask.to(dtype) / (1 - 0.1)))


@pytest.mark.skipif(not portable_bernoulli(), reason="torch draws from MKL's stream on this CPU (not emulated)")
def test_emulated_masks_equal_torchs_draws():
    """torch_rng.BernoulliStream = torch's default generator's bernoulli_ after manual_seed, over several batches
    of masks in a row (so the stream stays in step), and the draws after them."""
    stream = BernoulliStream(42)
    torch.manual_seed(42)
    for L, B in [(1, 3), (26, 194), (7, 512), (64, 5)]:
        ours, theirs = draw_masks(L, B, stream), draw_masks(L, B)
        assert all(np.array_equal(a, b) for a, b in zip(ours, theirs))
    np.testing.assert_array_equal(stream.bernoulli(1000, 0.3), torch.empty(1000, dtype=torch.uint8).bernoulli_(0.3))


def test_draw_masks_replays_the_modules_dropout(user8):
    """The module in training mode (nn.Transformer itself, float32 as upstream runs it) after manual_seed(s) equals
    the written-out forward fed with draw_masks' masks drawn after the same seed, and the generator ends in the
    same state (so the next batch's masks are the module's too)."""
    net = TransformerNet().train()
    net.functional = False
    b = training.make_batches(user8, np.ones(len(user8)), 64, 64)[-3]  # padded: lengths differ in the batch
    assert len(set(b.lengths.tolist())) > 1
    src = torch.stack([b.t, b.g], dim=-1)
    torch.manual_seed(5)
    s_module = net.stability(src)
    after_module = torch.rand(3)
    torch.manual_seed(5)
    masks = draw_masks(*b.t.shape)
    after_masks = torch.rand(3)
    assert [tuple(m.shape) for m in masks] == mask_shapes(*b.t.shape)
    out = transformer_forward(net.transformer, src, torch.zeros(1, src.shape[1], 2), True, _replay(masks))
    s_masks = torch.exp(net.fc(out[0])).squeeze(-1)
    torch.testing.assert_close(s_masks, s_module, rtol=1e-5, atol=0)
    assert torch.equal(after_module, after_masks)


@pytest.mark.parametrize("train_mode", [True, False])
def test_kernel_equals_autograd(user8, train_mode):
    """Forward to 1e-12 and all 127 gradient components to 1e-9 of the largest, on real padded batches of user 8
    (short and long histories), with dropout masks (training) and without (evaluation)."""
    net = _net(1)
    theta = net.theta()
    batches = training.make_batches(user8, np.linspace(0.5, 1.5, len(user8)), 128, 64, torch.float64)
    padded = [b for b in batches if (b.lengths < b.t.shape[0]).any() and b.t.shape[0] > 3]  # padding present
    assert len(padded) >= 2
    for b in (padded[0], padded[-1]):
        t, g, n, dt, y, w = (x.numpy() for x in (b.t, b.g, b.lengths, b.delta_t, b.y, b.weight))
        torch.manual_seed(3)
        masks = draw_masks(*t.shape) if train_mode else None
        grad = np.zeros(N_PARAMS)
        loss, p = kernel_batch(theta, t, g, n, dt, y, w, kernel_masks(masks) if masks else None, grad)
        ref_loss, ref_p = _torch_batch(net, t, g, dt, y, w, masks)
        ref_grad = _autograd_grad(net, ref_loss)
        np.testing.assert_allclose(p, ref_p.detach().numpy(), rtol=1e-12, atol=0)
        assert loss == pytest.approx(float(ref_loss.detach()), rel=1e-12)
        np.testing.assert_allclose(grad, ref_grad, rtol=0, atol=1e-9 * np.abs(ref_grad).max())


def test_kernel_equals_autograd_on_heavily_padded_histories():
    """Training mode with most of the window padding (histories of 1, 2, 5 and 12 in a window of 12, where the
    padded positions' attention weights and their dropout dominate): forward and gradient equal autograd of the
    module with the same masks. The encoder's own
    gradients are ~1e-29 (a LayerNorm over 2 features outputs ±1 up to eps: nearly flat), far below the global
    tolerance, so its in-projection block is held to its own scale, 1e-8 relative (keeping every attention weight
    instead of the drawn masks moves it by 1e-5 to 2, and a kernel variant that miscounted the padded keys' kept
    weights failed here)."""
    net = _net(6)
    rng = np.random.default_rng(3)
    n = np.array([1, 2, 5, 12, 1, 12, 3])
    L, B = 12, len(n)
    t = np.where(np.arange(L)[:, None] < n, rng.random((L, B)) * 30, 0.0)
    t[0] = 0.0
    g = np.where(np.arange(L)[:, None] < n, rng.integers(1, 5, (L, B)).astype(float), 0.0)
    dt, y, w = rng.random(B) * 20 + 1, (rng.random(B) < 0.7).astype(float), rng.random(B) + 0.5
    torch.manual_seed(11)
    masks = draw_masks(L, B)
    grad = np.zeros(N_PARAMS)
    loss, p = kernel_batch(net.theta(), t, g, n, dt, y, w, kernel_masks(masks), grad)
    ref_loss, ref_p = _torch_batch(net, t, g, dt, y, w, masks)
    ref_grad = _autograd_grad(net, ref_loss)
    np.testing.assert_allclose(p, ref_p.detach().numpy(), rtol=1e-12, atol=0)
    np.testing.assert_allclose(grad, ref_grad, rtol=0, atol=1e-9 * np.abs(ref_grad).max())
    enc = slice(0, 18)  # encoder self-attention in_proj weight and bias
    np.testing.assert_allclose(grad[enc], ref_grad[enc], rtol=1e-8, atol=1e-6 * np.abs(ref_grad[enc]).max())


def test_lane_kernel_equals_autograd_and_the_per_target_kernel():
    """The lane kernel (neural/transformer_lanes.py: training batches of short windows, targets side by side) on
    a batch of 70 targets (two full blocks of LANES and a partial one) at windows 1, 5 and LANES_MAX_WINDOW:
    forward and gradient equal autograd of the module with the same masks (1e-12, 1e-9 of the largest component),
    and the per-target kernel (transformer_kernels.batch_loss, which kernel_batch runs for longer windows) to
    rounding: the same operations per target, the gradient summed in another order. Without dropout (lanes_eval)
    too."""
    net = _net(4)
    theta = net.theta()
    rng = np.random.default_rng(5)
    B = 70
    assert B > 2 * LANES
    for L in (1, 5, LANES_MAX_WINDOW):
        n = np.full(B, L)
        n[: B // 3] = max(1, L - 2)  # padded targets too, as a sorted batch's first ones can be
        t = np.where(np.arange(L)[:, None] < n, np.round(rng.exponential(15.0, (L, B))), 0.0)
        t[0] = 0.0
        g = np.where(np.arange(L)[:, None] < n, rng.integers(1, 5, (L, B)).astype(float), 0.0)
        dt, y, w = np.round(rng.random(B) * 30) + 1, (rng.random(B) < 0.8).astype(float), rng.random(B) + 0.5
        torch.manual_seed(7 + L)
        masks = draw_masks(L, B)
        grad = np.zeros(N_PARAMS)
        loss, p = kernel_batch(theta, t, g, n, dt, y, w, kernel_masks(masks), grad)  # the lane kernel
        ref_loss, ref_p = _torch_batch(net, t, g, dt, y, w, masks)
        ref_grad = _autograd_grad(net, ref_loss)
        np.testing.assert_allclose(p, ref_p.detach().numpy(), rtol=1e-12, atol=0)
        assert loss == pytest.approx(float(ref_loss.detach()), rel=1e-12)
        np.testing.assert_allclose(grad, ref_grad, rtol=0, atol=1e-9 * np.abs(ref_grad).max())
        grad_pt, p_pt = np.zeros(N_PARAMS), np.empty(B)
        loss_pt = batch_loss(theta, t, g, n.astype(np.int64), dt, y, w, kernel_masks(masks), True, grad_pt, p_pt)
        np.testing.assert_allclose(p, p_pt, rtol=1e-14, atol=0)
        assert loss == pytest.approx(loss_pt, rel=1e-14)
        np.testing.assert_allclose(grad, grad_pt, rtol=0, atol=1e-13 * np.abs(grad_pt).max())
        # without dropout (the divergence check's evaluation): autograd, and the per-target kernel's collapsed pass
        loss, p = kernel_batch(theta, t, g, n, dt, y, w, None, lanes_eval=True)
        ref_loss, ref_p = _torch_batch(net, t, g, dt, y, w, None)
        np.testing.assert_allclose(p, ref_p.detach().numpy(), rtol=1e-12, atol=0)
        assert loss == pytest.approx(float(ref_loss.detach()), rel=1e-12)
        loss_pt, p_pt = kernel_batch(theta, t, g, n, dt, y, w, None)
        np.testing.assert_allclose(p, p_pt, rtol=1e-14, atol=0)
        assert loss == pytest.approx(loss_pt, rel=1e-14)


def test_lane_kernel_fails_as_the_per_target_kernel_where_the_stability_underflows():
    """The lane kernel skips numba's zero-divisor checks (error_model "numpy", so its loops vectorise) but keeps the
    one division that can meet 0, Δt / S with S = exp(fc) underflowing: ZeroDivisionError like the per-target
    kernel, whose divisions are all checked."""
    theta = _net(4).theta()
    fc = N_PARAMS - 3  # fc.weight (1, 2), then fc.bias
    theta[fc:fc + 2] = 0.0
    theta[fc + 2] = -1000.0  # exp(-1000) = 0
    L, B = 3, 40
    rng = np.random.default_rng(0)
    t, g = rng.random((L, B)) * 10, rng.integers(1, 5, (L, B)).astype(float)
    torch.manual_seed(0)
    masks = kernel_masks(draw_masks(L, B))
    ones = np.ones(B)
    with pytest.raises(ZeroDivisionError):
        kernel_batch(theta, t, g, np.full(B, L), ones, ones, ones, masks, np.zeros(N_PARAMS))
    with pytest.raises(ZeroDivisionError):
        batch_loss(theta, t, g, np.full(B, L), ones, ones, ones, masks, True, np.zeros(N_PARAMS), np.empty(B))


def test_fine_tune_equals_the_torch_recipe(user8):
    """fit_compiled against training.train (keep="final") on the written-out module in float64, 2 epochs: the same
    batches, batch order, dropout masks, AdamW and cosine schedule, so the same final weights and predictions."""
    data = user8.subset(np.arange(1200))
    cfg = RunConfig(algo="Transformer", n_epoch=2)
    ours, ref = _net(2), _net(2)
    fit_compiled(ours, data, cfg, n_epoch=2)
    training.train(ref, data, cfg, lr=ref.lr, dtype=torch.float64, keep="final")
    np.testing.assert_allclose(ours.theta(), ref.theta(), rtol=0, atol=1e-8)
    assert not np.allclose(ours.theta(), _net(2).theta(), atol=1e-3)  # it did train
    test = user8.subset(np.arange(1200, 2000))
    np.testing.assert_allclose(predict_compiled(ours, test), predict_windows(ref, test),
                               rtol=1e-8, atol=0)


def test_compiled_prediction_equals_the_module(user8):
    """Eval mode, upstream's chunks (each padded to its longest history): kernel vs nn.Transformer, float64."""
    net = _net(4)
    net.functional = False
    test = user8.subset(np.arange(300, 900))
    np.testing.assert_allclose(predict_compiled(net, test, chunk=128),
                               predict_windows(net, test, chunk=128), rtol=1e-12, atol=0)


def test_keep_final_skips_evaluations_but_not_the_divergence_error(user8, monkeypatch):
    """keep="final": the weights after the last step (as the per-step record did), one evaluation pass when the
    final weights are finite, InadequateData only when every checkpoint is NaN."""
    data = user8.subset(np.arange(600))
    cfg = RunConfig(algo="Transformer", n_epoch=2)
    net = TransformerNet()
    seen = []
    orig_clip = net.clip_
    net.clip_ = lambda: (orig_clip(), seen.append({k: v.clone() for k, v in net.state_dict().items()}))
    res = training.train(net, data, cfg, lr=net.lr, keep="final")
    assert len(res.eval_losses) == 1 and np.isfinite(res.best_loss)
    for k, v in net.state_dict().items():
        assert torch.equal(v, seen[-1][k])
    # final weights NaN but the initial ones finite: upstream keeps the (NaN) final weights, no error
    calls = []

    def fake_eval(module, batches, n):
        calls.append(1)
        return np.nan if len(calls) == 1 else 0.5
    monkeypatch.setattr(training, "_eval_loss", fake_eval)
    assert training.train(TransformerNet(), data, cfg, keep="final").best_loss == 0.5 and len(calls) == 2
    monkeypatch.setattr(training, "_eval_loss", lambda *a: np.nan)
    with pytest.raises(InadequateData):
        training.train(TransformerNet(), data, cfg, keep="final")


def test_fit_compiled_raises_when_every_checkpoint_is_nan(user8):
    net = _net(0)
    with torch.no_grad():
        net.fc.bias.fill_(np.nan)
    with pytest.raises(InadequateData):
        fit_compiled(net, user8.subset(np.arange(300)), RunConfig(algo="Transformer"), n_epoch=1)


def test_model_uses_the_compiled_path_by_default(user8):
    model = Transformer(RunConfig(algo="Transformer"))
    assert model.compiled and isinstance(model.net, TransformerFlat) and model.net.theta().dtype == np.float64
    torch.manual_seed(0)
    module = TransformerNet()
    neural_seq.load_pretrained(module, "Transformer", "")
    assert np.array_equal(model.net.theta(), module.theta())  # the pretrained weights, as the module holds them
    assert not Transformer(RunConfig(algo="Transformer", trainer="upstream")).compiled


def test_vectorised_exp_is_within_an_ulp_of_math_exp():
    """exp_nonpos (the encoder softmax's exps) against numpy's exp over the range the scores take, the floor at
    −708 (exp(−708) instead of subnormals) and NaN kept."""
    x = -np.concatenate([np.linspace(0, 1, 1001), np.random.default_rng(0).random(20000) * 708, [1e-300, 708.0]])
    out = np.empty_like(x)
    exp_nonpos(x, out, len(x))
    np.testing.assert_allclose(out, np.exp(x), rtol=4.5e-16, atol=0)
    y = np.array([-709.0, -1e4, -np.inf, np.nan, -0.5])
    exp_nonpos(y, y, len(y))
    assert y[0] == y[1] == y[2] == pytest.approx(np.exp(-708.0), rel=1e-15) and np.isnan(y[3])
    assert y[4] == pytest.approx(np.exp(-0.5), rel=1e-16)


def test_default_path_runs_without_torch():
    """On an AMD CPU (masks emulated) the default fit and prediction never import torch."""
    import subprocess
    import sys

    if not portable_bernoulli():
        pytest.skip("torch draws the masks on this CPU")
    code = ("import sys, numpy as np; from config import EMBEDDED_DATA, RunConfig; "
            "from data_loader import load_revlogs; from features import FeatureConfig, build_features; "
            "from models.transformer import Transformer; "
            "d = build_features(load_revlogs(EMBEDDED_DATA, 1), FeatureConfig()); "
            "m = Transformer(RunConfig(algo='Transformer', n_epoch=1)); "
            "m.fit(d.subset(np.arange(300))); m.predict(d.subset(np.arange(300, 400))); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.skipif(not portable_bernoulli(), reason="the emulated masks apply on AMD CPUs only")
def test_fit_with_torch_drawn_masks_equals_the_emulated_stream(user8, monkeypatch):
    """fit_compiled's two mask sources (torch's own bernoulli_, the fallback off AMD; the emulated stream) give
    bit-identical weights."""
    import models.transformer as tr

    data = user8.subset(np.arange(700))
    cfg = RunConfig(algo="Transformer", n_epoch=1)
    emulated, drawn = _net(5), _net(5)
    fit_compiled(emulated, data, cfg, n_epoch=1)
    monkeypatch.setattr(tr, "portable_bernoulli", lambda: False)
    fit_compiled(drawn, data, cfg, n_epoch=1)
    assert np.array_equal(emulated.theta(), drawn.theta())
