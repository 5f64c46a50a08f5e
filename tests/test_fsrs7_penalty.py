"""FSRS-7 --sched_penalties (models/fsrs7_penalty.py): the two penalties' values and gradients against an independent
torch transliteration of upstream's models/fsrs_v7_interval_penalty.py written here, the root property of the
intervals and the terms recomputed by hand from them, finite differences, the trainer's use of the term, the result
names in upstream's suffix order, and a run on the embedded data set."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from config import RunConfig, build_parser, config_from_args
from models import fsrs7, fsrs7_penalty
from engine.autograd_engine import AutogradEngine, Recipe
from models.fsrs7 import DEFAULT_W, LOWER, UPPER
from engine.traced import engine_for, recipe_runs_compiled
from result_store import read_results
from runner import DataError, run


# ------------------------------------------------------------------ upstream's formula, written out independently

def ref_fc(t, s, w):
    dec1, dec2 = -w[-8], -w[-7]
    base1, base2 = torch.clamp(w[-6], min=1e-4), torch.clamp(w[-5], min=1e-4)
    bw1, bw2 = torch.clamp(w[-4], min=1e-4), torch.clamp(w[-3], min=1e-4)
    c1 = torch.pow(base1, 1.0 / dec1) - 1.0
    c2 = torch.pow(base2, 1.0 / dec2) - 1.0
    i1 = torch.clamp(1.0 + c1 * (t / s), min=1e-9)
    i2 = torch.clamp(1.0 + c2 * (t / s), min=1e-9)
    wt1 = bw1 * torch.pow(s, -w[-2])
    wt2 = bw2 * torch.pow(s, w[-1])
    ws = torch.clamp(wt1 + wt2, min=1e-9)
    r = torch.clamp((wt1 * torch.pow(i1, dec1) + wt2 * torch.pow(i2, dec2)) / ws, 0.0, 1.0)
    dr = (wt1 * dec1 * torch.pow(i1, dec1 - 1.0) * (c1 / s) + wt2 * dec2 * torch.pow(i2, dec2 - 1.0) * (c2 / s)) / ws
    return r, torch.clamp(dr, max=0.0)


def ref_interval(s, w, target, n_newton=4):
    lo_t, hi_t = 1.0 / 86400.0, 36500.0
    sf = s.item()
    p = [x.item() for x in w]
    d1, d2 = -p[27], -p[28]
    c1, c2 = p[29] ** (1.0 / d1) - 1.0, p[30] ** (1.0 / d2) - 1.0
    wt1, wt2 = p[31] * sf ** (-p[33]), p[32] * sf ** p[34]
    u = math.log(max(sf, 1e-10))
    for _ in range(n_newton):
        u = min(max(u, math.log(lo_t)), math.log(hi_t))
        t = min(max(math.exp(u), lo_t), hi_t)
        a, b = max(1.0 + c1 * t / sf, 1e-9), max(1.0 + c2 * t / sf, 1e-9)
        r = (wt1 * a ** d1 + wt2 * b ** d2) / (wt1 + wt2)
        drdt = (wt1 * d1 * a ** (d1 - 1.0) * c1 / sf + wt2 * d2 * b ** (d2 - 1.0) * c2 / sf) / (wt1 + wt2)
        u = u - (r - target) / min(drdt * t, -1e-12)
    t_star = torch.tensor(min(max(math.exp(u), lo_t), hi_t), dtype=w.dtype)
    r, drdt = ref_fc(t_star, s, w)
    lifted = torch.log(t_star) - (r - target) / torch.clamp((drdt * t_star).detach(), max=-1e-9)
    return torch.exp(torch.clamp(lifted, math.log(lo_t), math.log(hi_t)))


def ref_init_d(w, g):
    return torch.clamp(w[4] - torch.exp(w[5] * (g - 1)) + 1.0, 1.0, 10.0)


def ref_next_s(w, s, d, t):
    r = ref_fc(t, s, w)[0]
    out = []
    for b in (7, 16):
        pls = torch.minimum(s, w[b + 3] * torch.pow(d, -w[b + 4]) * (torch.pow(s + 1.0, w[b + 5]) - 1.0)
                            * torch.exp((1.0 - r) * w[b + 6]))
        sinc = 1.0 + torch.exp(w[b] - 1.5) * (11.0 - d) * torch.pow(s, -w[b + 1]) * (
            torch.exp(torch.clamp((1.0 - r) * w[b + 2], max=30.0)) - 1.0)
        out.append(torch.maximum(pls, s * sinc))
    coef = torch.clamp(1.0 - w[26] * torch.exp(-w[25] * t), 0.0, 1.0)
    return torch.clamp(coef * out[0] + (1.0 - coef) * out[1], 0.0001, 36500.0)


def ref_run(w, target):
    s, d, ivls = w[2], ref_init_d(w, 3), []
    for _ in range(10):
        t = ref_interval(s, w, target)
        ivls.append(t)
        s = ref_next_s(w, s, d, t)
        d = torch.clamp(0.01 * ref_init_d(w, 4) + 0.99 * d, 1.0, 10.0)
    return torch.stack(ivls)


def ref_penalties(w):
    ivls = ref_run(w, 0.9)
    keep = ivls[:-1].detach() >= 1.0
    p1 = (ivls[1:] / ivls[:-1])[keep].max() ** 2 if keep.any() else w.new_zeros(())
    ivls = ref_run(w, 0.99)
    keep = ivls.detach() < 1.0
    p2 = (torch.clamp(1.0 / torch.clamp(ivls[keep].mean(), min=1.0 / 86400.0), min=144.0) - 144.0
          if keep.any() else w.new_zeros(()))
    return p1, p2


def ref_value_and_grad(w_np):
    w = torch.tensor(w_np, dtype=torch.float64, requires_grad=True)
    p1, p2 = ref_penalties(w)
    total = 0.5 * p1 + 0.0015 * p2
    return float(total.detach()), torch.autograd.grad(total, w)[0].numpy()


def weight_sets():
    """The defaults and three random points of the clip box (made valid by the model's clip)."""
    rng = np.random.default_rng(7)
    out = [list(DEFAULT_W)]
    for _ in range(3):
        w = np.clip(np.asarray(DEFAULT_W) * np.exp(rng.normal(0, 0.15, len(DEFAULT_W))), LOWER, UPPER)
        out.append(fsrs7.clip(torch.tensor(w, dtype=torch.float64)).tolist())
    return out


# ------------------------------------------------------------------------------------------------------ the terms

@pytest.mark.parametrize("k", range(4))
def test_value_and_gradient_equal_upstreams_formula(k):
    w = weight_sets()[k]
    value, grad = fsrs7_penalty.sched_penalty(w)
    ref_value, ref_grad = ref_value_and_grad(w)
    assert value > 0
    assert value == pytest.approx(ref_value, rel=1e-12)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("k", range(4))
def test_forward_mode_equals_autograd_on_the_same_equations(k):
    """sched_penalty's Dual numbers and torch autograd through the same functions agree (the Dual's derivative
    rules are torch's)."""
    w = torch.tensor(weight_sets()[k], dtype=torch.float64, requires_grad=True)
    p1, p2 = fsrs7_penalty.penalties(w)
    total = 0.5 * p1 + 0.0015 * p2
    value, grad = fsrs7_penalty.sched_penalty(weight_sets()[k])
    assert value == pytest.approx(float(total.detach()), rel=1e-13)
    np.testing.assert_allclose(grad, torch.autograd.grad(total, w)[0].numpy(), rtol=1e-11, atol=1e-13)


def test_default_weights_by_hand():
    """At the default weights: every interval solves R(t, S) = target (4 Newton steps and the lift: to ~1e-9), and the two terms
    recomputed from the intervals: growth 5.1796² = 26.83 (the 2nd interval over the 1st, 15.37 d / 2.967 d), the
    sub-day intervals at 99% averaging ~85 s (p2 = 86400/85 − 144 ≈ 908)."""
    w = torch.tensor(DEFAULT_W, dtype=torch.float64)
    for target in (0.9, 0.99):
        t = fsrs7_penalty.good_intervals(w, target)
        s, d = w[2], fsrs7_penalty._d0(w, 3)
        for i in range(10):  # the state each interval was computed from, replayed by the reference
            r, _ = ref_fc(t[i], s, w)
            assert float(r) == pytest.approx(target, abs=1e-8)
            s = ref_next_s(w, s, d, t[i])
            d = torch.clamp(0.01 * ref_init_d(w, 4) + 0.99 * d, 1.0, 10.0)
    t90 = [float(x) for x in fsrs7_penalty.good_intervals(w, 0.9)]
    t99 = [float(x) for x in fsrs7_penalty.good_intervals(w, 0.99)]
    assert t90[0] == pytest.approx(2.9669, abs=1e-4) and t90[1] == pytest.approx(15.368, abs=1e-3)
    ratios = [t90[i + 1] / t90[i] for i in range(9) if t90[i] >= 1]
    p1, p2 = fsrs7_penalty.penalties(w)
    assert float(p1) == pytest.approx(max(ratios) ** 2, rel=1e-14) == pytest.approx(26.8286, abs=1e-4)
    short = [x for x in t99 if x < 1]
    assert len(short) == 10
    assert float(p2) == pytest.approx(max(1 / (sum(short) / len(short)), 144) - 144, rel=1e-14)
    assert float(p2) == pytest.approx(908.1254, abs=1e-3)
    assert fsrs7_penalty.sched_penalty(DEFAULT_W)[0] == pytest.approx(0.5 * float(p1) + 0.0015 * float(p2), rel=1e-14)


def test_gradient_matches_finite_differences():
    """The implicit-function step's gradient is the derivative of the converged intervals: central differences of
    the penalty agree to 1e-3 (4 Newton steps leave a residual of up to ~1e-9 at 99%, so the implicit derivative
    and the difference quotient of the unconverged root differ in the 4th digit, as upstream's do)."""
    w = np.asarray(DEFAULT_W)
    _, grad = fsrs7_penalty.sched_penalty(w)
    for j in (2, 4, 5, 8, 9, 17, 18, 25, 27, 29, 31, 33, 34):
        h = 1e-6 * max(abs(w[j]), 1e-2)
        up, down = w.copy(), w.copy()
        up[j] += h
        down[j] -= h
        fd = (fsrs7_penalty.sched_penalty(up)[0] - fsrs7_penalty.sched_penalty(down)[0]) / (2 * h)
        assert grad[j] == pytest.approx(fd, rel=1e-3, abs=1e-4), j


def test_terms_vanish_without_intervals_of_their_kind(monkeypatch):
    """Penalty 1 is 0 when no interval reaches a day; penalty 2 is 0 when none is under a day."""
    w = torch.tensor(DEFAULT_W, dtype=torch.float64)
    slow = w.clone()
    slow[2] = 1e-4  # S0 of Good tiny: at 90% the first interval is seconds ...
    slow[7] = slow[16] = 0.0  # ... and grows slowly
    t = torch.stack(fsrs7_penalty.good_intervals(slow, 0.9))
    if bool((t[:-1] < 1).all()):
        assert float(fsrs7_penalty.penalties(slow)[0]) == 0.0
    fast = w.clone()
    fast[2] = 100.0  # S0 of Good 100 days: at 97% every interval is days
    monkeypatch.setattr(fsrs7_penalty, "SHORT_RETENTIONS", (0.97,))
    assert bool((torch.stack(fsrs7_penalty.good_intervals(fast, 0.97)) >= 1).all())
    assert float(fsrs7_penalty.penalties(fast)[1]) == 0.0


# ----------------------------------------------------------------------------------------------------- training

def test_penalty_runs_on_the_autograd_engine_only():
    plain = Recipe.from_dict(fsrs7.RECIPE)
    with_penalty = Recipe.from_dict(fsrs7.recipe(RunConfig(algo="FSRS-7", sched_penalties=True)))
    assert fsrs7.recipe(RunConfig(algo="FSRS-7")) is fsrs7.RECIPE
    assert recipe_runs_compiled(plain) is None and recipe_runs_compiled(with_penalty) == "penalty"
    assert isinstance(engine_for(fsrs7, recipe=with_penalty), AutogradEngine)


def test_penalty_enters_each_step_like_the_prior(user8_short):
    """A zero penalty changes nothing; the real one is added per batch, scaled by the batch's share of targets, so
    that the trained weights' penalty ends lower than without it."""
    train = user8_short.subset(np.arange(len(user8_short) // 4))
    w0 = fsrs7.initial_weights(train)
    engine = AutogradEngine(fsrs7, LOWER, UPPER)
    base = dict(fsrs7.RECIPE, n_epoch=2)
    plain = engine.fit(w0, train, None, base, w_init=w0, sigma=fsrs7.SIGMA)
    zero = engine.fit(w0, train, None, dict(base, penalty=lambda w: (0.0, np.zeros(len(w)))), w_init=w0,
                      sigma=fsrs7.SIGMA)
    assert np.array_equal(plain, zero)
    calls = []

    def counted(w):
        calls.append(1)
        return fsrs7_penalty.sched_penalty(w)

    penalised = engine.fit(w0, train, None, dict(base, penalty=counted), w_init=w0, sigma=fsrs7.SIGMA)
    assert len(calls) > 2  # once per step (keep="last": no objective pass)
    assert fsrs7_penalty.sched_penalty(penalised)[0] < fsrs7_penalty.sched_penalty(plain)[0]


# --------------------------------------------------------------------------------------------------- names, runs

@pytest.mark.parametrize("flags, name", [
    (["--sched_penalties"], "FSRS-7-sched_penalties"),
    (["--sched_penalties", "--short", "--secs", "--equalize_test_with_non_secs"], "FSRS-7-sched_penalties"),
    (["--sched_penalties", "--recency"], "FSRS-7-sched_penalties-recency"),
    (["--recency", "--sched_penalties", "--default"], "FSRS-7-default-sched_penalties-recency"),
    (["--S0", "--sched_penalties", "--partitions", "deck"], "FSRS-7-S0-sched_penalties-deck"),
    (["--sched_penalties", "--binary", "--partitions", "preset"], "FSRS-7-sched_penalties-binary-preset"),
])
def test_result_names_in_upstreams_order(flags, name):
    """Upstream: -default -S0 -sched_penalties -short -secs ... -recency ... -equalize_test_with_non_secs -{deck|preset};
    FSRS-7's built-in short/secs/equalize add no suffix (upstream's FSRS-7-sched_penalties-short-secs-
    equalize_test_with_non_secs is our FSRS-7-sched_penalties)."""
    cfg = config_from_args(build_parser("t", "FSRS-6", None).parse_args(["--model", "FSRS-7", *flags]))
    assert cfg.sched_penalties and cfg.name == name


def test_other_models_refuse_the_flag(tmp_path):
    with pytest.raises(DataError, match="sched_penalties"):
        run(RunConfig(algo="FSRS-6", processes=1, users=[3], result_dir=tmp_path, quiet=True, sched_penalties=True))


def test_runs_on_embedded_data(tmp_path):
    cfg = RunConfig(algo="FSRS-7", processes=1, users=[3], result_dir=tmp_path, quiet=True, sched_penalties=True)
    summary = run(cfg)
    assert summary.done == 1 and not summary.failed
    lines, _ = read_results(tmp_path / "FSRS-7-sched_penalties.jsonl")
    assert 0 < lines[0]["metrics"]["LogLoss"] < 1 and len(lines[0]["parameters"]["0"]) == 35
