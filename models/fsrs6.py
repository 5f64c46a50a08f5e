"""FSRS-6: 21 parameters, power forgetting curve with a trainable decay (spec models.md §1.2, variants §1.3).

The memory state of a card is (S, D). The first review sets S = w[G-1] and D = D0(G); every later review updates
both from the previous state, the elapsed time t and the grade G; the prediction for a target is R(t, S) with the
state after its history. The stability formulas use the difficulty from BEFORE the review (as SB, OPT and RS do).

Same-day reviews (t < 1) use the short-term update, whose growth factor is floored at 1 when G >= 3. This is the
published srs-benchmark FSRS-6 (fsrs-optimizer after Dec 2025 and fsrs-rs 6.x floor it already for G >= 2; the two
differ only on same-day Hard reviews).

Two trainers: `--trainer upstream` runs the torch model below (float32, as upstream's PyTorch model does; the peers
agree to ~1e-6); `--trainer fast` (default) trains the same equations in float64 through the general one-pass-per-
card engine (models/seq_engine.py) with FSRS-6's plug-in (models/fsrs6_kernels.py): `fit`, `predict` and
`loss_and_grad` below are its functional API (also used by bench/bench_fsrs6.py). Predictions of a fitted FSRS6 are
the torch model's in both cases.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor, nn

import training
from models.base import Model, ReviewData, recency_weights  # noqa: F401 (recency_weights: re-exported for benches)
from models.fsrs6_kernels import (CLIP_HI, CLIP_LO, DEFAULT_W, FLOOR_GRADE, LR, N_PARAMS, S_MAX,  # noqa: F401
                                  S_MIN, SIGMA)
from models.fsrs_init import initialize_s0
from models.seq_engine import SeqEngine

GAMMA = 1.0  # weight of the L2 prior
PREDICT_CHUNK = 8192  # cards per forward pass in predict()


def forgetting_curve(t, s, decay):
    """R(t, S) = (1 + F·t/S)^(−d), F = 0.9^(−1/d) − 1, so that R(S, S) = 0.9. Works on tensors and arrays."""
    factor = 0.9 ** (-1.0 / decay) - 1.0
    return (1.0 + factor * t / s) ** (-decay)


def _init_d(w: Tensor, g: Tensor) -> Tensor:
    return w[4] - torch.exp(w[5] * (g - 1)) + 1


def first_state(w: Tensor, g: Tensor) -> tuple[Tensor, Tensor]:
    """State after the first review with grade g (shape [B])."""
    s = w[:4][(g.long() - 1).clamp(0, 3)]
    d = _init_d(w, g).clamp(1, 10)
    return s.clamp(S_MIN, S_MAX), d


def _grade_terms(w: Tensor, t: Tensor, g: Tensor) -> dict:
    """Everything in a later review's update that depends on (t, G) and the weights but not on the state.
    Computed once for all steps of a batch ([L, B]), so the per-step graph stays small."""
    return {
        "short": t < 1,
        "recall": g > 1,
        "floor": g >= 3,  # published run: the same-day growth is floored at 1 only for Good/Easy
        # e^{w8}·h·b with the Hard penalty h and the Easy bonus b
        "inc": torch.exp(w[8]) * torch.where(g == 2, w[15], 1.0) * torch.where(g == 4, w[16], 1.0),
        "sinc_g": torch.exp(w[17] * (g - 3 + w[18])),  # grade part of the short-term factor
        "dd": -w[6] * (g - 3),  # ΔD before damping
    }


def _advance(w: Tensor, k, terms: dict, t: Tensor, s: Tensor, d: Tensor, c: dict):
    """One later review (row k of `terms`) from the previous state (s, d); `c` holds weight-only constants."""
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


def _constants(w: Tensor) -> dict:
    """Weight-only terms of the update, computed once per sequence batch."""
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


def next_state(w: Tensor, t: Tensor, g: Tensor, s: Tensor, d: Tensor) -> tuple[Tensor, Tensor]:
    """State after a later review (elapsed t, grade g) from the previous state (s, d); all shape [B]."""
    return _advance(w, slice(None), _grade_terms(w, t, g), t, s, d, _constants(w))


def stability_sequence(w: Tensor, t: Tensor, g: Tensor) -> Tensor:
    """S after each review of padded sequences: t, g of shape [L, B] (time-major) → S of shape [L, B].

    Column b's entries past its real length are padding: computed, never read."""
    s, d = first_state(w, g[0])
    out = [s]
    if t.shape[0] > 1:
        terms = _grade_terms(w, t, g)
        c = _constants(w)
        for k in range(1, t.shape[0]):
            s, d = _advance(w, k, terms, t[k], s, d, c)
            out.append(s)
    return torch.stack(out)


