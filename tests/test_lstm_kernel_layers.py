"""The LSTM kernels' elementwise layers (neural/lstm_kernels.py: silu, silu_back and silu_back_ip, add), which
run over their arrays flat, on the views chunk_loss hands them (row prefixes of the shared work space), and the
products that add onto their outputs (dot_wt_acc, dot_acc, dot_tn_acc: BLAS with beta = 1), against numpy's formulas
in float64 (the whole network is held to torch autograd in tests/test_lstm_compiled.py)."""

from __future__ import annotations

import numpy as np
import pytest

from neural import lstm_kernels as K


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_elementwise_layers_on_workspace_views(dtype):
    rng = np.random.default_rng(7)
    w20 = K.workspace(50, dtype)[0]  # [N_W20, 50, H]; chunk_loss passes w20[k, :n]
    n = 37
    a, gy = w20[0, :n], w20[1, :n]
    a[:] = rng.normal(0, 3, (n, K.H))
    gy[:] = rng.normal(0, 1, (n, K.H))
    w20[2:5] = 123.0  # the rows past n and the other slots must stay untouched
    y, sg, ga = w20[2, :n], w20[3, :n], w20[4, :n]
    K.silu(a, y, sg)
    a64, gy64 = a.astype(np.float64), gy.astype(np.float64)
    s = 1.0 / (1.0 + np.exp(-a64))
    tol = 1e-13 if dtype == np.float64 else 2e-6
    np.testing.assert_allclose(sg, s, rtol=tol, atol=tol)
    np.testing.assert_allclose(y, a64 * s, rtol=tol, atol=tol)
    K.silu_back(a, sg, gy, ga)
    np.testing.assert_allclose(ga, gy64 * s * (1.0 + a64 * (1.0 - s)), rtol=4 * tol, atol=4 * tol)
    g = w20[5, :n]
    g[:] = gy
    K.silu_back_ip(a, sg, g)  # in place: the same values (the same operations)
    np.testing.assert_array_equal(g, ga)
    K.add(a, gy, y)
    np.testing.assert_allclose(y, a64 + gy64, rtol=tol, atol=tol)
    assert (w20[2:5, n:] == 123.0).all()



