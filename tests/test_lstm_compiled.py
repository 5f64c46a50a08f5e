"""The LSTM compiled (neural/lstm_kernels.py) against its torch reference path, in float64: predictions and
gradients against autograd of upstream's per-target forward (each target's own padded history, nn.LSTM), also where
the heads' clamps bite, and the whole compiled fine-tune against the same recipe stepped by torch.optim.AdamW."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from models import lstm

from neural import lstm_kernels, lstm_torch, neural_seq

from engine import vec_math
from neural.card_net import CardSet
from models.lstm import LSTMData
from neural.lstm_torch import LSTMNet, finetune, inner_optimizer, per_target_batches, reptile
from test_neural import seeded_net

torch.set_num_threads(1)

F64 = torch.float64


def net_for(seed: int, clamps: bool = False) -> LSTMNet:
    net = seeded_net(LSTMNet, seed=seed, scale=0.1)
    with torch.no_grad():
        net.input_mean.copy_(torch.tensor([0.5, 8.5], dtype=F64))
        net.input_std.copy_(torch.tensor([2.0, 1.0], dtype=F64))
        if clamps:  # s and d heads pushed past ±25 for some curves and targets
            net.s_fc.weight.mul_(60.0)
            net.s_fc.bias.copy_(torch.tensor([-30.0, 0.0, 26.0], dtype=F64))
            net.d_fc.weight.mul_(60.0)
            net.d_fc.bias.copy_(torch.tensor([24.0, -2.0, -28.0], dtype=F64))
    return net


def per_target_p_and_grad(net: LSTMNet, data: LSTMData, keep: np.ndarray):
    """Upstream's layout under autograd: every target's own history through nn.LSTM. Returns (p of every row,
    Σ BCE over the kept rows, its gradient per parameter)."""
    w = np.ones(len(data))
    with torch.no_grad():
        p = np.concatenate([net.forward_padded(x, n, dt).numpy()
                            for x, n, dt, _, _ in per_target_batches(data, np.arange(len(data)), 4096, w, F64)])
    net.zero_grad()
    loss = sum(F.binary_cross_entropy(net.forward_padded(x, n, dt), y, reduction="sum")
               for x, n, dt, y, _ in per_target_batches(data, np.flatnonzero(keep), 2048, w, F64))
    loss.backward()
    return p, float(loss.detach()), [q.grad.numpy().copy() for q in net.parameters()]


def test_activations_match_torch():
    """The kernels' polynomial exponential behind σ and tanh, against torch over the whole range, saturation
    included."""
    x = torch.cat([torch.linspace(-60, 60, 240001, dtype=F64), torch.tensor([-1e4, -745.0, 0.0, 1e-300, 745.0, 1e4],
                                                                           dtype=F64)])
    xs = x.numpy()
    got_sig = np.array([lstm_kernels.sigmoid(v) for v in xs])
    got_tanh = np.array([lstm_kernels.tanh(v) for v in xs])
    ref_sig = torch.sigmoid(x).numpy()
    np.testing.assert_allclose(got_sig, ref_sig, rtol=1e-13, atol=5e-18)
    np.testing.assert_allclose(got_tanh, torch.tanh(x).numpy(), rtol=0, atol=1e-14)
    inside = np.abs(xs) <= vec_math.EXP_BOUND
    np.testing.assert_allclose([vec_math.exp_bounded(v) for v in xs[inside]], np.exp(xs[inside]), rtol=1e-13)


def test_flat_layout_follows_parameters():
    net = LSTMNet()
    assert [tuple(p.shape) for p in net.parameters()] == [s for _, s in lstm_kernels.SHAPES]
    assert lstm_kernels.N_PARAMS == len(net.theta()) == 8869


@pytest.mark.parametrize("clamps", [False, True])
def test_predictions_and_gradients_equal_autograd_per_target(user8_lstm, clamps):
    data = user8_lstm
    net = net_for(6, clamps)
    keep = data.rows["seq_pos"].to_numpy() <= 64
    p_ref, loss_ref, g_ref = per_target_p_and_grad(net, data, keep)
    np.testing.assert_allclose(neural_seq.predict_cards(net, data), p_ref, rtol=0, atol=1e-9)
    loss, grads = 0.0, [np.zeros(p.shape) for p in net.parameters()]
    for b in neural_seq.card_batches(net, data, 2048, keep):
        lo, g = net.loss_and_grad(b)
        loss += lo
        for acc, x in zip(grads, g):
            acc += x
    assert loss == pytest.approx(loss_ref, rel=1e-12)
    for a, b in zip(grads, g_ref):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-8 * max(1.0, np.abs(b).max()))


def test_clamp_case_puts_the_head_clamps_to_work(user8_lstm):
    """The clamped case above is only worth something if the heads leave [−25, 25] on both sides there."""
    net = net_for(6, clamps=True)
    w = np.ones(len(user8_lstm))
    with torch.no_grad():
        z = torch.cat([torch.cat([net.s_fc(h), net.d_fc(h)], dim=1) for h in
                       (net.process(net.encode(x))[n - 1, torch.arange(x.shape[1])]
                        for x, n, _, _, _ in per_target_batches(user8_lstm, np.arange(len(user8_lstm)), 4096, w,
                                                                F64))])
    assert bool((z < -25).any()) and bool((z > 25).any()) and bool(((z > -25) & (z < 25)).any())


def opt_state_for(net: LSTMNet, seed: int) -> dict:
    """A pretrained-looking AdamW state (step 1000, random moments) as torch writes it."""
    gen = torch.Generator().manual_seed(seed)
    opt = inner_optimizer(net, 0.03, None)
    for p in net.parameters():
        opt.state[p] = {"step": torch.tensor(1000.0), "exp_avg": torch.randn(p.shape, generator=gen, dtype=F64) * 1e-2,
                        "exp_avg_sq": torch.rand(p.shape, generator=gen, dtype=F64) * 1e-3}
    return opt.state_dict()


@pytest.mark.parametrize("clip_norm", [None, 300.0])
def test_compiled_finetune_equals_torch_adamw_loop(user8_lstm, clip_norm, monkeypatch):
    """The LSTM's whole fine-tune in one compiled call equals the same recipe stepped in torch (finetune's "cards"
    layout: the same groups of whole cards every pass, torch.optim.AdamW loaded with the pretraining state, the
    piecewise-linear lr, loss mean·B^1.2103 + the pull towards the start, clip_grad_norm_). With the recipe's clip
    norm (7050) the norm stays under it here; lowered to 300, clipping bites on about a third of the steps."""
    if clip_norm is not None:
        monkeypatch.setitem(lstm.FINETUNE, "clip_norm", clip_norm)
    clipped = []
    clip = torch.nn.utils.clip_grad_norm_

    def spy(params, max_norm):
        norm = clip(params, max_norm)
        clipped.append(float(norm) > max_norm)
        return norm

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", spy)
    train = user8_lstm.subset(np.arange(1200))
    nets = []
    for layout in ("compiled", "cards"):
        net = net_for(8)
        finetune(net, train, opt_state_for(net, 3), layout=layout, batch_size=300)
        nets.append(net)
    assert len(clipped) == 80 and (sum(clipped) > 10 if clip_norm else not any(clipped))
    np.testing.assert_allclose(nets[0].theta(), nets[1].theta(), rtol=0, atol=1e-8)
    assert np.abs(nets[0].theta() - net_for(8).theta()).max() > 0.1


def test_compiled_reptile_equals_torch_inner_loop(user8_lstm, monkeypatch):
    """Reptile with each task's inner loop compiled equals the inner loop stepped by torch.optim.AdamW (anchored
    steps, the AdamW state carried from task to task): 4 outer steps over two "users" (halves of user 8), at most 2
    inner groups per task (groups of 300 targets, so the limit bites); the weights and the returned state."""
    monkeypatch.setattr(lstm_torch, "BATCH", 300)  # reptile reads it there
    monkeypatch.setitem(lstm.REPTILE, "inner_steps", 2)
    users = [user8_lstm.subset(np.arange(0, 900)), user8_lstm.subset(np.arange(900, 1800))]
    nets, states = [], []
    for compiled in (True, False):
        net = net_for(9)
        states.append(reptile(net, users, 4, compiled=compiled))
        nets.append(net)
    np.testing.assert_allclose(nets[0].theta(), nets[1].theta(), rtol=0, atol=1e-8)
    assert np.abs(nets[0].theta() - net_for(9).theta()).max() > 1e-3
    got, ref = lstm_torch.flat_opt_state(nets[0], states[0]), lstm_torch.flat_opt_state(nets[1], states[1])
    assert got[2] == ref[2] == 8  # 4 tasks × 2 inner steps
    np.testing.assert_allclose(got[0], ref[0], rtol=0, atol=1e-8)
    np.testing.assert_allclose(got[1], ref[1], rtol=1e-8, atol=1e-14)


def test_chunks_sharing_one_work_space_equal_cards_alone(user8_lstm):
    """lstm_cards_loss runs a call's chunks in one work space (lstm_kernels.workspace): nothing of a chunk may leak
    into the next. The cards in one call (chunks of falling sizes: longest cards first) against each card in a call
    of its own (a fresh work space each): the same P(recall) per target, loss and gradient (up to the order in which
    the gradient's sums are added)."""
    net = net_for(6)
    data = user8_lstm
    cards = CardSet(net, data, data.rows["seq_pos"].to_numpy() <= 64)
    layout, theta, model = cards.layout(), net.theta(), net.model_consts()
    order = np.argsort(-cards.c_steps, kind="stable")  # longest first: the first chunk is the largest
    assert cards.c_steps.sum() > 3 * lstm_kernels.CHUNK_STEPS
    n_t = len(cards.t_dt)
    p_all, g_all = np.full(n_t, np.nan), np.zeros(lstm_kernels.N_PARAMS)
    loss_all = lstm_kernels.lstm_cards_loss(model, layout, order, theta, True, g_all, p_all)
    p_one, g_one, loss_one = np.full(n_t, np.nan), np.zeros(lstm_kernels.N_PARAMS), 0.0
    for c in order:
        loss_one += lstm_kernels.lstm_cards_loss(model, layout, order[c == order], theta, True, g_one, p_one)
    np.testing.assert_allclose(p_all, p_one, rtol=1e-13, atol=0)
    np.testing.assert_allclose(loss_all, loss_one, rtol=1e-12)
    np.testing.assert_allclose(g_all, g_one, rtol=1e-10, atol=1e-12 * np.abs(g_one).max())
    p_pred = np.full(n_t, np.nan)  # predictions only: same P(recall), the gradient left alone
    g_none = np.zeros(lstm_kernels.N_PARAMS)
    assert lstm_kernels.lstm_cards_loss(model, layout, order, theta, False, g_none, p_pred) == loss_all
    np.testing.assert_array_equal(p_pred, p_all)
    assert not g_none.any()
