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

import numpy as np
import torch
from torch import Tensor, nn

import training
from models.base import InadequateData, Model, ReviewData
from models.fsrs_init import initialize_s0

DEFAULT_W = [0.212, 1.2931, 2.3065, 8.2956, 6.4133, 0.8334, 3.0194, 0.001, 1.8722, 0.1666, 0.796, 1.4835, 0.0614,
             0.2629, 1.6483, 0.6014, 1.8729, 0.5425, 0.0912, 0.0658, 0.1542]
# Prior widths of the L2 pull towards the post-S0 weights.
SIGMA = [6.43, 9.66, 17.58, 27.85, 0.57, 0.28, 0.6, 0.12, 0.39, 0.18, 0.33, 0.3, 0.09, 0.16, 0.57, 0.25, 1.03, 0.31,
         0.32, 0.14, 0.27]
S_MIN = 0.001
S_MAX = 36500.0
# Box constraints applied after every optimizer step (published run: w19 lower bound 0).
CLIP_LO = [S_MIN] * 4 + [1, 0.001, 0.001, 0.001, 0, 0, 0.001, 0.001, 0.001, 0.001, 0, 0, 1, 0, 0, 0, 0.1]
CLIP_HI = [100] * 4 + [10, 4, 4, 0.75, 4.5, 0.8, 3.5, 5, 0.25, 0.9, 4, 1, 6, 2, 2, 0.8, 0.8]
GAMMA = 1.0  # weight of the L2 prior
LR = 4e-2
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


def next_state(w: Tensor, t: Tensor, g: Tensor, s: Tensor, d: Tensor) -> tuple[Tensor, Tensor]:
    """State after a later review (elapsed t, grade g) from the previous state (s, d); all shape [B]."""
    r = forgetting_curve(t, s, w[20])
    # Difficulty: linear damping towards 10, then mean reversion to D0(Easy).
    d_new = d - w[6] * (g - 3) * (10 - d) / 9
    d_new = w[7] * (w[4] - torch.exp(w[5] * 3) + 1) + (1 - w[7]) * d_new  # D0(4)
    d_new = d_new.clamp(1, 10)
    # Stability, from the OLD difficulty d.
    hard = torch.where(g == 2, w[15], 1.0)
    easy = torch.where(g == 4, w[16], 1.0)
    s_recall = s * (1 + torch.exp(w[8]) * (11 - d) * s.pow(-w[9]) * (torch.exp(w[10] * (1 - r)) - 1) * hard * easy)
    s_forget = w[11] * d.pow(-w[12]) * ((s + 1).pow(w[13]) - 1) * torch.exp(w[14] * (1 - r))
    s_forget = torch.minimum(s_forget, s / torch.exp(w[17] * w[18]))
    sinc = torch.exp(w[17] * (g - 3 + w[18])) * s.pow(-w[19])
    s_short = s * torch.where(g >= 3, sinc.clamp(min=1), sinc)  # published run: floor only for Good/Easy
    s_new = torch.where(t < 1, s_short, torch.where(g > 1, s_recall, s_forget))
    return s_new.clamp(S_MIN, S_MAX), d_new


def stability_sequence(w: Tensor, t: Tensor, g: Tensor) -> Tensor:
    """S after each review of padded sequences: t, g of shape [L, B] (time-major) → S of shape [L, B].

    Column b's entries past its real length are padding: computed, never read."""
    s, d = first_state(w, g[0])
    out = [s]
    for k in range(1, t.shape[0]):
        s, d = next_state(w, t[k], g[k], s, d)
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
        from models import fsrs6_fast
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
