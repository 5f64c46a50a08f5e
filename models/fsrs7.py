"""FSRS-7 (35 parameters), written to the own-model contract (docs: issue #17; spec models.md §9).

Version followed: upstream srs-benchmark models/fsrs_v7.py @049be71984b7 (the 35-parameter model; upstream marks
FSRS-7 unstable, its file has dozens of later revisions). Published mode: `--short --secs` (same-day reviews in the
histories, intervals in fractional days), evaluated on the day-mode test reviews (`--equalize_test_with_non_secs`):
these are the row's built-in flags, so `python other.py --model FSRS-7 [--recency]` reproduces upstream's
`FSRS-7-short-secs[-recency]-equalize_test_with_non_secs` rows and writes result/FSRS-7[-recency].jsonl. Training
then sees every secs-pipeline target before the fold's first test review, same-day reviews included.

State (S, D). w = w0..w34.
- First review (grade G): S = w[G−1]; D = clamp(D0(G), 1, 10), D0(G) = w4 − e^{w5(G−1)} + 1.
- Later review after elapsed t (days, fractional) with grade G; R = R(t, S) unclamped; the OLD D is used:
  two stability blocks with the same form, long-term b = 7 (w7..w15) and short-term b = 16 (w16..w24):
    fail_b  = w[b+3]·D^{−w[b+4]}·((S+1)^{w[b+5]} − 1)·e^{w[b+6](1−R)}
    PLS_b   = min(S, fail_b)                                             (post-lapse stability)
    SInc_b  = 1 + e^{w[b]−1.5}·(11−D)·S^{−w[b+1]}·(e^{w[b+2](1−R)} − 1)·h_b·e_b
              (h_b = w[b+7] if G = 2 else 1, e_b = w[b+8] if G = 4 else 1)
    S_b     = max(PLS_b, S·SInc_b) if G > 1 else PLS_b
  blend: c = 1 − w26·e^{−w25·t}, S' = clamp(c·S_7 + (1−c)·S_16, S_MIN, 36500)
  D' = clamp(0.01·D0(4) + 0.99·(D − w6(G−3)(10−D)/9), 1, 10)       (fixed mean reversion 0.01, D0(4) unclamped)
- Forgetting curve, two power curves mixed by S-dependent weights (d1, d2, b1, b2, a1, a2, p1, p2 = w27..w34):
    R_i = (1 + (b_i^{−1/d_i} − 1)·t/S)^{−d_i},   W1 = a1·S^{−p1},  W2 = a2·S^{p2},   R = (W1·R1 + W2·R2)/(W1 + W2)
  (R_i(S, S) = b_i); a prediction is R clamped to [1e−4, 0.9999].

Clip after every step (upstream's FSRS7ParameterClipper, in order): w0 ∈ [s_min, 50], w1 ∈ [w0, 100], w2 ∈ [w1, 100],
w3 ∈ [w2, 100], w28 ∈ [w27, 0.95], w30 ∈ [w29, 0.99]; the rest a fixed box (LOWER/UPPER). s_min = 1e−4 is the
--secs value (upstream config), the row's mode (upstream run without --secs would clamp at 0.01).

Initial weights (`initial_weights`, upstream `initialize_parameters`): for each of 16 candidate curve-parameter sets
(w27..w34), fit S0 per first rating on the first long-term reviews (i == 2) grouped by (first rating, interval) —
in secs mode the interval binned (< 2 h: 10-minute bins, < 1 day: 2-hour bins, else whole days, each at least its
bin width) — minimising Σ n·BCE(r̂, clamp(R(Δt, S), 1e−4, 0.9999)) + |S − DEFAULT_W[G−1]|/16 by L-BFGS-B on
[s_min, 100] from the default (r̂ = (mean·n + ȳ)/(n + 1), ȳ the training set's mean recall; both the smoothing and
the L1 term stay on in secs mode here, unlike FSRS-6's fit); order repair between ratings as FSRS-6. The candidate
with the lowest summed loss wins; missing ratings are filled by log-anchor interpolation (anchors −8.09, −3.83, −2.5,
−1.0: between two known ratings ln S is interpolated linearly in anchor position, outside them offset by the anchor
difference from the nearest known one), rounded to 4 decimals, clipped to [1e−4, 100] and made monotone; one known
rating scales all four defaults. w0..w3 (clamped to [s_min, 100]) and the winning curve set replace the defaults;
that vector is also the prior centre. The 64 fits of a fold (16 candidates × 4 ratings) step together
(`fit_s0_all`): the same L-BFGS-B runs and the same floats as one fit at a time, with one numpy evaluation per
round instead of a few per fit and point (the search was ~0.6 s of FSRS-7's ~0.75 CPU s per user).

Training (RECIPE): Adam(lr 2e−2, betas (0.8, 0.85)), cosine annealing per batch, 8 epochs, batches of 1024 targets,
the L2 prior 0.5·Σ((w − w_init)/σ)² (σ = SIGMA; 9999 for S0, i.e. free) scaled by B/N per batch, the final epoch's
weights kept. It runs on the plug-in engine/traced.py generates from this file: 8 epochs of one forward and one
reverse pass per card, each target fused with the step that reads the same state (its retention is that step's),
and no full-loss pass at the start or the end (keep="last" reads no objective). `--recency`: row weights
0.0667 + 0.9333·x^11.25, x = linspace(0, 1, N) over the training rows in time order (upstream's newest trainer;
"FSRS-7 recency"). `--sched_penalties` (upstream's "FSRS-7 sched. penalties" row, result FSRS-7-sched_penalties):
upstream's interval-growth and short-interval penalties (models/fsrs7_penalty.py) added to the loss as
0.5·penalty1 + 0.0015·penalty2 beside the 0.5-weighted L2 prior, scaled like it; such a fit runs on the autograd
engine (a per-step Python term; the compiled trainer is one numba loop), the same batches and steps: embedded
user 1 (3,705 test reviews) 2.9 s against 0.08 s compiled (1.6 s of it the autograd engine, the rest ~4 ms of
penalty per step).

What costs what (measured for issue #19; CPU time, one thread, shared machine, so ±10%):
- A 45k-review user (24,845 test rows), ~0.5 s: training ~0.38 s (~70%), the S0 search ~0.11 s before and
  ~0.07 s after the change below, prediction ~0.03, the two feature pipelines ~0.025, metrics ~0.02. A small user (a
  few hundred test rows) is mostly the S0 search: 16 candidates x (up to) 4 ratings of L-BFGS-B per fold.
- Training, per state and epoch: ~330-360 ns in the trainer's random card order (~290 ns for the same loss and
  gradient with the cards in order: random order costs ~30 ns a state, presumably cache misses, which prefetching
  did not measurably recover; FSRS-6's hand-written kernel ~110 ns). Of the ~290: the fused step + target ~186 ns,
  the reverse pass ~103 ns. The forward is its 21 libm calls (15 exp, 6 log; perf: libm ~2.5x the generated code's
  own time), none computed twice (the generated code shares ln S, ln D, ln(S + 1) between the pows of each base and
  hoists every weight-only value); the reverse pass is arithmetic only. Every one of those 21 values is needed by
  torch's where semantics (both sides computed).
- The S0 search: 14.3 -> 8.8 ms CPU per fold (75 folds of the 45k user, sim36 users 1-12 and the embedded users), S0
  and the ranking bit for bit: the runs of a rating allocated as rows of shared blocks and setulb's arguments bound
  once (fsrs_init.StepLbfgsb.batch; the separate small arrays were ~1/4 of the search), the candidate columns
  gathered once per set of runs and the loss computed in place. What is left: ~55% numpy's pow and log on
  [candidates x 2 points, groups] (kept in numpy: a compiled loss moves S0, models/fsrs_init.py), ~40% stepping
  scipy's routine from Python. Projection (bench/bench_executors.py project, four runs of each tree alternating,
  machine loaded): the per-user constant a ~111 -> ~52 ms (FSRS-7) and ~83 -> ~49 ms (recency); b, the training's
  share, unchanged by design and between 6.4 and 11.7 ms per 1k reviews from run to run of the same code, so the
  rows' CPU-hours move by ~0.1-0.17 of their ~2 (10,000·Δa), within that noise.
Tried and not kept (paired, same process): prefetching the next card's first review and target in the trainer (one
or two cards ahead: old/new 0.90-1.10 over eight pairs, no clear gain); the pow guards removed (no change: the
forward is not bound by them); exp as inline arithmetic (engine/vec_math.exp1) in the scalar step, 218 -> 306 ns a
step (slower: glibc's exp is ~5 ns a call, the polynomial a long dependent chain); four independent exps written
side by side for LLVM's SLP vectoriser (not vectorised, 18.6 -> 38.6 ns per four); two cards' steps interleaved
(slower: the step is throughput-bound, not latency-bound).
Lanes (issue #19): the training batches now run 8 cards side by side on the lane form of the generated plug-in
(engine/traced_lanes.py; exp and log as vec_math's vectorisable arithmetic): loss and gradient 2.16x, the 5-fold
fit 2.05x on the 45k user, results moved in the last bits only (engine/traced.py's docstring, item 4).
"""

