"""SBD, Stability–Brittleness–Difficulty (7 parameters; spec models.md §9): a memory model by andersschill
(memory-model-benchmark-for-spaced-repetition), as upstream srs-benchmark runs it (models/sbd.py@28e255f4).
Written to the own-model contract (engine/own_model.py): torch init / step / curve, trained on the compiled engine
through the plug-in engine/traced.py generates from them (`--trainer autograd`: the card-major autograd engine);
registered as "SBD" in models/__init__.py.

Parameters w = [L, H, k, α, c, v, log δ]. State after a review: (log S, g, n) — log stability, the review's grade
index g = rating − 1, and a "brittleness" count n of Hard/Again answers (Hard adds ½, Again 1, capped at 50).
    ρ       = e^((H' − L')/3) with L' = clamp(L), H' = clamp(max(L, H)) in [ln 0.001, ln 36500]
    first review, rating r:  log S0 = L' + (H' − L')·(r − 1)/3,  g0 = r − 1,  n0 = max(0, (3 − r)/2)
    β(n)    = e^(α + max(c, 0)·ln(δ + n)),  δ = e^(log δ)                 (the curve's shape grows with n)
    a(t)    = t^(1/k) + e^(v/k)·ρ^(−g/2)·√S,  k clamped to [0.5, 20]
    R(t)    = (1 + a(t)/S)^(−β(n)),  clamped to [1e-6, 1 − 1e-6]           (computed in logs: softplus, logaddexp)
    pass (r ≥ 2):  S' = S·R^(−1/β(n))   (= S + a(t) before the clamps)
    fail (r = 1):  S' = S·(1 − R)^max(c, 0)
    n' = min(50, n + max(0, (3 − r)/2)),  g' = r − 1,  log S' clamped to [ln 0.001, ln 36500]
Upstream's guards are kept where they change values: logs of x clamp x at 1e-9, exps clamp their argument to
[−30, 30], a NaN log S' becomes 0 and a NaN prediction 0.5.

Training (upstream's, not the Adam Trainer): full-batch L-BFGS (lr 1, strong-Wolfe line search, at most 200
iterations, history 20, tolerances 1e-7 / 1e-9) from the defaults, minimising Σ weight·BCE / Σ weight over the
training rows with history <= 64, plus λ·Σ((w − w_default)/σ)² with λ = 1e-3·2000 / N_targets; if the fit ends
with a higher objective than it started (or a non-finite one), the defaults are kept. Predictions use the weights
rounded to 4 decimals (upstream's benchmark_state, as for the FSRS models). Upstream float32, here float64.
Cost (a 45k-review simulated user, its 5 folds, in-process CPU time, best of 5, on the shared 2-core VM): ~24-32
loss/gradient evaluations per fold (138 in all), each one compiled pass. A user used to cost ~0.86-1.05 s: 148
passes over every training card (~4.7 ms each: the 138 the optimizer asks for, plus a start and an end objective
per fold) ~70%, torch.optim.LBFGS's bookkeeping on 0-dim tensors ~20%. Now ~0.33-0.37 s (2.3-2.6x):
- the passes run over a prefix tree of the training cards (engine/prefix_tree.py, seq_engine_kernels'
  tree_loss_grad): a state depends on the card's reviews so far only, so every distinct review prefix is computed
  once and equal targets' weights are summed; 24,849 states become 9,863 nodes on this user's last fold (2.5x;
  3.0-4.5x on the embedded users), ~1.8 ms a pass, 0.25 s of the user; the trees built in 0.01 s in all;
- the optimizer is torch's L-BFGS step for step in numpy (engine/lbfgs.py; its two-loop recursion compiled):
  0.02 s of the user, and its start and end objectives are evaluations it already made (10 passes fewer);
- the rest (features, the 5 predictions, metrics) ~0.06 s.
A small user (sim36, 590 test rows) went 0.07-0.09 → ~0.02 s, where torch's bookkeeping had been most of the cost.
The row's projection (bench_executors.py project, two paired runs) 4.84 / 4.90 → 1.66 / 1.84 CPU-hours; the whole
`other.py --model SBD` over the 36 sim36 users, one process, 16.0 → 6.9 CPU-seconds (median of 3 pairs). The
weights are those of the card loop and torch's optimizer up to rounding (raw weights within 1e-11;
tests/test_prefix_tree.py, tests/test_lbfgs.py): rounded to 4 decimals, they and the predictions were bit-identical
on the embedded and six sim36 users (result lines identical). A run imports no torch (since 29 Nov 2026; it had
been ~2 s of each process): the functions import it when called, the tracer runs them on engine/torch_standin.py,
and the L-BFGS is engine/lbfgs.fit_box.
The lanes of the traced plug-in (engine/traced_lanes.py, issue #19) serve Adam's mini-batches only: this L-BFGS
runs its passes over the prefix tree with the scalar functions, so SBD's fit is unchanged by them (a lane form of
the tree would take the nodes of one depth side by side). Not done: a step's grade-independent part (the recall
at t, both branches' S') is the same for siblings taken at the same time and could be shared (the generated step
would need splitting); predictions over a prefix tree of the test cards would save at most ~5 ms of the user's
~22 ms of predictions (the tree's build eats the rest).

Recency: the original always weights rows by recency, and upstream's published run passes --recency. Upstream's
script gives --recency its FSRS-7 formula (0.0667 + 0.9333·(i/N)^11.25) only for FSRS-7; every other model,
SBD included, gets 0.25 + 0.75·x³ (x = linspace(0, 1, N)), which is what runs here. --recency is this row's
built-in mode (config.ALWAYS_RECENCY): the result file is SBD-recency, upstream's name for the published run, and
the README shows it as "SBD" (evaluate.DISPLAY_NAMES).
"""

