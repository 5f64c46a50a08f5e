"""The LSTM for T stacked networks and its Reptile-style fine-tune, batched: many (user, fold) fine-tunes in one
pass on a device (neural/neural_batched.py, docs/gpu.md).

Per task it computes what the per-user fine-tune computes (models/lstm.py `finetune_compiled`; its torch twin
lstm_torch.finetune(layout="cards")), in float64:
- the task's data: equalized_train (the fold's rows plus the secs pipeline's extra rows before its test rows), its
  row weights (recency, mean 1) and rows (history 1..64) from lstm.finetune_rows, one card order from
  RandomState(2025) used in every pass, groups of whole cards with ≈ 16,384 targets; a task without a kept row is
  not trained (InadequateData on the per-user path: the pretrained weights stay);
- 20 passes; at global step s every task with a group left contributes it (task i's step s is pass s // g_i, g_i
  its groups per pass), so its learning rate is that pass's piecewise-linear lr (FINETUNE, times
  16000^(1 − 1.2103));
- loss_i = mean(weight·BCE)·B_i^1.2103 + 0.000244·‖θ_i − θ_pretrained‖² (B_i: the group's targets), summed over
  the tasks for one backward pass (task i's gradient comes from loss_i only); each task's gradient clipped to norm
  7050 as clip_grad_norm_ does (coefficient max_norm / (norm + 1e-6), at most 1);
- AdamW with betas (0, 0.999), weight decay 0.04855, started from the pretraining's inner optimizer state
  (pretrain/LSTM_opt: the same moments and step count for every task), neural_batched.StackedAdamW.

The network (neural/lstm_torch.LSTMNet's layers) with every weight stacked [T, ...]: the per-position layers
(Linear, SiLU, LayerNorm) run over all padded positions of all tasks as batched products, each LSTM's recurrence
step by step over the card slots still running (cards longest first per task, neural_batched.Padded), the heads
only at the states the targets read. Padded positions get finite values and no gradient (no target reads them).

Precision: always float64. The default per-user run computes the network in float32 (models/lstm.py PRECISION),
so a batched run equals `--precision float64`'s per-user run (tests/test_lstm_batched.py) and the default run to
float32's rounding (metrics within a few 1e-6, models/lstm.py's docstring).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from models.base import InadequateData, ReviewData
from neural.card_net import CardSet
from models.lstm import BATCH, FINETUNE, INNER_BETAS, equalized_train, finetune_recipe, finetune_rows
from neural.neural_batched import Padded, StackedAdamW, StackedNet


def linear(w: dict[str, Tensor], name: str, x: Tensor) -> Tensor:
    """nn.Linear of every task: x [t, N, in] → [t, N, out]."""
    return torch.baddbmm(w[f"{name}.bias"].unsqueeze(1), x, w[f"{name}.weight"].transpose(1, 2))


def layer_norm(w: dict[str, Tensor], name: str, x: Tensor) -> Tensor:
    """nn.LayerNorm (eps 1e-5, with or without bias) of every task over the last axis."""
    y = F.layer_norm(x, x.shape[-1:]) * w[f"{name}.weight"].unsqueeze(1)
    bias = w.get(f"{name}.bias")
    return y if bias is None else y + bias.unsqueeze(1)


def lstm(w: dict[str, Tensor], name: str, u: Tensor, n_run: list[int]) -> Tensor:
    """nn.LSTM (one layer, gates i, f, g, o) of every task over packed steps u [t, P, H]: step k's inputs are the
    n_run[k] card slots that follow step k − 1's (as a PackedSequence's data); returns the outputs, packed alike."""
    H = u.shape[-1]
    gi = torch.baddbmm(w[f"{name}.bias_ih_l0"].unsqueeze(1), u, w[f"{name}.weight_ih_l0"].transpose(1, 2))
    w_hh, b_hh = w[f"{name}.weight_hh_l0"].transpose(1, 2), w[f"{name}.bias_hh_l0"].unsqueeze(1)
    h = c = u.new_zeros(u.shape[0], n_run[0] if n_run else 0, H)
    outs, off = [], 0
    for n in n_run:
        gates = gi[:, off:off + n] + torch.baddbmm(b_hh, h[:, :n], w_hh)
        i, f, g, o = gates.chunk(4, dim=-1)
        c = torch.sigmoid(f) * c[:, :n] + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        outs.append(h)
        off += n
    return torch.cat(outs, dim=1)


class StackedLSTM(StackedNet):
    """T LSTMs (neural/lstm_torch.LSTMNet, every parameter in its parameters() order; the input standardisation
    buffers are the pretrained net's, fixed)."""

    width = 1024  # per card slot and step: ~40 tensors of 20–80 values kept for the backward pass

    def encode(self, x: Tensor) -> Tensor:
        """LSTMNet.encode: (Δt days, duration ms, rating) → standardised logs and the one-hot rating."""
        mean = self.net.input_mean.to(self.device, self.dtype)
        std = self.net.input_std.to(self.device, self.dtype)
        main = torch.stack([torch.log(1e-5 + x[..., 0]), torch.log(torch.clamp(x[..., 1], min=100, max=60000))], -1)
        rating = torch.clamp(x[..., 2], min=1).long() - 1
        return torch.cat([(main - mean) / std, F.one_hot(rating, num_classes=4).to(x.dtype)], dim=-1)

    def forward(self, rows: Tensor, pb: Padded) -> Tensor:
        w = self.rows_of(rows)
        t, C = len(rows), pb.C
        # the running card slots of every step, packed step after step ([t, P, 3], P = Σ n_run): the per-position
        # layers then run on real steps only (and the tasks' padding), not on the [L, C] rectangle
        x = torch.cat([pb.x[k, :, :n] for k, n in enumerate(pb.n_run)], dim=1)
        silu = F.silu
        v = silu(linear(w, "process.3", layer_norm(w, "process.2", silu(linear(w, "process.0", self.encode(x))))))
        for block in ("process.5", "process.6"):  # ResBlock[LayerNorm → LSTM]
            v = lstm(w, f"{block}.module.1.module", layer_norm(w, f"{block}.module.0", v), pb.n_run) + v
        u = silu(linear(w, "process.7.module.1", layer_norm(w, "process.7.module.0", v)))
        v = silu(linear(w, "process.7.module.4", layer_norm(w, "process.7.module.3", u))) + v
        v = silu(linear(w, "process.9", layer_norm(w, "process.8", v)))
        H = v.shape[-1]
        states = torch.cat([v.new_zeros(t, C, H), v], dim=1)  # Padded's order: h_0 (C slots), then the packed steps
        h = states.gather(1, pb.t_state.unsqueeze(-1).expand(-1, -1, H))  # [t, J, H]
        wc = torch.softmax(linear(w, "w_fc", h), dim=-1)
        s = torch.exp(torch.clamp(linear(w, "s_fc", h), -25, 25))
        d = torch.exp(torch.clamp(linear(w, "d_fc", h), -25, 25))
        return (1 - 1e-7) * torch.sum(wc * (1 + pb.t_dt.unsqueeze(-1) / (1e-7 + s)) ** -d, dim=-1)

    @staticmethod
    def fit_predict(cfg, splits: list[tuple[ReviewData, ReviewData]], device="cpu") -> list[np.ndarray]:
        """LSTM.fit then .predict for every (train, test) split, all fine-tunes in one batched pass."""
        from neural.lstm_torch import flat_opt_state
        from neural.neural_batched import torch_model

        model = torch_model(cfg)  # the pretrained torch module and the pretraining's optimizer state
        fitted = fit_tasks(model.net, [tr for tr, _ in splits], flat_opt_state(model.net, model.opt_state),
                           device=device)
        fitted.round_to(model.net.dtype)  # the per-user path's float32 weights (FlatNet), predicted in float64
        return fitted.predict([te for _, te in splits])


def task_groups(net, train: ReviewData, batch_size: int):
    """The per-user fine-tune's data for one task: (its groups of one pass, in order) or [] (not trained)."""
    data = equalized_train(train)
    if len(data) == 0:
        return []
    try:
        weights, keep, rng = finetune_rows(data)
    except InadequateData:
        return []
    cards = CardSet(net, data, keep, weights)
    return cards.batches(batch_size, rng.permutation(cards.n_cards)) if cards.n_cards else []


def fit_tasks(net, trains: list[ReviewData], opt_state: tuple | None, *, batch_size: int = BATCH, device="cpu",
              dtype=torch.float64, max_elems: int | None = None) -> StackedLSTM:
    """Fine-tune one copy of the pretrained LSTM `net` per training set (the module docstring's recipe), all
    together; `opt_state`: the inner optimizer's flat (exp_avg, exp_avg_sq, step) or None (fresh). Returns the
    stacked networks (task i = trains[i])."""
    fp = FINETUNE
    model = StackedLSTM(net, len(trains), device, dtype)
    if max_elems is not None:
        model.max_elems = max_elems
    groups = [task_groups(net, d, batch_size) for d in trains]
    n_groups = torch.tensor([max(1, len(g)) for g in groups], device=model.device)
    epoch_lr = torch.as_tensor(finetune_recipe()[0], dtype=dtype, device=model.device)
    start = [p.detach().clone() for p in model.params]
    state = None
    if opt_state is not None:
        m, v, step = opt_state
        sizes = [p[0].numel() for p in model.params]
        cut = lambda flat: [torch.as_tensor(a, dtype=dtype).to(model.device).view(p.shape[1:]).expand_as(p).clone()
                            for a, p in zip(np.split(np.asarray(flat, np.float64), np.cumsum(sizes)[:-1]),
                                            model.params)]  # noqa: E731
        state = (cut(m), cut(v), int(step))
    optimizer = StackedAdamW(model.params, 0.0, fp["weight_decay"], betas=INNER_BETAS, state=state)
    exp = fp["batch_size_exp"]
    for s in range(fp["passes"] * max([len(g) for g in groups] + [0])):
        items = [(i, g[s % len(g)]) for i, g in enumerate(groups) if s < fp["passes"] * len(g)]
        for p in model.params:
            p.grad = None
        for rows, _, pb in model.passes(items):
            p = model.forward(rows, pb)
            per_task = (F.binary_cross_entropy(p, pb.t_y, reduction="none") * pb.t_w).sum(1)
            loss = per_task / pb.n_targets * pb.n_targets ** exp  # mean(weight·BCE)·B^1.2103 per task
            pull = sum(((q[rows] - q0[rows]) ** 2).flatten(1).sum(1) for q, q0 in zip(model.params, start))
            (loss + fp["reg_scale"] * pull).sum().backward()
        live = torch.as_tensor([i for i, _ in items], device=model.device)
        with torch.no_grad():  # clip_grad_norm_ per task
            norm = torch.sqrt(sum((p.grad ** 2).flatten(1).sum(1) for p in model.params))
            coef = torch.clamp(fp["clip_norm"] / (norm + 1e-6), max=1.0)
            for p in model.params:
                p.grad.mul_(coef.view((-1,) + (1,) * (p.dim() - 1)))
        optimizer.step(live, epoch_lr[torch.div(s, n_groups, rounding_mode="floor").clamp(max=fp["passes"] - 1)])
    return model