from __future__ import annotations

import math

import numpy as np

from config import ACCEPTS_SECS, BUILTIN_FLAGS, RunConfig
from models.base import InadequateData, Model, ReviewData
from models.fsrs_init import S0_MAX, StepLbfgsb, fit_many, fit_one_rating, fit_one_rating_scipy, repair_order

NAME = "FSRS-7"
S_MIN = 1e-4
S_MAX = 36500.0
INIT_S_MAX = S0_MAX  # 100: upstream's S0 bound, the S0 fit's (models/fsrs_init.py) too
P_MIN, P_MAX = 1e-4, 0.9999
LONG, SHORT = 7, 16  # first index of each stability block

DEFAULT_W = [0.041, 2.4175, 4.1283, 11.9709,  # S0
             5.6385, 0.4468, 3.262,  # difficulty
             2.3054, 0.1688, 1.3325, 0.3524, 0.0049, 0.7503, 0.0896, 0.6625, 1.3,  # long-term stability
             0.882, 0.3072, 3.5875, 0.303, 0.0107, 0.2279, 2.6413, 0.5594, 1.3,  # short-term stability
             2.5, 1.0,  # long/short blend
             0.0723, 0.1634, 0.5, 0.9555, 0.2245, 0.6232, 0.1362, 0.3862]  # curve: d1 d2 b1 b2 a1 a2 p1 p2