import math

NAME = "SBD"
DEFAULT_W = [-2.803101, 1.386926, 1.739235, -1.819954, 0.529839, -0.886052, -1.393709]
SIGMA = [1.754, 1.2339, 0.5003, 0.546, 0.0989, 1.1685, 0.7778]  # L2 prior widths (upstream's L2_SIGMA)
ROUND = 4
RECIPE = dict(optimizer="lbfgs", lr=1.0, max_iter=200, history_size=20, tolerance_grad=1e-7, tolerance_change=1e-9,
              prior_weight=lambda n_targets: 1e-3 * 2000 / n_targets, revert_if_worse=True, recency=True)

LOG_S_MIN, LOG_S_MAX = math.log(0.001), math.log(36500.0)
K_MIN, K_MAX = 0.5, 20.0
R_MIN, R_MAX = 1e-6, 1 - 1e-6


def _log(x):
    import torch  # when called: a run on the compiled engine never imports torch (engine/torch_standin.py traces)

    return torch.log(x.clamp(min=1e-9))


def _exp(x):
    import torch

    return torch.exp(x.clamp(-30.0, 30.0))


def _ends(w):
    """(L', H'): the log stabilities of an Again and an Easy first review (H' >= L'). Upstream takes the cumulative
    max of (L, H); this where is the same value and, like cummax, gives a tie's gradient to H."""
    import torch

    high = torch.where(w[1] >= w[0], w[1], w[0])
    return w[0].clamp(LOG_S_MIN, LOG_S_MAX), high.clamp(LOG_S_MIN, LOG_S_MAX)


def _beta(w, n):
    import torch

    return _exp(w[3] + w[4].clamp(min=0.0) * torch.log(_exp(w[6]) + n))


def _recall(w, t, log_s, gi, n):
    import torch

    low, high = _ends(w)
    k = w[2].clamp(K_MIN, K_MAX)
    log_age = _log(t.clamp(min=0.0)) / k  # ln t^(1/k)
    log_b = 2 * w[5] / k - gi * (high - low) / 3  # ln(e^(2v/k)·ρ^(−g)), so that ½(log_b + log S) = ln(e^(v/k)ρ^(−g/2)√S)
    log_a = torch.logaddexp(log_age, 0.5 * (log_b + log_s))
    return _exp(-_beta(w, n) * torch.nn.functional.softplus(log_a - log_s)).clamp(R_MIN, R_MAX)  # (1 + a/S)^(−β)


def init(w, g, t):
    r = g.to(w.dtype).clamp(1.0, 4.0)
    low, high = _ends(w)
    return low + (high - low) * (r - 1) / 3, r - 1, ((3.0 - r) / 2.0).clamp(min=0.0)


def step(w, state, t, g):
    import torch

    log_s, gi, n = state
    r = g.to(w.dtype).clamp(1.0, 4.0)
    recall = _recall(w, t.clamp(min=0.0), log_s, gi, n)
    s = _exp(log_s)
    s_pass = s * _exp(-_log(recall) / _beta(w, n))
    s_fail = s * _exp(w[4].clamp(min=0.0) * _log(1.0 - recall))
    s_new = torch.where(r > 1.5, s_pass, s_fail)
    log_s_new = torch.nan_to_num(_log(s_new), nan=0.0).clamp(LOG_S_MIN, LOG_S_MAX)
    n_new = (n + ((3.0 - r) / 2.0).clamp(min=0.0)).clamp(0.0, 50.0)
    return log_s_new, r - 1, n_new


def curve(w, state, t):
    import torch

    log_s, gi, n = state
    return torch.nan_to_num(_recall(w, t, log_s, gi, n), nan=0.5).clamp(R_MIN, R_MAX)
