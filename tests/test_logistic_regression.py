"""LogisticRegression (models/logistic_regression.py): its 34 inputs and prediction by hand on a 4-review card,
training on a real user, and the upstream-check sizes (its built-in --secs --equalize_test_with_non_secs: the
day-mode test reviews)."""

import math

import numpy as np

from check_users import CHECK, UPSTREAM
from config import RunConfig
from data_loader import load_revlogs
from features import FeatureConfig, build_features
import models.logistic_regression as lr_module
from models.logistic_regression import MEAN, STD, LogisticRegression, features, recency
from result_store import read_results
from revlog_factory import make_revlog
from runner import run

SECS = FeatureConfig(short=True, secs=True, equalize=True)


def g(x):
    return (math.log(x + 1e-5) + 1.3) / 5


def L(x):
    return math.log1p(x)


def test_inputs_and_prediction_by_hand():
    # card 0: Good, Again 60 s later, Good 1 day (+120 s) later, Hard 2 days (+180 s) later; filler cards after it
    cards = [[(0, 3), (0, 1), (1, 3), (3, 2)]] + [[(0, 3), (1, 3), (5, 3)] for _ in range(5)]
    data = build_features(make_revlog(cards), SECS)
    x = features(data)
    mine = np.flatnonzero(data.rows["card_id"].to_numpy() == 0)
    e1, e2, e3 = 60 / 86400, 1 + 120 / 86400, 2 + 180 / 86400
    # target 1 (the same-day Again): previous review Good (its "interval" 0, same day), first target, label same-day
    deg1 = [1, 0, 1, 0, 0, 1, 0, 0, 0, 0]
    deg0 = [1, 0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 0, g(0), 0, 0, 0, 1, g(0), 1, g(0), 0, 0, L(1), 0]
    want1 = [v * g(e1) for v in deg1] + deg0
    # target 2 (day 1): previous review the same-day Again (a same-day fail; a lapse, so no time since it)
    deg1 = [1, 0, 0, 0, 0, 0, L(1), 0, 0, 0]
    deg0 = [1, 0, 0, 0, 0, 1, 0, 0, 0, 0, L(1), 0, g(e1), 0, 0, 0, 1, g(0), 0, g(e1), L(1), 0, L(2), 0]
    want2 = [v * g(e2) for v in deg1] + deg0
    # target 3 (day 3): previous review the day-1 Good (a long-term pass), time since the lapse e2
    deg1 = [1, 0, 1, 0, 0, 0, L(1), L(1), 0, 0]
    deg0 = [1, 0, 1, 0, 0, 1, 0, 0, 0, 0, L(1), L(1), g(e2), 0, L(1), 0, 1, g(e2), 0, g(e1 + e2), L(1), 0, L(2),
            L(1)]
    want3 = [v * g(e3) for v in deg1] + deg0
    np.testing.assert_allclose(x[mine], np.array([want1, want2, want3]), rtol=1e-12, atol=1e-15)
    # untrained: p = σ(x · mean)
    model = LogisticRegression(RunConfig(algo="LogisticRegression", default=True))
    p = model.predict(data.subset(mine))
    np.testing.assert_allclose(p, [1 / (1 + math.exp(-np.dot(w, MEAN))) for w in (want1, want2, want3)], rtol=1e-12)
    assert model.n_params == 0 and LogisticRegression(RunConfig(algo="LogisticRegression")).n_params == 34


def test_group_cumsum_is_pandas_grouped_cumsum_to_the_bit():
    """The compiled running sums against pandas' own `groupby(...).cumsum()` (what upstream's engineer calls):
    fractional times of very different sizes, NaN rows, groups of one; where a plain running sum rounds
    differently (pandas compensates), the compiled one still matches pandas."""
    import pandas as pd

    rng = np.random.default_rng(7)
    n = 4000
    v = rng.exponential(3.0, n) * rng.choice([1e-6, 1.0, 1e3], n)
    v[rng.random(n) < 0.01] = np.nan
    starts = rng.random(n) < 0.05
    starts[0] = True
    groups = np.cumsum(starts)
    ref = pd.Series(v).groupby(groups).cumsum().to_numpy()
    got = lr_module._group_cumsum(v, starts)
    assert np.array_equal(got, ref, equal_nan=True)
    plain = pd.Series(np.nan_to_num(v)).groupby(groups).transform(lambda s: np.cumsum(s.to_numpy())).to_numpy()
    finite = ~np.isnan(v)
    assert (plain[finite] != ref[finite]).any()  # the compensation matters on this data


def test_recency_weights():
    np.testing.assert_allclose(recency(5), [0.1, 0.1 + 0.9 / 256, 0.1 + 0.9 / 16, 0.1 + 0.9 * 81 / 256, 1.0])