LOWER = [S_MIN] * 4 + [1, 0.001, 0.1,
                       0, 0, 0.3, 0.01, 0.001, 0.1, 0, 0, 1,
                       0, 0, 0.5, 0.001, 0.001, 0.001, 0, 0, 1,
                       2.5, 0,
                       0.01, 0.01, 0.5, 0.5, 0.01, 0.1, 0, 0.1]
UPPER = [INIT_S_MAX / 2] + [INIT_S_MAX] * 3 + [10, 4, 4,
                                               4, 1.2, 3, 1.5, 0.9, 1, 3.5, 1, 7,
                                               4, 2, 6, 1.5, 2, 1, 5, 1, 7,
                                               15, 1,
                                               0.25, 0.95, 0.85, 0.99, 1, 1, 0.9, 1.1]
SIGMA = [9999.0] * 4 + [0.523, 0.2528, 0.4329,
                        0.2966, 0.2139, 0.2889, 0.1862, 0.0829, 0.175, 0.3812, 0.3013, 0.9104,
                        0.3234, 0.2448, 0.3273, 0.1842, 0.1542, 0.1735, 0.4608, 0.311, 0.864,
                        0.4053, 0.162,
                        0.0418, 0.2596, 0.0798, 0.0682, 0.1282, 0.1397, 0.1407, 0.1489]
PRIOR_WEIGHT = 0.5


