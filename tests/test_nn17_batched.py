"""NN-17 on the batched trainer (neural/nn17_batched.py through neural_batched.fit_tasks): per task it must be the
per-user fine-tune (fit_cards, compiled, float64) and its predictions, and a `--batch-users 2` run must write the
per-user run's result lines."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import pipeline
from check_users import CHECK
from config import RunConfig
from neural import neural_batched, neural_seq
from models.nn17 import NN17
from neural.nn17_batched import StackedNN17
from test_neural_batched import (assert_cuda_equals_cpu, check_tasks, max_diff, no_per_user_fallback,
                                 per_target_reference, run_rows)

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tasks():
    return check_tasks()


def pretrained64():
    cfg = RunConfig(algo="NN-17")
    return neural_seq.torch_net(NN17.net_class, NN17.weights_name(cfg), NN17.pretrain_command(cfg)).double()


def fit_batched(trains, **kw):
    return neural_batched.fit_tasks(pretrained64(), trains, n_epoch=NN17.n_epoch, stacked=StackedNN17, **kw)


def test_batched_tasks_equal_compiled_fit_cards(tasks):
    """4 tasks of unequal sizes (745, 2227, 1224 and 30 rows) trained together: each ends with the weights and
    predictions of the per-user path (fit_cards' compiled loop + predict_cards, on a float64 copy of the net)."""
    stacked = fit_batched([tr for tr, _ in tasks])
    preds = stacked.predict([te for _, te in tasks])
    worst_w = worst_p = 0.0
    for i, (train, test) in enumerate(tasks):
        net = pretrained64()
        neural_seq.fit_cards(net, train, n_epoch=NN17.n_epoch)
        assert max_diff(net.state_dict(), pretrained64().state_dict()) > 1e-2  # it did train
        worst_w = max(worst_w, max_diff(stacked.state_dict(i), net.state_dict()))
        ref = neural_seq.predict_cards(net, test)
        assert np.array_equal(np.isnan(preds[i]), np.isnan(ref))
        worst_p = max(worst_p, float(np.nanmax(np.abs(preds[i] - ref))))
    print(f"NN-17: max |Δweight| {worst_w:.2e}, max |Δp| {worst_p:.2e}")  # measured 1.4e-14, 4.4e-16
    assert worst_w < 1e-10 and worst_p < 1e-10


def test_one_task_alone_equals_tasks_together(tasks):
    trains = [tr for tr, _ in tasks]
    together = fit_batched(trains)
    for i in (0, 3):
        alone = fit_batched([trains[i]])
        assert max_diff(together.state_dict(i), alone.state_dict(0)) < 1e-12
    split = fit_batched(trains, max_elems=1)  # every task its own forward/backward pass
    for i in range(len(trains)):
        assert max_diff(together.state_dict(i), split.state_dict(i)) < 1e-12


def test_batched_task_equals_per_target_torch_reference(tasks):
    """An independent reference: fit_cards' groups of targets, each target's own padded history through NN17Net's
    torch recurrence (forward_batch, upstream's layout), stepped by torch.optim.Adam + CosineAnnealingLR with the
    clipper after every step."""
    train = tasks[0][0]
    stacked = fit_batched([train])
    net = pretrained64()
    per_target_reference(net, train, NN17.n_epoch, torch.optim.Adam(net.parameters(), lr=net.lr),
                         after_step=net.clip_params_)
    assert max_diff(stacked.state_dict(0), net.state_dict()) < 1e-10


def test_clip_box_is_nn17s():
    stacked = StackedNN17(pretrained64(), 1)
    lower = {n: b[0] for n, b in zip(stacked.names, stacked.bounds()) if b is not None}
    assert set(lower) == {"S0", "D0", "sinc_w"}
    assert lower["S0"].tolist() == [0.01] * 4 and lower["sinc_w"].tolist() == [-5.0, 0.0, -5.0]


def test_run_batched_equals_per_user(tmp_path, monkeypatch):
    """`--batch-users 2 --device cpu` writes the per-user run's lines: same users and sizes, every metric to 1e-9
    (the batched path rounds its weights to float32 before predicting, as the per-user path stores them)."""
    per_user = run_rows(tmp_path, "per-user", algo="NN-17", data=CHECK)
    monkeypatch.setattr(pipeline, "evaluate_user", no_per_user_fallback)
    batched = run_rows(tmp_path, "batched", algo="NN-17", data=CHECK, batch_users=2, device="cpu")
    assert [r["user"] for r in batched] == [r["user"] for r in per_user] and len(batched) == 2
    for a, b in zip(batched, per_user):
        assert a["size"] == b["size"] and set(a) == set(b) and set(a["metrics"]) == set(b["metrics"])
        for k in a["metrics"]:
            assert a["metrics"][k] == pytest.approx(b["metrics"][k], abs=1e-9)


def test_chunk_of_a_per_user_config_runs_batched(monkeypatch):
    """evaluate_chunk with a config whose per-user model would be torch-free (batch_users unset, CPU), as
    bench/bench_gpu.py calls it: the batched pass builds the torch module itself and does not fall back."""
    import runner

    cfg = RunConfig(algo="NN-17", processes=1, quiet=True)
    alone = runner.evaluate_user(12, cfg, CHECK).record
    monkeypatch.setattr(pipeline, "evaluate_user", no_per_user_fallback)
    (out,) = runner.evaluate_chunk([12], cfg, CHECK)
    assert out.record["size"] == alone["size"] and out.record["metrics"] == alone["metrics"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_tasks_equal_cpu_nn17(tasks):
    assert_cuda_equals_cpu(fit_batched, tasks)
