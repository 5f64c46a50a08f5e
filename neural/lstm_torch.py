"""The LSTM's torch side (description, data and recipes in neural/lstm_spec.py, the model in models/lstm.py): the
torch module LSTMNet (upstream's architecture, `--trainer upstream`, Reptile pretraining, the reference the compiled
kernels are tested against), the fine-tune stepped in torch (`finetune(layout="cards" | "targets")`) and Reptile.
Imported only by those paths, so that a default LSTM run never loads torch.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

from models.base import ReviewData
from neural.lstm_spec import (BATCH, FINETUNE, INNER_BETAS, N_CURVES, N_HIDDEN, REPTILE, LSTMData,  # noqa: F401
                              LSTMSpec, finetune_compiled, finetune_rows, inner_recipe, lstm_features, piecewise_lr)
from neural.neural_seq import TORCH_SEED, CardBatch, CardSet, CompiledCardNet


class ResBlock(nn.Module):
    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, x):
        return self.module(x) + x


class RNNWrapper(nn.Module):
    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, x):
        return self.module(x)[0]


class LSTMNet(LSTMSpec, CompiledCardNet):
    """Fine-tuned and predicted compiled (neural/lstm_kernels.py, float64); the torch methods below are the
    reference path (tests, `--trainer upstream`, Reptile pretraining)."""

    def __init__(self):
        super().__init__()
        H = N_HIDDEN
        self.register_buffer("input_mean", torch.zeros(2))
        self.register_buffer("input_std", torch.ones(2))
        self.process = nn.Sequential(
            nn.Linear(6, H), nn.SiLU(), nn.LayerNorm(H, bias=False), nn.Linear(H, H), nn.SiLU(),
            ResBlock(nn.Sequential(nn.LayerNorm(H, bias=False), RNNWrapper(nn.LSTM(H, H, num_layers=1)))),
            ResBlock(nn.Sequential(nn.LayerNorm(H), RNNWrapper(nn.LSTM(H, H, num_layers=1)))),
            ResBlock(nn.Sequential(nn.LayerNorm(H, bias=False), nn.Linear(H, H), nn.SiLU(),
                                   nn.LayerNorm(H, bias=False), nn.Linear(H, H), nn.SiLU())),
            nn.LayerNorm(H, bias=False), nn.Linear(H, H), nn.SiLU(),
        )
        for name, p in self.named_parameters():
            if "weight_ih" in name or "weight_hh" in name:
                nn.init.orthogonal_(p.data)
            elif "bias_ih" in name:
                p.data[len(p) // 4:len(p) // 2].fill_(1.0)  # forget gate
        self.w_fc = nn.Linear(H, N_CURVES)
        self.s_fc = nn.Linear(H, N_CURVES)
        self.d_fc = nn.Linear(H, N_CURVES)

    def n_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def normalisation(self):
        return self.input_mean.tolist(), self.input_std.tolist()

    def encode(self, x: Tensor) -> Tensor:
        """(Δt days, duration ms, rating) → the 6 inputs: standardised logs and the one-hot rating."""
        delay = torch.log(1e-5 + x[..., 0:1])
        dur = torch.log(torch.clamp(x[..., 1:2], min=100, max=60000))
        main = (torch.cat([delay, dur], dim=-1) - self.input_mean) / self.input_std
        rating = torch.clamp(x[..., 2], min=1).long() - 1
        return torch.cat([main, F.one_hot(rating, num_classes=4).to(x.dtype)], dim=-1)

    def out_heads(self, h: Tensor) -> Tensor:
        """h [..., 20] → [..., 3, 3] = (w, s, d) per curve."""
        w = torch.softmax(self.w_fc(h), dim=-1)
        s = torch.exp(torch.clamp(self.s_fc(h), -25, 25))
        d = torch.exp(torch.clamp(self.d_fc(h), -25, 25))
        return torch.stack([w, s, d], dim=-2)

    def heads(self, x: Tensor) -> Tensor:
        """Upstream's forward over padded x [L, B, 3] → [L, B, 3, 3]."""
        return self.out_heads(self.process(self.encode(x)))

    def process_packed(self, packed: PackedSequence) -> PackedSequence:
        """`process` over a PackedSequence: the per-position layers run on its data, the two LSTMs on the packed
        sequences, so no step beyond a card's length is computed."""
        P = self.process
        v = P[4](P[3](P[2](P[1](P[0](packed.data)))))
        for block in (P[5], P[6]):
            out, _ = block.module[1].module(packed._replace(data=block.module[0](v)))
            v = out.data + v
        v = P[10](P[9](P[8](P[7](v))))
        return packed._replace(data=v)

    @staticmethod
    def curve(wsd: Tensor, t: Tensor) -> Tensor:
        w, s, d = wsd[:, 0], wsd[:, 1], wsd[:, 2]
        return (1 - 1e-7) * torch.sum(w * (1 + t[:, None] / (1e-7 + s)) ** -d, dim=-1)

    # --- card-sequence contract
    def card_states(self, x, c_steps):
        """Hidden outputs [L + 1, C, 20] (index k: after k steps), the cards packed by length."""
        zeros = torch.zeros(1, x.shape[1], N_HIDDEN, dtype=x.dtype)
        if x.shape[0] == 0:
            return zeros
        packed = pack_padded_sequence(self.encode(x), torch.as_tensor(c_steps), enforce_sorted=False)
        h, _ = pad_packed_sequence(self.process_packed(packed), total_length=x.shape[0])
        return torch.cat([zeros, h], dim=0)

    def target_p(self, states, batch: CardBatch):
        return self.curve(self.out_heads(states[batch.t_pos, batch.t_card]), batch.t_dt)

    def forward_padded(self, x: Tensor, lengths: Tensor, dt: Tensor) -> Tensor:
        """Upstream's per-target layout: x [L, B, 3] each target's own history, zero-padded."""
        return self.curve(self.heads(x)[lengths - 1, torch.arange(x.shape[1])], dt)