def recency_weights(n: int) -> np.ndarray:
    """FSRS-7's --recency row weights: 0.0667 + 0.9333·x^11.25 over the training rows in time order."""
    return 0.0667 + 0.9333 * np.power(np.linspace(0, 1, n), 11.25)


RECIPE = dict(optimizer="adam", lr=2e-2, betas=(0.8, 0.85), weight_decay=0.0, n_epoch=8, batch_size=1024,
              keep="last", recency_fn=recency_weights, prior_weight=PRIOR_WEIGHT)

# The S0 search's candidate curve parameters (w27..w34); the first is the defaults'.
CURVE_CANDIDATES = [
    DEFAULT_W[27:],
    [0.0594, 0.3358, 0.598, 0.9517, 0.3122, 0.5685, 0.2371, 0.4871],
    [0.0441, 0.2533, 0.6823, 0.9598, 0.3613, 0.5202, 0.2283, 0.4783],
    [0.0621, 0.2475, 0.6496, 0.9744, 0.313, 0.5662, 0.2336, 0.4836],
    [0.0462, 0.2962, 0.6938, 0.9592, 0.3341, 0.5273, 0.2185, 0.4685],
    [0.0422, 0.2813, 0.6713, 0.9421, 0.2935, 0.5985, 0.2183, 0.4683],
    [0.0568, 0.1563, 0.6567, 0.9633, 0.3682, 0.5041, 0.1952, 0.4452],
    [0.0651, 0.2502, 0.6682, 0.9472, 0.3757, 0.4933, 0.2408, 0.4908],
    [0.0548, 0.1655, 0.6138, 0.9654, 0.3251, 0.5717, 0.1418, 0.3918],
    [0.0381, 0.2803, 0.7202, 0.9491, 0.3362, 0.5166, 0.2248, 0.4748],
    [0.0422, 0.1935, 0.694, 0.9549, 0.3871, 0.4704, 0.2413, 0.4913],
    [0.0651, 0.1916, 0.623, 0.972, 0.3528, 0.5484, 0.2373, 0.4873],
    [0.0508, 0.3743, 0.5863, 0.9448, 0.2974, 0.606, 0.1444, 0.3944],
    [0.0498, 0.3753, 0.6875, 0.9319, 0.3758, 0.4984, 0.2268, 0.4768],
    [0.0618, 0.1663, 0.5977, 0.9682, 0.3619, 0.5066, 0.2972, 0.5472],
    [0.0656, 0.197, 0.5693, 0.9692, 0.3599, 0.5374, 0.2596, 0.5096],
]
LOG_ANCHORS = {1: -8.09, 2: -3.83, 3: -2.5, 4: -1.0}


# ----------------------------------------------------------------------------------------- the equations (torch)

def retention(w, s, t):
    """R(t, S): the S-weighted mix of the two power curves (unclamped; the stability updates read this)."""
    return mixed_curve(t, s, [w[k] for k in range(27, 35)])


def mixed_curve(t, s, cp):
    """The forgetting curve of curve parameters cp = (d1, d2, b1, b2, a1, a2, p1, p2) = w27..w34: operators only,
    so the same expressions run on torch tensors (the model) and numpy arrays (the S0 search)."""
    d1, d2, b1, b2, a1, a2, p1, p2 = cp
    x = t / s
    r1 = (1 + (b1 ** (-1 / d1) - 1) * x) ** (-d1)
    r2 = (1 + (b2 ** (-1 / d2) - 1) * x) ** (-d2)
    wt1 = a1 * s ** (-p1)
    wt2 = a2 * s ** p2
    return (wt1 * r1 + wt2 * r2) / (wt1 + wt2)


def init(w, g, t):
    """(S, D) after a card's first review with grade g."""
    import torch  # when called: a run on the compiled engine never imports torch

    s = w[(g.long() - 1).clamp(0, 3)].clamp(S_MIN, S_MAX)
    d = (w[4] - torch.exp(w[5] * (g - 1)) + 1).clamp(1, 10)
    return s, d


