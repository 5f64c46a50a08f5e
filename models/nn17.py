"""NN-17 (39 parameters): a neural re-creation of SuperMemo-17's structure; spec models.md §2.5, SB
models/nn_17.py@0e0b0dc9, features in other.py@00c9de57 (`model_name == "NN-17"`).

Input per previous review k: (t_k, G_k, L_k), t_0 = 0, L_k = number of Again ratings among the card's reviews before
k. State (S, D). Small MLPs Linear(in→1) → Mish → Linear(1→1) → activation:
  rw(D, S, R) → softplus → exp(−x) clamped to [1e−4, 0.9999];  next_d(D, rw, G) → sigmoid;
  pls(rw, L) → softplus;  sinc(D', S_r, rw) → softplus;  best_sinc(sinc_t, sinc_nn) → softplus.
First review: S = S0[G] (clamped to [s_min, 36500]), D = D0[G].
Later review: R_t = 0.9^{t/S} clamped to [1e−4, 0.9999]; r_w = rw(D, S, R_t) clamped; S_r = ln 0.9 / ln r_w · t
clamped to [s_min, 36500]; D' = next_d(D, r_w, G); PLS = pls(r_w, L) clamped; sinc_t = 1 + e^{w0}·(5(1−D')+1)·
S_r^{−w1}·e^{−r_w·w2}; sinc_nn = 1 + sinc(D', S_r, r_w); best = 1 + best_sinc(sinc_t, sinc_nn) (upstream's
`best_sinc.clamp(1, 100)` result is discarded: no clamp [QUIRK]); S' = S_r·best if G > 1 else PLS, clamped.
Prediction: p = rw(D, S, 0.9^{t/S}) (R not clamped here). s_min = 0.01 (day mode).
Clipper after every step: S0 ∈ [s_min, 100], D0 ∈ [0, 1], sinc_w ∈ [−5, 5] × [0, 1] × [−5, 5].
Fine-tune: Adam(lr 4e-2) (upstream BaseModel: no weight decay), 5 epochs, batch 512, cosine; final-epoch weights.
Upstream runs the batch from an all-ones state and takes the first-review branch when the WHOLE state equals ones,
which is step 0 of every sequence; here step 0 of a card is its first review.

Compiled (models/nn17_kernels.py: the recurrence and its reverse pass in numba, one forward and one reverse pass
per card): fit_cards runs the whole fine-tune in one call (models/card_fit.py, float64) and predict_cards one pass
per group of cards. The torch methods (`step`, `run`, `forward_batch`, `target_p`) stay as the reference path for
the tests and `--trainer upstream`. Module names follow upstream's so its state dicts load unchanged.

Card grouping "shuffled" (neural_seq.fit_cards), as for the GRU family. NN-17 used to group "sorted" because,
stepped in torch at ~20 operations per time step whatever the number of cards, a group cost as many steps as its
longest card; compiled, a group costs its reviews (measured before fit_cards became compiled-only: "sorted" stepped
by torch's Adam per group took 2× the CPU time). Held-out Log Loss, shuffled / sorted / upstream's per-target trainer:
  embedded users 1–3 (other.py, weighted by reviews)          0.1435 / 0.1419 / 0.1430
  upstream-check users 8, 12 (bench/bench_neural.py, mean)    0.1450 / 0.1437 / 0.1449
  3 simulated users, seed 100 (bench/bench_neural.py, mean)   0.3259 / 0.3309 / 0.3286
  3 simulated users, seed 200                                 0.3384 / 0.3437 / 0.3413
Neither wins everywhere (sorted by ~0.0015 on the real users, shuffled by ~0.005 on the simulated ones); both stay
within 0.003 of upstream's trainer, shuffled within 0.0005 on the real users.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor, nn

import training
from models.neural_seq import CardBatch, CompiledCardNet, NeuralModel, card_first_mask
from models.nn17_kernels import LOG_09, N_PARAMS, S_MAX, S_MIN, nn17_cards_loss

INIT_S_MAX = 100.0
SINC_W_LOWER = (-5.0, 0.0, -5.0)
SINC_W_UPPER = (5.0, 1.0, 5.0)


class ExpActivation(nn.Module):
    def forward(self, x):
        return torch.exp(-x).clamp(0.0001, 0.9999)


def _mlp(n_in: int, out_act: nn.Module, *extra: nn.Module) -> nn.Sequential:
    return nn.Sequential(nn.Linear(n_in, 1), nn.Mish(), nn.Linear(1, 1), out_act, *extra)


class NN17Net(CompiledCardNet):
    """Fine-tuned and predicted compiled (models/nn17_kernels.py); the torch methods below are the reference path
    (tests, `--trainer upstream`)."""

    lr = 4e-2
    optimizer = "adam"
    card_loss = nn17_cards_loss

    init_s = [1, 2.5, 4.5, 10]
    init_d = [1, 0.72, 0.07, 0.05]
    init_w = [1.26, 0.0, 0.67]

    def __init__(self):
        super().__init__()
        self.S0 = nn.Parameter(torch.tensor(self.init_s, dtype=torch.float32))
        self.D0 = nn.Parameter(torch.tensor(self.init_d, dtype=torch.float32))
        self.sinc_w = nn.Parameter(torch.tensor(self.init_w, dtype=torch.float32))
        self.rw = _mlp(3, nn.Softplus(), ExpActivation())
        self.next_d = _mlp(3, nn.Sigmoid())
        self.pls = _mlp(2, nn.Softplus())
        self.sinc = _mlp(3, nn.Softplus())
        self.best_sinc = _mlp(2, nn.Softplus())

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

    # --- card-sequence contract -------------------------------------------------------------------------------
    def step_features(self, data):
        g = np.asarray(data.seq_rating, dtype=np.float64)
        again = (g == 1).astype(np.float64)
        first = card_first_mask(data)
        total = np.cumsum(again)
        run_start = np.maximum.accumulate(np.where(first, np.arange(len(g)), 0))
        lapses = total - again - (total - again)[run_start]  # Again ratings before k within the card
        return np.stack([np.asarray(data.seq_delta_t, dtype=np.float64), g, lapses], axis=1)

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

    # --- compiled -------------------------------------------------------------------------------------------
    def model_consts(self) -> tuple:
        return ()

    def param_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """clip_params_'s box on the flat parameters (S0, D0, sinc_w first; the MLP weights are free)."""
        lower, upper = np.full(N_PARAMS, -np.inf), np.full(N_PARAMS, np.inf)
        lower[:11] = [S_MIN] * 4 + [0.0] * 4 + list(SINC_W_LOWER)
        upper[:11] = [INIT_S_MAX] * 4 + [1.0] * 4 + list(SINC_W_UPPER)
        return lower, upper


class NN17(NeuralModel):
    name = "NN-17"
    net_class = NN17Net
    n_epoch = 5
