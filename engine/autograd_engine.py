"""The card-major autograd trainer: any model written as torch `init` / `step` / `curve` (engine/own_model.py, the
contract), trained with one forward pass per card and torch autograd for the gradient.

Why: the compiled engine (engine/seq_engine.py) needs every model's vector-Jacobian products written by hand in
numba; the upstream-style trainer (`--trainer upstream`, upstream/training.py) needs none but replays every target's whole
history (Σ_targets history length steps per epoch). Here a batch is a set of WHOLE cards: their review sequences are
padded time-major into [L, B] tensors, init/step run once over the L steps (vectorised over the batch's cards), and
every target of a card reads the state before its own review (state index seq_pos − 1, the card's column). One
forward pass yields every target's prediction; autograd through it gives the gradient.

Columns are sorted by card length (longest first), so step k runs on the prefix of cards still that long (no
padded step is ever computed: a model's step never sees a padding value, and no padded NaN can leak into the
gradient). The states of all steps are concatenated and each target gathers its own (step, column) entry.

The gradient (gradient="sweep", the default; see _sweep_loss_grad) does not tape the time loop: eager torch on
the CPU pays per op, and a taped step costs its forward ops plus as many backward nodes, whatever the batch width.
The loop runs untaped, init/step/curve are re-run once each over all (step, card) pairs at once with the tape on,
autograd on those wide calls gives every element's state Jacobian (cards are independent columns, so one backward
pass per state component gives all of them), the adjoint goes back through time in numpy, and one last backward
pass gives the parameter gradient: the same chain rule with ~2–3× fewer torch calls per step than taping it
(gradient="tape" keeps plain autograd, the check of the sweep). A model's step must keep cards independent (a
card's new state depends on its own previous state, time and grade only), as the contract asks anyway.

The trainer reproduces `SeqEngine.fit`'s "cards" batching exactly (same seeded numpy permutations of whole cards
per epoch, same batch cuts at >= batch_size targets, Adam with the same per-step cosine schedule, the prior scaled
by the batch's share of targets, non-finite gradient entries zeroed, grad_mask, clipping after every step, the best
of {initial, end of training} on the full objective, max_seq_len, recency weights), so that on a model that has
both, a run's numbers equal the compiled engine's (tests/test_autograd_engine.py). Adam's update is done in numpy
with the compiled kernel's formula (engine/kernel_math.adam_step), not torch.optim, for the same reason. A model's
RECIPE may change the optimizer (adam, adamw, or full-batch L-BFGS), betas, weight decay, lr, epochs, batch size,
which weights are kept (best | last) and the recency weights (see `Recipe`).

Float64 on the CPU by default; any torch device when given (`device="cuda"`).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from models.base import ReviewData
from engine.lbfgs import fit_box
from engine.recipe import Recipe, upstream_recency  # noqa: F401 (re-exported: the trainers' recipe)
from engine.seq_engine import Cards, fit_prior, training_cards


class _CardBatch:
    """Whole cards ready for one forward pass: time-major [L, B] inputs (columns sorted longest first), the width
    of each step's active prefix, and for each target its index into the concatenated per-step states."""

    __slots__ = ("t", "g", "width", "flat", "dt", "y", "wt", "targets")

    def __init__(self, cards: Cards, card_ids: np.ndarray, n_states: np.ndarray, device, dtype,
                 targets_of: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]):
        order = np.argsort(-n_states, kind="stable")
        card_ids, n = card_ids[order], n_states[order]
        length = int(n[0]) if len(n) else 0
        steps = np.arange(length, dtype=np.int64)
        valid = steps[:, None] < n[None, :]
        idx = np.where(valid, cards.c_start[card_ids][None, :] + steps[:, None], 0)
        self.t = torch.as_tensor(np.where(valid, cards.seq_dt[idx], 0.0), dtype=dtype, device=device)
        self.g = torch.as_tensor(np.where(valid, cards.seq_g[idx], 0), dtype=torch.int64, device=device)
        self.width = valid.sum(axis=1).tolist()  # cards still active at step k (a prefix: sorted by length)
        offsets = np.concatenate([[0], np.cumsum(self.width)[:-1]]).astype(np.int64)
        col, tgt = targets_of(card_ids)
        self.targets = tgt
        self.flat = torch.as_tensor(offsets[cards.t_pos[tgt] - 1] + col, device=device)
        self.dt = torch.as_tensor(cards.t_dt[tgt], dtype=dtype, device=device)
        self.y = torch.as_tensor(cards.t_y[tgt], dtype=dtype, device=device)
        self.wt = torch.as_tensor(cards.t_wt[tgt], dtype=dtype, device=device)


