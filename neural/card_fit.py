"""The compiled fine-tune loop shared by the neural networks whose loss and gradient are compiled (GRU, GRU-P:
neural/gru_kernels.py; NN-17: neural/nn17_kernels.py): neural_seq.fit_cards's recipe in one numba call, so no Python
runs per optimizer step.

A network supplies `card_loss(model, layout, cards, theta, want, grad, p_out) -> Σ weight·BCE`, an @njit function
over the targets of the given cards: it writes each target's P(recall) to p_out[target] and, with `want`, ADDS the
gradient to grad (flat, like theta). `model` is the network's own tuple of constants; `layout` is
card_net.CardSet.layout(): (feats, c_start, c_steps, c_tfirst, c_count, t_pos, t_dt, t_g, t_y, t_w) — card c's
step inputs are rows c_start[c] .. c_start[c] + c_steps[c] − 1 of feats, its targets the entries c_tfirst[c] ..
c_tfirst[c] + c_count[c] − 1 of the t_* arrays (history length, elapsed time, last history rating, label, weight).
feats may have any number of columns (the LSTM's: fractional interval, duration, rating); the network's
kernel_layout may append entries of its own (the LSTM's memo of its card groups' chunk plans, when every epoch
visits the cards in one order).

The optimizer recipe is a tuple (`recipe()`): GRU, GRU-P and NN-17 use Adam/AdamW at a cosine learning rate; the
LSTM (models/lstm.py) adds what its Reptile-style fine-tune needs: AdamW with its own betas and a state carried in
from pretraining, a learning rate per epoch, the loss scaled by the group's size, a pull towards the starting weights
and gradient-norm clipping.
"""

from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path

import numpy as np
from numba import njit

from neural.gru_kernels import gru_cards_loss as card_loss  # CARD-LOSS-IMPORT (rebound per network: loop_for)
from engine.kernel_math import adam_step, cosine_lr

ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8


@njit(cache=True)
def group_bounds(counts, batch_size):
    """Cards (already in visiting order, with `counts` targets each) cut into groups of ≈ batch_size targets: a card
    joins the group in which its first target falls. Returns the group boundaries (positions), n_groups + 1 of them."""
    n = len(counts)
    bounds = np.empty(n + 1, dtype=np.int64)
    nb = 0
    acc = 0
    for k in range(n):
        g = acc // batch_size
        if k == 0 or g != (acc - counts[k - 1]) // batch_size:
            bounds[nb] = k
            nb += 1
        acc += counts[k]
    bounds[nb] = n
    return bounds[:nb + 1]


def recipe(epoch_lr, t_max=0, betas=ADAM_BETAS, eps=ADAM_EPS, weight_decay=0.0, size_exp=1.0, reg_scale=0.0,
           clip_norm=np.inf, max_groups=0) -> tuple:
    """fit_card_groups's optimizer recipe: epoch_lr[e] is epoch e's learning rate, times torch's cosine factor
    (1 + cos(π·s/t_max))/2 at optimizer step s when t_max > 0; Adam with `betas`, `eps` (AdamW when weight_decay >
    0); a group's loss is Σ weight·BCE · B^(size_exp − 1) (B: its targets; size_exp 1: the plain sum, i.e.
    mean·B^size_exp) + reg_scale·‖θ − θ_start‖²; the gradient's norm clipped at clip_norm (torch's
    clip_grad_norm_); only the first max_groups groups of an epoch (0: all; Reptile's inner loop)."""
    return (np.asarray(epoch_lr, dtype=np.float64), int(t_max), float(betas[0]), float(betas[1]), float(eps),
            float(weight_decay), float(size_exp), float(reg_scale), float(clip_norm), int(max_groups))


@njit(cache=True)
def fit_card_groups(model, layout, orders, batch_size, theta, lower, upper, recipe, m, v, step0):
    """Epoch e visits the cards in orders[e] in groups of ≈ batch_size targets; after each group, one Adam step
    (torch's update; `recipe()` says which) with the state m, v, step0 (torch's exp_avg, exp_avg_sq, step: zeros
    and 0 for a fresh optimizer, updated in place), then theta is clipped to [lower, upper]. theta (flat, float64)
    is updated in place; the final weights are kept (upstream's effective behaviour, see neural_seq). Returns the
    number of optimizer steps taken."""
    epoch_lr, t_max, b1, b2, eps, weight_decay, size_exp, reg_scale, clip_norm, max_groups = recipe
    c_count = layout[4]
    n_w = len(theta)
    grad = np.zeros(n_w)
    start = theta.copy()
    p_scratch = np.empty(len(layout[5]))
    want = n_w >= 0  # True, as a run-time bool: a literal True would compile card_loss once more (a type of its own)
    step = 0
    for e in range(orders.shape[0]):
        order = orders[e]
        bounds = group_bounds(c_count[order], batch_size)
        n_groups = len(bounds) - 1 if max_groups <= 0 else min(len(bounds) - 1, max_groups)
        for b in range(n_groups):
            grad[:] = 0.0
            cards = order[bounds[b]:bounds[b + 1]]
            card_loss(model, layout, cards, theta, want, grad, p_scratch)
            if size_exp != 1.0:
                n_t = 0
                for c in cards:
                    n_t += c_count[c]
                grad *= float(n_t) ** (size_exp - 1.0)
            if reg_scale != 0.0:
                for j in range(n_w):
                    grad[j] += 2.0 * reg_scale * (theta[j] - start[j])
            if clip_norm < np.inf:
                norm = math.sqrt(np.sum(grad * grad))
                grad *= min(clip_norm / (norm + 1e-6), 1.0)
            lr_t = cosine_lr(epoch_lr[e], step, t_max) if t_max > 0 else epoch_lr[e]
            step += 1
            adam_step(theta, grad, m, v, step0 + step, lr_t, b1, b2, eps, weight_decay)
            for j in range(n_w):
                theta[j] = min(max(theta[j], lower[j]), upper[j])
    return step


@lru_cache(maxsize=None)
def loop_for(card_loss_fn):
    """fit_card_groups bound to one network's card_loss (an @njit function): this module copied with its
    CARD-LOSS-IMPORT line importing that function (seq_engine.bound_copy says why a copy), compiled once and cached
    on disk; made once per process (fit_cards calls it for every fold)."""
    from engine.seq_engine import bound_copy

    fn = card_loss_fn.py_func
    source = Path(__file__).read_text(encoding="utf-8")
    line = next(x for x in source.splitlines() if x.endswith("# CARD-LOSS-IMPORT (rebound per network: loop_for)"))
    copy = bound_copy(source, line, f"from {fn.__module__} import {fn.__name__} as card_loss",
                      f"card_fit_{fn.__module__.replace('.', '_')}_{fn.__name__}")
    return copy.fit_card_groups
