"""FSRS-6: 21 parameters, power forgetting curve with a trainable decay (spec models.md §1.2, variants §1.3).

The memory state of a card is (S, D). The first review sets S = w[G-1] and D = D0(G); every later review updates
both from the previous state, the elapsed time t and the grade G; the prediction for a target is R(t, S) with the
state after its history. The stability formulas use the difficulty from BEFORE the review (as SB, OPT and RS do).

Same-day reviews (t < 1) use the short-term update, whose growth factor is floored at 1 when G >= 3. This is the
published srs-benchmark FSRS-6 (fsrs-optimizer after Dec 2025 and fsrs-rs 6.x floor it already for G >= 2; the two
differ only on same-day Hard reviews).

Two trainers: `--trainer upstream` runs the torch model of upstream/fsrs6_torch.py (float32, as upstream's PyTorch
model does; the peers agree to ~1e-6); `--trainer fast` (default) trains the same equations in float64 through the
general one-pass-per-card engine (engine/seq_engine.py) with FSRS-6's plug-in (models/fsrs6_kernels.py): `fit`,
`predict` and `loss_and_grad` below are its functional API (also used by bench/bench_fsrs6.py). Predictions are the
engine's float64 forward pass whichever trainer fitted the weights (and for FSRS-rs's weights too), so a default run
never imports torch; upstream's float32 stabilities differ from them by ~1e-7 relative.
"""

from __future__ import annotations

import numpy as np

from config import ACCEPTS_SECS
from models.base import Model, ReviewData, recency_weights  # noqa: F401 (recency_weights: re-exported for benches)
from models.fsrs6_kernels import (CLIP_HI, CLIP_LO, DEFAULT_W, FLOOR_GRADE, LR, N_PARAMS, S_MAX,  # noqa: F401
                                  S_MIN, SIGMA, forgetting_curve)
from models.fsrs_init import SECS_S_MIN, initialize_s0
from engine.seq_engine import SeqEngine


# ---------------------------------------------------------------------------------- the compiled (fast) trainer
KERNELS = "models.fsrs6_kernels"
# the same equations in the traced contract's spelling (init / step / curve in torch), which the tracer can generate
# a plug-in and lanes from (bench/bench_generated_lanes.py; lane_kernels/fsrs6_lanes.py says why the hand ones stay)
TORCH_EQUATIONS = "upstream.fsrs6_torch:TorchSteps"
LOWER = np.array(CLIP_LO, dtype=np.float64)
UPPER = np.array(CLIP_HI, dtype=np.float64)
SEED = 2023


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
    return SeqEngine(KERNELS, lower, upper, opts=[float(floor_grade), float(s_min)])


def clip(w) -> np.ndarray:
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

        net = FSRS6Net(w_init, dtype=torch.float32)
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