def _card_targets(cards: Cards, lo: np.ndarray, hi: np.ndarray):
    """targets_of for cards whose targets are lo[c]..hi[c]-1: (column of each target, target index)."""
    def targets_of(card_ids):
        a, b = lo[card_ids], hi[card_ids]
        counts = b - a
        col = np.repeat(np.arange(len(card_ids), dtype=np.int64), counts)
        first = np.repeat(a - np.concatenate([[0], np.cumsum(counts)[:-1]]), counts)
        return col, first + np.arange(int(counts.sum()), dtype=np.int64)
    return targets_of


class AutogradEngine:
    """Predictions, loss/gradient and training of a torch init/step/curve model on `ReviewData`."""

    def __init__(self, module, lower=None, upper=None, device: str | torch.device | None = None,
                 dtype: torch.dtype = torch.float64, gradient: str = "sweep"):
        if gradient not in ("sweep", "tape"):
            raise ValueError(f"gradient {gradient!r} is not sweep or tape")
        self.gradient = gradient  # sweep: _sweep_loss_grad; tape: plain autograd through the time loop
        self._live_cache = None
        self.module = module
        # an engine plug-in carries numba init/step/curve AND their torch twins: the torch_* spelling wins
        self.init = getattr(module, "torch_init", None) or getattr(module, "init")
        self.step = getattr(module, "torch_step", None) or getattr(module, "step")
        self.curve = getattr(module, "torch_curve", None) or getattr(module, "curve")
        self.module_clip = getattr(module, "clip", None)  # optional bounds that depend on other parameters
        self.lower = np.asarray(getattr(module, "LOWER", None) if lower is None else lower, dtype=np.float64)
        self.upper = np.asarray(getattr(module, "UPPER", None) if upper is None else upper, dtype=np.float64)
        self.device = torch.device(device or "cpu")
        self.dtype = dtype

    # ---------------------------------------------------------------------------------------------- plumbing
    def _w(self, w) -> np.ndarray:
        w = np.array(w, dtype=np.float64)
        if w.shape != self.lower.shape:
            raise ValueError(f"expected {len(self.lower)} parameters, got shape {w.shape}")
        return w

    def clip(self, w) -> np.ndarray:
        """The LOWER/UPPER box, then the module's own `clip(w)` when it has one (e.g. FSRS-7's ordered S0)."""
        w = np.minimum(np.maximum(np.asarray(w, dtype=np.float64), self.lower), self.upper)
        if self.module_clip is not None:
            with torch.no_grad():
                w = np.array(self.module_clip(torch.as_tensor(w)).numpy(), dtype=np.float64)
        return w

    def _all_cards(self, cards: Cards) -> _CardBatch:
        ids = np.arange(len(cards.c_start), dtype=np.int64)
        return _CardBatch(cards, ids, cards.c_n, self.device, self.dtype, _card_targets(cards, cards.c_tb, cards.c_te))

    def forward(self, w: torch.Tensor, batch: _CardBatch) -> torch.Tensor:
        """P(recall) of every target of the batch (in batch.targets order): one pass over the cards' reviews."""
        state = tuple(self.init(w, batch.g[0], batch.t[0]))
        parts = [[s] for s in state]
        for k in range(1, len(batch.width)):
            a = batch.width[k]
            if a < batch.width[k - 1]:
                state = tuple(s[:a] for s in state)
            state = tuple(self.step(w, state, batch.t[k, :a], batch.g[k, :a]))
            for part, s in zip(parts, state):
                part.append(s)
        gathered = tuple(torch.cat(part)[batch.flat] if len(part) > 1 else part[0][batch.flat] for part in parts)
        return self.curve(w, gathered, batch.dt)

    def _bce_sum(self, w: torch.Tensor, batch: _CardBatch) -> torch.Tensor:
        p = self.forward(w, batch)
        return (F.binary_cross_entropy(p, batch.y, reduction="none") * batch.wt).sum()

    def _tensor(self, w, grad: bool) -> torch.Tensor:
        return torch.tensor(np.asarray(w, dtype=np.float64), dtype=self.dtype, device=self.device,
                            requires_grad=grad)

    def _batch_loss_grad(self, w: np.ndarray, batch: _CardBatch) -> tuple[float, np.ndarray]:
        if self.gradient == "sweep":
            return self._sweep_loss_grad(w, batch)
        wt = self._tensor(w, True)
        loss = self._bce_sum(wt, batch)
        loss.backward()
        return float(loss.detach()), wt.grad.detach().cpu().numpy().astype(np.float64)

    def _live(self, w_np: np.ndarray, batch: _CardBatch) -> list[int]:
        """Indices of the state components that depend on w through the recurrence (as autograd would track
        them): those init makes from w, then, to a fixed point, those step makes from w or a live component.
        Structural (requires_grad does not depend on the data), so probed once on one card and cached."""
        if getattr(self, "_live_cache", None) is None:
            w = self._tensor(w_np, True)
            g0, t0 = batch.g[0, :1], batch.t[0, :1]
            with torch.no_grad():
                plain = tuple(self.init(w.detach(), g0, t0))
            live = {i for i, x in enumerate(self.init(w, g0, t0)) if x.requires_grad}
            while True:
                prev = tuple(_batch_shape(x, 1).detach().requires_grad_(i in live) for i, x in enumerate(plain))
                grown = live | {j for j, x in enumerate(self.step(w, prev, t0 + 1.0, g0)) if x.requires_grad}
                if grown == live:
                    break
                live = grown
            self._live_cache = sorted(live)
        return self._live_cache

    def _sweep_loss_grad(self, w_np: np.ndarray, batch: _CardBatch) -> tuple[float, np.ndarray]:
        """Σ weight·BCE and its gradient with a taped forward only where it is wide (gradient="sweep").

        Why: on the CPU, eager autograd costs per op, and a time step is tens of ops forward and as many backward
        whatever the batch width. So: (1) the forward runs step by step WITHOUT a tape; (2) init, step and curve
        are re-run ONCE each over all (step, card) pairs flattened — one wide taped call each; (3) autograd on
        those wide graphs gives the per-element Jacobians of the state update (a card's new state depends on its
        own previous state only, so a backward pass with cotangent 1 on state component j gives d new_j / d prev_i
        of every element at once) and the curve's state gradients; (4) the adjoints are carried back through time
        in numpy (a few array ops per step); (5) one backward pass over the wide graphs with those adjoints gives
        the parameter gradient. The chain rule is autograd's own (same backward formulas: clamps, wheres, NaN
        branches), summed in another order; tests/test_autograd_engine.py holds it to the compiled engine."""
        width = batch.width
        n_steps = len(width)
        w0 = self._tensor(w_np, False)
        with torch.inference_mode():  # ~20 % less per op than no_grad; the results are only read below
            states = [tuple(_batch_shape(x, width[0]) for x in self.init(w0, batch.g[0], batch.t[0]))]
            for k in range(1, n_steps):
                prev = tuple(x[:width[k]] for x in states[-1])
                states.append(tuple(_batch_shape(x, width[k]) for x in
                                    self.step(w0, prev, batch.t[k, :width[k]], batch.g[k, :width[k]])))
        flat = [torch.cat([st[i] for st in states]) for i in range(len(states[0]))]
        n_state = len(flat)
        live = self._live(w_np, batch)  # the state components that depend on w (the others carry no gradient)
        offsets = np.concatenate([[0], np.cumsum(width)]).astype(np.int64)
        w = self._tensor(w_np, True)
        # the curve over every target, wide: the loss, its gradient w.r.t. the states read, and (later) w.r.t. w
        read = [f[batch.flat].detach().requires_grad_(i in live) for i, f in enumerate(flat)]
        p = self.curve(w, tuple(read), batch.dt)
        loss = (F.binary_cross_entropy(p, batch.y, reduction="none") * batch.wt).sum()
        g_read = torch.autograd.grad(loss, [read[i] for i in live], retain_graph=True, allow_unused=True) \
            if live else ()
        adj = [np.zeros(int(offsets[-1])) for _ in range(n_state)]
        idx = batch.flat.cpu().numpy()
        for i, g in zip(live, g_read):
            if g is not None:
                np.add.at(adj[i], idx, g.detach().cpu().numpy())
        outputs, cotangents = [loss], [None]
        if n_steps > 1:
            # every later review at once: prev = the state before it (a prefix of the previous step's columns)
            sel = [torch.cat([st[i][:width[k]] for k, st in zip(range(1, n_steps), states[:-1])])
                   for i in range(n_state)]
            prev = [x.detach().requires_grad_(i in live) for i, x in enumerate(sel)]
            t_all = torch.cat([batch.t[k, :width[k]] for k in range(1, n_steps)])
            g_all = torch.cat([batch.g[k, :width[k]] for k in range(1, n_steps)])
            new = [_batch_shape(x, len(t_all)) for x in self.step(w, tuple(prev), t_all, g_all)]
            jac = [[None] * n_state for _ in range(n_state)]  # jac[j][i] = d new_j / d prev_i, per element
            for j in live:
                if new[j].requires_grad and live:
                    rows = torch.autograd.grad(new[j].sum(), [prev[i] for i in live], retain_graph=True,
                                               allow_unused=True)
                    for i, r in zip(live, rows):
                        jac[j][i] = None if r is None else r.detach().cpu().numpy()
            seg = offsets[1:] - width[0]  # step k's elements start at seg[k - 1] in the wide step call
            for k in range(n_steps - 1, 0, -1):
                a, lo, hi = width[k], offsets[k], offsets[k + 1]
                s0, pk = seg[k - 1], offsets[k - 1]
                for i in range(n_state):
                    acc = None
                    for j in range(n_state):
                        d = jac[j][i]
                        if d is not None:
                            term = d[s0:s0 + a] * adj[j][lo:hi]
                            acc = term if acc is None else acc + term
                    if acc is not None:
                        adj[i][pk:pk + a] += acc
            outputs += new
            cotangents += [torch.as_tensor(adj[j][offsets[1]:], dtype=self.dtype, device=self.device)
                           for j in range(n_state)]
        first = [_batch_shape(x, width[0]) for x in self.init(w, batch.g[0], batch.t[0])]
        outputs += first
        cotangents += [torch.as_tensor(adj[j][:width[0]], dtype=self.dtype, device=self.device)
                       for j in range(n_state)]
        # one scalar (no grad_outputs: torch imports sympy the first time a tensor of them is given, ~1.5 s)
        total = sum(o if c is None else (o * c).sum() for o, c in zip(outputs, cotangents) if o.requires_grad)
        grads = torch.autograd.grad(total, w, allow_unused=True)[0] if torch.is_tensor(total) else None
        grad = np.zeros(len(w_np)) if grads is None else grads.detach().cpu().numpy().astype(np.float64)
        return float(loss.detach()), grad

    def _loss(self, w: np.ndarray, batch: _CardBatch) -> float:
        if len(batch.targets) == 0:
            return 0.0
        with torch.inference_mode():
            return float(self._bce_sum(self._tensor(w, False), batch))

    # ---------------------------------------------------------------------------------------------- the API
    def predict(self, w, data: ReviewData) -> np.ndarray:
        """P(recall) for every row of `data`, in row order (NaN for a row without history)."""
        cards = Cards(data)
        out = np.full(len(data), np.nan)
        if len(cards.t_row) == 0:
            return out
        batch = self._all_cards(cards)
        with torch.inference_mode():
            p = self.forward(self._tensor(self._w(w), False), batch)
        out[cards.t_row[batch.targets]] = p.detach().cpu().numpy()
        return out

    def loss_and_grad(self, w, data: ReviewData, weights=None, w_init=None, sigma=None,
                      max_seq_len: int | None = None) -> tuple[float, np.ndarray]:
        """Σ weight·BCE (+ the L2 prior when sigma is given) and its gradient by autograd, over the rows of `data`
        (only those with history length <= max_seq_len when given): SeqEngine.loss_and_grad's signature."""
        w = self._w(w)
        keep = None if max_seq_len is None else data.rows["seq_pos"].to_numpy() <= max_seq_len
        cards = Cards(data, weights, keep)
        if len(cards.t_row) == 0:
            loss, grad = 0.0, np.zeros(len(w))
        else:
            loss, grad = self._batch_loss_grad(w, self._all_cards(cards))
        if sigma is not None:
            inv_var = 1.0 / np.asarray(sigma, dtype=np.float64) ** 2
            diff = w - self._w(w_init)
            loss += float(np.sum(diff ** 2 * inv_var))
            grad = grad + 2.0 * diff * inv_var
        return float(loss), grad

    def fit(self, w0, train: ReviewData, cfg=None, recipe: Recipe | dict | None = None, *, w_init=None, sigma=None,
            grad_mask=None, keep: np.ndarray | None = None, lr: float | None = None, betas=None,
            seed: int | None = None, check_every_epoch: bool = False, batching: str = "cards",
            sort_kind: str = "stable") -> np.ndarray:
        """Trained weights from w0 (clipped), SeqEngine.fit's arguments: cfg supplies n_epoch, batch_size,
        max_seq_len and recency (a recipe's own values win); `keep` restricts the training rows; w_init/sigma the
        L2 prior (none if sigma is None); grad_mask zeros the gradient of frozen parameters. lr, betas, seed and
        check_every_epoch, when given, override the recipe (SeqEngine.fit's keywords, so that a SeqModel runs on
        either engine); only the "cards" batching exists here (sort_kind belongs to the "length" one)."""
        recipe = recipe if isinstance(recipe, Recipe) else Recipe.from_dict(recipe)
        if batching != "cards":
            raise ValueError(f"the autograd engine batches whole cards only (batching {batching!r} asked)")
        overrides = {k: v for k, v in (("lr", lr), ("betas", betas), ("seed", seed)) if v is not None}
        if check_every_epoch:
            overrides["keep"] = "every_epoch"
        if overrides:
            recipe = replace(recipe, **overrides)
        n_epoch, batch_size = recipe.epochs_and_batch(cfg)
        max_seq_len = int(getattr(cfg, "max_seq_len", 64))
        w0 = self.clip(self._w(w0))
        inv_var, w_init, mask = fit_prior(w0, None if sigma is None else self._w(w_init), sigma, grad_mask)
        cards = training_cards(train, recipe.row_weights(cfg, len(train)), max_seq_len, keep)
        if len(cards.c_start) == 0 or (n_epoch <= 0 and recipe.optimizer != "lbfgs"):
            return w0
        if recipe.optimizer == "lbfgs":
            if recipe.penalty is not None:
                raise ValueError("RECIPE: a penalty runs with adam / adamw only")
            return self._lbfgs(w0, w_init, inv_var, mask, cards, recipe)
        return self._adam(w0, w_init, inv_var, mask, cards, recipe, n_epoch, batch_size)

    # ---------------------------------------------------------------------------------------------- trainers
    def _adam(self, w0, w_init, inv_var, mask, cards: Cards, recipe: Recipe, n_epoch: int, batch_size: int):
        """SeqEngine's "cards" batching and seq_engine_kernels.adam_fit's update, step for step."""
        from engine.kernel_math import card_batch_bounds

        n_cards = len(cards.c_start)
        n_targets = len(cards.t_pos)
        pw = recipe.prior_weight
        inv_var = inv_var * (pw(n_targets) if callable(pw) else float(pw))
        rng = np.random.default_rng(recipe.seed)
        orders = [rng.permutation(n_cards).astype(np.int64) for _ in range(n_epoch)]
        sizes = cards.c_te - cards.c_tb
        cuts = [card_batch_bounds(sizes[order], batch_size) for order in orders]
        total = sum(len(c) - 1 for c in cuts)
        targets_of = _card_targets(cards, cards.c_tb, cards.c_te)
        everything = self._all_cards(cards)

        penalty = recipe.penalty

        def objective(w):
            extra = penalty(w)[0] if penalty is not None else 0.0
            return self._loss(w, everything) + float(np.sum((w - w_init) ** 2 * inv_var)) + extra

        w = w0.copy()
        m, v = np.zeros(len(w)), np.zeros(len(w))
        b1, b2 = float(recipe.betas[0]), float(recipe.betas[1])
        wd = float(recipe.weight_decay) if recipe.optimizer == "adamw" else 0.0
        best_w, best = w.copy(), objective(w) if recipe.keep != "last" else math.inf
        step_no = 0
        for e, (order, cut) in enumerate(zip(orders, cuts)):
            for b in range(len(cut) - 1):
                ids = order[cut[b]:cut[b + 1]]
                batch = _CardBatch(cards, ids, cards.c_n[ids], self.device, self.dtype, targets_of)
                _, grad = self._batch_loss_grad(w, batch)
                scale = len(batch.targets) / n_targets
                grad = grad + 2.0 * scale * (w - w_init) * inv_var
                if penalty is not None:  # a weights-only term, scaled like the prior
                    grad = grad + scale * penalty(w)[1]
                grad = grad * mask
                grad[~np.isfinite(grad)] = 0.0
                lr_t = recipe.lr * 0.5 * (1.0 + math.cos(math.pi * step_no / total))
                step_no += 1
                _adam_step(w, grad, m, v, step_no, lr_t, b1, b2, 1e-8, wd)
                w = self.clip(w)
            if recipe.keep == "every_epoch" or (recipe.keep == "best" and e == n_epoch - 1):
                cur = objective(w)
                if cur < best:
                    best, best_w = cur, w.copy()
        return self.clip(w if recipe.keep == "last" else best_w)

    def _lbfgs(self, w0, w_init, inv_var, mask, cards: Cards, recipe: Recipe):
        """Full-batch L-BFGS (lbfgs_fit) with every target of every card in one forward pass per evaluation."""
        everything = self._all_cards(cards)

        def bce_sum(w):
            if self.gradient == "sweep":
                return NumpyLoss.apply(w, lambda x: self._sweep_loss_grad(x, everything))
            return self._bce_sum(w, everything)

        return lbfgs_fit(w0, bce_sum, float(cards.t_wt.sum()), len(cards.t_pos), w_init, inv_var, mask, self.lower,
                         self.upper, recipe, self.device, self.dtype)


