"""FSRS-6's equations in torch: the upstream-style trainer's model (`--trainer upstream`, float32 as upstream's
PyTorch model), the autograd engine's `TorchSteps`, and the reference the compiled plug-in (models/fsrs6_kernels.py)
is tested against. Imported only by those paths, so that a default FSRS-6 run never loads torch (~1.5 s)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

import upstream.training as training
from models.fsrs6_kernels import CLIP_HI, CLIP_LO, S_MAX, S_MIN, SIGMA, forgetting_curve

GAMMA = 1.0  # weight of the L2 prior


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
    """FSRS-6's torch recurrence in the own-model contract's spelling (init / step / curve, engine/own_model.py),
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
