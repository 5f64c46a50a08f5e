"""The batched GRU-family trainer (neural/neural_batched.py) and the runner's batched path (`--batch-users`,
`--device`): per task it must be fit_cards + predict_cards, and a run must give the per-user path's results."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import pipeline
import runner
from check_users import CHECK
import upstream.training as training
from config import EMBEDDED_DATA, RunConfig
from data_loader import load_revlogs
from features import FeatureConfig, build_features
from neural import neural_batched, neural_seq
from models.gru_p import GRU, GRUP
from split import time_series_folds

torch.set_num_threads(1)

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
MODELS = {"GRU-P": GRUP, "GRU": GRU}


def check_tasks():
    """(train, test) of: folds 1 and 3 of user 8, fold 2 of user 12, and a tiny set (30 rows: one group)."""
    out = []
    for user, folds in ((8, (0, 2)), (12, (1,))):
        data = build_features(load_revlogs(CHECK, user), FeatureConfig())
        split = time_series_folds(len(data), 5)
        out += [(data.subset(split[k][0]), data.subset(split[k][1])) for k in folds]
    tiny = out[0][0].subset(np.arange(30))
    return out + [(tiny, out[0][1])]


@pytest.fixture(scope="module")
def tasks():
    return check_tasks()


def pretrained64(name: str):
    """The pretrained torch module (the batched trainer's network; a default per-user model holds a FlatNet)."""
    cls = MODELS[name]
    cfg = RunConfig(algo=name)
    return neural_seq.torch_net(cls.net_class, cls.weights_name(cfg), cls.pretrain_command(cfg)).double()


def max_diff(a: dict, b: dict) -> float:
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


def assert_cuda_equals_cpu(fit, tasks, tol: float = 1e-6) -> None:
    """The batched fit `fit(trains, device=...)` on CUDA against the CPU: every prediction (NaN where both are) and
    every task's weights within tol (the NN-17, LSTM and Transformer batched trainers' CUDA tests)."""
    trains, tests = [tr for tr, _ in tasks], [te for _, te in tasks]
    cpu, gpu = fit(trains), fit(trains, device="cuda")
    for a, b in zip(cpu.predict(tests), gpu.predict(tests)):
        assert np.array_equal(np.isnan(a), np.isnan(b)) and np.nanmax(np.abs(a - b)) < tol
    for i in range(len(trains)):
        assert max_diff(cpu.state_dict(i), gpu.state_dict(i)) < tol


# ----------------------------------------------------------------------------------------------- the trainer

def test_gru_step_equals_nn_gru():
    torch.manual_seed(0)
    T, N, n_f, H, steps = 3, 5, 2, 8, 7
    rnns = [torch.nn.GRU(n_f, H).double() for _ in range(T)]
    stack = lambda name: torch.stack([getattr(r, name).detach() for r in rnns])
    x = torch.randn(steps, T, N, n_f, dtype=torch.float64)
    h0 = torch.randn(T, N, H, dtype=torch.float64)
    h = h0
    for k in range(steps):
        h = neural_batched.gru_step(x[k], h, stack("weight_ih_l0"), stack("weight_hh_l0"), stack("bias_ih_l0"),
                                    stack("bias_hh_l0"))
    with torch.no_grad():
        ref = torch.stack([rnns[i](x[:, i], h0[i][None])[1][0] for i in range(T)])
    assert float((h - ref).abs().max()) < 1e-6


@pytest.mark.parametrize("name", ["GRU-P", "GRU"])
def test_batched_tasks_equal_fit_cards_alone(name, tasks):
    """Every task of one batched pass ends with the weights and predictions of fit_cards + predict_cards run on
    that task alone (float64 both sides)."""
    n_epoch = MODELS[name].n_epoch
    stacked = neural_batched.fit_tasks(pretrained64(name), [tr for tr, _ in tasks], n_epoch=n_epoch)
    preds = stacked.predict([te for _, te in tasks])
    worst_w = worst_p = 0.0
    for i, (train, test) in enumerate(tasks):
        net = pretrained64(name)
        neural_seq.fit_cards(net, train, n_epoch=n_epoch)
        assert max_diff(net.state_dict(), pretrained64(name).state_dict()) > 1e-3  # it did train
        worst_w = max(worst_w, max_diff(stacked.state_dict(i), net.state_dict()))
        worst_p = max(worst_p, float(np.abs(preds[i] - neural_seq.predict_cards(net, test)).max()))
    print(f"{name}: max |Δweight| {worst_w:.2e}, max |Δp| {worst_p:.2e}")
    assert worst_w < 1e-6 and worst_p < 1e-6


def per_target_reference(net, train, n_epoch: int, opt, after_step=None):
    """An independent reference for one task: the same groups of targets (fit_cards' schedule), each target's own
    padded history through the torch module's forward_batch, stepped by `opt` + CosineAnnealingLR in float64;
    after_step (e.g. a clipper) runs after every step. Returns net, trained in place."""
    cards = neural_seq.CardSet(net, train, train.rows["seq_pos"].to_numpy() <= 64)
    generator = torch.Generator().manual_seed(neural_seq.SHUFFLE_SEED)
    n_groups = len(cards.batches(512, np.arange(cards.n_cards)))
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=n_groups * n_epoch)
    for _ in range(n_epoch):
        for group in cards.batches(512, torch.randperm(cards.n_cards, generator=generator).numpy()):
            rows = train.subset(np.sort(group.t_row))
            (b,) = training.make_batches(rows, np.ones(len(rows)), len(rows), 64, dtype=torch.float64)
            opt.zero_grad()
            F.binary_cross_entropy(net.forward_batch(b), b.y, reduction="sum").backward()
            opt.step()
            sched.step()
            if after_step is not None:
                after_step()
    return net