def lbfgs_fit(w0, bce_sum: Callable, denom: float, n_targets: int, w_init, inv_var, mask, lower, upper,
              recipe: Recipe, device=None, dtype=torch.float64, loss_grad: Callable | None = None) -> np.ndarray:
    """torch's L-BFGS (strong-Wolfe line search, recipe's lr / max_iter / history / tolerances) on
    bce_sum(w) / denom + λ·Σ(w − w_init)²·inv_var, λ = recipe.prior_weight (or prior_weight(n_targets)); upstream's
    SBD recipe. A non-finite objective or gradient reads as a very bad point (1e6, zero gradient), so the line
    search backs off; with revert_if_worse, w_init comes back when the fit ends higher than it started. Shared by
    the card-major engine and the per-target trainer (engine/own_model.py, --trainer upstream).

    loss_grad (optional): Σ weight·BCE and its gradient as float64 numpy, (loss, grad) = loss_grad(w) (the compiled
    engine's). Then no torch at all: engine/lbfgs.fit_box runs torch's algorithm in numpy on the objective and
    gradient the closure would form, the same trial points to rounding (tests/test_traced.py,
    tests/test_lbfgs.py); torch's optimizer on 0-dim tensors had been ~20% of SBD's fit, more on small users."""
    lam = recipe.prior_weight_for(n_targets)
    if loss_grad is not None:
        return fit_box(w0, loss_grad, denom, lam, w_init, inv_var, mask, lower, upper, recipe)
    as_t = lambda x: torch.as_tensor(np.asarray(x, dtype=np.float64), dtype=dtype, device=device)  # noqa: E731
    inv_var_t, anchor, mask_t, lo, hi = as_t(inv_var), as_t(w_init), as_t(mask), as_t(lower), as_t(upper)
    w = as_t(w0).clone().requires_grad_(True)

    def objective():
        return bce_sum(w) / denom + lam * torch.sum((w - anchor) ** 2 * inv_var_t)

    optimizer = torch.optim.LBFGS([w], lr=recipe.lr, max_iter=recipe.max_iter, history_size=recipe.history_size,
                                  line_search_fn="strong_wolfe", tolerance_grad=recipe.tolerance_grad,
                                  tolerance_change=recipe.tolerance_change)

    def closure():
        optimizer.zero_grad()
        if loss_grad is not None:
            loss = _direct_objective(w)
        else:
            loss = objective()
            if torch.isfinite(loss):
                loss.backward()
        if torch.isfinite(loss):
            w.grad.mul_(mask_t)
        if not torch.isfinite(loss) or w.grad is None or not bool(torch.isfinite(w.grad).all()):
            w.grad = torch.zeros_like(w)
            loss = loss.detach().new_tensor(1e6)
        return loss

    lam_inv_var = lam * inv_var_t  # what autograd computes for d(lam·Σ(w − anchor)²·inv_var)/d((w − anchor)²)

    @torch.no_grad()
    def _direct_objective(x):
        """objective() and, when finite, x.grad as loss.backward() leaves them (NumpyLoss's backward g·grad with g =
        1/denom, the prior's pow backward (lam·inv_var)·(2·(x − anchor)), summed), from one loss_grad call."""
        value, grad = loss_grad(x.detach().cpu().numpy().astype(np.float64))
        diff = x - anchor
        loss = x.new_tensor(value) / denom + lam * torch.sum(diff ** 2 * inv_var_t)
        if torch.isfinite(loss):
            one_over = torch.ones((), dtype=x.dtype, device=x.device) / denom
            x.grad = one_over * torch.as_tensor(grad, dtype=x.dtype, device=x.device) + lam_inv_var * (2 * diff)
        return loss

    with torch.no_grad():
        start = float(objective())
    try:
        optimizer.step(closure)
        with torch.no_grad():
            w.copy_(torch.minimum(torch.maximum(w, lo), hi))
            final = float(objective())
    except RuntimeError:
        final = math.nan
    w_fit = np.minimum(np.maximum(w.detach().cpu().numpy().astype(np.float64), lower), upper)
    if recipe.revert_if_worse and (not math.isfinite(final) or final > start):
        return np.minimum(np.maximum(np.asarray(w_init, dtype=np.float64), lower), upper)
    return w_fit