class TorchSteps:
    """FSRS-6's torch recurrence in the own-model contract's spelling (init / step / curve, models/own_model.py),
    so that the autograd engine runs it: `AutogradEngine(TorchSteps, CLIP_LO, CLIP_HI)`. A namespace of its own
    rather than this module, whose numpy `clip` is not the contract's optional torch `clip` hook."""

    @staticmethod
    def init(w, g, t):
        return first_state(w, g)

    @staticmethod
    def step(w, state, t, g):
        return next_state(w, t, g, *state)

    @staticmethod
    def curve(w, state, t):
        return forgetting_curve(t, state[0], w[20])


class FSRS6Net(training.TrainableModule):
    """The 21 weights as one trainable tensor, plus the prior centre used by the penalty."""

    def __init__(self, w, w_init=None, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.w = nn.Parameter(torch.tensor(list(w), dtype=dtype))
        self.register_buffer("w_init", torch.tensor(list(w if w_init is None else w_init), dtype=dtype))
        self.register_buffer("sigma", torch.tensor(SIGMA, dtype=dtype))
        self.register_buffer("lo", torch.tensor(CLIP_LO, dtype=dtype))
        self.register_buffer("hi", torch.tensor(CLIP_HI, dtype=dtype))

    def forward_batch(self, batch: training.Batch) -> Tensor:
        s_all = stability_sequence(self.w, batch.t, batch.g)
        s = s_all[batch.lengths - 1, torch.arange(len(batch))]
        return forgetting_curve(batch.delta_t, s, self.w[20])

    def penalty(self) -> Tensor:
        return GAMMA * torch.sum(torch.square(self.w - self.w_init) / torch.square(self.sigma))

    def clip_(self) -> None:
        self.w.data.copy_(torch.clamp(self.w.data, self.lo, self.hi))


# ---------------------------------------------------------------------------------- the compiled (fast) trainer
KERNELS = "models.fsrs6_kernels"
LOWER = np.array(CLIP_LO, dtype=np.float64)
UPPER = np.array(CLIP_HI, dtype=np.float64)
SEED = 2023


def engine(floor_grade: int = FLOOR_GRADE) -> SeqEngine:
    """The engine on FSRS-6's plug-in; floor_grade: the same-day growth is floored at 1 from this grade up (3: the
    published run and this model; 2: fsrs-rs >= 0.9 and newer fsrs-optimizer)."""
    return SeqEngine(KERNELS, LOWER, UPPER, opts=[float(floor_grade)])


def clip(w) -> np.ndarray:
    return np.minimum(np.maximum(np.asarray(w, dtype=np.float64), LOWER), UPPER)


def predict(w, data: ReviewData, floor_grade: int = FLOOR_GRADE) -> np.ndarray:
    """R for every row of `data` in row order (NaN without history): one float64 forward pass per card."""
    return engine(floor_grade).predict(w, data)


def loss_and_grad(w, w_init, sigma, data: ReviewData, weights=None, floor_grade: int = FLOOR_GRADE,
                  max_seq_len: int | None = None) -> tuple[float, np.ndarray]:
    """Σ weight·BCE + Σ((w − w_init)/σ)² and its gradient (torch clamp semantics), over all rows of `data` (or
    those with history length ≤ max_seq_len when given)."""
    return engine(floor_grade).loss_and_grad(w, data, weights=weights, w_init=w_init, sigma=sigma,
                                             max_seq_len=max_seq_len)


def fit(w_init, sigma, train: ReviewData, cfg=None, method: str = "adam", seed: int = SEED,
        floor_grade: int = FLOOR_GRADE, lr: float = LR, check_every_epoch: bool = False) -> np.ndarray:
    """All 21 parameters trained from `w_init` (the post-S0 vector, also the prior centre): the engine's Adam
    (cfg's n_epoch, batch_size, max_seq_len, recency; mini-batches of whole cards, seeded), returning clipped
    float64 weights. The result is the better (lower full objective) of w_init and the final weights;
    check_every_epoch=True also considers the end of every epoch, as upstream does (each check is a full forward
    pass; under the cosine schedule the last epoch is practically always the best, so it is off by default).
    method="lbfgs": scipy's L-BFGS-B within the bounds on the same objective (for the bench)."""
    eng = engine(floor_grade)
    if method == "lbfgs":
        from scipy.optimize import minimize

        max_seq_len = int(getattr(cfg, "max_seq_len", 64))
        weights = recency_weights(len(train)) if getattr(cfg, "recency", False) else None
        res = minimize(lambda x: loss_and_grad(x, w_init, sigma, train, weights, floor_grade, max_seq_len),
                       clip(w_init), jac=True, method="L-BFGS-B", bounds=list(zip(LOWER, UPPER)))
        return clip(res.x)
    if method != "adam":
        raise ValueError(f"unknown method {method!r}")
    return eng.fit(w_init, train, cfg, w_init=w_init, sigma=sigma, lr=lr, seed=seed,
                   check_every_epoch=check_every_epoch)


def warmup() -> None:
    """Compile (or load from numba's cache) the engine's FSRS-6 kernels on a two-card toy set."""
    import pandas as pd

    rows = pd.DataFrame({"card_id": [0, 0, 1], "delta_t": [1.0, 3.0, 2.0], "y": [1, 0, 1],
                         "seq_start": [0, 0, 3], "seq_pos": [1, 2, 1]})
    data = ReviewData(rows, np.array([0.0, 1.0, 3.0, 0.0, 2.0]), np.array([3, 3, 1, 1, 3], dtype=np.int8))
    predict(DEFAULT_W, data)
    loss_and_grad(DEFAULT_W, DEFAULT_W, SIGMA, data)
    fit(DEFAULT_W, SIGMA, data)


class FSRS6(Model):
    name = "FSRS-6"
    dtype = torch.float32

    def __init__(self, cfg=None):
        if cfg is None:
            from config import RunConfig

            cfg = RunConfig()
        self.cfg = cfg
        self.n_params = 0 if cfg.default else 4 if cfg.S0 else 17 if cfg.two_buttons else 21
        self.w = list(DEFAULT_W)
        self.w_init: list[float] | None = None
        self.train_result: training.TrainResult | None = None

    # ----------------------------------------------------------------------------------------------- training
    def fit(self, train: ReviewData) -> "FSRS6":
        if self.cfg.default:
            return self
        decay = DEFAULT_W[20]
        s0 = initialize_s0(train.rows, lambda t, s: forgetting_curve(t, s, decay), DEFAULT_W[:4], S_MIN)
        w_init = list(s0) + DEFAULT_W[4:]
        self.w_init = w_init  # also the centre of the L2 prior
        if self.cfg.S0:
            self.w = w_init
            return self
        if getattr(self.cfg, "trainer", "upstream") == "fast":
            w = fit(w_init, list(SIGMA), train, self.cfg)
            self.w = [float(x) for x in (w.tolist() if hasattr(w, "tolist") else w)]
            return self
        net = FSRS6Net(w_init, dtype=self.dtype)
        self.train_result = training.train(net, train, self.cfg, lr=LR, dtype=self.dtype)
        self.w = net.w.detach().double().tolist()
        return self

    # ----------------------------------------------------------------------------------------------- inference
    def stabilities(self, data: ReviewData) -> np.ndarray:
        """S after each target's history, with one pass per card: every target of a card reads a prefix of the
        same sequence, so each card's sequence is run once (up to its longest target history), cards batched."""
        rows = data.rows
        n = len(rows)
        out = np.empty(n, dtype=np.float64)
        if n == 0:
            return out
        starts = rows["seq_start"].to_numpy(np.int64)
        pos = rows["seq_pos"].to_numpy(np.int64)
        if pos.min() < 1:
            raise ValueError("a target without history (seq_pos 0) cannot be predicted")
        cards, card_of_row = np.unique(starts, return_inverse=True)
        need = np.zeros(len(cards), dtype=np.int64)
        np.maximum.at(need, card_of_row, pos)
        order = np.argsort(need, kind="stable")  # similar lengths together: less padding
        col_of_card = np.empty(len(cards), dtype=np.int64)
        w = torch.tensor(self.w, dtype=self.dtype)
        with torch.no_grad():
            for lo in range(0, len(cards), PREDICT_CHUNK):
                chunk = order[lo:lo + PREDICT_CHUNK]
                col_of_card[chunk] = np.arange(len(chunk))
                t, g = training.pad_histories(data.seq_delta_t, data.seq_rating, cards[chunk], need[chunk])
                s_all = stability_sequence(w, torch.as_tensor(t.T.copy(), dtype=self.dtype),
                                           torch.as_tensor(g.T.copy(), dtype=self.dtype)).numpy()
                in_chunk = np.zeros(len(cards), dtype=bool)
                in_chunk[chunk] = True
                sel = np.flatnonzero(in_chunk[card_of_row])
                out[sel] = s_all[pos[sel] - 1, col_of_card[card_of_row[sel]]]
        return out

    def predict(self, test: ReviewData) -> np.ndarray:
        s = torch.as_tensor(self.stabilities(test), dtype=self.dtype)
        t = torch.tensor(test.rows["delta_t"].to_numpy(np.float64), dtype=self.dtype)
        with torch.no_grad():
            r = forgetting_curve(t, s, torch.tensor(self.w[20], dtype=self.dtype))
        return r.numpy().astype(np.float64)

    def parameters(self) -> list[float]:
        return [round(float(x), 6) for x in self.w]
