"""The LSTM's compiled kernels in float32 (the default run's precision, models/lstm.py PRECISION) against the same
kernels in float64 (which tests/test_lstm_compiled.py holds equal to torch autograd): the float32 exponential, the
loss, predictions and gradient on a real batch, and a short fine-tune. Pretrained weights, embedded-check user 8."""

from __future__ import annotations

import numpy as np
import pytest

from models import lstm

from neural import lstm_kernels

from engine import vec_math
from neural.card_net import CardSet, read_weights


def flat_net(precision: str) -> lstm.LSTMFlat:
    net = lstm.LSTMFlat(read_weights("LSTM", "pretrain.py"))
    net.precision = precision
    return net


def test_exp32_is_float32_accurate():
    """exp32 against numpy's float64 exp over the clamped range: float32 arithmetic, relative error of a few ulps
    (float32's ulp is 6e−8 relative); beyond ±EXP_BOUND the bound's value."""
    x = np.concatenate([np.linspace(-45.0, 45.0, 200001), [-1e4, 0.0, 1e4]]).astype(np.float32)
    got = np.array([vec_math.exp32(v) for v in x])
    ref = np.exp(np.clip(x.astype(np.float64), -vec_math.EXP_BOUND, vec_math.EXP_BOUND))
    np.testing.assert_allclose(got, ref, rtol=4e-7, atol=0)


def test_float32_kernel_equals_float64_on_a_real_batch(user8_lstm):
    """One call of lstm_cards_loss over all of user 8's cards (pretrained weights), float32 against float64: every
    target's P(recall), the loss and the gradient agree to float32's precision."""
    data = user8_lstm
    keep = data.rows["seq_pos"].to_numpy() <= 64
    out = {}
    for precision in ("float64", "float32"):
        net = flat_net(precision)
        cards = CardSet(net, data, keep)
        p = np.full(len(cards.t_dt), np.nan)
        g = np.zeros(lstm_kernels.N_PARAMS)
        order = np.random.RandomState(1).permutation(cards.n_cards)
        loss = lstm_kernels.lstm_cards_loss(net.model_consts(), cards.layout(), order, net.theta(), True, g, p)
        out[precision] = loss, p, g
    (l64, p64, g64), (l32, p32, g32) = out["float64"], out["float32"]
    assert len(p64) > 1000 and not np.isnan(p32).any()
    np.testing.assert_allclose(p32, p64, rtol=0, atol=1e-6)  # measured: 8e−8
    assert l32 == pytest.approx(l64, rel=1e-6)
    np.testing.assert_allclose(g32, g64, rtol=0, atol=1e-5 * np.abs(g64).max())  # measured: 1.7e−7
    assert np.abs(g32 - g64).max() > 0  # really another precision


def test_float32_finetune_stays_close_to_float64(user8_lstm):
    """The whole compiled fine-tune (20 passes, AdamW, the recipe's lr schedule) on 1,200 rows of user 8 in groups
    of 300 targets, from the pretrained weights and optimizer state: the float32 weights end close to the float64
    ones, far closer than either is to the start."""
    train = lstm.equalized_train(user8_lstm.subset(np.arange(1200)))
    opt = lstm.read_opt_state("pretrain.py")
    thetas = {}
    for precision in ("float64", "float32"):
        net = flat_net(precision)
        lstm.finetune_compiled(net, train, opt, batch_size=300)
        thetas[precision] = net.theta()
    start = flat_net("float64").theta()
    moved = np.abs(thetas["float64"] - start).max()
    apart = np.abs(thetas["float32"] - thetas["float64"]).max()
    assert moved > 0.01
    assert apart < 1e-5 * moved  # measured: 4e−7 (one float32 rounding of the stored weights)