def _block(w, b, s, d, r, g):
    """One stability block (long-term b = 7, short-term b = 16): the stability after grade g."""
    import torch  # when called: a run on the compiled engine never imports torch

    fail = w[b + 3] * d ** (-w[b + 4]) * ((s + 1) ** w[b + 5] - 1) * torch.exp((1 - r) * w[b + 6])
    pls = torch.minimum(s, fail)
    bonus = torch.where(g == 2, w[b + 7], 1.0) * torch.where(g == 4, w[b + 8], 1.0)
    sinc = 1 + torch.exp(w[b] - 1.5) * (11 - d) * s ** (-w[b + 1]) * (torch.exp((1 - r) * w[b + 2]) - 1) * bonus
    return torch.where(g > 1, torch.maximum(pls, s * sinc), pls)


def step(w, state, t, g):
    """(S, D) after a later review: elapsed t (days), grade g. Both blocks read the OLD D."""
    import torch  # when called: a run on the compiled engine never imports torch

    s, d = state
    r = retention(w, s, t)
    c = 1 - w[26] * torch.exp(-w[25] * t)
    ns = (c * _block(w, LONG, s, d, r, g) + (1 - c) * _block(w, SHORT, s, d, r, g)).clamp(S_MIN, S_MAX)
    d04 = w[4] - torch.exp(3 * w[5]) + 1
    nd = (0.01 * d04 + 0.99 * (d - w[6] * (g - 3) * (10 - d) / 9)).clamp(1, 10)
    return ns, nd


def curve(w, state, t):
    """P(recall) after elapsed t from the state."""
    return retention(w, state[0], t).clamp(P_MIN, P_MAX)


def clip(w):
    """The bounds that depend on other parameters, applied in upstream's order after the LOWER/UPPER box."""
    w = w.clone()
    for k in (1, 2, 3):  # clamp(x, lo, hi) = min(max(x, lo), hi), the lower bound a tensor (so that it traces)
        w[k] = w[k].clamp(min=w[k - 1]).clamp(max=INIT_S_MAX)
    w[28] = w[28].clamp(min=w[27]).clamp(max=0.95)
    w[30] = w[30].clamp(min=w[29]).clamp(max=0.99)
    return w


# ----------------------------------------------------------------------------------------- S0 search (numpy)

def bin_interval(t: np.ndarray) -> np.ndarray:
    """Secs-mode grouping of first intervals: 10-minute bins below 2 h, 2-hour bins below a day, whole days above,
    each at least its bin width."""
    t = np.asarray(t, dtype=np.float64)
    ten_min, two_h = 10 / 1440, 2 / 24
    return np.where(t < two_h, np.maximum(np.floor(t / ten_min) * ten_min, ten_min),
                    np.where(t < 1, np.maximum(np.floor(t / two_h) * two_h, two_h), np.maximum(np.floor(t), 1.0)))


def first_review_groups(rows, secs: bool):
    """{first rating: (interval, mean recall, count) arrays} over the first long-term reviews (i == 2), intervals
    sorted: pandas' groupby(["first_rating", "delta_t"]).mean/count in numpy (y is 0/1, so every sum is an exact
    integer and the means are pandas' to the bit; a groupby cost ~15 ms per fold)."""
    first = rows["i"].to_numpy() == 2
    ratings = rows["first_rating"].to_numpy()[first].astype(int)
    dt = rows["delta_t"].to_numpy(np.float64)[first]
    y = rows["y"].to_numpy(np.float64)[first]
    if secs:
        dt = bin_interval(dt)
    groups = {}
    for g in np.unique(ratings).tolist():
        sel = ratings == g
        t, inv = np.unique(dt[sel], return_inverse=True)
        n = np.bincount(inv).astype(np.float64)
        groups[g] = (t, np.bincount(inv, weights=y[sel]) / n, n)
    return groups


