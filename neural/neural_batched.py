"""Many fine-tunes of a neural model trained together in one batched pass, on any torch device (docs/gpu.md): the
shared parts, and the GRU family's (GRU-P, GRU-P --short, GRU) network. NN-17 (neural/nn17_batched.py), the LSTM
(neural/lstm_batched.py) and the Transformer (neural/transformer_batched.py) add their own stacked networks; the
registry BATCHED names each model's class.

Why: one user's fine-tune is ~10^3 optimizer steps of a network with 39 to 8,869 parameters: far too little work
per step for a GPU. Stacking T independent tasks (task = one (user, fold) training set, each starting from the
pretrained weights) makes every kernel launch do T tasks' work.

Shared: `StackedNet` (every parameter stacked [T, ...], the net's clip box, passes bounded in memory, prediction
by card groups), `Padded` (card batches padded across tasks), `StackedAdamW` (per-task Adam/AdamW, masked tasks
untouched), `fit_tasks` (fit_cards' recipe) and `fit_predict` (the runner's entry point).

What fit_tasks computes, per task, is `neural_seq.fit_cards` then `neural_seq.predict_cards` (tests/
test_neural_batched.py and test_nn17_batched.py hold them equal in float64):
- the same schedule: the task's `CardSet` (targets with history ≤ max_seq_len), its own Generator seeded 2023, a
  torch.randperm card order per epoch, the same groups of whole cards of ≈ batch_size targets;
- parameters stacked [T, ...]; at global step s every task that still has a group s contributes it: cards are padded
  across tasks (time-major [L, T, C, F]; each task's cards sorted longest first so step k runs only the first n_k
  card slots, like a packed sequence), targets padded with weight 0;
- the network's recurrence written with batched matmuls (GRU: gates r, z, n), gradients by autograd;
- per-task AdamW (Adam for NN-17) with torch.optim.AdamW's update and CosineAnnealingLR's schedule (its own T_max =
  groups·epochs and step count), elementwise on the stacked tensors, then the net's clip box; a task with no group
  left is masked: its weights and moments stay exactly as they are;
- Σ weight·BCE with torch's clamped BCE. Float64 by default: a GPU then gives the CPU's numbers up to rounding.
  Before predicting, fit_predict rounds the weights to the net's float32, as the per-user path stores them.

Tasks whose padded step would exceed `max_elems` state elements are split into several forward/backward passes
within the same optimizer step (the update is the same; only memory is bounded).
"""

from __future__ import annotations

import importlib
import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from models.base import ReviewData
from neural.gru_kernels import HEAD_SIGMOID_CELL
from neural.gru_torch import DECAY, FACTOR, GRUFamilyNet
from neural.neural_seq import SHUFFLE_SEED, CardBatch, CardSet, epoch_orders

BETAS, EPS = (0.9, 0.999), 1e-8  # torch.optim.AdamW's defaults, as make_optimizer uses them
PREDICT_GROUP = 4096  # targets per prediction group (its size does not change any prediction)
MAX_ELEMS = {"cpu": 2 ** 22, "cuda": 2 ** 26}  # state elements (tasks · cards · (steps + 1) · hidden) per pass


def gru_step(x: Tensor, h: Tensor, w_ih: Tensor, w_hh: Tensor, b_ih: Tensor, b_hh: Tensor) -> Tensor:
    """One nn.GRU step for T stacked networks: x [T, N, F], h [T, N, H], weights [T, 3H, F|H], biases [T, 3H]."""
    H = h.shape[-1]
    gi = torch.baddbmm(b_ih.unsqueeze(1), x, w_ih.transpose(1, 2))
    gh = torch.baddbmm(b_hh.unsqueeze(1), h, w_hh.transpose(1, 2))
    rz = torch.sigmoid(gi[..., :2 * H] + gh[..., :2 * H])
    r, z = rz[..., :H], rz[..., H:]
    n = torch.tanh(gi[..., 2 * H:] + r * gh[..., 2 * H:])
    return (1 - z) * n + z * h


