"""The LSTM kernels' elementwise layers (models/lstm_kernels.py: silu, silu_back, add), which run over their arrays
flat, on the views chunk_loss hands them (row prefixes of the shared work space), against numpy's formulas in float64
(the whole network is held to torch autograd in tests/test_lstm_compiled.py)."""

from __future__ import annotations

import numpy as np
import pytest

from models import lstm_kernels as K


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
    K.add(a, gy, y)
    np.testing.assert_allclose(y, a64 + gy64, rtol=tol, atol=tol)
    assert (w20[2:5, n:] == 123.0).all()