def per_target_batches(data: LSTMData, rows: np.ndarray, batch_size: int, weights: np.ndarray, dtype):
    """Upstream's BatchDataset(sort_by_length=False) over `rows` in the given order: (x, lengths, dt, y, w)."""
    r = data.rows
    starts = r["seq_start"].to_numpy(np.int64)
    lengths = r["seq_pos"].to_numpy(np.int64)
    feats = lstm_features(data)
    out = []
    for lo in range(0, len(rows), batch_size):
        sel = rows[lo:lo + batch_size]
        width = int(lengths[sel].max())
        cols = np.arange(width)
        mask = cols[None, :] < lengths[sel][:, None]
        x = np.where(mask[:, :, None], feats[np.where(mask, starts[sel][:, None] + cols[None, :], 0)], 0.0)
        out.append((torch.as_tensor(x.transpose(1, 0, 2).copy(), dtype=dtype), torch.as_tensor(lengths[sel]),
                    torch.as_tensor(r["delta_t"].to_numpy(np.float64)[sel], dtype=dtype),
                    torch.as_tensor(r["y"].to_numpy(np.float64)[sel], dtype=dtype),
                    torch.as_tensor(weights[sel], dtype=dtype)))
    return out



# ----------------------------------------------------------------------------------------------- training

def flat_params(net: nn.Module) -> Tensor:
    return torch.cat([p.reshape(-1) for p in net.parameters()])


def inner_optimizer(net: nn.Module, weight_decay: float, state: dict | None) -> torch.optim.Optimizer:
    opt = torch.optim.AdamW(net.parameters(), lr=1e9, betas=INNER_BETAS, weight_decay=weight_decay)
    if state is not None:
        opt.load_state_dict(copy.deepcopy(state))
    for group in opt.param_groups:
        group["weight_decay"] = weight_decay
    return opt


def _batch_loss(net: LSTMNet, batch, exp: float) -> Tensor:
    if isinstance(batch, CardBatch):
        p, y, w = net.predict_batch(batch), batch.t_y, batch.t_w
    else:
        x, lengths, dt, y, w = batch
        p = net.forward_padded(x, lengths, dt)
    vec = F.binary_cross_entropy(p, y, reduction="none") * w
    return vec.mean() * vec.shape[0] ** exp


