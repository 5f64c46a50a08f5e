"""FSRS-6: 21 parameters, power forgetting curve with a trainable decay (spec models.md §1.2, variants §1.3).

The memory state of a card is (S, D). The first review sets S = w[G-1] and D = D0(G); every later review updates
both from the previous state, the elapsed time t and the grade G; the prediction for a target is R(t, S) with the
state after its history. The stability formulas use the difficulty from BEFORE the review (as SB, OPT and RS do):
- first review: S = w[G−1], D = clamp(w4 − e^{w5(G−1)} + 1, 1, 10);
- later review: same-day (t < 1) SInc = e^{w17(G−3+w18)}·S^{−w19}, S' = S·max(SInc, 1) if G ≥ the floor grade else
  S·SInc; recall S' = S(1 + e^{w8}(11−D)S^{−w9}(e^{w10(1−R)}−1)·h·b) (h = w15 for Hard, b = w16 for Easy); lapse
  S' = min(w11·D^{−w12}((S+1)^{w13}−1)e^{w14(1−R)}, S/e^{w17 w18}); S clamped to [s_min, 36500];
  D' = D − w6(G−3)(10−D)/9, D'' = w7·D0(4) + (1−w7)·D' with the UNCLAMPED D0(4) = w4 − e^{3 w5} + 1, in [1, 10];
- R(t, S) = (1 + F·t/S)^{−w20}, F = 0.9^{−1/w20} − 1.

Same-day reviews (t < 1) use the short-term update, whose growth factor is floored at 1 when G >= 3. This is the
published srs-benchmark FSRS-6 (fsrs-optimizer after Dec 2025 and fsrs-rs 6.x floor it already for G >= 2; the two
differ only on same-day Hard reviews).

The equations are written once, in torch, below (`first_state`, `grade_terms`, `advance`: torch_init / torch_step /
torch_curve). Two trainers run them:
- `--trainer fast` (default): the compiled one-pass-per-card engine (engine/seq_engine.py) on the plug-in that
  engine/traced.py generates from them (scalar steps and their VJPs, the weight-only terms hoisted, the lane kernel
  of the trainer's batches: 8 cards side by side), traced without torch (engine/torch_standin.py); the floor grade
  and s_min are run-time options (RUN_OPTIONS). `fit`, `predict` and `loss_and_grad` below are its functional API
  (also used by FSRS-rs's predictions and bench/bench_fsrs6.py). Predictions are this engine's float64 forward pass
  whichever trainer fitted the weights, so a default run never imports torch.
- `--trainer upstream`: upstream/fsrs6_torch.py's module steps the same functions in torch, float32 as upstream's
  PyTorch model (upstream's float32 stabilities differ from the engine's by ~1e-7 relative).
Until 29 Nov 2026 the compiled engine ran a hand-written plug-in (models/fsrs6_kernels.py: steps and VJPs) and lane
kernel (lane_kernels/fsrs6_lanes.py), the equations written three times. The generated ones give the same result
lines for all 17 FSRS-6 rows (FSRS-rs and FSRS-6-one-step included) on data/embedded and upstream-check. Measured
side by side against the hand ones (29 Nov 2026, this 2-core machine):
- the lane kernel, loss and gradient over 20,000 random cards: 1.04x the hand kernel's time
  (bench/bench_generated_lanes.py, 15 pairs), loss equal, gradient within 1.4e-15;
- a 100k-review user's fit (bench/bench_fsrs6.py, best of 5, two runs each): 0.025 / 0.026 s against 0.024 s
  (fsrs-rs-python: 0.15-0.16 s); a forward pass over its training rows 6.4 / 7.2 ms against 6.5 / 8.3 ms, since
  predictions step with the generated `step_value`, which computes only the side of each torch.where its condition
  takes (~5 exp / log a review, as the hand step did; `step` computes all 12, for its VJP; 9.2 ms before);
- `python script.py` warm 1.02x (farm-bench, 7 pairs); from an empty cache 5.59 s against 5.21 s with the hand
  kernels (3 pairs; CPU 9.0 against 8.8 s) and 5.81 s for the code of the day before (the hand kernels, the engine's
  loops one unit): the generated code's compile time was brought close first (docs/first-run.md).
"""

from __future__ import annotations

import sys

import numpy as np

from config import ACCEPTS_SECS
from models.base import Model, ReviewData, recency_weights  # noqa: F401 (recency_weights: re-exported for benches)
from models.fsrs_init import SECS_S_MIN, initialize_s0
from engine.seq_engine import SeqEngine