def product_operands(rng, dtype, w_shape):
    """x: 26 rows with a row stride of 2H (hu[:, H:] style), a weight matrix of w_shape, and out_all [30, 4H]."""
    wide = rng.normal(0, 1, (40, 2 * K.H)).astype(dtype)
    x = wide[3:29, K.H:]  # 26 rows, row stride 2H
    w = rng.normal(0, 1, w_shape).astype(dtype)
    return x, w, rng.normal(0, 1, (30, K.G4)).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_products_add_onto_their_outputs(dtype):
    """dot_wt_acc / dot_tn_acc (BLAS gemm with beta = 1) on row slices, one of them with a row stride wider than its
    columns (hu[:, H:] style): out += x·wᵀ and gw += gyᵀ·x, against float64 numpy; nothing outside the targets
    moves, and empty row ranges add nothing."""
    rng = np.random.default_rng(11)
    x, w, out_all = product_operands(rng, dtype, (K.G4, K.H))
    before = out_all.astype(np.float64)
    out = out_all[2:28]
    K.dot_wt_acc(x, w, out)
    expect = before.copy()
    expect[2:28] += x.astype(np.float64) @ w.astype(np.float64).T
    tol = 1e-12 if dtype == np.float64 else 2e-5
    np.testing.assert_allclose(out_all, expect, rtol=tol, atol=tol)
    K.dot_wt_acc(x[:0], w, out[:0])
    np.testing.assert_allclose(out_all, expect, rtol=tol, atol=tol)
    gy = rng.normal(0, 1, (26, K.G4)).astype(dtype)
    gw = rng.normal(0, 1, (K.G4, K.H)).astype(dtype)
    gw0 = gw.astype(np.float64)
    K.dot_tn_acc(gy, x, gw)
    np.testing.assert_allclose(gw, gw0 + gy.astype(np.float64).T @ x.astype(np.float64), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_transposed_and_blocked_products(dtype):
    """dot_acc (out += x·wt, wt a transposed weight matrix) on row slices, and dot_tn_acc over more rows than one
    of its small-matrix blocks (SMALL_MNK: [80, 40] summed over 700 rows goes in 3 blocks, the last one short, one
    operand with a wider row stride), against float64 numpy; nothing outside the targets moves."""
    rng = np.random.default_rng(13)
    x, wt, out_all = product_operands(rng, dtype, (K.H, K.G4))
    expect = out_all.astype(np.float64)
    K.dot_acc(x, wt, out_all[2:28])
    expect[2:28] += x.astype(np.float64) @ wt.astype(np.float64)
    tol = 1e-12 if dtype == np.float64 else 2e-5
    np.testing.assert_allclose(out_all, expect, rtol=tol, atol=tol)
    n = 700
    assert n > 2 * K.SMALL_MNK // (K.G4 * 2 * K.H)
    hu_all = rng.normal(0, 1, (n, 3 * K.H)).astype(dtype)
    hu = hu_all[:, :2 * K.H]  # row stride 3H
    dg = rng.normal(0, 1, (n, K.G4)).astype(dtype)
    gw = rng.normal(0, 1, (K.G4, 2 * K.H)).astype(dtype)
    gw0 = gw.astype(np.float64)
    K.dot_tn_acc(dg, hu, gw)
    tol = 1e-11 if dtype == np.float64 else 2e-4
    np.testing.assert_allclose(gw, gw0 + dg.astype(np.float64).T @ hu.astype(np.float64), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("has_beta, out", [(False, K.H), (True, K.G4)])
def test_layer_norm_and_its_parameter_gradients(dtype, has_beta, out):
    """layer_norm, then a layer z = y·wᵀ + b (out = 20: a linear; 80: an LSTM's input product), against torch
    autograd in float64: y, x̂, 1/σ, dL/dx (layer_norm_back) and the parameters' gradients dL/dw, dL/dγ, dL/dβ, which
    the kernel takes from the product over x̂ (ln_weight_grads; linear_ln_back for the linear), added onto what the
    gradient held. 39 rows: the four-row blocks end with a short one; the mean far from 0 (cancellation in x − μ)."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(17)
    n = 39
    w20 = K.workspace(n, dtype)[0]
    x, y, xh, gy, gx = w20[0, :n], w20[1, :n], w20[2, :n], w20[3, :n], w20[4, :n]
    x[:] = rng.normal(3.0, 0.7, (n, K.H))
    gamma, beta = rng.normal(1, 0.3, K.H).astype(dtype), rng.normal(0, 0.3, K.H).astype(dtype)
    w, b = rng.normal(0, 0.4, (out, K.H)).astype(dtype), rng.normal(0, 0.1, out).astype(dtype)
    gz = rng.normal(0, 1, (n, out)).astype(dtype)  # dL/dz
    rstd = np.empty(n, dtype)
    K.layer_norm(x, gamma, beta, has_beta, y, xh, rstd)

    t = {k: torch.tensor(v.astype(np.float64), requires_grad=True) for k, v in
         (("x", x), ("gamma", gamma), ("beta", beta), ("w", w), ("b", b))}
    t_y = torch.nn.functional.layer_norm(t["x"], (K.H,), t["gamma"], t["beta"] if has_beta else None, eps=K.LN_EPS)
    t_y.retain_grad()
    (torch.nn.functional.linear(t_y, t["w"], t["b"]) * torch.tensor(gz.astype(np.float64))).sum().backward()
    mu, var = x.astype(np.float64).mean(1, keepdims=True), x.astype(np.float64).var(1, keepdims=True)
    tol = 1e-12 if dtype == np.float64 else 2e-5
    np.testing.assert_allclose(y, t_y.detach().numpy(), rtol=tol, atol=tol)
    np.testing.assert_allclose(xh, (x - mu) / np.sqrt(var + K.LN_EPS), rtol=tol, atol=tol)
    np.testing.assert_allclose(rstd, 1.0 / np.sqrt(var[:, 0] + K.LN_EPS), rtol=tol, atol=tol)

    held = rng.normal(0, 1, 4).astype(dtype)  # what the gradient held before: the kernels add onto it
    gw, gb, gg, gbeta = (np.full(s, v, dtype) for s, v in zip(((out, K.H), out, K.H, K.H), held))
    if out == K.H and not has_beta:
        gyl = w20[5, :n]
        K.linear_ln_back(xh, gamma, w, gz, gw, gb, gg, gyl)
        np.testing.assert_allclose(gyl, t_y.grad.numpy(), rtol=tol, atol=tol)
        np.testing.assert_allclose(gb, held[1] + t["b"].grad.numpy(), rtol=tol, atol=tol)
    else:
        gyl = gz @ w  # dL/dy as the LSTM's reverse hands it over (gu)
        g, gbias = (gz.T @ xh).astype(dtype), gz.sum(0).astype(dtype)
        K.ln_weight_grads(g, gbias, gamma, beta, has_beta, w, gw, gg, gbeta)
    np.testing.assert_allclose(gw, held[0] + t["w"].grad.numpy(), rtol=tol, atol=tol * 10)
    np.testing.assert_allclose(gg, held[2] + t["gamma"].grad.numpy(), rtol=tol, atol=tol * 10)
    if has_beta:
        np.testing.assert_allclose(gbeta, held[3] + t["beta"].grad.numpy(), rtol=tol, atol=tol * 10)
    gy[:] = gyl
    K.layer_norm_back(xh, rstd, gamma, gy, gx, False)
    np.testing.assert_allclose(gx, t["x"].grad.numpy(), rtol=tol, atol=tol * 10)


def test_stable_argsort_small_is_numpys_stable_argsort():
    """The chunks' card order (kernel_math.stable_argsort_small, a counting sort) against numpy's stable argsort,
    ascending and descending, on lengths with many ties, empty and single-key inputs."""
    from engine.kernel_math import stable_argsort_small

    rng = np.random.default_rng(3)
    cases = [np.zeros(0, np.int64), np.array([5]), np.full(9, 2)]
    cases += [rng.integers(0, int(rng.integers(1, 70)), int(rng.integers(1, 600))) for _ in range(50)]
    for keys in cases:
        np.testing.assert_array_equal(stable_argsort_small(keys, False), np.argsort(keys, kind="stable"))
        np.testing.assert_array_equal(stable_argsort_small(keys, True), np.argsort(-keys, kind="stable"))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_row_gather_and_scatter_on_workspace_views(dtype):
    """gather_rows / scatter_rows (v2 at the read rows, dL/dv2 back to them) against numpy's fancy indexing, on
    work-space views as chunk_loss passes them (rows in increasing order, a prefix of a longer index array cut to
    length); the rows not named and the other slots stay untouched."""
    rng = np.random.default_rng(11)
    w20 = K.workspace(60, dtype)[0]
    n = 41
    src = w20[0, :n]
    src[:] = rng.normal(0, 1, (n, K.H))
    rd = np.full(n, -1, np.int64)  # as chunk_loss's rd: the read rows first, cut to their count
    rd[:17] = np.sort(rng.choice(n, 17, replace=False))
    rows = rd[:17]
    w20[1:3] = -5.0
    out = w20[1, :len(rows)]
    K.gather_rows(src, rows, out)
    np.testing.assert_array_equal(out, src[rows])
    assert (w20[1, len(rows):] == -5.0).all() and (w20[2] == -5.0).all()
    back = w20[2, :n]
    K.scatter_rows(out, rows, back)
    expect = np.full((n, K.H), -5.0, dtype)
    expect[rows] = src[rows]
    np.testing.assert_array_equal(back, expect)
    assert (w20[2, n:] == -5.0).all() and (w20[0, :n] == src).all()
