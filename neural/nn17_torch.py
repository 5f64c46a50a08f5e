"""NN-17's torch module (description and equations in models/nn17.py): the upstream trainer's model (`--trainer
upstream`), pretrain.py's, and the reference the compiled kernels (neural/nn17_kernels.py) are tested against.
Imported only by those paths, so that a default NN-17 run never loads torch. The init_* values are upstream's
starting weights; a run loads the pretrained state dict over all of them.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

import upstream.training as training
from neural.neural_seq import CardBatch, CompiledCardNet
from models.nn17 import INIT_S_MAX, MLP_INPUTS, SINC_W_LOWER, SINC_W_UPPER, NN17Spec
from neural.nn17_kernels import LOG_09, S_MAX, S_MIN


class ExpActivation(nn.Module):
    def forward(self, x):
        return torch.exp(-x).clamp(0.0001, 0.9999)


def _mlp(n_in: int, out_act: nn.Module, *extra: nn.Module) -> nn.Sequential:
    return nn.Sequential(nn.Linear(n_in, 1), nn.Mish(), nn.Linear(1, 1), out_act, *extra)


class NN17Net(NN17Spec, CompiledCardNet):
    """Fine-tuned and predicted compiled (neural/nn17_kernels.py); the torch methods below are the reference path
    (tests, `--trainer upstream`)."""

    init_s = [1, 2.5, 4.5, 10]
    init_d = [1, 0.72, 0.07, 0.05]
    init_w = [1.26, 0.0, 0.67]

    def __init__(self):
        super().__init__()
        self.S0 = nn.Parameter(torch.tensor(self.init_s, dtype=torch.float32))
        self.D0 = nn.Parameter(torch.tensor(self.init_d, dtype=torch.float32))
        self.sinc_w = nn.Parameter(torch.tensor(self.init_w, dtype=torch.float32))
        self.rw = _mlp(MLP_INPUTS["rw"], nn.Softplus(), ExpActivation())
        self.next_d = _mlp(MLP_INPUTS["next_d"], nn.Sigmoid())
        self.pls = _mlp(MLP_INPUTS["pls"], nn.Softplus())
        self.sinc = _mlp(MLP_INPUTS["sinc"], nn.Softplus())
        self.best_sinc = _mlp(MLP_INPUTS["best_sinc"], nn.Softplus())

    # --- the recurrence ---------------------------------------------------------------------------------------
    def first(self, g: Tensor) -> tuple[Tensor, Tensor]:
        idx = (g.long() - 1).clamp(0, 3)
        return self.S0[idx].clamp(S_MIN, S_MAX), self.D0[idx]

    def step(self, s: Tensor, d: Tensor, t: Tensor, g: Tensor, lapses: Tensor) -> tuple[Tensor, Tensor]:
        rt = torch.pow(0.9, t / s).clamp(0.0001, 0.9999)
        rw = self.rw(torch.stack([d, s, rt], dim=1)).squeeze(1).clamp(0.0001, 0.9999)
        sr = (LOG_09 / torch.log(rw) * t).clamp(S_MIN, S_MAX)
        nd = self.next_d(torch.stack([d, rw, g], dim=1)).squeeze(1)
        pls = self.pls(torch.stack([rw, lapses], dim=1)).squeeze(1).clamp(S_MIN, S_MAX)
        w = self.sinc_w
        sinc_t = 1 + torch.exp(w[0]) * (5 * (1 - nd) + 1) * torch.pow(sr, -w[1]) * torch.exp(-rw * w[2])
        sinc_nn = 1 + self.sinc(torch.stack([nd, sr, rw], dim=1)).squeeze(1)
        best = 1 + self.best_sinc(torch.stack([sinc_t, sinc_nn], dim=1)).squeeze(1)
        ns = torch.where(g > 1, sr * best, pls).clamp(S_MIN, S_MAX)
        return ns, nd

    def run(self, x: Tensor) -> Tensor:
        """States [L, B, 2] (S, D) after each step of x [L, B, 3] = (t, G, lapses); step 0 is the first review."""
        s, d = self.first(x[0, :, 1])
        out = [torch.stack([s, d], dim=1)]
        for k in range(1, x.shape[0]):
            s, d = self.step(s, d, x[k, :, 0], x[k, :, 1], x[k, :, 2])
            out.append(torch.stack([s, d], dim=1))
        return torch.stack(out)

    def head(self, state: Tensor, dt: Tensor) -> Tensor:
        s, d = state[:, 0], state[:, 1]
        return self.rw(torch.stack([d, s, torch.pow(0.9, dt / s)], dim=1)).squeeze(1)

    # --- card-sequence contract (torch) --------------------------------------------------------------------
    def card_states(self, x, c_steps):
        ones = torch.ones(1, x.shape[1], 2, dtype=x.dtype)
        if x.shape[0] == 0:
            return ones
        return torch.cat([ones, self.run(x)], dim=0)

    def target_p(self, states, batch: CardBatch):
        return self.head(states[batch.t_pos, batch.t_card], batch.t_dt)

    def forward_batch(self, batch: training.Batch) -> Tensor:
        """Upstream's per-target tensor (t, G, L) of each history, zero-padded, stepped from its first review."""
        again = (batch.g == 1).to(batch.g.dtype)
        lapses = torch.cumsum(again, dim=0) - again
        states = self.run(torch.stack([batch.t, batch.g, lapses], dim=-1))
        return self.head(states[batch.lengths - 1, torch.arange(len(batch))], batch.delta_t)

    def clip_params_(self) -> None:
        with torch.no_grad():
            self.S0.clamp_(S_MIN, INIT_S_MAX)
            self.D0.clamp_(0, 1)
            lo = torch.tensor(SINC_W_LOWER, dtype=self.sinc_w.dtype)
            hi = torch.tensor(SINC_W_UPPER, dtype=self.sinc_w.dtype)
            self.sinc_w.copy_(torch.maximum(torch.minimum(self.sinc_w, hi), lo))