# Defaults: per-parameter medians of per-user fits (fsrs-optimizer since 2025-06, fsrs-rs DEFAULT_PARAMETERS).
DEFAULT_W = [0.212, 1.2931, 2.3065, 8.2956, 6.4133, 0.8334, 3.0194, 0.001, 1.8722, 0.1666, 0.796, 1.4835, 0.0614,
             0.2629, 1.6483, 0.6014, 1.8729, 0.5425, 0.0912, 0.0658, 0.1542]
# Prior widths of the L2 pull towards the post-S0 weights.
SIGMA = [6.43, 9.66, 17.58, 27.85, 0.57, 0.28, 0.6, 0.12, 0.39, 0.18, 0.33, 0.3, 0.09, 0.16, 0.57, 0.25, 1.03, 0.31,
         0.32, 0.14, 0.27]
S_MIN = 0.001  # the lower clamp of S (upstream's --secs: 1e-4); a run-time option of the generated plug-in
S_MAX = 36500.0
FLOOR_GRADE = 3  # same-day growth floored at 1 from this grade up (published run); a run-time option
RUN_OPTIONS = ("FLOOR_GRADE", "S_MIN")  # the engine's opts, in this order (engine/traced.py)
# Box constraints applied after every optimizer step (published run: w19 lower bound 0).
CLIP_LO = [S_MIN] * 4 + [1, 0.001, 0.001, 0.001, 0, 0, 0.001, 0.001, 0.001, 0.001, 0, 0, 1, 0, 0, 0, 0.1]
CLIP_HI = [100] * 4 + [10, 4, 4, 0.75, 4.5, 0.8, 3.5, 5, 0.25, 0.9, 4, 1, 6, 2, 2, 0.8, 0.8]
LR = 4e-2  # Adam learning rate of both trainers
N_PARAMS = 21
LOWER = np.array(CLIP_LO, dtype=np.float64)
UPPER = np.array(CLIP_HI, dtype=np.float64)
SEED = 2023


# ---------------------------------------------------------------------------------- the equations (torch)
# torch is imported inside the functions: the compiled engine traces them on a stand-in (engine/torch_standin.py),
# and only the upstream-style trainer runs them in torch. S_MIN and FLOOR_GRADE are read when called: the tracer
# binds them to run-time options.

def forgetting_curve(t, s, decay):
    """R(t, S) = (1 + F·t/S)^(−d), F = 0.9^(−1/d) − 1, so that R(S, S) = 0.9. Works on tensors and arrays (the S0
    fit, the torch trainer, the traced plug-in)."""
    factor = 0.9 ** (-1.0 / decay) - 1.0
    return (1.0 + factor * t / s) ** (-decay)


def first_state(w, g):
    """State after the first review with grade g."""
    import torch

    s = w[:4][(g.long() - 1).clamp(0, 3)]
    d = (w[4] - torch.exp(w[5] * (g - 1)) + 1).clamp(1, 10)
    return s.clamp(S_MIN, S_MAX), d


def grade_terms(w, t, g) -> dict:
    """Everything in a later review's update that depends on (t, G) and the weights but not on the state (the torch
    trainer computes them once for all steps of a batch, [L, B], so that the per-step graph stays small)."""
    import torch

    return {
        "short": t < 1,
        "recall": g > 1,
        "floor": g >= FLOOR_GRADE,  # the same-day growth is floored at 1 from this grade up
        # e^{w8}·h·b with the Hard penalty h and the Easy bonus b
        "inc": torch.exp(w[8]) * torch.where(g == 2, w[15], 1.0) * torch.where(g == 4, w[16], 1.0),
        "sinc_g": torch.exp(w[17] * (g - 3 + w[18])),  # grade part of the short-term factor
        "dd": -w[6] * (g - 3),  # ΔD before damping
    }


def weight_terms(w) -> dict:
    """Weight-only terms of the update (the torch trainer computes them once per batch; the generated plug-in
    hoists them out of the per-review loop)."""
    import torch

    return {
        "F": 0.9 ** (-1.0 / w[20]) - 1.0,  # forgetting-curve factor, R = (1 + F·t/S)^(−w20)
        "-d": -w[20],
        "-w9": -w[9],
        "-w12": -w[12],
        "-w19": -w[19],
        "w7_d0_easy": w[7] * (w[4] - torch.exp(w[5] * 3) + 1),  # mean reversion target D0(Easy), weighted
        "1-w7": 1 - w[7],
        "lapse_cap": torch.exp(w[17] * w[18]),  # post-lapse S is at most S / e^{w17·w18}
    }