@pytest.mark.parametrize("precision", ["float64", "float32"])
def test_inputs_encoded_once_change_nothing(user8_lstm, precision):
    """The fine-tune hands the kernel its inputs encoded once (LSTMSpec.kernel_layout, lstm_kernels.encode_rows)
    instead of the raw (Δt, duration, rating) it encodes per chunk: the same loss, P(recall) and gradient bit for
    bit, and the encoded rows are the standardised logs and one-hot rating computed here with numpy."""
    data = user8_lstm
    net = flat_net(precision)
    cards = CardSet(net, data, data.rows["seq_pos"].to_numpy() <= 64)
    encoded = net.kernel_layout(cards)[0]
    assert encoded.dtype == np.dtype(precision)  # stored in the kernels' dtype (each value rounded once)
    tol = 1e-12 if precision == "float64" else 1e-7
    (m0, m1), (s0, s1) = net.normalisation()
    raw = cards.feats
    np.testing.assert_allclose(encoded[:, 0], (np.log(1e-5 + raw[:, 0]) - m0) / s0, rtol=tol, atol=tol)
    np.testing.assert_allclose(encoded[:, 1], (np.log(np.clip(raw[:, 1], 100, 60000)) - m1) / s1, rtol=tol,
                               atol=tol)
    np.testing.assert_array_equal(encoded[:, 2:], np.eye(4)[np.maximum(raw[:, 2].astype(int), 1) - 1])
    assert net.kernel_layout(cards)[0] is encoded  # kept on the CardSet
    order = np.random.RandomState(2).permutation(cards.n_cards)
    out = []
    for layout in (cards.layout(), net.kernel_layout(cards)):
        p = np.full(len(cards.t_dt), np.nan)
        g = np.zeros(lstm_kernels.N_PARAMS)
        out.append((lstm_kernels.lstm_cards_loss(net.model_consts(), layout, order, net.theta(), True, g, p), p, g))
    (l_raw, p_raw, g_raw), (l_enc, p_enc, g_enc) = out
    assert l_raw == l_enc
    np.testing.assert_array_equal(p_raw, p_enc)
    np.testing.assert_array_equal(g_raw, g_enc)


def test_plan_memo_reused_across_passes(user8_lstm):
    """The fine-tune's layout carries a memo of each card group's chunk plans (lstm_kernels.plan_memo, made when
    the card order repeats): filled on a group's first training call, reused by the next passes with the same loss,
    P(recall) and gradient bit for bit as without it; prediction calls (no gradient) leave it alone. Each plan
    packs exactly its cards' steps and targets."""
    data = user8_lstm
    net = flat_net("float32")
    cards = CardSet(net, data, data.rows["seq_pos"].to_numpy() <= 64)
    order = np.random.RandomState(3).permutation(cards.n_cards)
    groups = np.array_split(order, 3)
    plain, memo_layout = net.kernel_layout(cards), net.kernel_layout(cards, repeat=True)
    assert len(plain) == 10 and len(memo_layout) == 11 and len(memo_layout[10][0]) == 0
    model, theta = net.model_consts(), net.theta()

    def one_pass(layout):
        p, g, loss = np.full(len(cards.t_dt), np.nan), np.zeros(lstm_kernels.N_PARAMS), 0.0
        for grp in groups:
            loss += lstm_kernels.lstm_cards_loss(model, layout, grp, theta, True, g, p)
        return loss, p, g

    ref = one_pass(plain)
    for _ in range(2):  # the first pass fills the memo, the second reads it
        got = one_pass(memo_layout)
        assert got[0] == ref[0]
        np.testing.assert_array_equal(got[1], ref[1])
        np.testing.assert_array_equal(got[2], ref[2])
    keys, plans = memo_layout[10]
    assert len(keys) == 3 and all(np.array_equal(k, grp) for k, grp in zip(keys, groups))
    c_steps, c_tfirst, c_count = cards.layout()[2], cards.layout()[3], cards.layout()[4]
    for grp, grp_plans in zip(groups, plans):
        rows = sum(int(pl[1][len(pl[0])]) for pl in grp_plans)
        assert rows == c_steps[grp].sum() == sum(len(pl[2]) for pl in grp_plans)
        tj = np.sort(np.concatenate([pl[4] for pl in grp_plans]))
        np.testing.assert_array_equal(tj, np.sort(np.concatenate([np.arange(c_tfirst[c], c_tfirst[c] + c_count[c])
                                                                  for c in grp])))
        for bs, off, x0, tr, _, rd in grp_plans:
            assert (np.diff(rd) > 0).all() and tr.min() >= 0 and tr.max() < len(rd)
            np.testing.assert_array_equal(np.diff(off), bs)
    p = np.empty(len(cards.t_dt))
    lstm_kernels.lstm_cards_loss(model, memo_layout, order[:7], theta, False, np.zeros(0), p)
    assert len(keys) == 3  # a prediction call is not remembered


