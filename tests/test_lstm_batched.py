"""The LSTM on the batched trainer (neural/lstm_batched.py): per task it must be the per-user Reptile-style
fine-tune (lstm.finetune_compiled in float64, and its torch twin finetune(layout="cards")) and its predictions, and
a `--batch-users 2` run must write the per-user run's result lines (both in float64: `--precision float64`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import models
import pipeline
from check_users import CHECK
from config import RunConfig
from models import lstm
from neural import lstm_batched, neural_seq
from neural.lstm_torch import finetune, flat_opt_state
from revlog_factory import write_user
from test_neural_batched import assert_cuda_equals_cpu, max_diff, no_per_user_fallback, run_rows

torch.set_num_threads(1)
BATCH = 100  # targets per group (the recipe's 16,384 would give these small tasks one group per pass)


def pretrained64():
    """The pretrained LSTM (float64 copy, the compiled kernels in float64) and the pretraining's optimizer state."""
    model = models.create(RunConfig(algo="LSTM", batch_users=2))  # batch_users > 1: the torch module
    model.net.double().precision = "float64"
    return model.net, model.opt_state


@pytest.fixture(scope="module")
def tasks(user8_lstm):
    """(train, test) of unequal sizes from user 8 (prefixes, as a fold's training rows are): 240, 150, 30 rows."""
    d = user8_lstm
    return [(d.subset(np.arange(n)), d.subset(np.arange(n, n + 150))) for n in (240, 150, 30)]


def fit_batched(trains, **kw):
    net, state = pretrained64()
    return lstm_batched.fit_tasks(net, trains, flat_opt_state(net, state), batch_size=BATCH, **kw)


def params_of(net) -> dict:
    return {k: v.detach() for k, v in net.named_parameters()}


def per_user(train, layout):
    net, state = pretrained64()
    finetune(net, lstm.equalized_train(train), state, layout=layout, batch_size=BATCH)
    return net


def test_batched_tasks_equal_per_user_finetune(tasks):
    """Each task of one batched pass ends with the weights and predictions of the per-user fine-tune alone: the
    compiled loop (the default path, here in float64) and, for one task, the same recipe stepped by
    torch.optim.AdamW."""
    stacked = fit_batched([tr for tr, _ in tasks])
    preds = stacked.predict([te for _, te in tasks])
    worst_w = worst_p = 0.0
    for i, (train, test) in enumerate(tasks):
        for layout in ("compiled", "cards") if i == 1 else ("compiled",):
            net = per_user(train, layout)
            assert max_diff(net.state_dict(), pretrained64()[0].state_dict()) > 1e-3  # it did train
            worst_w = max(worst_w, max_diff(stacked.state_dict(i), params_of(net)))
            worst_p = max(worst_p, float(np.abs(preds[i] - neural_seq.predict_cards(net, test)).max()))
    print(f"LSTM: max |Δweight| {worst_w:.2e}, max |Δp| {worst_p:.2e}")  # measured ~1e-15 both
    assert worst_w < 1e-10 and worst_p < 1e-10


def test_clipping_per_task(tasks, monkeypatch):
    """With the clip norm lowered until it bites, each task's gradient is clipped by its own norm, as
    clip_grad_norm_ on that task alone (torch reference)."""
    trains = [tasks[0][0], tasks[2][0]]
    free = fit_batched(trains)
    monkeypatch.setitem(lstm.FINETUNE, "clip_norm", 5.0)
    clipped = fit_batched(trains)
    for i, train in enumerate(trains):
        assert max_diff(free.state_dict(i), clipped.state_dict(i)) > 1e-4  # clipping changed the result
        assert max_diff(clipped.state_dict(i), params_of(per_user(train, "cards"))) < 1e-10


def test_one_task_alone_equals_tasks_together(tasks):
    trains = [tr for tr, _ in tasks]
    together = fit_batched(trains)
    alone = fit_batched([trains[1]])
    assert max_diff(together.state_dict(1), alone.state_dict(0)) < 1e-12
    split = fit_batched(trains, max_elems=1)  # every task its own forward/backward pass
    for i in range(len(trains)):
        assert max_diff(together.state_dict(i), split.state_dict(i)) < 1e-12


def test_run_batched_equals_per_user(tmp_path, monkeypatch):
    """`--batch-users 2 --device cpu` writes the per-user run's lines (both `--precision float64`): same users and
    sizes, every metric to 1e-9. Users 8 and 12 cut to their first 1,000 reviews, to stay fast."""
    root = tmp_path / "data"
    for user in (8, 12):
        write_user(root, user, pd.read_parquet(Path(CHECK) / "revlogs" / f"user_id={user}").iloc[:1000])
    per_user_rows = run_rows(tmp_path, "per-user", algo="LSTM", data=root, precision="float64")
    monkeypatch.setattr(pipeline, "evaluate_user", no_per_user_fallback)
    batched = run_rows(tmp_path, "batched", algo="LSTM", data=root, precision="float64", batch_users=2,
                       device="cpu")
    assert [r["user"] for r in batched] == [r["user"] for r in per_user_rows] and len(batched) == 2
    for a, b in zip(batched, per_user_rows):
        assert a["size"] == b["size"] > 100 and set(a) == set(b) and set(a["metrics"]) == set(b["metrics"])
        for k in a["metrics"]:
            assert a["metrics"][k] == pytest.approx(b["metrics"][k], abs=1e-9)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_tasks_equal_cpu_lstm(tasks):
    assert_cuda_equals_cpu(fit_batched, tasks)