class Padded:
    """One CardBatch per task as padded tensors on a device.

    x [L, t, C, F]: x[k, i, c] is step k of task i's c-th longest card (zero beyond its steps); step k runs only the
    first n_run[k] card slots (the most cards any of the tasks has with more than k steps), as a packed sequence
    would. The states are kept as [h_0 (C slots), h_1 (n_run[0] slots), h_2 (n_run[1] slots), ...] concatenated
    along the card axis, and t_state[i, j] is where target j of task i finds the state its prediction reads: the
    state after t_pos − read_back steps of its card. Targets beyond a task's count are padding with weight 0.
    n_tasks[i] is task i's number of real targets."""

    def __init__(self, batches: list[CardBatch], device, dtype, read_back: int = 0):
        t = len(batches)
        C = max(len(b.c_steps) for b in batches)
        L = max(int(b.c_steps.max()) for b in batches)
        J = max(len(b) for b in batches)
        x = np.zeros((L, t, C, batches[0].x_packed.shape[1]))
        runs = np.zeros((t, L + 1), dtype=np.int64)  # runs[i, k]: cards of task i with at least k steps
        slot = np.zeros((t, J), dtype=np.int64)  # the target's card slot
        read = np.zeros((t, J), dtype=np.int64)  # the state it reads: h after `read` steps of its card
        targets = np.zeros((4, t, J))  # delta_t, last rating, y, weight
        for i, b in enumerate(batches):
            order = np.argsort(-b.c_steps, kind="stable")
            steps = b.c_steps[order]
            k = np.arange(int(steps.sum())) - np.repeat(np.cumsum(steps) - steps, steps)
            x[k, i, np.repeat(np.arange(len(order)), steps)] = b.x_packed[np.repeat(b.c_off[order], steps) + k]
            runs[i] = np.bincount(steps, minlength=L + 1)[::-1].cumsum()[::-1]
            rank = np.empty(len(order), dtype=np.int64)
            rank[order] = np.arange(len(order))
            n = len(b)
            slot[i, :n] = rank[b.t_card_np]
            read[i, :n] = b.t_pos_np - read_back
            targets[:, i, :n] = (b.t_dt_np, b.t_last_g_np, b.t_y_np, b.t_w_np)
        n_run = runs.max(axis=0)[1:]
        h_start = np.concatenate([[0, C], C + np.cumsum(n_run)[:-1]])  # where h_k starts along the card axis
        as_t = lambda a, kind=dtype: torch.as_tensor(a, dtype=kind).to(device)
        self.x, self.C, self.n_run = as_t(x), C, [int(n) for n in n_run]
        self.t_state = as_t(h_start[read] + slot, torch.long)
        self.t_dt, self.t_g, self.t_y, self.t_w = (as_t(a) for a in targets)
        self.n_targets = as_t([len(b) for b in batches])


