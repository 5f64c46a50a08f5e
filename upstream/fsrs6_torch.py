"""FSRS-6 as upstream's PyTorch model (`--trainer upstream`, float32): a torch module that steps the equations
models/fsrs6.py writes once (handed to it as `eq`, that module, so that nothing here imports a model). Imported only
by that path, so that a default FSRS-6 run never loads torch (~1.5 s)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

import upstream.training as training

GAMMA = 1.0  # weight of the L2 prior


def stability_sequence(eq, w: Tensor, t: Tensor, g: Tensor) -> Tensor:
    """S after each review of padded sequences: t, g of shape [L, B] (time-major) → S of shape [L, B], the grade
    and weight terms computed once for all steps (eq: models/fsrs6.py).

    Column b's entries past its real length are padding: computed, never read."""
    s, d = eq.first_state(w, g[0])
    out = [s]
    if t.shape[0] > 1:
        terms = eq.grade_terms(w, t, g)
        c = eq.weight_terms(w)
        for k in range(1, t.shape[0]):
            s, d = eq.advance(w, k, terms, t[k], s, d, c)
            out.append(s)
    return torch.stack(out)


class FSRS6Net(training.TrainableModule):
    """The 21 weights as one trainable tensor, plus the prior centre used by the penalty (eq: models/fsrs6.py, its
    equations, prior widths and clip box)."""

    def __init__(self, eq, w, w_init=None, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.eq = eq
        self.w = nn.Parameter(torch.tensor(list(w), dtype=dtype))
        self.register_buffer("w_init", torch.tensor(list(w if w_init is None else w_init), dtype=dtype))
        self.register_buffer("sigma", torch.tensor(eq.SIGMA, dtype=dtype))
        self.register_buffer("lo", torch.tensor(eq.CLIP_LO, dtype=dtype))
        self.register_buffer("hi", torch.tensor(eq.CLIP_HI, dtype=dtype))

    def forward_batch(self, batch: training.Batch) -> Tensor:
        s_all = stability_sequence(self.eq, self.w, batch.t, batch.g)
        s = s_all[batch.lengths - 1, torch.arange(len(batch))]
        return self.eq.forgetting_curve(batch.delta_t, s, self.w[20])

    def penalty(self) -> Tensor:
        return GAMMA * torch.sum(torch.square(self.w - self.w_init) / torch.square(self.sigma))

    def clip_(self) -> None:
        self.w.data.copy_(torch.clamp(self.w.data, self.lo, self.hi))
