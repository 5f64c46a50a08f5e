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

Compiled (neural/nn17_kernels.py: the recurrence and its reverse pass in numba, one forward and one reverse pass
per card): fit_cards runs the whole fine-tune in one call (neural/card_fit.py, float64) and predict_cards one pass
per group of cards. The training kernel is ~60% of a user's CPU time and bound by libm calls (a step is ~25 exp/
log/tanh/pow calls forward). These changes cut it from 0.37 to ~0.15 CPU s on a 45k-review simulated user: the
reverse pass reads what it needs again from the forward pass's record instead of recomputing it (0.31,
bit-identical), and Mish's tanh(softplus(a)) and σ(a), and each softplus with its derivative (and the rw output's
e^{−softplus}), come from one exp instead of up to four libm calls (nn17_kernels.mish_parts, softplus_parts;
0.17 CPU s, final weights within 2e-12 relative, result lines unchanged); a target whose interval is its card's
next step's reads that step's rw values instead of recomputing them (~0.15 CPU s, bit-identical).

This module is torch-free: the description (NN17Spec: flat layout, features, clip box, optimizer) and its FlatNet
twin, which the default run uses (neural/card_net.py). The torch module NN17Net (neural/nn17_torch.py:
`step`, `run`, `forward_batch`, `target_p`) inherits the same description and stays the reference path for the tests
and `--trainer upstream`. Parameter names follow upstream's module names so its state dicts load unchanged.

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

from neural.card_net import CompiledNet, FlatNet, LazyClass, NeuralModel, card_first_mask
from neural.nn17_kernels import N_PARAMS, S_MIN, nn17_cards_loss

INIT_S_MAX = 100.0
SINC_W_LOWER = (-5.0, 0.0, -5.0)
SINC_W_UPPER = (5.0, 1.0, 5.0)
MLP_INPUTS = {"rw": 3, "next_d": 3, "pls": 2, "sinc": 3, "best_sinc": 2}  # Linear(in→1) → Mish → Linear(1→1) → act


class NN17Spec(CompiledNet):
    """NN-17's description: S0[4], D0[4], sinc_w[3], then the five MLPs' Linear layers (indices 0 and 2 of each
    nn.Sequential), in the torch module's parameters() order."""

    lr = 4e-2
    optimizer = "adam"
    card_loss = nn17_cards_loss

    def param_shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        out = [("S0", (4,)), ("D0", (4,)), ("sinc_w", (3,))]
        for name, n_in in MLP_INPUTS.items():
            out += [(f"{name}.0.weight", (1, n_in)), (f"{name}.0.bias", (1,)), (f"{name}.2.weight", (1, 1)),
                    (f"{name}.2.bias", (1,))]
        return out

    def step_features(self, data):
        g = np.asarray(data.seq_rating, dtype=np.float64)
        again = (g == 1).astype(np.float64)
        first = card_first_mask(data)
        total = np.cumsum(again)
        run_start = np.maximum.accumulate(np.where(first, np.arange(len(g)), 0))
        lapses = total - again - (total - again)[run_start]  # Again ratings before k within the card
        return np.stack([np.asarray(data.seq_delta_t, dtype=np.float64), g, lapses], axis=1)

    def model_consts(self) -> tuple:
        return ()

    def param_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """The clipper's box on the flat parameters (S0, D0, sinc_w first; the MLP weights are free)."""
        lower, upper = np.full(N_PARAMS, -np.inf), np.full(N_PARAMS, np.inf)
        lower[:11] = [S_MIN] * 4 + [0.0] * 4 + list(SINC_W_LOWER)
        upper[:11] = [INIT_S_MAX] * 4 + [1.0] * 4 + list(SINC_W_UPPER)
        return lower, upper


class NN17Flat(NN17Spec, FlatNet):
    """NN-17 without torch."""


class NN17(NeuralModel):
    name = "NN-17"
    first_run_seconds = 12  # its first run's compiling (warmup.py), measured in an empty cache
    net_class = LazyClass("neural.nn17_torch:NN17Net")
    flat_class = NN17Flat
    n_epoch = 5
