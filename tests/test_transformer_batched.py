"""The Transformer on the batched trainer (neural/transformer_batched.py): per task it must be the per-user path
(transformer.fit_compiled + predict_compiled, float64, upstream's padded windows and dropout masks), and a
`--batch-users 2` run must write the per-user run's result lines."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import pipeline
from check_users import CHECK
from config import RunConfig
from neural import transformer_batched
from neural.neural_batched import torch_model
from upstream.torch_rng import BernoulliStream, portable_bernoulli
from models.transformer import Transformer, draw_masks, fit_compiled, predict_compiled
from test_neural_batched import assert_cuda_equals_cpu, check_tasks, max_diff, no_per_user_fallback, run_rows

torch.set_num_threads(1)
CFG = RunConfig(algo="Transformer")


@pytest.fixture(scope="module")
def tasks():
    return check_tasks()


def fit_batched(trains, **kw):
    return transformer_batched.fit_tasks(torch_model(CFG).net, trains, [np.ones(len(tr)) for tr in trains],
                                         n_epoch=Transformer.n_epoch, **kw)


def test_batched_tasks_equal_compiled_per_user_fit(tasks):
    """4 tasks (745, 2227, 1224 and 30 rows; windows of unequal lengths and batch counts) trained together: each
    ends with the weights and predictions of the per-user compiled fit alone (its own windows, batch order and
    dropout masks), although the tasks' windows are padded to a common length in the stacked tensors."""
    stacked = fit_batched([tr for tr, _ in tasks])
    preds = stacked.predict([te for _, te in tasks])
    worst_w = worst_p = 0.0
    for i, (train, test) in enumerate(tasks):
        model = Transformer(CFG)
        fit_compiled(model.net, train, CFG, n_epoch=Transformer.n_epoch)
        theta = model.net.theta()
        assert np.abs(theta - Transformer(CFG).net.theta()).max() > 1e-2  # it did train
        mine = np.concatenate([stacked.state_dict(i)[n].numpy().ravel() for n in stacked.names])
        worst_w = max(worst_w, float(np.abs(mine - theta).max()))
        worst_p = max(worst_p, float(np.abs(preds[i] - predict_compiled(model.net, test)).max()))
    print(f"Transformer: max |Δweight| {worst_w:.2e}, max |Δp| {worst_p:.2e}")  # measured 1.2e-11, 5.6e-16
    assert worst_w < 1e-10 and worst_p < 1e-10


def test_one_task_alone_equals_tasks_together(tasks):
    trains = [tr for tr, _ in tasks]
    together = fit_batched(trains)
    for i in (0, 3):
        assert max_diff(together.state_dict(i), fit_batched([trains[i]]).state_dict(0)) < 1e-10
    split = fit_batched(trains, max_elems=1)  # every task its own forward/backward pass
    for i in range(len(trains)):
        assert max_diff(together.state_dict(i), split.state_dict(i)) < 1e-10


def test_each_task_draws_its_own_masks(monkeypatch):
    """A task's masks are the draws of its own generator seeded 42, whichever way they are drawn: the emulated
    stream, or torch's default generator with the task's state swapped in (which leaves the caller's generator
    where it was)."""
    shapes = [(5, 3), (2, 7), (5, 3)]
    expected = []
    stream = BernoulliStream(42)
    for L, B in shapes:
        expected.append(draw_masks(L, B, stream))
    sources = [transformer_batched.MaskSource(), transformer_batched.MaskSource()]
    for n, (L, B) in enumerate(shapes):  # two tasks drawing in turn do not disturb each other
        for src in sources:
            assert all(np.array_equal(a, b) for a, b in zip(src.draw(L, B), expected[n]))
    if not portable_bernoulli():
        pytest.skip("torch's draws are MKL's here: the emulated stream is not the reference")
    monkeypatch.setattr(transformer_batched, "portable_bernoulli", lambda: False)
    torch.manual_seed(7)
    before = torch.get_rng_state()
    src = transformer_batched.MaskSource()
    got = [src.draw(L, B) for L, B in shapes]
    assert torch.equal(torch.get_rng_state(), before)
    for g, e in zip(got, expected):
        assert all(np.array_equal(a, b) for a, b in zip(g, e))


def test_run_batched_equals_per_user(tmp_path, monkeypatch):
    """`--batch-users 2 --device cpu` writes the per-user run's lines: same users and sizes, every metric to 1e-9
    except AUC, to 1e-4: this model's predictions take few distinct values up to ~1e-15 (models/transformer.py),
    so a change of summation order reorders near-ties (measured: AUC 0.480055 / 0.480063 and 0.353231 / 0.353250,
    every other metric equal)."""
    per_user = run_rows(tmp_path, "per-user", algo="Transformer", data=CHECK)
    monkeypatch.setattr(pipeline, "evaluate_user", no_per_user_fallback)
    batched = run_rows(tmp_path, "batched", algo="Transformer", data=CHECK, batch_users=2, device="cpu")
    assert [r["user"] for r in batched] == [r["user"] for r in per_user] and len(batched) == 2
    for a, b in zip(batched, per_user):
        assert a["size"] == b["size"] and set(a) == set(b) and set(a["metrics"]) == set(b["metrics"])
        for k in a["metrics"]:
            assert a["metrics"][k] == pytest.approx(b["metrics"][k], abs=1e-4 if k == "AUC" else 1e-9)


def test_diverged_task_sends_its_chunk_to_the_per_user_path(monkeypatch):
    """A final loss that evaluates NaN: the per-user rule (check_diverged) decides, so the chunk runs per user."""
    import runner

    monkeypatch.setattr(transformer_batched.StackedTransformer, "eval_losses",
                        lambda self, windows: np.full(len(windows), np.nan))
    called = []
    per_user = pipeline.evaluate_user
    monkeypatch.setattr(pipeline, "evaluate_user", lambda *a: called.append(a[0]) or per_user(*a))
    cfg = RunConfig(algo="Transformer", processes=1, quiet=True)
    (out,) = runner.evaluate_chunk([12], cfg, CHECK)
    assert called == [12] and out.record["size"] == 3055


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_tasks_equal_cpu_transformer(tasks):
    assert_cuda_equals_cpu(fit_batched, tasks)
