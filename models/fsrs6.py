"""FSRS-6: 21 parameters, power forgetting curve with a trainable decay (spec models.md §1.2, variants §1.3).

The memory state of a card is (S, D). The first review sets S = w[G-1] and D = D0(G); every later review updates
both from the previous state, the elapsed time t and the grade G; the prediction for a target is R(t, S) with the
state after its history. The stability formulas use the difficulty from BEFORE the review (as SB, OPT and RS do).

Same-day reviews (t < 1) use the short-term update, whose growth factor is floored at 1 when G >= 3. This is the
published srs-benchmark FSRS-6 (fsrs-optimizer after Dec 2025 and fsrs-rs 6.x floor it already for G >= 2; the two
differ only on same-day Hard reviews).

Everything runs in float32, as upstream's PyTorch model does (and as the peers agree to ~1e-6).
"""

from __future__ import annotations

import importlib

import numpy as np
import torch
from torch import Tensor, nn

import training
from models.base import Model, ReviewData
from models.fsrs6_params import CLIP_HI, CLIP_LO, DEFAULT_W, LR, S_MAX, S_MIN, SIGMA  # noqa: F401 (re-exported)
from models.fsrs_init import initialize_s0

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


def _fast_fit():
    try:
        fsrs6_fast = importlib.import_module("models.fsrs6_fast")
    except ImportError as exc:
        raise RuntimeError("--trainer fast needs models/fsrs6_fast.py (fit(w_init, sigma, train, cfg)), "
                           f"which could not be imported: {exc}") from exc
    return fsrs6_fast.fit


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
            w = _fast_fit()(w_init, list(SIGMA), train, self.cfg)
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