def _rating_problems(groups, avg_recall: float):
    """(rating, intervals, smoothed recall, counts, default S0) of each first rating with data, in rating order:
    what one S0 fit minimises over (recall pulled toward the training set's mean, r̂ = (mean·n + ȳ)/(n + 1))."""
    for g in (1, 2, 3, 4):
        if g in groups:
            t, mean, n = groups[g]
            yield g, t, (mean * n + avg_recall) / (n + 1), n, DEFAULT_W[g - 1]


def fit_s0(groups, avg_recall: float, cp, s_min: float = S_MIN, reference: bool = False) -> tuple[float, dict]:
    """For one candidate curve: the summed minimum loss over the ratings and each rating's S0 (order-repaired).
    Each rating is upstream's `minimize(loss, x0=S_default, bounds=[(s_min, 100)], maxiter=Σ count)` (L-BFGS-B,
    finite differences), run by models/fsrs_init.fit_one_rating: scipy's routine driven directly, the same S0 bit
    for bit; `reference=True` calls minimize itself. The search itself runs fit_s0_all (all candidates at once)."""
    def curve(t, s):
        return np.clip(mixed_curve(t, s, cp), P_MIN, P_MAX)

    solve = fit_one_rating_scipy if reference else fit_one_rating
    total, stability, count = 0.0, {}, {}
    for g, t, recall, n, s_default in _rating_problems(groups, avg_recall):
        stability[g], fun = solve(t, recall, n, curve, s_default, s_min, with_loss=True)
        count[g] = float(n.sum())
        total += fun
    return total, repair_order(stability, count)


def fit_s0_all(groups, avg_recall: float, candidates=CURVE_CANDIDATES, s_min: float = S_MIN) -> list[tuple[float, dict]]:
    """fit_s0 of every candidate curve, the same numbers bit for bit (tests/test_fsrs7.py), ~10x faster: per rating,
    the candidates' L-BFGS-B runs step together (fsrs_init.fit_many) and each round's losses are ONE numpy
    evaluation of [candidates x points, groups], with the elementwise operations and the per-row sums fit_s0's loss
    does on one S at a time (the curve's constant b^(-1/d) − 1 is computed as a Python float, as there)."""
    # per candidate: k1, −d1, k2, −d2, a1, −p1, a2, p2 (negating a gathered value = gathering the negated one)
    table = np.array([[b1 ** (-1 / d1) - 1, -d1, b2 ** (-1 / d2) - 1, -d2, a1, -p1, a2, p2]
                      for d1, d2, b1, b2, a1, a2, p1, p2 in candidates], dtype=np.float64)
    totals = [0.0] * len(candidates)
    stability = [{} for _ in candidates]
    count = {}
    for g, t, recall, n, s_default in _rating_problems(groups, avg_recall):
        miss = 1 - recall
        gathered = [None, None]  # (which as bytes, the rows' parameter columns): a round often repeats the last

        def batch_loss(which, s):
            key = which.tobytes()
            if gathered[0] != key:
                rows = table[np.repeat(which, 2)]
                gathered[:] = [key, [rows[:, j:j + 1] for j in range(8)]]
            k1, nd1, k2, nd2, a1, np1, a2, p2 = gathered[1]
            s = s.reshape(-1, 1)
            x = t / s
            r1 = k1 * x  # (1 + k1·x)^(−d1), in place: the same operations as fit_s0's curve
            r1 += 1
            np.power(r1, nd1, out=r1)
            r2 = np.multiply(k2, x, out=x)
            r2 += 1
            np.power(r2, nd2, out=r2)
            wt1 = a1 * s ** np1
            wt2 = a2 * s ** p2
            r1 *= wt1
            r2 *= wt2
            r1 += r2
            r1 /= wt1 + wt2
            p = np.clip(r1, P_MIN, P_MAX, out=r1)
            q = np.subtract(1, p, out=r2)
            lp = np.log(p, out=p)
            lp *= recall
            lq = np.log(q, out=q)
            lq *= miss
            lp += lq
            np.negative(lp, out=lp)
            lp *= n
            return (np.sum(lp, axis=1) + np.abs(s[:, 0] - s_default) / 16).reshape(-1, 2)

        runs = StepLbfgsb.batch(len(candidates), s_default, s_min, int(np.sum(n)))
        fit_many(runs, batch_loss)
        count[g] = float(n.sum())
        for c, run in enumerate(runs):
            stability[c][g], fun = run.result()
            totals[c] += fun
    return [(totals[c], repair_order(stability[c], count)) for c in range(len(candidates))]