class StackedNet:
    """T copies of one network, each parameter stacked [T, ...] on one device (task i = row i). Subclasses give the
    stacked forward pass (`forward`), which parameters train (`names`: default all, in the net's parameters()
    order), `width` (the elements a card slot holds per step, forward and backward, for the memory bound) and
    `read_back` (a target reads the state after t_pos − read_back steps of its card)."""

    width = 1
    read_back = 0

    def __init__(self, net, n_tasks: int, device="cpu", dtype=torch.float64):
        self.net, self.device, self.dtype = net, torch.device(device), dtype
        if not getattr(self, "names", None):
            self.names = [n for n, _ in net.named_parameters()]
        pretrained = dict(net.named_parameters())
        self.params = [pretrained[n].detach().to(self.device, dtype).expand(n_tasks, *pretrained[n].shape).clone()
                       .requires_grad_() for n in self.names]
        self.max_elems = MAX_ELEMS["cpu" if self.device.type == "cpu" else "cuda"]

    def rows_of(self, rows: Tensor) -> dict[str, Tensor]:
        """The weights of tasks `rows` by name ([t, ...] each)."""
        return {n: p[rows] for n, p in zip(self.names, self.params)}

    def bounds(self) -> list[tuple[Tensor, Tensor] | None]:
        """Per parameter the (lower, upper) box every optimizer step projects it into, or None (free): the net's
        param_bounds() (flat, in param_shapes() order: NN-17's clipper; none for the GRU family)."""
        if not hasattr(self.net, "param_bounds"):
            return [None] * len(self.names)
        lower, upper = self.net.param_bounds()
        sizes = [int(np.prod(shape)) for _, shape in self.net.param_shapes()]
        start = dict(zip([name for name, _ in self.net.param_shapes()], np.cumsum([0] + sizes[:-1])))
        out = []
        for n, p in zip(self.names, self.params):
            lo, hi = lower[start[n]:start[n] + p[0].numel()], upper[start[n]:start[n] + p[0].numel()]
            as_t = lambda v: torch.as_tensor(v, dtype=self.dtype).to(self.device).view(p.shape[1:])  # noqa: E731
            out.append(None if np.isinf(lo).all() and np.isinf(hi).all() else (as_t(lo), as_t(hi)))
        return out

    def state_dict(self, i: int) -> dict[str, Tensor]:
        """Task i's weights under the net's own names (float64, CPU)."""
        return {n: p[i].detach().cpu().double() for n, p in zip(self.names, self.params)}

    def forward(self, rows: Tensor, pb: Padded) -> Tensor:
        """P(recall) [t, J] of the padded targets, with the weights of tasks `rows`."""
        raise NotImplementedError

    def round_to(self, dtype: torch.dtype) -> None:
        """Round every weight through `dtype` (float32: what the per-user path stores between its fine-tune and its
        predictions, card_net.FlatNet), so that the predictions read the per-user path's weights."""
        with torch.no_grad():
            for p in self.params:
                p.copy_(p.to(dtype).to(p.dtype))

    def padded(self, batches: list[CardBatch]) -> Padded:
        return Padded(batches, self.device, self.dtype, self.read_back)

    def passes(self, items: list[tuple[int, CardBatch]]):
        """(task rows, items, Padded) per forward pass over `items` (task, its batch): sorted by padded size and cut
        so that a pass's states stay within max_elems elements (one task at least)."""
        size = lambda b: (int(b.c_steps.max()), len(b.c_steps))
        items = sorted(items, key=lambda it: size(it[1]), reverse=True)
        cuts, L, C = [0], 0, 0
        for n, (_, b) in enumerate(items):
            L, C = max(L, size(b)[0]), max(C, size(b)[1])
            if n > cuts[-1] and (n - cuts[-1] + 1) * (L + 1) * C * self.width > self.max_elems:
                cuts.append(n)
                L, C = size(b)
        for a, z in zip(cuts, cuts[1:] + [len(items)]):
            rows = torch.as_tensor([i for i, _ in items[a:z]], device=self.device)
            yield rows, items[a:z], self.padded([b for _, b in items[a:z]])

    def predict(self, tests: list[ReviewData]) -> list[np.ndarray]:
        """`predict_cards` for every task: P(recall) of each test row (NaN without history), in row order."""
        out = [np.full(len(d), np.nan) for d in tests]
        items = [(i, b) for i, d in enumerate(tests) for b in CardSet(self.net, d).batches(PREDICT_GROUP)]
        with torch.no_grad():
            for rows, chunk, pb in self.passes(items):
                p = self.forward(rows, pb).double().cpu().numpy()
                for k, (i, b) in enumerate(chunk):
                    out[i][b.t_row] = p[k, :len(b)]
        return out


class StackedGRU(StackedNet):
    """T GRU-family networks of one architecture (order: weight_ih, weight_hh, bias_ih, bias_hh, fc.weight,
    fc.bias, as in the net)."""

    names = ["rnn.weight_ih_l0", "rnn.weight_hh_l0", "rnn.bias_ih_l0", "rnn.bias_hh_l0", "fc.weight", "fc.bias"]

    def __init__(self, net: GRUFamilyNet, n_tasks: int, device="cpu", dtype=torch.float64):
        super().__init__(net, n_tasks, device, dtype)
        self.head = net.head_kind
        self.width = net.rnn.hidden_size
        # GRU: the state after the whole history; GRU-P: after all but its last step, which forward() takes with
        # the target's own (delta_t, last rating), as upstream's per-target tensor ends
        self.read_back = 1 if self.head == HEAD_SIGMOID_CELL else 0

    def forward(self, rows: Tensor, pb: Padded) -> Tensor:
        w_ih, w_hh, b_ih, b_hh, fc_w, fc_b = (p[rows] for p in self.params)
        h = torch.zeros(len(rows), pb.C, w_hh.shape[-1], dtype=self.dtype, device=self.device)
        states = [h]
        for k, n in enumerate(pb.n_run):
            h = gru_step(pb.x[k, :, :n], h[:, :n], w_ih, w_hh, b_ih, b_hh)
            states.append(h)
        states = torch.cat(states, dim=1)
        h = states.gather(1, pb.t_state.unsqueeze(-1).expand(-1, -1, states.shape[-1]))
        if self.head == HEAD_SIGMOID_CELL:  # GRU-P: one more step with the target's own (delta_t, last rating)
            h = gru_step(torch.stack([pb.t_dt, pb.t_g], dim=-1), h, w_ih, w_hh, b_ih, b_hh)
            return torch.sigmoid(torch.baddbmm(fc_b.unsqueeze(1), h, fc_w.transpose(1, 2))).squeeze(-1)
        s = torch.exp(torch.baddbmm(fc_b.unsqueeze(1), h, fc_w.transpose(1, 2))).squeeze(-1)
        return (1 + FACTOR * pb.t_dt / s) ** DECAY


