"""FSRS-6-one-step (models/fsrs_one_step.py): its recurrence by hand, upstream's one-row SGD update against torch
autograd through the last transition, training on a real user, and the upstream-check sizes."""

import math

import numpy as np
import pytest
import torch

from check_users import CHECK, UPSTREAM
from config import RunConfig
from models.base import ReviewData
from models.fsrs_init import initialize_s0
from models.fsrs_one_step import CLIP_HI, CLIP_LO, DEFAULT_W, LR, FSRS6OneStep, run_history, sgd_pass
from result_store import read_results
from runner import run

W = DEFAULT_W


def test_recurrence_by_hand_uses_the_new_difficulty():
    # Good, Again after 3 days, Good on the same day
    t = np.array([0.0, 3.0, 0.0])
    g = np.array([3, 1, 3])
    s1 = W[2]
    d1 = W[4] - math.exp(W[5] * 2) + 1
    d0_easy = W[4] - math.exp(W[5] * 3) + 1
    d2 = W[7] * d0_easy + (1 - W[7]) * (d1 + 2 * W[6] * (10 - d1) / 9)  # ΔD = −w6·(1 − 3)
    factor = 0.9 ** (-1 / W[20]) - 1
    r = (1 + factor * 3 / s1) ** (-W[20])
    s2 = W[11] * d2 ** (-W[12]) * ((s1 + 1) ** W[13] - 1) * math.exp((1 - r) * W[14])  # new D, not d1
    d3 = W[7] * d0_easy + (1 - W[7]) * d2
    s3 = s2 * max(1.0, math.exp(W[17] * W[18]) * s2 ** (-W[19]))
    last_s, last_d, new_s, new_d = run_history(np.array(W), t, g)
    assert (last_s, last_d) == pytest.approx((s2, d2), rel=1e-12)
    assert (new_s, new_d) == pytest.approx((s3, d3), rel=1e-12)
    assert new_s != pytest.approx(W[11] * d1 ** (-W[12]) * ((s1 + 1) ** W[13] - 1) * math.exp((1 - r) * W[14]))
    _, _, s_one, d_one = run_history(np.array(W), t[:1], g[:1])
    assert (s_one, d_one) == pytest.approx((s1, d1), rel=1e-12)


def one_row(hist_t, hist_g, t, y) -> ReviewData:
    import pandas as pd

    rows = pd.DataFrame({"seq_start": [0], "seq_pos": [len(hist_t)], "delta_t": [float(t)], "y": [y]})
    return rows, np.array(hist_t + [t], dtype=np.float64), np.array(hist_g + [3], dtype=np.int64)


def sgd_one(hist_t, hist_g, t, y, w=None):
    rows, seq_t, seq_g = one_row(hist_t, hist_g, t, y)
    return sgd_pass(np.array(W if w is None else w, dtype=np.float64), seq_t, seq_g,
                    rows["seq_start"].to_numpy(np.int64), rows["seq_pos"].to_numpy(np.int64),
                    rows["delta_t"].to_numpy(np.float64), rows["y"].to_numpy(np.float64), LR, CLIP_LO, CLIP_HI)


def torch_last_step_grad(hist_t, hist_g, t, y):
    """Autograd through the last (long-term) transition only: the state before it and R(t_last, S_last) are
    constants, and D's clamp passes the gradient straight through, as upstream's hand-derived gradient treats them
    (with g_last = 4 below, D falls under 1 and is clamped)."""
    w = torch.tensor(W, dtype=torch.float64, requires_grad=True)
    last_s, last_d, _, _ = run_history(np.array(W), np.array(hist_t, dtype=np.float64), np.array(hist_g))
    g = float(hist_g[-1])
    wd = w.detach()
    last_r = (1 + (0.9 ** (-1 / wd[20]) - 1) * hist_t[-1] / last_s) ** (-wd[20])
    init_d4 = w[4] - torch.exp(w[5] * 3) + 1
    new_d = w[7] * init_d4 + (1 - w[7]) * (last_d - w[6] * (g - 3) * (10 - last_d) / 9)
    # D is clamped to [1, 10] in value, but upstream's gradient ignores the clamp: a straight-through clamp
    new_d = new_d + (new_d.clamp(1, 10) - new_d).detach()
    if g == 1:
        new_s = w[11] * new_d ** (-w[12]) * ((last_s + 1) ** w[13] - 1) * torch.exp((1 - last_r) * w[14])
    else:
        hard = w[15] if g == 2 else 1.0
        easy = w[16] if g == 4 else 1.0
        new_s = last_s * (1 + torch.exp(w[8]) * (11 - new_d) * last_s ** (-w[9])
                          * (torch.exp((1 - last_r) * w[10]) - 1) * hard * easy)
    r = (1 + (0.9 ** (-1 / w[20]) - 1) * t / new_s) ** (-w[20])
    loss = torch.nn.functional.binary_cross_entropy(r, torch.tensor(float(y), dtype=torch.float64))
    loss.backward()
    return w.grad.numpy()


