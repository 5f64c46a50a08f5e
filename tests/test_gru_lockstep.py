"""The GRU family's lockstep kernels (neural/gru_kernels.py) and the array exp/sigmoid/tanh they use
(engine/vec_math.py): the functions against the C library's, each card's states independent of the cards it runs
beside, and the recurrence with its reverse pass against torch's nn.GRU in float64."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from neural.gru_kernels import _gru_forward, _weight_grads
from engine.kernel_math import lockstep_plan
from neural.gru_torch import gru_sequences
from engine.vec_math import exp_vec, sigmoid_vec, tanh_vec


def ulps(got, want):
    """|got − want| in units of want's last place (0 where equal, NaN and infinities included)."""
    got, want = np.asarray(got), np.asarray(want)
    same = (got == want) | (np.isnan(got) & np.isnan(want))
    spacing = np.spacing(np.abs(np.where(np.isfinite(want), want, 0.0)))
    with np.errstate(invalid="ignore"):
        return np.where(same, 0.0, np.abs(got - want) / np.maximum(spacing, 5e-324))


def run(fn, x):
    x = np.asarray(x, dtype=np.float64)
    out = np.empty_like(x)
    fn(x, out)
    return out


@pytest.mark.parametrize("lo,hi", [(-1.0, 1.0), (-40.0, 40.0), (-745.0, 709.7), (-1e-8, 1e-8)])
def test_vec_math_within_a_few_ulp_of_libm(lo, hi):
    x = np.random.default_rng(7).uniform(lo, hi, 200_000)
    with np.errstate(over="ignore"):
        assert ulps(run(exp_vec, x), np.exp(x)).max() <= 1
        assert ulps(run(sigmoid_vec, x), 1.0 / (1.0 + np.exp(-x))).max() <= 4
    assert ulps(run(tanh_vec, x), np.tanh(x)).max() <= 3


def test_vec_math_edge_values_as_libm():
    x = [float("nan"), float("inf"), -float("inf"), 0.0, 800.0, -800.0, 709.7, -744.0, -708.5, 1e-300, 30.0]
    want_exp = [math.nan, math.inf, 0.0, 1.0, math.inf, 0.0] + [math.exp(v) for v in x[6:]]
    assert ulps(run(exp_vec, x), want_exp).max() <= 1  # the special values exactly
    np.testing.assert_array_equal(run(sigmoid_vec, x)[1:6], [1.0, 0.0, 0.5, 1.0, 0.0])
    assert math.isnan(run(sigmoid_vec, x)[0]) and math.isnan(run(tanh_vec, x)[0])
    np.testing.assert_array_equal(run(tanh_vec, x)[1:], [1.0, -1.0, 0.0, 1.0, -1.0, 1.0, -1.0, -1.0, 1e-300, 1.0])


def random_gru(H, F, seed):
    rng = np.random.default_rng(seed)
    return (rng.normal(0, 0.5, (3 * H, F)), rng.normal(0, 0.5, (3 * H, H)), rng.normal(0, 0.3, 3 * H),
            rng.normal(0, 0.3, 3 * H))


def lockstep_states(seqs, weights):
    """Each sequence's states [steps, H] from one lockstep run over all of them (zero start)."""
    w_ih, w_hh, b_ih, b_hh = weights
    H, F = w_hh.shape[1], w_ih.shape[1]
    order = np.argsort([-len(s) for s in seqs], kind="stable")
    A, base = lockstep_plan(np.array([len(seqs[c]) for c in order]))
    xs = np.empty(base[-1] * F)
    for c, s in enumerate(order):
        for k in range(len(seqs[s])):
            for f in range(F):
                xs[base[k] * F + f * A[k] + c] = seqs[s][k, f]
    hs, gates = np.empty(base[-1] * H), np.empty(base[-1] * 4 * H)
    _gru_forward(xs, A, base, np.zeros(H * A[0]), w_ih, w_hh, b_ih, b_hh, hs, gates)
    out = [None] * len(seqs)
    for c, s in enumerate(order):
        out[s] = np.array([[hs[base[k] * H + j * A[k] + c] for j in range(H)] for k in range(len(seqs[s]))])
    return out


@pytest.mark.parametrize("H", [8, 2])
def test_a_sequence_in_lockstep_equals_it_alone_bit_for_bit(H):
    """The lanes never mix: a card's states are the same to the last bit whatever cards share its group."""
    rng = np.random.default_rng(H)
    seqs = [np.column_stack([rng.exponential(20.0, n), rng.integers(1, 5, n)]).astype(float)
            for n in rng.integers(1, 40, 37)]
    weights = random_gru(H, 2, seed=H + 1)
    together = lockstep_states(seqs, weights)
    for s, states in zip(seqs, together):
        np.testing.assert_array_equal(states, lockstep_states([s], weights)[0])