def test_training_lowers_the_loss_on_a_real_user():
    data = build_features(load_revlogs(CHECK, 8), SECS)
    data = LogisticRegression.restrict_targets(data, CHECK, 8)
    train = data.subset(np.arange(int(len(data) * 0.8)))
    y = train.rows["y"].to_numpy()
    w = recency(len(train))

    def loss(p):
        return -np.sum(w * (y * np.log(p) + (1 - y) * np.log(1 - p))) / w.sum()

    start = LogisticRegression(RunConfig(algo="LogisticRegression"))
    fitted = LogisticRegression(RunConfig(algo="LogisticRegression")).fit(train)
    assert loss(fitted.predict(train)) < loss(start.predict(train)) - 1e-3
    assert len(fitted.parameters()) == 34


def torch_fit(x, y, weight, recipe):
    """The training loop as upstream writes it, in torch float64: AdamW, cosine annealing, randperm batches,
    autograd of Σ weight·BCE-with-logits (the reference for the numpy fit)."""
    import torch

    x, y, weight = (torch.as_tensor(a, dtype=torch.float64) for a in (x, y, weight))
    mean = torch.tensor(MEAN, dtype=torch.float64)
    std = torch.tensor(STD, dtype=torch.float64)
    theta = torch.zeros(34, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.AdamW([theta], lr=recipe["lr"], betas=recipe["betas"], eps=recipe["eps"],
                            weight_decay=recipe["weight_decay"])
    n, bs = len(y), recipe["batch_size"]
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=recipe["n_epoch"] * ((n + bs - 1) // bs))
    gen = torch.Generator().manual_seed(recipe["seed"])
    for _ in range(recipe["n_epoch"]):
        perm = torch.randperm(n, generator=gen)
        for lo in range(0, n, bs):
            b = perm[lo:lo + bs]
            loss = torch.nn.functional.binary_cross_entropy_with_logits(x[b] @ (theta * std + mean), y[b],
                                                                        reduction="none")
            opt.zero_grad()
            (loss * weight[b]).sum().backward()
            opt.step()
            sched.step()
    return theta.detach().numpy()


def test_numpy_fit_equals_torch_autograd_adamw():
    """The numpy fit (gradient by hand, adam_step, torch_rng's shuffles) against the same loop in torch float64 on
    a real user's training rows, 4 epochs of batches of 512 so the cosine schedule and reshuffles all act."""
    data = build_features(load_revlogs(CHECK, 8), SECS)
    data = LogisticRegression.restrict_targets(data, CHECK, 8)
    train = data.subset(np.arange(int(len(data) * 0.5)))
    recipe = dict(lr_module.RECIPE, n_epoch=4, batch_size=512)
    ref = torch_fit(LogisticRegression.inputs(train), train.rows["y"].to_numpy(np.float64), recency(len(train)),
                    recipe)
    saved = lr_module.RECIPE
    lr_module.RECIPE = recipe
    try:
        ours = LogisticRegression(RunConfig(algo="LogisticRegression")).fit(train).theta
    finally:
        lr_module.RECIPE = saved
    assert np.abs(ref).max() > 0.1  # it moved
    np.testing.assert_allclose(ours, ref, rtol=0, atol=1e-12)


def test_name_and_flags():
    cfg = RunConfig(algo="LogisticRegression")
    assert cfg.name == "LogisticRegression" and cfg.secs_mode and cfg.equalize_mode and cfg.include_short
    same = RunConfig(algo="LogisticRegression", short=True, secs=True, recency=True, equalize_test_with_non_secs=True)
    assert same.name == "LogisticRegression"


def test_upstream_check_sizes_are_the_day_mode_sizes(tmp_path):
    cfg = RunConfig(algo="LogisticRegression", data=CHECK, processes=1, result_dir=tmp_path, quiet=True)
    assert run(cfg).exit_code == 0
    lines, _ = read_results(tmp_path / "LogisticRegression.jsonl")
    assert len(lines) == 2
    for line in lines:
        assert line["size"] == UPSTREAM["FSRS-6"][str(line["user"])]["size"]
        assert 0 < line["metrics"]["LogLoss"] < 1 and len(line["parameters"]["0"]) == 34


def test_cli_on_one_embedded_user(tmp_path):
    """`other.py --model LogisticRegression` end to end on the embedded data; upstream's command line (its flags
    spelled out) writes the same result file."""
    import runner
    from config import EMBEDDED_DATA

    base = ["--data", str(EMBEDDED_DATA), "--users", "3", "--processes", "1", "--quiet"]
    assert runner.main(["--model", "LogisticRegression"] + base + ["--result-dir", str(tmp_path / "a")], "",
                       "FSRS-6", None) == 0
    upstream = ["--model", "LogisticRegression", "--short", "--secs", "--recency", "--equalize_test_with_non_secs"]
    assert runner.main(upstream + base + ["--result-dir", str(tmp_path / "b")], "", "FSRS-6", None) == 0
    a, _ = read_results(tmp_path / "a" / "LogisticRegression.jsonl")
    b, _ = read_results(tmp_path / "b" / "LogisticRegression.jsonl")
    assert len(a) == 1 and a[0]["metrics"] == b[0]["metrics"] and 0 < a[0]["metrics"]["LogLoss"] < 1
