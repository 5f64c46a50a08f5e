"""The torch side of `SeqModel` (engine/seq_model.py): the module the upstream-style trainer (`--trainer upstream`,
upstream/training.py) fits, and the reference the compiled engine is tested against. Apart from seq_model.py so that a run
with the default trainer never imports torch (~1.5 s per process)."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor, nn

import upstream.training as training


class TorchSeqNet(training.TrainableModule):
    """The model's weights as one tensor, stepped in torch over time-major padded histories."""

    def __init__(self, kernels, w, lower, upper, w_init=None, sigma=None, grad_mask=None,
                 dtype: torch.dtype = torch.float32):
        super().__init__()
        self.kern = kernels
        self.w = nn.Parameter(torch.tensor(np.asarray(w, dtype=np.float64), dtype=dtype))
        self.register_buffer("lo", torch.tensor(np.asarray(lower, dtype=np.float64), dtype=dtype))
        self.register_buffer("hi", torch.tensor(np.asarray(upper, dtype=np.float64), dtype=dtype))
        self.has_prior = sigma is not None
        if self.has_prior:
            self.register_buffer("w_init", torch.tensor(np.asarray(w_init, dtype=np.float64), dtype=dtype))
            self.register_buffer("sigma", torch.tensor(np.asarray(sigma, dtype=np.float64), dtype=dtype))
        if grad_mask is not None:
            mask = torch.tensor(np.asarray(grad_mask, dtype=np.float64), dtype=dtype)
            self.w.register_hook(lambda g: g * mask)

    def states(self, t: Tensor, g: Tensor) -> list[Tensor]:
        """State components after each review: t, g of shape [L, B] → list of [L, B] tensors."""
        state = self.kern.torch_init(self.w, g[0], t[0])
        out = [[x] for x in state]
        for k in range(1, t.shape[0]):
            state = self.kern.torch_step(self.w, state, t[k], g[k])
            for lst, x in zip(out, state):
                lst.append(x)
        return [torch.stack(lst) for lst in out]

    def forward_batch(self, batch: training.Batch) -> Tensor:
        cols = torch.arange(len(batch))
        state = tuple(s[batch.lengths - 1, cols] for s in self.states(batch.t, batch.g))
        return self.kern.torch_curve(self.w, state, batch.delta_t)

    def penalty(self):
        if not self.has_prior:
            return None
        return torch.sum(torch.square(self.w - self.w_init) / torch.square(self.sigma))

    def clip_(self) -> None:
        self.w.data.copy_(torch.clamp(self.w.data, self.lo, self.hi))


class HLRNet(training.TrainableModule):
    """Upstream's module: nn.Linear(2, 1) on the count features, h = 2^out, p = 0.5^(t/h). The features of the
    rows given to the trainer are precomputed (float32 like upstream's tensors) and looked up by `batch.rows`."""

    def __init__(self, w, features: np.ndarray, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.w = nn.Parameter(torch.tensor(np.asarray(w, dtype=np.float64), dtype=dtype))
        self.x = torch.as_tensor(np.asarray(features, dtype=np.float32), dtype=dtype)

    def forward_batch(self, batch: training.Batch):
        x = self.x[torch.as_tensor(batch.rows)]
        h = 2 ** (x[:, 0] * self.w[0] + x[:, 1] * self.w[1] + self.w[2])
        return 0.5 ** (batch.delta_t / h)
