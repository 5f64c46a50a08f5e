"""The Transformer for T stacked networks and its fine-tune, batched: many (user, fold) fine-tunes in one pass on a
device (neural/neural_batched.py, docs/gpu.md).

Per task it computes what the per-user path computes (models/transformer.py `fit_compiled` + `predict_compiled`;
their torch twin is transformer_torch.transformer_forward), in float64:
- the task's own upstream windows: target_batches (rows with history ≤ max_seq_len sorted by length, batches of
  512, each zero-padded to its own longest history), their order per epoch from the task's own
  TorchGenerator(2023), 5 epochs; a task without such a row is not trained (InadequateData per user: the
  pretrained weights stay);
- the dropout masks the per-user fit draws, from the task's OWN generator seeded 42, batch after batch in the
  task's order, in the module's ten shapes (transformer.draw_masks: torch_rng.BernoulliStream where it emulates
  torch's draws, else torch's default generator with the task's own saved state swapped in and out);
- AdamW(4e-2, weight decay 1e-5) at each task's own cosine schedule (neural_batched.StackedAdamW);
- prediction in upstream's layout: the test rows in order, chunks of 8,192, each padded to its own longest history.

Upstream passes no padding mask, so a target's output depends on how far ITS batch is padded [QUIRK,
models/transformer.py]. Tasks stacked in one tensor are padded to the longest window among them (and to the
largest batch); the positions beyond a task's own window are masked out of every attention (their keys at −∞, so
exactly 0 weight after the softmax), which leaves each task's own padded positions attending and attended to as
upstream's are. Padded targets have weight 0.

Divergence (target_batches.check_diverged): per user, a fit whose final weights evaluate NaN on its training
windows looks at the epoch-start weights and may end in InadequateData. Here each task's final weights are
evaluated the same way; if any is NaN, the batched pass raises, and the chunk's users run on the per-user path,
which applies the rule itself.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from models.base import InadequateData, ReviewData, recency_weights
from neural.card_net import SHUFFLE_SEED, TORCH_SEED
from models.gru_p import DECAY, FACTOR
from neural.neural_batched import StackedAdamW, StackedNet
from upstream.target_batches import pad_histories, target_batches
from upstream.torch_rng import BernoulliStream, TorchGenerator, portable_bernoulli
from models.transformer import PREDICT_BATCH, draw_masks, mask_shapes
from neural.transformer_kernels import DROPOUT, PARAMS

ENC, DEC = "transformer.encoder.layers.0.", "transformer.decoder.layers.0."


class MaskSource:
    """One task's dropout masks, drawn as its per-user fit draws them after torch.manual_seed(42)."""

    def __init__(self):
        if portable_bernoulli():
            self.stream, self.state = BernoulliStream(TORCH_SEED), None
        else:
            self.stream = None
            saved = torch.get_rng_state()
            torch.manual_seed(TORCH_SEED)
            self.state = torch.get_rng_state()
            torch.set_rng_state(saved)

    def draw(self, length: int, batch: int) -> list[np.ndarray]:
        if self.stream is not None:
            return draw_masks(length, batch, self.stream)
        saved = torch.get_rng_state()
        torch.set_rng_state(self.state)
        try:
            return draw_masks(length, batch)
        finally:
            self.state = torch.get_rng_state()
            torch.set_rng_state(saved)