def task_schedule(net: GRUFamilyNet, data: ReviewData, *, n_epoch: int, batch_size: int, max_seq_len: int,
                  weights=None, seed: int = SHUFFLE_SEED):
    """fit_cards' schedule for one task: (T_max of its cosine, iterator over its groups, epoch after epoch); no
    groups when no target has a history of length 1..max_seq_len (fit_cards' InadequateData: the pretrained
    weights stay, as the per-user path's fallback)."""
    cards = CardSet(net, data, data.rows["seq_pos"].to_numpy() <= max_seq_len, weights)
    if cards.n_cards == 0:
        return 1, iter(())
    n_groups = cards.n_groups(batch_size, np.arange(cards.n_cards))  # as fit_cards counts them

    def groups():
        for order in epoch_orders(cards.n_cards, n_epoch, seed):
            yield from cards.batches(batch_size, order)

    return max(1, n_groups * n_epoch), groups()


def fit_tasks(net, trains: list[ReviewData], *, n_epoch: int, batch_size: int = 512, max_seq_len: int = 64,
              weights: list | None = None, lr: float | None = None, device="cpu", dtype=torch.float64,
              max_elems: int | None = None, stacked: type | None = None) -> StackedNet:
    """Fine-tune one copy of `net` (the pretrained weights) per training set, all together, with fit_cards' recipe
    (Adam or AdamW per the net, cosine schedule, the net's clip box after every step); returns the stacked networks
    (task i = trains[i]). `stacked`: the StackedNet class (default: the GRU family's)."""
    model = (stacked or StackedGRU)(net, len(trains), device, dtype)
    if max_elems is not None:
        model.max_elems = max_elems
    schedules = [task_schedule(net, d, n_epoch=n_epoch, batch_size=batch_size, max_seq_len=max_seq_len,
                               weights=None if weights is None else weights[i]) for i, d in enumerate(trains)]
    t_max = torch.tensor([s[0] for s in schedules], dtype=dtype, device=model.device)
    streams = [s[1] for s in schedules]
    wd = net.wd if net.optimizer == "adamw" else 0.0  # "adam": upstream's BaseModel, no weight decay
    optimizer = StackedAdamW(model.params, net.lr if lr is None else lr, wd, t_max, bounds=model.bounds())
    live = list(range(len(trains)))
    while True:
        items = [(i, b) for i in live if (b := next(streams[i], None)) is not None]  # each task's next group
        live = [i for i, _ in items]
        if not items:
            break
        for p in model.params:
            p.grad = None
        for rows, _, pb in model.passes(items):
            p = model.forward(rows, pb)
            (F.binary_cross_entropy(p, pb.t_y, reduction="none") * pb.t_w).sum().backward()
        optimizer.step(torch.as_tensor(live, device=model.device))
    return model