def solo_by_hand(name: str, train, n_epoch: int):
    """per_target_reference for the GRU family: torch's nn.GRU, torch.optim.AdamW."""
    net = pretrained64(name)
    opt = torch.optim.AdamW(net.parameters(), lr=net.lr, weight_decay=net.wd)
    return per_target_reference(net, train, n_epoch, opt)


@pytest.mark.parametrize("name", ["GRU-P", "GRU"])
def test_batched_tasks_equal_per_target_nn_gru_reference(name, tasks):
    picked = [tasks[0], tasks[3]]  # a fold of user 8 and the tiny set
    n_epoch = MODELS[name].n_epoch
    stacked = neural_batched.fit_tasks(pretrained64(name), [tr for tr, _ in picked], n_epoch=n_epoch)
    for i, (train, _) in enumerate(picked):
        assert max_diff(stacked.state_dict(i), solo_by_hand(name, train, n_epoch).state_dict()) < 1e-6


def test_finished_task_keeps_its_solo_weights(tasks):
    """The tiny task has 1 group per epoch, the fold 5: once done it is masked (no weight or moment change), so it
    ends with the weights it gets when trained alone; and a masked step leaves a task bit for bit untouched."""
    big, tiny = tasks[1][0], tasks[3][0]
    together = neural_batched.fit_tasks(pretrained64("GRU"), [big, tiny], n_epoch=5)
    alone = neural_batched.fit_tasks(pretrained64("GRU"), [tiny], n_epoch=5)
    assert max_diff(together.state_dict(1), alone.state_dict(0)) < 1e-12
    # a step in which only task 0 is active, with a nonzero gradient everywhere
    params = [p.detach().clone() for p in together.params]
    opt = neural_batched.StackedAdamW(params, 1e-2, 1e-5, torch.tensor([4.0, 4.0], dtype=torch.float64))
    opt.m[0][1] += 0.5
    before = [(p[1].clone(), m[1].clone(), v[1].clone()) for p, m, v in zip(params, opt.m, opt.v)]
    for p in params:
        p.grad = torch.ones_like(p)
    opt.step(torch.tensor([0]))
    for (p0, m0, v0), p, m, v in zip(before, params, opt.m, opt.v):
        assert torch.equal(p[1], p0) and torch.equal(m[1], m0) and torch.equal(v[1], v0)
    assert not torch.equal(params[0][0], together.params[0][0])  # task 0 did step


def test_small_pass_budget_gives_the_same_result(tasks):
    """Splitting a step into several forward/backward passes (memory bound) changes nothing but rounding."""
    trains = [tr for tr, _ in tasks]
    whole = neural_batched.fit_tasks(pretrained64("GRU"), trains, n_epoch=2)
    split = neural_batched.fit_tasks(pretrained64("GRU"), trains, n_epoch=2, max_elems=1)
    for i in range(len(trains)):
        assert max_diff(whole.state_dict(i), split.state_dict(i)) < 1e-12


# ----------------------------------------------------------------------------------------------- the runner

def strip_time(path: Path) -> list[dict]:
    return [{k: v for k, v in obj.items() if k != "time_ms"} for obj in runner.read_results(path)[0]]


def run_rows(tmp_path: Path, tag: str, **kw) -> list[dict]:
    cfg = RunConfig(quiet=True, result_dir=tmp_path / tag, **{"processes": 1, **kw})
    assert runner.run(cfg).exit_code == 0
    return strip_time(tmp_path / tag / f"{cfg.name}.jsonl")


def no_per_user_fallback(*args):
    raise AssertionError("the batched path fell back to the per-user path")


@pytest.mark.parametrize("algo,data,flags", [("GRU-P", CHECK, {}), ("GRU", EMBEDDED_DATA, {}),
                                             ("GRU-P", CHECK, {"short": True, "recency": True})])