class Windows:
    """Several tasks' padded windows stacked: src [t, L, B, 2] (task i's window [L_i, B_i] in the corner, zeros
    elsewhere), `valid` [t, L] (position < L_i: the keys attention may read), dt, y, w [t, B] (w 0 beyond B_i),
    and with `masks` (per task the ten 0/1 arrays of draw_masks) the ten dropout factors mask/(1 − p), padded with
    ones."""

    def __init__(self, parts: list[tuple], device, dtype, masks: list[list[np.ndarray]] | None = None):
        t = len(parts)
        L = max(p[0].shape[0] for p in parts)
        B = max(p[0].shape[1] for p in parts)
        src = np.zeros((t, L, B, 2))
        valid = np.zeros((t, L), dtype=bool)
        tgt = np.zeros((3, t, B))
        tgt[:2] = 1.0  # padded targets: dt 1, y 1 (finite loss), weight 0
        for i, (tt, g, dt, y, w) in enumerate(parts):
            n_l, n_b = tt.shape
            src[i, :n_l, :n_b, 0], src[i, :n_l, :n_b, 1] = tt, g
            valid[i, :n_l] = True
            tgt[0, i, :n_b], tgt[1, i, :n_b] = dt, y
            tgt[2, i, :n_b] = w
        as_t = lambda a: torch.as_tensor(a, dtype=dtype).to(device)  # noqa: E731
        self.src, self.valid = as_t(src), torch.as_tensor(valid).to(device)
        self.dt, self.y, self.w = (as_t(a) for a in tgt)
        self.drop = None
        if masks is not None:
            shapes = [(t,) + s for s in mask_shapes(L, B)]
            self.drop = []
            for site, shape in enumerate(shapes):
                full = np.ones(shape, dtype=np.float64)
                for i, m in enumerate(masks):
                    full[(i,) + tuple(slice(0, n) for n in m[site].shape)] = m[site]
                self.drop.append(as_t(full) / (1 - DROPOUT))


