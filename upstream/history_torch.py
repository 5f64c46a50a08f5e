"""The torch side of the whole-history models, ACT-R (models/act_r.py) and DASH / DASH[MCM] / DASH[ACT-R]
(models/dash.py): upstream's modules over padded histories, which `--trainer upstream` (upstream/training.py) fits and
which the compiled engine kernels are tested against. A module of its own so that the default (compiled) trainer
never imports torch (~1.5 s per process)."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

import upstream.training as training
from models.base import ReviewData
from models.history_constants import ACTR_MIN_DELTA, MCM_TAU, SECONDS_PER_DAY, WINDOWS


# ------------------------------------------------------------------------------------------ ACT-R

def torch_cumulative_times(t, lengths, delta_t):
    """Upstream's ACT-R input [L+1, B]: cumsum of (history intervals, the target's interval), zero-padded after."""
    n_rows, width = t.shape[1], t.shape[0] + 1
    idx = torch.arange(width).unsqueeze(1)
    full = torch.cat([t, torch.zeros(1, n_rows, dtype=t.dtype)], dim=0)
    full = torch.where(idx == lengths.unsqueeze(0), delta_t.unsqueeze(0), full)
    full = torch.where(idx <= lengths.unsqueeze(0), full, torch.zeros_like(full))
    sp = torch.cumsum(full, dim=0)
    return torch.where(idx <= lengths.unsqueeze(0), sp, torch.zeros_like(sp))


def torch_act_r_p(w, t, lengths, delta_t):
    """Upstream's ACT_R.forward over the padded batch, read at each row's target (index = history length)."""
    sp = torch_cumulative_times(t, lengths, delta_t)
    m = [torch.full_like(sp[0], -math.inf)]
    for i in range(1, sp.shape[0]):
        prev = torch.stack(m)
        decay = w[1] * torch.exp(prev) + w[0]
        m.append(torch.log(torch.sum(((sp[i] - sp[:i]) * SECONDS_PER_DAY * w[4]).clamp_min(1) ** (-decay), dim=0)))
    m_now = torch.stack(m)[lengths, torch.arange(sp.shape[1])]
    return 1 / (1 + torch.exp((w[3] - m_now) / w[2]))


class ClippedWeights(training.TrainableModule):
    """A model whose parameters are one tensor `w`, clamped into [lower, upper] after every step (ACT-R,
    DASH[ACT-R]); subclasses give forward_batch."""

    def __init__(self, w, lower, upper, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.w = nn.Parameter(torch.tensor(np.asarray(w, dtype=np.float64), dtype=dtype))
        self.register_buffer("lo", torch.tensor(np.asarray(lower, dtype=np.float64), dtype=dtype))
        self.register_buffer("hi", torch.tensor(np.asarray(upper, dtype=np.float64), dtype=dtype))

    def clip_(self) -> None:
        self.w.data.copy_(torch.clamp(self.w.data, self.lo, self.hi))


class ACTRNet(ClippedWeights):
    def forward_batch(self, batch: training.Batch):
        return torch_act_r_p(self.w, batch.t, batch.lengths, batch.delta_t)


# ------------------------------------------------------------------------------------------ DASH family

def torch_deltas(t, lengths, delta_t):
    """Δ[j, b] = time from history review j of row b to its target (0 on padding), and the validity mask.
    t: [L, B] intervals before each history review (time-major, zero-padded); lengths: [B]; delta_t: [B]."""
    idx = torch.arange(t.shape[0]).unsqueeze(1)
    valid = idx < lengths.unsqueeze(0)
    tv = torch.where(valid, t, torch.zeros_like(t))
    csum = torch.cumsum(tv, dim=0)
    delta = csum[-1:] - csum + delta_t.unsqueeze(0)
    return torch.where(valid, delta, torch.zeros_like(delta)), valid


def torch_window_features(t, g, lengths, delta_t, decay: bool):
    """[B, 8] DASH (decay=False) or DASH[MCM] features from padded histories."""
    delta, valid = torch_deltas(t, lengths, delta_t)
    success = g > 1
    cols = []
    for window, tau in zip(WINDOWS, MCM_TAU):
        inside = valid & (delta <= window)
        e = torch.exp(-delta / tau) if decay else torch.ones_like(delta)
        e = torch.where(inside, e, torch.zeros_like(e))
        cols += [e.sum(0), torch.where(success, e, torch.zeros_like(e)).sum(0)]
    return torch.stack(cols, dim=1)


def torch_dash_p(w, x):
    return torch.sigmoid(torch.log(x + 1) @ w[:8] + w[8])


def torch_dash_actr_p(w, t, g, lengths, delta_t):
    """Upstream's DASH_ACTR.forward on [Δ, r] built from padded histories (padding: Δ = 0, r = 0)."""
    delta, valid = torch_deltas(t, lengths, delta_t)
    r = torch.where(valid, (g > 1).to(t.dtype), torch.zeros_like(t))
    x = delta.clamp_min(ACTR_MIN_DELTA)
    term = torch.where(x == ACTR_MIN_DELTA, torch.zeros_like(x), x ** -w[1]) * torch.where(r == 0, w[2], w[3])
    return torch.sigmoid(w[0] * torch.log(1 + torch.sum(term, dim=0).clamp_min(0)) + w[4])


class DASHNet(training.TrainableModule):
    """Upstream's DASH / DASH[MCM] module (nn.Linear(8, 1) + sigmoid on ln(1 + x)) with its 9 weights as one
    tensor. `features` (optional, [N, 8]) are those of the trainer's rows, looked up by `batch.rows`."""

    def __init__(self, w, decay: bool, features=None, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.decay = decay
        self.w = nn.Parameter(torch.tensor(np.asarray(w, dtype=np.float64), dtype=dtype))
        self.features = None if features is None else torch.as_tensor(features, dtype=dtype)

    def forward_batch(self, batch: training.Batch):
        if self.features is not None:
            x = self.features[torch.as_tensor(batch.rows)]
        else:
            x = torch_window_features(batch.t, batch.g, batch.lengths, batch.delta_t, self.decay)
        return torch_dash_p(self.w, x)


class DASHACTRNet(ClippedWeights):
    def forward_batch(self, batch: training.Batch):
        return torch_dash_actr_p(self.w, batch.t, batch.g, batch.lengths, batch.delta_t)


def history_features(data: ReviewData, decay: bool, chunk: int = 8192) -> np.ndarray:
    """[len(data), 8] window features of every row, computed by the torch code from padded histories."""
    rows = data.rows
    starts = np.array(rows["seq_start"], dtype=np.int64)
    lengths = np.array(rows["seq_pos"], dtype=np.int64)
    delta_t = np.array(rows["delta_t"], dtype=np.float64)
    out = np.zeros((len(rows), 8))
    for lo in range(0, len(rows), chunk):
        sel = slice(lo, lo + chunk)
        t, g = training.pad_histories(data.seq_delta_t, data.seq_rating, starts[sel], lengths[sel])
        with torch.no_grad():
            out[sel] = torch_window_features(torch.as_tensor(t.T.copy()), torch.as_tensor(g.T.copy()),
                                             torch.as_tensor(lengths[sel]), torch.as_tensor(delta_t[sel]),
                                             decay).numpy()
    return out