def fill_log_anchor(stability: dict[int, float]) -> list[float]:
    """All four S0 from 2 or 3 known ones by log-anchor interpolation/extrapolation, rounded to 4 decimals,
    clipped to [1e−4, 100] and made monotone (a known value wins against a filled one; else the two swap)."""
    known = sorted(stability)
    log_s = {g: math.log(stability[g]) for g in known}
    a = LOG_ANCHORS

    def between(g, lo, hi):
        return log_s[lo] + (a[g] - a[lo]) / (a[hi] - a[lo]) * (log_s[hi] - log_s[lo])

    def beside(g, near):
        return log_s[near] + a[g] - a[near]

    # each missing rating: interpolated between the nearest known ratings below and above, or extrapolated from the
    # nearest rating on its side (Again from Hard, Hard from Good, Good from Hard, Easy from Good), in this order
    plan = {(1,): [(1, "beside", 2)], (2,): [(2, "between", 1, 3)], (3,): [(3, "between", 2, 4)],
            (4,): [(4, "beside", 3)],
            (3, 4): [(3, "beside", 2), (4, "beside", 3)], (2, 4): [(2, "between", 1, 3), (4, "beside", 3)],
            (2, 3): [(2, "between", 1, 4), (3, "between", 1, 4)], (1, 4): [(1, "beside", 2), (4, "beside", 3)],
            (1, 3): [(3, "between", 2, 4), (1, "beside", 2)], (1, 2): [(2, "beside", 3), (1, "beside", 2)]}
    missing = tuple(g for g in (1, 2, 3, 4) if g not in stability)
    for g, how, *ref in plan[missing]:
        log_s[g] = between(g, *ref) if how == "between" else beside(g, *ref)
    out = {g: float(round(float(np.clip(math.exp(log_s[g]), 1e-4, 100)), 4)) for g in (1, 2, 3, 4)}
    for lo, hi in ((1, 2), (1, 3), (1, 4), (2, 3), (2, 4), (3, 4)):
        if out[lo] > out[hi]:
            if lo in stability and hi not in stability:
                out[hi] = out[lo]
            elif hi in stability and lo not in stability:
                out[lo] = out[hi]
            else:
                out[lo], out[hi] = out[hi], out[lo]
    values = [out[g] for g in (1, 2, 3, 4)]
    if values != sorted(values):
        raise InadequateData(f"S0 interpolation not monotone: {values}")
    return values


def initial_weights(train: ReviewData, cfg=None) -> list[float]:
    """DEFAULT_W with S0 (w0..w3) and the curve (w27..w34) from the candidate search (see the module docstring)."""
    rows = train.rows
    groups = first_review_groups(rows, bool(getattr(cfg, "secs_mode", False)))  # RunConfig.secs_mode (--secs)
    avg_recall = float(rows["y"].mean())
    best = None
    for cp, (total, stability) in zip(CURVE_CANDIDATES, fit_s0_all(groups, avg_recall)):
        if best is None or total < best[0]:  # ties: the earlier candidate (upstream's stable sort)
            best = (total, cp, stability)
    _, cp, stability = best
    if not stability:
        raise InadequateData("no first long-term reviews to initialise S0")
    if len(stability) == 1:
        (g,) = stability
        s0 = [x * stability[g] / DEFAULT_W[g - 1] for x in DEFAULT_W[:4]]
    elif len(stability) < 4:
        s0 = fill_log_anchor(stability)
    else:
        s0 = [stability[g] for g in (1, 2, 3, 4)]
    if not all(np.isfinite(s0)):
        raise InadequateData("NaN/inf in the S0 fill")
    w = list(DEFAULT_W)
    w[:4] = [min(max(x, S_MIN), INIT_S_MAX) for x in s0]
    w[27:] = list(cp)
    return w