class StackedAdamW:
    """torch.optim.AdamW (no amsgrad) for each task of stacked parameters, by default at CosineAnnealingLR's
    schedule (T_max, eta_min 0): task i's learning rate at its step s (0-based) is lr·(1 + cos(π·s/T_max[i]))/2;
    or at the learning rates the caller gives each step (`step(rows, lr)`, the LSTM's per-pass lr). Only the tasks
    in `rows` step; the others keep their weights and moments untouched. All tasks start together, so an active
    task's step count is the number of steps taken so far (plus `state`'s step: an optimizer state carried in,
    the same for every task). weight_decay 0 is torch's Adam. `bounds`: per parameter None or a (lower, upper)
    box every stepped task is clamped into after its update (NN-17's clipper; card_fit does the same)."""

    def __init__(self, params: list[Tensor], lr: float, weight_decay: float, t_max: Tensor | None = None,
                 betas: tuple[float, float] = BETAS, state: tuple | None = None, bounds: list | None = None):
        self.params, self.lr, self.wd, self.t_max, self.betas = params, lr, weight_decay, t_max, betas
        if state is None:
            self.m = [torch.zeros_like(p) for p in params]
            self.v = [torch.zeros_like(p) for p in params]
            self.step0 = 0
        else:
            m, v, self.step0 = state
            self.m, self.v = [a.clone() for a in m], [a.clone() for a in v]
        self.bounds = bounds or [None] * len(params)
        self.steps = 0

    def step(self, rows: Tensor, lr: Tensor | None = None) -> None:
        s = self.steps
        self.steps += 1
        b1, b2 = self.betas
        if lr is None:
            lr = self.lr * (1 + torch.cos(math.pi * s / self.t_max)) / 2  # [T]
        n_tasks = self.params[0].shape[0]
        active = torch.zeros(n_tasks, dtype=torch.bool, device=self.params[0].device)
        active[rows] = True
        t = self.step0 + s + 1
        step_size = lr / (1 - b1 ** t)
        c2 = math.sqrt(1 - b2 ** t)
        with torch.no_grad():
            for p, m, v, box in zip(self.params, self.m, self.v, self.bounds):
                g = p.grad
                shape = (-1,) + (1,) * (p.dim() - 1)
                act = active.view(shape)
                m_new = m + (g - m) * (1 - b1)
                v_new = v * b2 + g * g * (1 - b2)
                decayed = p * (1 - lr * self.wd).view(shape)
                p_new = decayed - step_size.view(shape) * m_new / (v_new.sqrt() / c2 + EPS)
                if box is not None:
                    p_new = torch.maximum(torch.minimum(p_new, box[1]), box[0])
                p.copy_(torch.where(act, p_new, p))
                m.copy_(torch.where(act, m_new, m))
                v.copy_(torch.where(act, v_new, v))


# models with a batched trainer: the StackedNet class of each ("module:Class"); a class with its own
# `fit_predict(cfg, splits, device)` runs its own recipe, the others fit_cards' (fit_tasks)
BATCHED = {"GRU-P": "neural.neural_batched:StackedGRU", "GRU": "neural.neural_batched:StackedGRU",
           "NN-17": "neural.nn17_batched:StackedNN17", "LSTM": "neural.lstm_batched:StackedLSTM",
           "Transformer": "neural.transformer_batched:StackedTransformer"}


def supports(algo: str) -> bool:
    """Models with a batched trainer (BATCHED)."""
    return algo in BATCHED


def stacked_class(algo: str) -> type:
    module, name = BATCHED[algo].split(":")
    return getattr(importlib.import_module(module), name)


def torch_model(cfg):
    """The model of `cfg` holding its torch module (the batched trainer stacks its parameters), even where a
    per-user run would hold the torch-free twin (card_net.NeuralModel.torch_free: one user per chunk on the CPU)."""
    import dataclasses

    import models

    return models.create(dataclasses.replace(cfg, batch_users=max(2, cfg.users_per_chunk)))


def fit_predict(cfg, splits: list[tuple[ReviewData, ReviewData]], device="cpu") -> list[np.ndarray]:
    """NeuralModel.fit then .predict for every (train, test) split, all fine-tunes in one batched pass: the
    predictions of each test set, in row order."""
    import upstream.training as training

    stacked = stacked_class(cfg.algo)
    if hasattr(stacked, "fit_predict"):
        return stacked.fit_predict(cfg, splits, device)
    model = torch_model(cfg)  # the pretrained net and the model's own epoch count
    trains = [tr for tr, _ in splits]
    weights = [training.recency_weights(len(tr)) for tr in trains] if cfg.recency else None
    fitted = fit_tasks(model.net, trains, n_epoch=model.n_epoch, batch_size=cfg.batch_size,
                       max_seq_len=cfg.max_seq_len, weights=weights, device=device, stacked=stacked)
    fitted.round_to(model.net.dtype)  # the per-user path's float32 weights (FlatNet), predicted in float64
    return fitted.predict([te for _, te in splits])