def advance(w, k, terms: dict, t, s, d, c: dict):
    """One later review (row k of `terms`) from the previous state (s, d); `c`: weight_terms(w)."""
    import torch

    r = (1 + c["F"] * t / s).pow(c["-d"])
    # Difficulty: linear damping towards 10, then mean reversion to D0(Easy).
    d_new = d + terms["dd"][k] * (10 - d) / 9
    d_new = (c["w7_d0_easy"] + c["1-w7"] * d_new).clamp(1, 10)
    # Stability, from the OLD difficulty d.
    s_recall = s * (1 + terms["inc"][k] * (11 - d) * s.pow(c["-w9"]) * (torch.exp(w[10] * (1 - r)) - 1))
    s_forget = w[11] * d.pow(c["-w12"]) * ((s + 1).pow(w[13]) - 1) * torch.exp(w[14] * (1 - r))
    s_forget = torch.minimum(s_forget, s / c["lapse_cap"])
    sinc = terms["sinc_g"][k] * s.pow(c["-w19"])
    s_short = s * torch.where(terms["floor"][k], sinc.clamp(min=1), sinc)
    s_new = torch.where(terms["short"][k], s_short, torch.where(terms["recall"][k], s_recall, s_forget))
    return s_new.clamp(S_MIN, S_MAX), d_new


def torch_init(w, g, t):
    return first_state(w, g)


def torch_step(w, state, t, g):
    return advance(w, slice(None), grade_terms(w, t, g), t, *state, weight_terms(w))


def torch_curve(w, state, t):
    return forgetting_curve(t, state[0], w[20])


# ---------------------------------------------------------------------------------- the compiled (fast) trainer
def plugin() -> str:
    """The generated plug-in's module name (engine/trace_cache.py: traced once per version, then imported)."""
    from engine.trace_cache import plugin_for

    return plugin_for(sys.modules[__name__], N_PARAMS, use_clip=False)


def bounds(s_min: float = S_MIN) -> tuple[np.ndarray, np.ndarray]:
    """The clip box for a run's s_min: w0..w3 are bounded below by s_min (upstream's clipper), the rest fixed."""
    if s_min == S_MIN:
        return LOWER, UPPER
    lower = LOWER.copy()
    lower[:4] = s_min
    return lower, UPPER


def engine(floor_grade: int = FLOOR_GRADE, s_min: float = S_MIN) -> SeqEngine:
    """The engine on FSRS-6's plug-in; floor_grade: the same-day growth is floored at 1 from this grade up (3: the
    published run and this model; 2: fsrs-rs >= 0.9 and newer fsrs-optimizer); s_min: the lower clamp of S after
    every step and of w0..w3 (S_MIN = 0.001; upstream's --secs runs 1e-4, models/fsrs_init.SECS_S_MIN)."""
    lower, upper = bounds(s_min)
    return SeqEngine(plugin(), lower, upper, opts=[float(floor_grade), float(s_min)])


def clip_weights(w) -> np.ndarray:
    return np.minimum(np.maximum(np.asarray(w, dtype=np.float64), LOWER), UPPER)


def predict(w, data: ReviewData, floor_grade: int = FLOOR_GRADE, s_min: float = S_MIN) -> np.ndarray:
    """R for every row of `data` in row order (NaN without history): one float64 forward pass per card."""
    return engine(floor_grade, s_min).predict(w, data)


def loss_and_grad(w, w_init, sigma, data: ReviewData, weights=None, floor_grade: int = FLOOR_GRADE,
                  max_seq_len: int | None = None, s_min: float = S_MIN) -> tuple[float, np.ndarray]:
    """Σ weight·BCE + Σ((w − w_init)/σ)² and its gradient (torch clamp semantics), over all rows of `data` (or
    those with history length ≤ max_seq_len when given)."""
    return engine(floor_grade, s_min).loss_and_grad(w, data, weights=weights, w_init=w_init, sigma=sigma,
                                             max_seq_len=max_seq_len)