def flat_opt_state(net: nn.Module, opt_state: dict | None) -> tuple[np.ndarray, np.ndarray, int] | None:
    """A torch AdamW state dict of `net`'s parameters as flat (exp_avg, exp_avg_sq, step) in parameters() order
    (None: a fresh optimizer)."""
    if opt_state is None or not opt_state.get("state"):
        return None
    states = [opt_state["state"][k] for k in range(len(list(net.parameters())))]
    steps = {float(st["step"]) for st in states}
    if len(steps) != 1:
        raise ValueError(f"LSTM optimizer state: parameters at different steps {sorted(steps)}")
    flat = lambda key: np.concatenate([st[key].double().numpy().ravel() for st in states])  # noqa: E731
    return flat("exp_avg"), flat("exp_avg_sq"), int(steps.pop())


def finetune(net: LSTMNet, train: ReviewData, opt_state: dict | None, layout: str = "compiled",
             batch_size: int = BATCH) -> None:
    """SB reptile_trainer.finetune (see the module docstring), in place; `layout` "compiled" (one pass per card,
    the whole loop in one numba call: card_fit.fit_card_groups), "cards" (the same, stepped in torch: the
    reference) or "targets" (upstream's per-target padded batches)."""
    if layout == "compiled":
        finetune_compiled(net, train, flat_opt_state(net, opt_state), batch_size)
        return
    fp = FINETUNE
    weights, keep, rng = finetune_rows(train)
    n = len(train)
    if layout == "cards":  # the same random card order as the compiled loop, every pass
        cards = CardSet(net, train, keep, weights)
        batches = cards.batches(batch_size, rng.permutation(cards.n_cards))
    else:
        rows = rng.permutation(n)
        batches = per_target_batches(train, rows[keep[rows]], batch_size, weights, net.dtype)
    meta = flat_params(net).detach().clone()
    opt = inner_optimizer(net, fp["weight_decay"], opt_state)
    scale = 16000 ** (1.0 - fp["batch_size_exp"])
    torch.manual_seed(TORCH_SEED)
    net.train()
    for k in range(fp["passes"]):
        lr = scale * piecewise_lr(k, fp["lr_start"], fp["lr_middle"], fp["lr_end"], fp["warmup"], fp["passes"])
        for group in opt.param_groups:
            group["lr"] = lr
        for batch in batches:
            anchored_step(net, opt, batch, meta, fp)
    net.eval()


def anchored_step(net: "LSTMNet", opt: torch.optim.Optimizer, batch, meta: Tensor, recipe: dict) -> float:
    """One optimizer step of the fine-tune and of Reptile's inner learner alike: loss = the batch's weighted BCE
    scaled by B^batch_size_exp + reg_scale·‖θ − meta‖², gradient norm clipped at clip_norm. Returns the loss."""
    opt.zero_grad()
    loss = _batch_loss(net, batch, recipe["batch_size_exp"])
    loss = loss + recipe["reg_scale"] * torch.sum((flat_params(net) - meta) ** 2)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(net.parameters(), recipe["clip_norm"])
    opt.step()
    return float(loss.detach())


def input_normalisation(users: list[ReviewData]) -> tuple[Tensor, Tensor]:
    """Mean and (population) std of ln(1e−5 + Δt) and ln(clamp(duration)) over the history of every card's last
    target, over all training users (SB reptile_trainer.main)."""
    delay, dur = [], []
    for d in users:
        r = d.rows.sort_values("review_th", kind="stable").groupby("seq_start", sort=False).last()
        for start, pos in zip(r.index.to_numpy(), r["seq_pos"].to_numpy()):
            delay.append(d.seq_secs[start:start + pos])
            dur.append(d.seq_duration[start:start + pos])
    feats = np.stack([np.log(1e-5 + np.concatenate(delay)), np.log(np.clip(np.concatenate(dur), 100, 60000))], 1)
    return torch.tensor(feats.mean(0), dtype=torch.float32), torch.tensor(feats.std(0), dtype=torch.float32)