def linear(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
    """F.linear of every task: x [t, ..., in], w [t, out, in], b [t, out]."""
    shape = (w.shape[0],) + (1,) * (x.dim() - 3)
    return torch.matmul(x, w.transpose(1, 2).view(shape + w.shape[1:][::-1])) + b.view(shape + (1, b.shape[-1]))


def layer_norm(x: Tensor, w: dict[str, Tensor], name: str) -> Tensor:
    shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (x.shape[-1],)
    return F.layer_norm(x, x.shape[-1:]) * w[f"{name}.weight"].view(shape) + w[f"{name}.bias"].view(shape)


def attention(x: Tensor, mem: Tensor, w: dict[str, Tensor], name: str, valid: Tensor | None, drop) -> Tensor:
    """transformer_torch._attention for every task: x [t, Lq, B, 2], mem [t, Lk, B, 2]; keys where `valid`
    [t, Lk] is False get no weight."""
    w_in, b_in = w[f"{name}.in_proj_weight"], w[f"{name}.in_proj_bias"]
    if x is mem:
        qkv = linear(x, w_in, b_in)
        q, k, v = qkv[..., 0:2], qkv[..., 2:4], qkv[..., 4:6]
    else:
        q = linear(x, w_in[:, :2], b_in[:, :2])
        kv = linear(mem, w_in[:, 2:], b_in[:, 2:])
        k, v = kv[..., 0:2], kv[..., 2:4]
    q, k, v = (a.permute(0, 2, 3, 1) for a in (q, k, v))  # [t, B, heads, L]: head_dim 1
    scores = q.unsqueeze(-1) * k.unsqueeze(-2)  # [t, B, heads, Lq, Lk]
    if valid is not None:
        scores = scores.masked_fill(~valid[:, None, None, None, :], float("-inf"))
    attn = drop(torch.softmax(scores, dim=-1))
    out = (attn * v.unsqueeze(-2)).sum(-1).permute(0, 3, 1, 2)  # [t, Lq, B, heads]
    return linear(out, w[f"{name}.out_proj.weight"], w[f"{name}.out_proj.bias"])


def feed_forward(x: Tensor, w: dict[str, Tensor], name: str, drop) -> Tensor:
    h = drop(F.relu(linear(x, w[f"{name}linear1.weight"], w[f"{name}linear1.bias"])))
    return linear(h, w[f"{name}linear2.weight"], w[f"{name}linear2.bias"])


class StackedTransformer(StackedNet):
    """T Transformers (transformer_torch.TransformerNet, parameters in transformer_kernels.PARAMS order)."""

    names = [n for n, _ in PARAMS]
    # elements a pass keeps per target and (window² + window), forward and backward: ~6 attention maps [2, L, L]
    # (scores, masked, softmax, dropout, weighted values) and ~40 values per position, rounded up
    cost_per_target = 16

    def forward_windows(self, rows: Tensor, win: Windows) -> Tensor:
        """P(recall) [t, B] of the stacked windows (training mode when win.drop is set)."""
        w = self.rows_of(rows)
        sites = iter(win.drop) if win.drop is not None else None
        drop = (lambda x: x * next(sites)) if sites is not None else (lambda x: x)
        src = win.src
        x = layer_norm(src + drop(attention(src, src, w, ENC + "self_attn", win.valid, drop)), w, ENC + "norm1")
        x = layer_norm(x + drop(feed_forward(x, w, ENC, drop)), w, ENC + "norm2")
        mem = layer_norm(x, w, "transformer.encoder.norm")
        tgt = src.new_zeros(src.shape[0], 1, src.shape[2], 2)
        y = layer_norm(tgt + drop(attention(tgt, tgt, w, DEC + "self_attn", None, drop)), w, DEC + "norm1")
        y = layer_norm(y + drop(attention(y, mem, w, DEC + "multihead_attn", win.valid, drop)), w, DEC + "norm2")
        y = layer_norm(y + drop(feed_forward(y, w, DEC, drop)), w, DEC + "norm3")
        out = layer_norm(y, w, "transformer.decoder.norm")[:, 0]  # [t, B, 2]
        s = torch.exp(linear(out, w["fc.weight"], w["fc.bias"])).squeeze(-1)
        return (1 + FACTOR * win.dt / s) ** DECAY

    def groups(self, items: list[tuple[int, tuple]]):
        """(task rows, items) per forward pass: sorted by window, cut so that a pass holds at most max_elems
        elements (tasks · B · (L² + L) · cost_per_target; one item at least)."""
        size = lambda part: (part[0].shape[0], part[0].shape[1])  # noqa: E731
        items = sorted(items, key=lambda it: size(it[1]), reverse=True)
        cuts, L, B = [0], 0, 0
        for n, (_, part) in enumerate(items):
            L, B = max(L, size(part)[0]), max(B, size(part)[1])
            if n > cuts[-1] and (n - cuts[-1] + 1) * B * (L * L + L) * self.cost_per_target > self.max_elems:
                cuts.append(n)
                L, B = size(part)
        for a, z in zip(cuts, cuts[1:] + [len(items)]):
            yield torch.as_tensor([i for i, _ in items[a:z]], device=self.device), items[a:z]

    def predict(self, tests: list[ReviewData]) -> list[np.ndarray]:
        """predict_compiled for every task: upstream's chunks of the test rows, each padded to its longest history."""
        out = [np.empty(len(d)) for d in tests]
        items = []
        for i, d in enumerate(tests):
            rows = d.rows
            starts, lengths = rows["seq_start"].to_numpy(np.int64), rows["seq_pos"].to_numpy(np.int64)
            dt = np.array(rows["delta_t"], dtype=np.float64)
            for lo in range(0, len(rows), PREDICT_BATCH):
                sl = slice(lo, lo + PREDICT_BATCH)
                t, g = pad_histories(d.seq_delta_t, d.seq_rating, starts[sl], lengths[sl])
                ones = np.ones(len(t))
                items.append((i, (t.T, g.T, dt[sl], ones, ones, lo)))
        with torch.no_grad():
            for rows, chunk in self.groups(items):
                p = self.forward_windows(rows, Windows([c[:5] for _, c in chunk], self.device, self.dtype))
                p = p.double().cpu().numpy()
                for k, (i, c) in enumerate(chunk):
                    out[i][c[5]:c[5] + c[0].shape[1]] = p[k, :c[0].shape[1]]
        return out

    def eval_losses(self, windows: list[list[tuple]]) -> np.ndarray:
        """Σ weight·BCE of each task's training windows (windows[i]: task i's) at its weights, without dropout."""
        total = np.zeros(len(windows))
        items = [(i, part) for i, parts in enumerate(windows) for part in parts]
        with torch.no_grad():
            for rows, chunk in self.groups(items):
                win = Windows([c for _, c in chunk], self.device, self.dtype)
                p = self.forward_windows(rows, win)
                loss = (F.binary_cross_entropy(p, win.y, reduction="none") * win.w).sum(1).double().cpu().numpy()
                np.add.at(total, [i for i, _ in chunk], loss)
        return total

    @staticmethod
    def fit_predict(cfg, splits: list[tuple[ReviewData, ReviewData]], device="cpu") -> list[np.ndarray]:
        """Transformer.fit then .predict for every (train, test) split, all fine-tunes in one batched pass."""
        from neural.neural_batched import torch_model

        model = torch_model(cfg)
        trains = [tr for tr, _ in splits]
        weights = [recency_weights(len(tr)) if cfg.recency else np.ones(len(tr)) for tr in trains]
        fitted = fit_tasks(model.net, trains, weights, n_epoch=model.n_epoch, batch_size=cfg.batch_size,
                           max_seq_len=cfg.max_seq_len, device=device)
        return fitted.predict([te for _, te in splits])


def task_windows(data: ReviewData, weights: np.ndarray, batch_size: int, max_seq_len: int) -> list[tuple]:
    """One task's training windows (t, g [L, B], dt, y, w), as fit_compiled builds them; [] when none."""
    if len(data) == 0:
        return []
    try:
        return [(b[0], b[1], b[3], b[4], b[5]) for b in target_batches(data, weights, batch_size, max_seq_len)]
    except InadequateData:
        return []


def fit_tasks(net, trains: list[ReviewData], weights: list[np.ndarray], *, n_epoch: int, batch_size: int = 512,
              max_seq_len: int = 64, device="cpu", dtype=torch.float64,
              max_elems: int | None = None) -> StackedTransformer:
    """Fine-tune one copy of the pretrained Transformer `net` per training set (the module docstring's recipe),
    all together; returns the stacked networks (task i = trains[i])."""
    model = StackedTransformer(net, len(trains), device, dtype)
    if max_elems is not None:
        model.max_elems = max_elems
    windows = [task_windows(d, w, batch_size, max_seq_len) for d, w in zip(trains, weights)]

    def stream(i):  # task i's windows in its per-user order, each with the masks its fit draws for it
        generator, masks = TorchGenerator(SHUFFLE_SEED), MaskSource()
        for _ in range(n_epoch):
            for k in generator.randperm(len(windows[i])).tolist():
                yield windows[i][k], masks.draw(*windows[i][k][0].shape)

    streams = [stream(i) for i in range(len(trains))]
    t_max = torch.tensor([max(1, len(w) * n_epoch) for w in windows], dtype=dtype, device=model.device)
    optimizer = StackedAdamW(model.params, net.lr, net.wd, t_max)
    live = [i for i in range(len(trains)) if windows[i]]
    while True:
        drawn = {i: nxt for i in live if (nxt := next(streams[i], None)) is not None}  # task → (window, masks)
        live = list(drawn)
        if not drawn:
            break
        for p in model.params:
            p.grad = None
        for rows, chunk in model.groups([(i, drawn[i][0]) for i in live]):
            win = Windows([c for _, c in chunk], model.device, dtype, [drawn[i][1] for i, _ in chunk])
            p = model.forward_windows(rows, win)
            (F.binary_cross_entropy(p, win.y, reduction="none") * win.w).sum().backward()
        optimizer.step(torch.as_tensor(live, device=model.device))
    if np.isnan(model.eval_losses(windows)).any():  # (a task without windows adds nothing: 0)
        raise RuntimeError("a Transformer fine-tune diverged (NaN loss): its users go to the per-user path")
    return model