def test_run_batched_equals_per_user_and_is_deterministic(tmp_path, monkeypatch, algo, data, flags):
    if not Path(data).exists():
        pytest.skip(f"{data} not present")
    per_user = run_rows(tmp_path, "per-user", algo=algo, data=data, **flags)
    monkeypatch.setattr(pipeline, "evaluate_user", no_per_user_fallback)
    batched = run_rows(tmp_path, "batched", algo=algo, data=data, batch_users=3, device="cpu", **flags)
    assert batched == run_rows(tmp_path, "again", algo=algo, data=data, batch_users=3, device="cpu", **flags)
    assert [r["user"] for r in batched] == [r["user"] for r in per_user] and len(batched) >= 2
    for a, b in zip(batched, per_user):
        assert a["size"] == b["size"] and set(a) == set(b) and set(a["metrics"]) == set(b["metrics"])
        print(f"{algo} user {a['user']}: LogLoss per-user {b['metrics']['LogLoss']}, batched "
              f"{a['metrics']['LogLoss']}")
        for k in a["metrics"]:  # the batched path predicts with the per-user path's float32 weights
            assert a["metrics"][k] == pytest.approx(b["metrics"][k], abs=1e-9)


def test_run_batched_on_worker_processes_equals_in_process(tmp_path):
    """--processes 2: chunks go to two worker processes (the pool a run with --gpus uses, one worker per device)."""
    kw = dict(algo="GRU", data=EMBEDDED_DATA, batch_users=2, device="cpu")
    assert run_rows(tmp_path, "pool", processes=2, **kw) == run_rows(tmp_path, "here", processes=1, **kw)

def test_bad_user_does_not_sink_its_chunk():
    cfg = RunConfig(algo="GRU", processes=1, quiet=True)
    out = {o.user: o for o in runner.evaluate_chunk([8, 999999, 12], cfg, CHECK)}
    assert out[999999].error and out[999999].record is None
    for user in (8, 12):
        alone = runner.evaluate_user(user, cfg, CHECK)
        assert out[user].record["size"] == alone.record["size"]
        assert abs(out[user].record["metrics"]["LogLoss"] - alone.record["metrics"]["LogLoss"]) <= 1e-4


def test_failed_batched_pass_runs_its_users_one_by_one(monkeypatch):
    def broken(*args, **kw):
        raise RuntimeError("out of device memory")

    monkeypatch.setattr(neural_batched, "fit_predict", broken)
    cfg = RunConfig(algo="GRU", processes=1, quiet=True)
    (out,) = runner.evaluate_chunk([12], cfg, CHECK)
    assert out.record["metrics"] == runner.evaluate_user(12, cfg, CHECK).record["metrics"]


def test_per_user_fallbacks():
    assert runner.per_user_reason(RunConfig(algo="GRU-P")) is None
    assert runner.per_user_reason(RunConfig(algo="GRU", short=True)) is None
    assert runner.per_user_reason(RunConfig(algo="NN-17")) is None
    for algo in ("LSTM", "Transformer"):
        assert runner.per_user_reason(RunConfig(algo=algo)) is None
    assert "no batched trainer" in runner.per_user_reason(RunConfig(algo="FSRS-6"))
    for kw in ({"partitions": "deck"}, {"trainer": "upstream"}, {"default": True}, {"executor": "dask"}):
        assert runner.per_user_reason(RunConfig(algo="GRU-P", **kw))


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is present")
@pytest.mark.parametrize("flag", [["--device", "cuda"], ["--gpus", "0,1"]])
def test_cuda_without_cuda_exits_2(tmp_path, capsys, flag):
    code = runner.main(["--model", "GRU-P", "--data", str(EMBEDDED_DATA), "--result-dir", str(tmp_path / "r")] + flag,
                       "", "FSRS-6", None)
    err = capsys.readouterr().err
    assert code == 2 and "CUDA is not available" in err and err.count("\n") == 1
    assert not (tmp_path / "r").exists()  # before any work


# ----------------------------------------------------------------------------------------------- CUDA only

@needs_cuda
def test_cuda_tasks_equal_cpu(tasks):
    trains, tests = [tr for tr, _ in tasks], [te for _, te in tasks]
    cpu = neural_batched.fit_tasks(pretrained64("GRU-P"), trains, n_epoch=16)
    gpu = neural_batched.fit_tasks(pretrained64("GRU-P"), trains, n_epoch=16, device="cuda")
    for a, b in zip(cpu.predict(tests), gpu.predict(tests)):
        assert np.abs(a - b).max() < 1e-4
    for i in range(len(trains)):
        assert max_diff(cpu.state_dict(i), gpu.state_dict(i)) < 1e-4


@needs_cuda
def test_cuda_run_equals_cpu_run(tmp_path):
    cpu = run_rows(tmp_path, "cpu", algo="GRU-P", data=CHECK, batch_users=2, device="cpu")
    gpu = run_rows(tmp_path, "cuda", algo="GRU-P", data=CHECK, device="cuda")
    assert [r["size"] for r in cpu] == [r["size"] for r in gpu]
    for a, b in zip(cpu, gpu):
        assert abs(a["metrics"]["LogLoss"] - b["metrics"]["LogLoss"]) <= 1e-4

