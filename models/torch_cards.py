"""A compact card-major torch trainer for models written to the own-model contract (init / step / curve in torch).

Interim: the contract's trainer is `models/autograd_engine.py` (AutogradEngine, written in parallel); this module
does the same job in the same shape (`predict(module, w, data)`, `fit(module, w0, train, cfg, recipe)`) so that a
model using it switches by one import. It exists so that FSRS-7 (models/fsrs7.py) trains today.

Why card-major: every target of a card reads the state after a prefix of the same review sequence, so one forward
pass over a batch of whole cards, padded by length into [L, C] time-major tensors, yields every target's prediction
(target (card c, history length k) reads the state after review k−1 of column c), and torch autograd gives the
gradient of the batch's summed loss. Padding steps are computed on harmless values (t = 1, g = 3) and never read.

Objective per mini-batch (upstream's trainer, spec models.md §0.4): Σ weight·BCE(p, y) over the batch's targets +
PRIOR_WEIGHT·Σ((w − w_init)/σ)²·B/N (B = the batch's targets, N = all kept targets); Adam with the recipe's lr and
betas, cosine annealing stepped per batch over all batches of all epochs, the model's clip after every step. Targets
whose history is longer than max_seq_len are left out of the loss (upstream's BatchDataset drops them). Batches are
whole cards in a new random order each epoch (numpy Generator, seed 2023), cut once they hold ≥ batch_size targets.
keep "last" returns the final weights; "best" the lowest full objective (mean weighted BCE + prior/N) among the
weights before each epoch and after the last, as upstream's checkpoint rule. float64 on the CPU.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from models.base import ReviewData
from models.seq_engine import Cards

SEED = 2023


def _pad(cards: Cards, sel: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """[L, C] intervals and ratings of the cards `sel` (L = the longest history any of their targets reads)."""
    n = cards.c_n[sel]
    width = int(n.max()) if len(n) else 1
    cols = np.arange(width)
    inside = cols[None, :] < n[:, None]
    idx = np.where(inside, cards.c_start[sel][:, None] + cols[None, :], 0)
    t = np.where(inside, cards.seq_dt[idx], 1.0)
    g = np.where(inside, cards.seq_g[idx], 3)
    return torch.as_tensor(t.T.copy(), dtype=torch.float64), torch.as_tensor(g.T.copy(), dtype=torch.int64)


def _forward(module, w: torch.Tensor, cards: Cards, sel: np.ndarray) -> tuple[torch.Tensor, np.ndarray]:
    """Predictions of every target of the cards `sel` (card by card, targets in history-length order) and their
    positions in the Cards target arrays."""
    t, g = _pad(cards, sel)
    state = module.init(w, g[0], t[0])
    states = [[x] for x in state]
    for k in range(1, t.shape[0]):
        state = module.step(w, state, t[k], g[k])
        for lst, x in zip(states, state):
            lst.append(x)
    stacked = [torch.stack(lst) for lst in states]
    targets = np.concatenate([np.arange(cards.c_tb[c], cards.c_te[c]) for c in sel]) if len(sel) else np.zeros(0, int)
    column = np.repeat(np.arange(len(sel)), cards.c_te[sel] - cards.c_tb[sel])
    row = torch.as_tensor(cards.t_pos[targets] - 1)
    col = torch.as_tensor(column)
    read = tuple(s[row, col] for s in stacked)
    p = module.curve(w, read, torch.as_tensor(cards.t_dt[targets], dtype=torch.float64))
    return p, targets


def predict(module, w, data: ReviewData, chunk: int = 4096) -> np.ndarray:
    """P(recall) for every row of `data`, in row order (NaN for a row without history)."""
    cards = Cards(data)
    out = np.full(len(data), np.nan)
    wt = torch.as_tensor(np.asarray(w, dtype=np.float64))
    order = np.argsort(cards.c_n, kind="stable")  # similar lengths together: less padding
    with torch.no_grad():
        for lo in range(0, len(order), chunk):
            p, targets = _forward(module, wt, cards, order[lo:lo + chunk])
            out[cards.t_row[targets]] = p.numpy()
    return out


def _clip(module, w: torch.Tensor, lower: torch.Tensor, upper: torch.Tensor) -> None:
    with torch.no_grad():
        w.copy_(torch.clamp(w, lower, upper))
        if hasattr(module, "clip"):  # bounds that depend on other parameters (e.g. FSRS-7's ordered S0)
            w.copy_(module.clip(w))


def _batches(cards: Cards, rng: np.random.Generator, batch_size: int) -> list[np.ndarray]:
    order = rng.permutation(len(cards.c_start))
    sizes = (cards.c_te - cards.c_tb)[order]
    out, lo, acc = [], 0, 0
    for k, size in enumerate(sizes):
        acc += size
        if acc >= batch_size:
            out.append(order[lo:k + 1])
            lo, acc = k + 1, 0
    if lo < len(order):
        out.append(order[lo:])
    return out


def fit(module, w0, train: ReviewData, cfg, recipe: dict, *, w_init=None, sigma=None, prior_weight: float = 1.0,
        weights: np.ndarray | None = None) -> np.ndarray:
    """Trained weights from w0 (clipped first). `weights`: per-row loss weights of `train` (None: all 1);
    `sigma`: L2 prior widths around `w_init` (None: no prior). recipe: lr, betas, n_epoch, batch_size, keep."""
    lower = torch.as_tensor(np.asarray(module.LOWER, dtype=np.float64))
    upper = torch.as_tensor(np.asarray(module.UPPER, dtype=np.float64))
    w = torch.nn.Parameter(torch.as_tensor(np.asarray(w0, dtype=np.float64)).clone())
    _clip(module, w.data, lower, upper)
    max_seq_len = int(getattr(cfg, "max_seq_len", 64))
    use = train.rows["seq_pos"].to_numpy() <= max_seq_len
    cards = Cards(train, weights, use)
    n = len(cards.t_row)
    n_epoch = int(recipe["n_epoch"])
    if n == 0 or n_epoch <= 0:
        return w.detach().numpy().copy()
    y = torch.as_tensor(cards.t_y)
    wt = torch.as_tensor(cards.t_wt)
    if sigma is not None:
        centre = torch.as_tensor(np.asarray(w_init, dtype=np.float64))
        inv_var = 1.0 / torch.as_tensor(np.asarray(sigma, dtype=np.float64)) ** 2

    def prior():
        return prior_weight * torch.sum((w - centre) ** 2 * inv_var) if sigma is not None else None

    rng = np.random.default_rng(SEED)
    plan = [_batches(cards, rng, int(recipe["batch_size"])) for _ in range(n_epoch)]
    optimizer = torch.optim.Adam([w], lr=float(recipe["lr"]), betas=tuple(recipe.get("betas", (0.9, 0.999))),
                                 weight_decay=float(recipe.get("weight_decay", 0.0)))
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max(1, sum(len(b) for b in plan)))
    keep_best = recipe.get("keep", "best") == "best"
    best = (np.inf, None)

    def checkpoint():
        nonlocal best
        with torch.no_grad():
            loss = 0.0
            for sel in _batches(cards, np.random.default_rng(0), 1 << 16):
                p, targets = _forward(module, w, cards, sel)
                loss += float((F.binary_cross_entropy(p, y[targets], reduction="none") * wt[targets]).sum())
            loss /= n
            pen = prior()
            loss += 0.0 if pen is None else float(pen) / n
        if loss < best[0]:
            best = (loss, w.detach().numpy().copy())

    for epoch_batches in plan:
        if keep_best:
            checkpoint()
        for sel in epoch_batches:
            optimizer.zero_grad()
            p, targets = _forward(module, w, cards, sel)
            loss = (F.binary_cross_entropy(p, y[targets], reduction="none") * wt[targets]).sum()
            pen = prior()
            if pen is not None:
                loss = loss + pen * len(targets) / n
            loss.backward()
            optimizer.step()
            scheduler.step()
            _clip(module, w.data, lower, upper)
    if keep_best:
        checkpoint()
        if best[1] is not None:
            return best[1]
    return w.detach().numpy().copy()