def test_fit_compiled_asks_for_the_memo_when_the_order_repeats(user8_lstm, monkeypatch):
    """CompiledNet.fit_compiled tells kernel_layout whether every epoch visits the cards in one order (the LSTM's
    fine-tune: np.tile of one permutation), which is when the memo pays."""
    data = user8_lstm
    net = flat_net("float32")
    cards = CardSet(net, data, data.rows["seq_pos"].to_numpy() <= 64)
    seen = []
    real = type(net).kernel_layout

    def spy(self, c, repeat=False):
        seen.append(repeat)
        return real(self, c, repeat)

    monkeypatch.setattr(type(net), "kernel_layout", spy)
    order = np.random.RandomState(4).permutation(cards.n_cards)
    recipe = lstm.finetune_recipe()
    net.fit_compiled(cards, np.tile(order, (2, 1)), 10_000, recipe)
    net.fit_compiled(cards, np.stack([order, order[::-1]]), 10_000, recipe)
    assert seen == [True, False]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_plan_memo_made_compiled_has_the_memos_types(dtype):
    """plan_memo's two lists come from a cached compiled maker (not numba's list constructor compiled in every
    process); they are empty typed lists of the item types the kernels' memo reads: int64 card arrays, and lists of
    (int64[::1], int64[::1], dtype[:, ::1], int64[::1] ×3) plans."""
    from numba import types

    keys, plans = lstm_kernels.plan_memo(dtype)
    ints = types.int64[::1]
    arr = getattr(types, np.dtype(dtype).name)[:, ::1]
    assert len(keys) == 0 and len(plans) == 0
    assert keys._list_type.item_type == ints
    assert plans._list_type.item_type == types.ListType(types.Tuple((ints, ints, arr, ints, ints, ints)))
    with pytest.raises(ValueError):
        lstm_kernels.plan_memo(np.int32)


@pytest.mark.parametrize("precision", ["float32", "float64"])
def test_predictions_on_the_finetunes_layout_equal_the_raw_layout_to_the_bit(user8_lstm, precision):
    """predict_compiled hands the kernel the fine-tune's layout (inputs encoded once, an empty plan memo:
    LSTMSpec.predict_layout), so predictions run the kernel the fine-tune compiled; on the raw layout the kernel
    encodes the inputs itself. Every target's P(recall) is the same to the bit, over all of user 8's cards in the
    prediction's groups."""
    net = flat_net(precision)
    cards = CardSet(net, user8_lstm, user8_lstm.rows["seq_pos"].to_numpy() <= 64)
    assert len(net.predict_layout(cards)) == len(cards.layout()) + 1  # the memo
    p = net.predict_compiled(cards, 512)
    theta, order = net.theta(), cards.card_order()
    raw = np.full(len(p), np.nan)
    for lo in range(0, len(order), 40):  # other groups than predict_compiled's: a target's value is its card's own
        lstm_kernels.lstm_cards_loss(net.model_consts(), cards.layout(), order[lo:lo + 40], theta, False,
                                     np.zeros(0), raw)
    assert len(p) > 1000 and np.isfinite(p).all()
    np.testing.assert_array_equal(p, raw)