def _batch_shape(x: torch.Tensor, n: int) -> torch.Tensor:
    """A state component as a [n] tensor (a model may return a constant as a 0-dim tensor)."""
    return x if x.dim() == 1 and x.shape[0] == n else x.expand(n)


class NumpyLoss(torch.autograd.Function):
    """A loss whose value and gradient come from outside torch's tape, (loss, grad) = fn(w as float64 numpy), as a
    differentiable function of w: what torch's L-BFGS (lbfgs_fit) minimises for the sweep and the compiled engine."""

    @staticmethod
    def forward(ctx, w, fn):
        with torch.enable_grad():  # a Function's forward runs without grad mode; the sweep needs its wide graphs
            loss, grad = fn(w.detach().cpu().numpy().astype(np.float64))
        ctx.save_for_backward(torch.as_tensor(grad, dtype=w.dtype, device=w.device))
        return w.new_tensor(loss)

    @staticmethod
    def backward(ctx, g):
        (grad,) = ctx.saved_tensors
        return g * grad, None


def _adam_step(w, grad, m, v, step, lr, b1, b2, eps, weight_decay):
    """engine/kernel_math.adam_step in numpy (the same operations in the same order): torch's Adam, AdamW when
    weight_decay > 0."""
    bc1 = 1.0 - b1 ** step
    bc2 = 1.0 - b2 ** step
    if weight_decay != 0.0:
        w *= 1.0 - lr * weight_decay
    m[:] = b1 * m + (1.0 - b1) * grad
    v[:] = b2 * v + (1.0 - b2) * grad * grad
    w -= lr * (m / bc1) / (np.sqrt(v / bc2) + eps)
