"""GRU-P (297 parameters) and GRU (39 parameters): spec models.md §2.1–2.2, one pass per card (neural/neural_seq.py).

GRU-P (SB models/gru_p.py@00c9de57, features in other.py@00c9de57): a GRU(2→8) over the shifted sequence
step k = (t_{k+1}, G_k) — the rating of review k paired with the interval after it; the last step's interval is the
target's own delta_t — and p = σ(Linear(8→1)(h_last)). No forgetting curve: the probability comes out directly.
Fine-tune: AdamW(lr 1e-2, weight_decay 1e-5), 16 epochs, batch 512, cosine. `--short` (GRU-P-short) puts same-day
reviews into the sequence as steps (interval 0 between same-day reviews); targets stay long-term only.

One pass per card for GRU-P. A target with history length n ends with the step (its own delta_t, G_{n−1}); the
card's own shifted step n−1 is exactly that, because the interval after review n−1 IS the target's delta_t. So the
card is run ONCE through the GRU over its first n_max steps and every target reads its final state off the card's
sequence (h after step n−1). A target whose last inputs differ from its card's step (none that features.py builds;
e.g. a hand-edited delta_t) gets one GRU step of its own from the card's state after n−1 steps, so the result is
upstream's per-target computation in every case. The GRU is nn.GRU's recurrence compiled with its gradient
(neural/gru_kernels.py); the per-target path `forward_batch` (neural/gru_torch.py) runs torch's own nn.GRU upstream's
way, and the tests hold the two equal.

What runs how (default: compiled trainer, one user per process, no torch): fit_cards (neural/card_net.py) hands the
whole fine-tune to one numba call (neural/card_fit.py: per epoch the cards in torch.randperm order, cut into groups
of ≈ batch_size targets, one AdamW step per group); each group is one call of gru_kernels.gru_cards_loss, which runs
the group's cards side by side in lockstep (vectorised over cards, vectorised exp/tanh) and returns the group's
gradient; prediction runs the same kernel over groups of ≈ 16,384 targets. The fine-tune is ~90% of a GRU-P user's
time (a 45,000-review user: 0.81 CPU s, of which prediction ~0.05 s, features and metrics ~0.15 s); there is no
per-epoch evaluation pass (the final weights are kept, see neural/neural_seq.py), so nothing is computed and thrown
away.

GRU (SB models/rnn.py@6b652a99, `model_name == "GRU"`): a GRU(2→2) over the FSRS-style steps (t_k, G_k) (t_0 = 0),
S = exp(Linear(2→1)(h_last)), p = (1 + (19/81)·t/S)^(−0.5). Fine-tune: AdamW(lr 4e-2, weight_decay 1e-5), 5 epochs.

Both: orthogonal weight_ih/weight_hh and zero biases before the pretrained weights are loaded; the weights come from
pretrain/GRU-P.pth, pretrain/GRU-P-short.pth and pretrain/GRU.pth (made by pretrain.py; see its docstring for the
exact commands and data of the shipped files).

This module is torch-free: each network's description (GRUPSpec, GRUSpec: flat parameter layout, features, head,
optimizer) and its FlatNet twin, which the default run fine-tunes and predicts with (neural/card_net.py). The torch
modules (GRUPNet, GRUNet in neural/gru_torch.py) inherit the same description; the upstream trainer, CUDA, batched
users and pretrain.py use them.
"""

from __future__ import annotations

import numpy as np

from config import ACCEPTS_SECS
from neural.card_net import CompiledNet, FlatNet, LazyClass, NeuralModel
from neural.gru_kernels import HEAD_POWER_CURVE, HEAD_SIGMOID_CELL, gru_cards_loss, units_of

DECAY = -0.5
FACTOR = 0.9 ** (1 / DECAY) - 1  # 19/81: the FSRS-4.5 power curve, R(S, S) = 0.9


def _stack(*cols) -> np.ndarray:
    return np.stack([np.asarray(c, dtype=np.float64) for c in cols], axis=1)


class GRUFamilySpec(CompiledNet):
    """A one-layer GRU(2→H) + Linear(H→1), parameters named as nn.GRU's and nn.Linear's (rnn.*, fc.*)."""

    head_kind: int = HEAD_SIGMOID_CELL
    n_hidden: int = 8
    n_input: int = 2
    card_loss = gru_cards_loss

    def param_shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        H, F = self.n_hidden, self.n_input
        return [("rnn.weight_ih_l0", (3 * H, F)), ("rnn.weight_hh_l0", (3 * H, H)), ("rnn.bias_ih_l0", (3 * H,)),
                ("rnn.bias_hh_l0", (3 * H,)), ("fc.weight", (1, H)), ("fc.bias", (1,))]

    def model_consts(self) -> tuple:
        return (self.head_kind, units_of(self.n_hidden), FACTOR, DECAY)


class GRUPSpec(GRUFamilySpec):
    lr = 1e-2
    wd = 1e-5
    n_hidden = 8

    def step_features(self, data):
        """Step k = (interval after review k, rating of review k). At a card's last review the 'next interval'
        belongs to another card, but no target ever reads that step from the sequence (its last step is its own)."""
        return _stack(np.append(np.asarray(data.seq_delta_t, dtype=np.float64)[1:], 0.0), data.seq_rating)


class GRUSpec(GRUFamilySpec):
    head_kind = HEAD_POWER_CURVE
    lr = 4e-2
    wd = 1e-5
    n_hidden = 2

    def step_features(self, data):
        return _stack(data.seq_delta_t, data.seq_rating)


class GRUPFlat(GRUPSpec, FlatNet):
    """GRU-P without torch."""


class GRUFlat(GRUSpec, FlatNet):
    """GRU without torch."""


class GRUP(NeuralModel):
    name = "GRU-P"
    accepts_secs = name in ACCEPTS_SECS  # --short --secs: fractional intervals (weights pretrain/GRU-P-short-secs)
    first_run_seconds = 12  # its first run's compiling (warmup.py), measured in an empty cache (11.4 s, 29 Nov 2026)
    net_class = LazyClass("neural.gru_torch:GRUPNet")
    flat_class = GRUPFlat
    n_epoch = 16


class GRU(NeuralModel):
    name = "GRU"
    accepts_secs = name in ACCEPTS_SECS  # --short --secs: fractional intervals (weights pretrain/GRU-short-secs)
    first_run_seconds = 11  # its first run's compiling (warmup.py), measured in an empty cache (10.8 s, 29 Nov 2026)
    net_class = LazyClass("neural.gru_torch:GRUNet")
    flat_class = GRUFlat
    n_epoch = 5
