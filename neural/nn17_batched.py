"""NN-17's recurrence for T stacked networks: the batched trainer's network (neural/neural_batched.py,
docs/gpu.md), so that many (user, fold) fine-tunes of NN-17 train in one pass on a device.

Per task it computes what NN17Net's torch reference (neural/nn17_torch.py: `first`, `step`, `head`) and the
compiled default path (neural/nn17_kernels.py) compute; the equations are in models/nn17.py. What is stacked:
every parameter [T, ...]; the five MLPs Linear(n→1) → Mish → Linear(1→1) → activation become a batched matrix
product per task plus elementwise operations, so one kernel launch serves all tasks. The schedule (fit_cards'
groups, Adam without weight decay at the cosine rate, the clip box after every step) is neural_batched.fit_tasks';
the box comes from NN17Spec.param_bounds() (StackedNet.bounds).

Step 0 of a card is its first review, S = S0[G] clamped, D = D0[G] (upstream starts from an all-ones state and
takes that branch at step 0); the all-ones state before it is never read (no target has an empty history). Like
the GRU's stacked pass, step k runs only the card slots still running (cards sorted longest first per task), so no
padding step is ever computed: a padded step of NN-17 (t = 0, G = 0) would be finite but is simply not needed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from neural.neural_batched import Padded, StackedNet
from neural.nn17_kernels import LOG_09, S_MAX, S_MIN

R_MIN, R_MAX = 0.0001, 0.9999  # ExpActivation's clamp and R_t's


def mlp(w: dict[str, Tensor], name: str, inputs: list[Tensor]) -> Tensor:
    """NN-17's Linear(n→1) → Mish → Linear(1→1) of every task (before its output activation): inputs n tensors
    [t, N] → [t, N]."""
    x = torch.stack(inputs, dim=-1)  # [t, N, n]
    a = torch.baddbmm(w[f"{name}.0.bias"].unsqueeze(1), x, w[f"{name}.0.weight"].transpose(1, 2))  # [t, N, 1]
    z = F.mish(a) * w[f"{name}.2.weight"] + w[f"{name}.2.bias"].unsqueeze(1)  # [t, 1, 1] and [t, 1, 1]
    return z.squeeze(-1)


def rw(w: dict[str, Tensor], d: Tensor, s: Tensor, r: Tensor) -> Tensor:
    """The rw MLP with its output activation: e^{−softplus(z)} clamped to [1e−4, 0.9999] (ExpActivation)."""
    return torch.exp(-F.softplus(mlp(w, "rw", [d, s, r]))).clamp(R_MIN, R_MAX)


def first(w: dict[str, Tensor], g: Tensor) -> tuple[Tensor, Tensor]:
    """(S, D) after a card's first review with rating g [t, N]."""
    idx = (g.long() - 1).clamp(0, 3)
    return w["S0"].gather(1, idx).clamp(S_MIN, S_MAX), w["D0"].gather(1, idx)


def step(w: dict[str, Tensor], s: Tensor, d: Tensor, t: Tensor, g: Tensor, lapses: Tensor) -> tuple[Tensor, Tensor]:
    """NN17Net.step for every task: state (s, d) [t, N], the review's (t, G, lapses) → the next (s, d)."""
    rt = torch.pow(0.9, t / s).clamp(R_MIN, R_MAX)
    r_w = rw(w, d, s, rt).clamp(R_MIN, R_MAX)
    sr = (LOG_09 / torch.log(r_w) * t).clamp(S_MIN, S_MAX)
    nd = torch.sigmoid(mlp(w, "next_d", [d, r_w, g]))
    pls = F.softplus(mlp(w, "pls", [r_w, lapses])).clamp(S_MIN, S_MAX)
    sw = w["sinc_w"].unsqueeze(1)  # [t, 1, 3]
    sinc_t = 1 + torch.exp(sw[..., 0]) * (5 * (1 - nd) + 1) * torch.pow(sr, -sw[..., 1]) * torch.exp(-r_w * sw[..., 2])
    sinc_nn = 1 + F.softplus(mlp(w, "sinc", [nd, sr, r_w]))
    best = 1 + F.softplus(mlp(w, "best_sinc", [sinc_t, sinc_nn]))
    return torch.where(g > 1, sr * best, pls).clamp(S_MIN, S_MAX), nd


class StackedNN17(StackedNet):
    """T NN-17 networks (every parameter, in NN17Net's parameters() order)."""

    width = 64  # per card slot and step: the state (2) and the ~30 intermediate values autograd keeps

    def forward(self, rows: Tensor, pb: Padded) -> Tensor:
        w = self.rows_of(rows)
        n0 = pb.n_run[0] if pb.n_run else 0
        s, d = first(w, pb.x[0, :, :n0, 1]) if n0 else (None, None)
        ones = torch.ones(len(rows), pb.C, dtype=self.dtype, device=self.device)
        s_all, d_all = [ones], [ones]  # index 0: the state before any step (never read)
        if n0:
            s_all.append(s)
            d_all.append(d)
        for k, n in enumerate(pb.n_run[1:], start=1):
            x = pb.x[k, :, :n]
            s, d = step(w, s[:, :n], d[:, :n], x[..., 0], x[..., 1], x[..., 2])
            s_all.append(s)
            d_all.append(d)
        s_t = torch.cat(s_all, dim=1).gather(1, pb.t_state)
        d_t = torch.cat(d_all, dim=1).gather(1, pb.t_state)
        return rw(w, d_t, s_t, torch.pow(0.9, pb.t_dt / s_t))