@pytest.mark.parametrize("H", [8, 2])
def test_lockstep_forward_and_reverse_equal_nn_gru_float64(H):
    """Sequences of lengths 0..9 from random (non-zero) initial states: outputs, and the gradients of every weight
    and of h0 for a random loss, equal torch's own nn.GRU run on each sequence alone (GRU-P's 8 units and GRU's 2:
    each size is compiled on its own)."""
    torch.manual_seed(0)
    F = 2
    rnn = torch.nn.GRU(F, H).double()
    steps = np.array([3, 0, 9, 1, 9, 4, 7, 2], dtype=np.int64)
    L, C = int(steps.max()), len(steps)
    x = torch.randn(L, C, F, dtype=torch.float64) * 3
    h0 = torch.randn(C, H, dtype=torch.float64, requires_grad=True)
    g_out = torch.randn(L, C, H, dtype=torch.float64)
    mask = torch.as_tensor(np.arange(L)[:, None] < steps[None, :])[..., None]

    out = gru_sequences(rnn, x, steps, h0)
    (out * g_out).sum().backward()
    got = [p.grad.clone() for p in rnn.parameters()] + [h0.grad.clone()]
    rnn.zero_grad()
    h0.grad = None

    ref = torch.zeros(L, C, H, dtype=torch.float64)
    for c in range(C):
        if steps[c]:
            o, _ = rnn(x[:steps[c], c:c + 1], h0[c][None, None])
            ref[:steps[c], c] = o[:, 0]
    (ref * g_out).sum().backward()
    want = [p.grad for p in rnn.parameters()] + [h0.grad]
    torch.testing.assert_close(out * mask, ref * mask, rtol=0, atol=1e-14)
    assert float(out.detach()[~mask.expand_as(out)].abs().max()) == 0.0
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-13)


def test_weight_grads_are_the_sums_over_cells():
    """_weight_grads ADDS, per gate row, Σ over cells of the gate gradient (biases) and of it times each input and
    each previous state, as numpy's matrix products compute them."""
    H, F, S = 8, 2, 37
    rng = np.random.default_rng(3)
    d, xa, hp = rng.normal(size=(4 * H, S)), rng.normal(size=(F, S)), rng.normal(size=(H, S))
    start = [rng.normal(size=shape) for shape in ((3 * H, F), (3 * H, H), (3 * H,), (3 * H,))]
    gw_ih, gw_hh, gb_ih, gb_hh = (a.copy() for a in start)
    _weight_grads((0.0,) * H, (0.0,) * F, d.ravel(), S, xa.ravel(), hp.ravel(), gw_ih, gw_hh, gb_ih, gb_hh)
    rows_hh = np.r_[0:2 * H, 3 * H:4 * H]  # r, z and W_hn·h + b_hn: the hidden weights' gate gradients
    np.testing.assert_allclose(gw_ih, start[0] + d[:3 * H] @ xa.T, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(gw_hh, start[1] + d[rows_hh] @ hp.T, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(gb_ih, start[2] + d[:3 * H].sum(axis=1), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(gb_hh, start[3] + d[rows_hh].sum(axis=1), rtol=1e-12, atol=1e-12)


def test_only_the_gru_family_sizes_compile():
    w_ih, w_hh, b_ih, b_hh = random_gru(3, 2, seed=0)
    A, base = lockstep_plan(np.array([2]))
    with pytest.raises(ValueError, match="8 or 2 hidden units"):
        _gru_forward(np.zeros(4), A, base, np.zeros(3), w_ih, w_hh, b_ih, b_hh, np.empty(6), np.empty(24))


def test_each_row_hands_its_loss_its_own_hidden_size():
    """GRU-P's loss compiles for 8 units and GRU's for 2 (neural/gru_kernels.units_of: the size is the length of a
    tuple in the loss's model constants, a compile-time constant), and other sizes are refused as above."""
    from models.gru_p import GRUFlat, GRUPFlat
    from neural.gru_kernels import units_of

    for flat, hidden in ((GRUPFlat, 8), (GRUFlat, 2)):
        units = flat().model_consts()[1]
        assert units == (0.0,) * hidden and flat().n_hidden == hidden
    with pytest.raises(ValueError, match="8 or 2 hidden units"):
        units_of(4)
