"""The engine's STEP-TARGET section (engine/seq_engine_kernels.py) on a hand-written plug-in: a model that defines
step_target / step_target_vjp gets the loss and gradient of the plain card loop (the same model without them) and
of a direct per-target replay in Python, whose gradient is taken by central differences."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).parent))  # the plug-ins are imported by name by the generated engine

from models.base import ReviewData  # noqa: E402
from engine.seq_engine import SeqEngine  # noqa: E402

W = np.array([1.5, 2.0, 4.0, 9.0, 1.3, 2.1, 0.6])  # S ≥ 1 and t ≤ 21: p(1 − p) stays above BCE_GRAD_EPS


def _data(seed: int = 3, n_cards: int = 60) -> ReviewData:
    """Random cards; every review after the first is a target whose delta_t is its own review's elapsed time
    (fused with the step), except every fourth, whose delta_t is moved off it (target_loss_vjp instead)."""
    rng = np.random.default_rng(seed)
    seq_dt, seq_g, rows = [], [], []
    for c in range(n_cards):
        n = int(rng.integers(1, 9))
        start = len(seq_dt)
        for k in range(n):
            seq_dt.append(0.0 if k == 0 else float(rng.integers(1, 15)))
            seq_g.append(int(rng.integers(1, 5)))
            if k >= 1:
                dt = seq_dt[-1] if len(rows) % 4 else seq_dt[-1] * 1.5 + 0.25
                rows.append((c, dt, int(rng.random() < 0.8), start, k))
    frame = pd.DataFrame(rows, columns=["card_id", "delta_t", "y", "seq_start", "seq_pos"])
    return ReviewData(frame, np.array(seq_dt), np.array(seq_g, dtype=np.int8))


def _replay_loss(w, data: ReviewData, weights) -> float:
    """Σ weight·BCE, each target replayed from its card's first review (no engine)."""
    total = 0.0
    for i, r in enumerate(data.rows.itertuples(index=False)):
        s = w[data.seq_rating[r.seq_start] - 1]
        for k in range(1, r.seq_pos):
            t, g = data.seq_delta_t[r.seq_start + k], data.seq_rating[r.seq_start + k]
            rr = math.exp(-t / s)
            s = s * (w[4] + w[5] * (1 - rr)) if g > 1 else w[6] * s + 1
        p = math.exp(-r.delta_t / s)
        total -= weights[i] * (math.log(p) if r.y else math.log1p(-p))
    return total


def test_fused_loop_equals_plain_loop_and_replay():
    data = _data()
    weights = np.random.default_rng(5).uniform(0.5, 1.5, len(data))
    lower, upper = np.full(len(W), 1e-3), np.full(len(W), 100.0)
    fused = SeqEngine("step_target_plugin", lower, upper)
    plain = SeqEngine("step_target_plugin_plain", lower, upper)
    assert hasattr(fused.k, "same_time") and not hasattr(plain.k, "same_time")  # each took its section
    loss, grad = fused.loss_and_grad(W, data, weights=weights)
    loss_plain, grad_plain = plain.loss_and_grad(W, data, weights=weights)
    assert loss == pytest.approx(loss_plain, rel=1e-13)
    np.testing.assert_allclose(grad, grad_plain, rtol=1e-12, atol=0)
    assert loss == pytest.approx(_replay_loss(W, data, weights), rel=1e-12)
    for j in range(len(W)):
        h = 1e-6 * W[j]
        up, down = W.copy(), W.copy()
        up[j] += h
        down[j] -= h
        fd = (_replay_loss(up, data, weights) - _replay_loss(down, data, weights)) / (2 * h)
        assert grad[j] == pytest.approx(fd, rel=1e-6, abs=1e-8)
    # training reads the same card loop: the same weights either way, to rounding
    w_fused = fused.fit(W, data, None, keep_last=True)
    w_plain = plain.fit(W, data, None, keep_last=True)
    np.testing.assert_allclose(w_fused, w_plain, rtol=1e-10)
    np.testing.assert_allclose(fused.predict(W, data), plain.predict(W, data), rtol=0, atol=0)


def test_edited_plugin_gets_a_fresh_engine_copy(tmp_path, monkeypatch):
    """A plug-in outside models/ is not covered by the cache folder's name (models/__init__.py): its engine copy
    carries a digest of the plug-in's file, so an edited plug-in is bound into a new copy (compiled afresh), not the
    copy whose cached machine code inlined its old functions. Nothing is compiled here."""
    from engine import seq_engine

    source = (Path(__file__).parent / "step_target_plugin.py").read_text(encoding="utf-8")
    plugin = tmp_path / "digest_probe_plugin.py"
    plugin.write_text(source, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    names = []
    try:
        for text in (source, source, source.replace("N_ADJ = 1", "N_ADJ = 1  # edited")):
            plugin.write_text(text, encoding="utf-8")
            seq_engine._INSTANCES.pop(("digest_probe_plugin", False), None)
            sys.modules.pop("digest_probe_plugin", None)
            names.append(seq_engine.instantiate("digest_probe_plugin").__name__)
    finally:
        seq_engine._INSTANCES.pop(("digest_probe_plugin", False), None)
        sys.modules.pop("digest_probe_plugin", None)
    assert names[0] == names[1]  # same plug-in: the same copy (compiled once, reused)
    assert names[0] != names[2]  # edited plug-in: another copy