@pytest.mark.parametrize("g_last", [1, 2, 3, 4])
@pytest.mark.parametrize("y", [0, 1])
def test_sgd_update_equals_autograd_through_a_long_term_last_step(g_last, y):
    hist_t, hist_g = [0.0, 2.0, 6.0], [3, 3, g_last]
    got = sgd_one(hist_t, hist_g, 9.0, y)
    want = np.clip(np.array(W) - LR * torch_last_step_grad(hist_t, hist_g, 9.0, y), CLIP_LO, CLIP_HI)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)
    assert not np.allclose(got, W)
    assert got[0] == W[0] and got[17:20].tolist() == W[17:20]  # no path to S0 or to the short-term weights


def test_sgd_update_with_one_review_moves_its_initial_stability_100_times_faster():
    t, y = 4.0, 0
    s = torch.tensor(W[1], dtype=torch.float64, requires_grad=True)  # a Hard first review: S = w1
    decay = torch.tensor(W[20], dtype=torch.float64, requires_grad=True)
    r = (1 + (0.9 ** (-1 / decay) - 1) * t / s) ** (-decay)
    (-torch.log(1 - r)).backward()
    got = sgd_one([0.0], [2], t, y)
    want = np.array(W)
    want[1] -= LR * 100 * float(s.grad)
    want[20] -= LR * float(decay.grad)
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_rows_under_one_day_take_no_step():
    assert sgd_one([0.0, 2.0], [3, 3], 0.5, 0).tolist() == W


def test_training_lowers_the_loss_on_a_real_user(user8_short):
    n = len(user8_short)
    train = user8_short.subset(np.arange(int(n * 0.8)))
    model = FSRS6OneStep(RunConfig(algo="FSRS-6-one-step")).fit(train)
    start = FSRS6OneStep(RunConfig(algo="FSRS-6-one-step"))
    decay = W[20]
    start.w = initialize_s0(train.rows, lambda t, s: (1 + (0.9 ** (-1 / decay) - 1) * t / s) ** (-decay), W[:4],
                            0.001) + W[4:]
    y = train.rows["y"].to_numpy()

    def log_loss(p):
        return -np.mean(y * np.log(p) + (1 - y) * np.log(1 - p))

    assert log_loss(model.predict(train)) < log_loss(start.predict(train)) - 1e-4
    assert len(model.parameters()) == 21 and model.w[:4] != W[:4]


def test_upstream_check_sizes(tmp_path):
    cfg = RunConfig(algo="FSRS-6-one-step", data=CHECK, processes=1, result_dir=tmp_path, quiet=True)
    assert cfg.name == "FSRS-6-one-step" and cfg.include_short  # same-day histories built in, as FSRS-6
    assert RunConfig(algo="FSRS-6-one-step", short=True).name == "FSRS-6-one-step"
    assert run(cfg).exit_code == 0
    lines, _ = read_results(tmp_path / "FSRS-6-one-step.jsonl")
    assert len(lines) == 2
    for line in lines:
        assert line["size"] == UPSTREAM["FSRS-6"][str(line["user"])]["size"]
        assert 0 < line["metrics"]["LogLoss"] < 1 and len(line["parameters"]["0"]) == 21


def test_cli_on_one_embedded_user(tmp_path):
    import runner
    from config import EMBEDDED_DATA

    argv = ["--model", "FSRS-6-one-step", "--data", str(EMBEDDED_DATA), "--users", "3", "--processes", "1",
            "--quiet", "--result-dir", str(tmp_path)]
    assert runner.main(argv, "", "FSRS-6", None) == 0
    lines, _ = read_results(tmp_path / "FSRS-6-one-step.jsonl")
    assert len(lines) == 1 and 0 < lines[0]["metrics"]["LogLoss"] < 1 and len(lines[0]["parameters"]["0"]) == 21