# ----------------------------------------------------------------------------------------- the model

def recipe(cfg=None) -> dict:
    """RECIPE, with upstream's scheduling penalties (models/fsrs7_penalty.py) as a loss term under --sched_penalties."""
    if getattr(cfg, "sched_penalties", False):
        from models.fsrs7_penalty import sched_penalty

        return dict(RECIPE, penalty=sched_penalty)
    return RECIPE


def _engine(cfg=None, training: bool = False):
    """The engine for this module: its generated compiled plug-in (engine/traced.py), or the card-major autograd
    engine (engine/autograd_engine.py) with `--trainer autograd` or when tracing fails (one stderr line). A fit with
    --sched_penalties trains on the autograd engine (its penalty is a per-step Python term, which the compiled
    trainer's single loop cannot call; recipe_runs_compiled says "penalty") and predicts on the compiled one."""
    import sys

    from engine.recipe import Recipe
    from engine.traced import engine_for

    chosen = recipe(cfg) if training else RECIPE
    return engine_for(sys.modules[__name__], recipe=Recipe.from_dict(chosen), trainer=getattr(cfg, "trainer", "fast"),
                      label=NAME)  # on the CPU, as before (its autograd engine never took --device)


class FSRS7(Model):
    """FSRS-7 and FSRS-7 recency (--recency); --default (0 parameters) and --S0 (S0 + curve search, 12) too."""

    name = NAME
    first_run_seconds = 30  # a toy run's compiling in an empty cache (warmup.py: the autograd-trained rows; else units)
    autograd = True  # `--trainer autograd` runs the equations on the autograd engine instead of the traced plug-in
    accepts_secs = NAME in ACCEPTS_SECS  # the general --secs feature pipeline: fractional intervals, same-day targets
    # the published mode, always on (no result-name suffix): `other.py --model FSRS-7` = upstream's
    # `--short --secs --equalize_test_with_non_secs` (secs, equalize_test_with_non_secs: config.BUILTIN_FLAGS;
    # --short through config.ALWAYS_SHORT)
    builtin_flags = BUILTIN_FLAGS[NAME]
    accepts_sched_penalties = True  # --sched_penalties: upstream's scheduling penalties in the loss (fsrs7_penalty.py)

    def __init__(self, cfg=None):
        if cfg is None:
            cfg = RunConfig(algo=NAME)
        self.cfg = cfg
        self.w = list(DEFAULT_W)
        self.n_params = 0 if cfg.default else (12 if cfg.S0 else len(DEFAULT_W))

    def compile_units(self) -> list:
        """The generated plug-in's engine units (its lane kernel's parts, the kernel, the engine's loops), which a first
        run compiles side by side (warmup.py); the trainer's only when the row trains (not --default, --S0). A row
        trained on the autograd engine (--trainer autograd, --sched_penalties) has none: a toy run warms it."""
        trains = not (self.cfg.default or self.cfg.S0)
        if getattr(self.cfg, "trainer", "fast") != "fast" or (trains and getattr(self.cfg, "sched_penalties", False)):
            return []
        units = getattr(_engine(self.cfg), "compile_units", None)
        return units(train=trains) if units else []

    def fit(self, train: ReviewData) -> "FSRS7":
        if self.cfg.default:
            return self
        if len(train) == 0:
            raise InadequateData("no training rows")
        w_init = initial_weights(train, self.cfg)
        if self.cfg.S0:
            self.w = w_init
            return self
        w = _engine(self.cfg, training=True).fit(w_init, train, self.cfg, recipe(self.cfg), w_init=w_init,
                                                 sigma=SIGMA)
        self.w = [float(x) for x in w]
        return self

    def predict(self, test: ReviewData) -> np.ndarray:
        return _engine(self.cfg).predict(self.w, test)

    def parameters(self) -> list[float]:
        return [round(float(x), 6) for x in self.w]