def torch_opt_state(net: nn.Module, state: tuple[np.ndarray, np.ndarray, int], weight_decay: float) -> dict:
    """flat_opt_state's inverse: the state dict of inner_optimizer(net) holding (exp_avg, exp_avg_sq, step)."""
    opt = inner_optimizer(net, weight_decay, None)
    m, v, step = state
    if step > 0:
        k = 0
        for p in net.parameters():
            n = p.numel()
            opt.state[p] = {"step": torch.tensor(float(step)),
                            "exp_avg": torch.from_numpy(m[k:k + n].copy()).view_as(p).to(p.dtype),
                            "exp_avg_sq": torch.from_numpy(v[k:k + n].copy()).view_as(p).to(p.dtype)}
            k += n
    return opt.state_dict()


def reptile(net: LSTMNet, users: list[ReviewData], outer_steps: int, log=None, compiled: bool = True) -> dict:
    """SB reptile_trainer.train with whole-card batches; returns the inner optimizer's state dict. `compiled`: each
    task's inner loop is one compiled call (card_fit with inner_recipe()); otherwise stepped by torch (the
    reference). The outer AdamW step is torch's in both."""
    rp = REPTILE
    mean, std = input_normalisation(users)
    net.input_mean.copy_(mean)
    net.input_std.copy_(std)
    gen = torch.Generator().manual_seed(rp["seed"])
    tasks = []
    for d in users:
        keep = (d.rows["seq_pos"].to_numpy() <= 64) & (d.rows["seq_pos"].to_numpy() >= 1)
        tasks.append(CardSet(net, d, keep))
    outer = torch.optim.AdamW(net.parameters(), lr=rp["outer_lr"], betas=(0.9, 0.999),
                              weight_decay=rp["outer_weight_decay"])
    warm = max(1, int(outer_steps * rp["warmup_fraction"]))
    sched = torch.optim.lr_scheduler.SequentialLR(outer, [
        torch.optim.lr_scheduler.LinearLR(outer, start_factor=1e-4, end_factor=1.0, total_iters=warm),
        torch.optim.lr_scheduler.CosineAnnealingLR(outer, T_max=max(1, outer_steps - warm))], milestones=[warm])
    state = inner_optimizer(net, rp["inner_weight_decay"], None).state_dict()
    flat_state = None
    for it in range(1, outer_steps + 1):
        cards = tasks[it % len(tasks)]
        learner = copy.deepcopy(net)
        lr = rp["lr"] * min(1.0, it / warm)
        loss = float("nan")
        order = torch.randperm(cards.n_cards, generator=gen).numpy()
        if compiled:
            flat_state = learner.fit_compiled(cards, order[None, :], BATCH, inner_recipe(lr), flat_state)
        else:
            opt = inner_optimizer(learner, rp["inner_weight_decay"], state)
            for group in opt.param_groups:
                group["lr"] = lr
            meta = flat_params(net).detach().clone()
            learner.train()
            for k, batch in enumerate(cards.batches(BATCH, order)):
                if k >= rp["inner_steps"]:
                    break
                loss = anchored_step(learner, opt, batch, meta, rp)
            state = copy.deepcopy(opt.state_dict())
        outer.zero_grad()
        for p, q in zip(net.parameters(), learner.parameters()):
            p.grad = (p.data - q.data).clone()
        outer.step()
        sched.step()
        if log is not None and it % max(1, outer_steps // 10) == 0:
            log(f"outer step {it}/{outer_steps}" + ("" if compiled else f": last inner loss {loss:.4f}"))
    if compiled and flat_state is not None:
        return torch_opt_state(net, flat_state, rp["inner_weight_decay"])
    return state




def save_opt_state(net: nn.Module, state: dict, path) -> None:
    """The inner optimizer's state dict in `path` (.pth) and its flat (exp_avg, exp_avg_sq, step) as float32 arrays
    in path.with_suffix(".npz") (step 0: a fresh optimizer)."""
    torch.save(state, path)
    flat = flat_opt_state(net, state)
    m, v, step = flat if flat is not None else (np.zeros(0), np.zeros(0), 0)
    np.savez(path.with_suffix(".npz"), exp_avg=m.astype(np.float32), exp_avg_sq=v.astype(np.float32),
             step=np.int64(step))