def fit(w_init, sigma, train: ReviewData, cfg=None, method: str = "adam", seed: int = SEED,
        floor_grade: int = FLOOR_GRADE, lr: float = LR, check_every_epoch: bool = False,
        s_min: float = S_MIN) -> np.ndarray:
    """All 21 parameters trained from `w_init` (the post-S0 vector, also the prior centre): the engine's Adam
    (cfg's n_epoch, batch_size, max_seq_len, recency; mini-batches of whole cards, seeded), returning clipped
    float64 weights. The result is the better (lower full objective) of w_init and the final weights;
    check_every_epoch=True also considers the end of every epoch, as upstream does (each check is a full forward
    pass; under the cosine schedule the last epoch is practically always the best, so it is off by default).
    method="lbfgs": scipy's L-BFGS-B within the bounds on the same objective (for the bench). s_min: as `engine`."""
    eng = engine(floor_grade, s_min)
    if method == "lbfgs":
        from scipy.optimize import minimize

        max_seq_len = int(getattr(cfg, "max_seq_len", 64))
        weights = recency_weights(len(train)) if getattr(cfg, "recency", False) else None
        res = minimize(lambda x: loss_and_grad(x, w_init, sigma, train, weights, floor_grade, max_seq_len, s_min),
                       eng.clip(w_init), jac=True, method="L-BFGS-B", bounds=list(zip(eng.lower, eng.upper)))
        return eng.clip(res.x)
    if method != "adam":
        raise ValueError(f"unknown method {method!r}")
    return eng.fit(w_init, train, cfg, w_init=w_init, sigma=sigma, lr=lr, seed=seed,
                   check_every_epoch=check_every_epoch)


def warmup() -> None:
    """Compile (or load from numba's cache) the engine's FSRS-6 kernels on a two-card toy set."""
    from engine.seq_engine import toy_data

    data = toy_data()
    predict(DEFAULT_W, data)
    loss_and_grad(DEFAULT_W, DEFAULT_W, SIGMA, data)
    fit(DEFAULT_W, SIGMA, data)


class FSRS6(Model):
    name = "FSRS-6"
    # upstream's --secs (config.ACCEPTS_SECS): fractional intervals, same-day targets, s_min 1e-4 (fast trainer)
    accepts_secs = name in ACCEPTS_SECS

    def __init__(self, cfg=None):
        if cfg is None:
            from config import RunConfig

            cfg = RunConfig()
        self.cfg = cfg
        self.n_params = 0 if cfg.default else 4 if cfg.S0 else 17 if cfg.two_buttons else 21
        # upstream's --secs (config.s_min): S and w0..w3 bounded below by 1e-4 instead of 0.001
        self.secs = bool(getattr(cfg, "secs_mode", False))
        self.s_min = SECS_S_MIN if self.secs else S_MIN
        self.w = list(DEFAULT_W)
        self.w_init: list[float] | None = None
        self.train_result = None  # training.TrainResult of the upstream-style trainer

    def compile_units(self) -> list:
        """The engine's units: its trainer's only when this row trains on it (not --default, --S0, the torch
        trainer)."""
        return engine(s_min=self.s_min).compile_units(train=self.n_params > 4 and
                                                      getattr(self.cfg, "trainer", "fast") == "fast")

    def fit(self, train: ReviewData) -> "FSRS6":
        if self.cfg.default:
            return self
        decay = DEFAULT_W[20]
        # secs mode: no recall smoothing and no L1 pull in the S0 fit, bounds [1e-4, 100] (upstream's pretrain)
        s0 = initialize_s0(train.rows, lambda t, s: forgetting_curve(t, s, decay), DEFAULT_W[:4], self.s_min,
                           secs=self.secs)
        w_init = list(s0) + DEFAULT_W[4:]
        self.w_init = w_init  # also the centre of the L2 prior
        if self.cfg.S0:
            self.w = w_init
            return self
        if getattr(self.cfg, "trainer", "upstream") == "fast":
            w = fit(w_init, list(SIGMA), train, self.cfg, s_min=self.s_min)
            self.w = [float(x) for x in (w.tolist() if hasattr(w, "tolist") else w)]
            return self
        import torch

        import upstream.training as training
        from upstream.fsrs6_torch import FSRS6Net

        net = FSRS6Net(sys.modules[__name__], w_init, dtype=torch.float32)
        self.train_result = training.train(net, train, self.cfg, lr=LR, dtype=torch.float32)
        self.w = net.w.detach().double().tolist()
        return self

    def predict(self, test: ReviewData) -> np.ndarray:
        """One float64 forward pass per card through the engine (every target reads a prefix of its card)."""
        if len(test) and test.rows["seq_pos"].min() < 1:
            raise ValueError("a target without history (seq_pos 0) cannot be predicted")
        return predict(self.w, test, s_min=self.s_min)

    def parameters(self) -> list[float]:
        return [round(float(x), 6) for x in self.w]
