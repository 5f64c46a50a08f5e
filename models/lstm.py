"""LSTM (8,869 parameters), Reptile-pretrained: spec models.md §2.3; SB models/lstm.py@00c9de57,
reptile_trainer.py@0704a99a, features in other.py@00c9de57 (`model_name in "LSTM"`).

Published run: `other.py --algo LSTM --short --secs --equalize_test_with_non_secs` (upstream file name
`LSTM-short-secs-equalize_test_with_non_secs`). Here those flags are the row's defaults: `other.py --model LSTM`
writes result/LSTM.jsonl (same-day reviews in the histories, fractional intervals and durations as inputs, the test
rows of the day-mode pipeline).

Input per previous review k (same-day reviews included): ln(1e−5 + Δt_k) with Δt_k = elapsed_seconds/86400 (0 for
the first review) and ln(clamp(duration_k, 100, 60000)) (ms), standardised with the buffers input_mean/input_std
(fixed at pretraining), and the one-hot rating: 6 inputs. Architecture (hidden 20, ResBlock(f)(x) = f(x) + x):
Linear(6→20), SiLU, LayerNorm(no bias), Linear(20→20), SiLU; ResBlock[LN(no bias) → LSTM]; ResBlock[LN → LSTM];
ResBlock[LN(no bias) → Linear → SiLU → LN(no bias) → Linear → SiLU]; LN(no bias) → Linear → SiLU; heads
Linear(20→3) ×3: w = softmax, s = exp(clamp(·, ±25)), d = exp(clamp(·, ±25)). Output after the last history review,
p = (1 − 1e−7)·Σ_c w_c (1 + t/(1e−7 + s_c))^(−d_c) with t = the target's elapsed DAYS (so same-day targets never
count). Module names follow upstream's so its state dicts load unchanged.

Targets (`restrict_targets`, the runner's per-user hook, reproduces --equalize_test_with_non_secs): the test rows are
the day-mode `--short` rows (outlier filter included) of each TimeSeriesSplit fold; the training rows of a fold are
ALL long-term reviews with review_th below the fold's first test review, including the cards that the day-mode
outlier filter removed (the secs pipeline has no outlier filter). The fractional intervals and durations of every
sequence position are attached to the user's ReviewData (`LSTMData`), recomputed from the revlogs in the order
features.py uses (checked against its intervals and ratings).

Fine-tune per user and fold (SB reptile_trainer.finetune): row weights 1 + 6.49·x^2.4758 (x = linspace(0, 1, N) over
the fold's training rows in time order), normalised to mean 1; rows with history > 64 dropped; AdamW with betas
(0, 0.999) whose state comes from pretraining (pretrain/LSTM_opt.pth), weight decay 0.04855; 20 passes over all
batches; per pass a piecewise-linear lr 0.0019622 → 0.006455344 (5 warm-up passes) → 0.0034213, times
16000^(1 − 1.2103); batch loss = mean(weight·BCE)·B^1.2103 + 0.000244·‖θ − θ_pretrained‖²; gradient norm clipped
at 7050; the final weights. One pass per card: batches are groups of whole cards with ≈ 16,384 targets in one
random card order (seed 2025; upstream shuffles the rows once with random_state 2025 and cuts batches of 16,384).
Compiled (models/lstm_kernels.py, float64): the network's forward and reverse pass, one of each per card, and the
whole fine-tune of a fold in one numba call (models/card_fit.py with `finetune_recipe()`), because stepped in torch
the fine-tune was the slowest row of the table (~47 s per 100k reviews). Predictions run on the same kernel. The
torch path stays as the reference: `finetune(layout="cards")` is the same recipe stepped by torch.optim.AdamW
(tests/test_lstm_compiled.py: equal to 1e−8), `--trainer upstream` the same recipe over upstream's per-target
padded batches.

Pretraining (`pretrain.py --model LSTM`, Reptile, SB reptile_trainer.train): input_mean/std from the training users
(every review in the history of each card's last target); then outer steps over the users in turn (task =
step mod users): a learner copy adapts with AdamW(betas (0, 0.999), weight decay 0.03, state carried from task to
task) for up to 15 batches of that user (≤ 16,384 targets each), lr 0.0026945·min(1, step/warm-up), loss
mean(BCE)·B + 0.000244·‖θ_learner − θ‖², clip 7050; the meta "gradient" θ − θ_learner goes to AdamW(lr 0.02, betas
(0.9, 0.999), weight decay 0.03) with a linear warm-up from 1e−4× over the first 10% of the steps and cosine decay
after. Upstream: 100,000 outer steps on users 9000–9099; `--epochs` sets the number of outer steps here. Each
task's inner loop is one compiled call on the fine-tune's kernels (card_fit with `inner_recipe()`, the AdamW state
carried flat from task to task); `reptile(compiled=False)` steps it in torch (the reference).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

from models.base import InadequateData, ReviewData
from models.card_fit import recipe
from models.lstm_kernels import lstm_cards_loss
from models.neural_seq import CardBatch, CardSet, CompiledCardNet, NeuralModel, TORCH_SEED, pretrain_path

N_HIDDEN = 20
N_CURVES = 3
BATCH = 16384
FINETUNE = dict(lr_start=0.0019622, lr_middle=0.006455344, lr_end=0.0034213, warmup=5, batch_size_exp=1.2103,
                clip_norm=7050.0, reg_scale=0.000244, passes=20, recency_weight=6.49, recency_degree=2.4758,
                weight_decay=0.04855, shuffle_seed=2025)
REPTILE = dict(lr=0.0026945, batch_size_exp=1.0, clip_norm=7050.0, reg_scale=0.000244, inner_steps=15,
               inner_weight_decay=0.03, outer_lr=0.02, outer_weight_decay=0.03, warmup_fraction=0.1, seed=2030)
INNER_BETAS = (0.0, 0.999)


# ----------------------------------------------------------------------------------------------- data

@dataclass
class LSTMData(ReviewData):
    """ReviewData plus what the LSTM reads per sequence position (fractional interval, duration) and the extra
    training rows of --equalize_test_with_non_secs. Subsets keep them (the sequences are shared)."""

    seq_secs: np.ndarray = None  # Δt in fractional days (elapsed_seconds / 86400, 0 for a first review)
    seq_duration: np.ndarray = None  # answer time in ms
    extra_rows: pd.DataFrame | None = None  # long-term reviews of the secs pipeline that are not target rows
    full_review_th: np.ndarray | None = field(default=None)  # review_th of the whole user's target rows

    def subset(self, selector) -> "LSTMData":
        base = ReviewData.subset(self, selector)
        return LSTMData(base.rows, self.seq_delta_t, self.seq_rating, self.seq_secs, self.seq_duration,
                        self.extra_rows, self.full_review_th)


def attach_sequences(data: ReviewData, revlogs: pd.DataFrame, max_seq_len: int = 64) -> LSTMData:
    """`data` (built by features.build_features with same-day histories) with the LSTM's per-position inputs and the
    equalized extra training rows. The sequence order is recomputed as features.py builds it (stable sort by card,
    ratings 1–4, each card's first 2·max_seq_len reviews, same-day reviews kept) and checked against `data`."""
    card = revlogs["card_id"].to_numpy(np.int64)
    rating = revlogs["rating"].to_numpy(np.int64)
    elapsed = revlogs["elapsed_days"].to_numpy(np.int64)
    secs = revlogs["elapsed_seconds"].to_numpy(np.float64)
    duration = revlogs["duration"].to_numpy(np.float64) if "duration" in revlogs else np.zeros(len(revlogs))
    order = np.argsort(card, kind="stable")
    order = order[(rating[order] >= 1) & (rating[order] <= 4)]
    c = card[order]
    starts = np.ones(len(c), dtype=bool)
    starts[1:] = c[1:] != c[:-1]
    idx = np.arange(len(c))
    run_start = np.maximum.accumulate(np.where(starts, idx, 0))
    order = order[idx - run_start < 2 * max_seq_len]
    if (len(order) != len(data.seq_delta_t) or not np.array_equal(np.maximum(elapsed[order], 0), data.seq_delta_t)
            or not np.array_equal(rating[order], data.seq_rating)):
        raise ValueError("LSTM: the revlog sequences do not match the feature pipeline's (same-day histories "
                         "expected)")
    c = card[order]
    starts = np.ones(len(c), dtype=bool)
    starts[1:] = c[1:] != c[:-1]
    idx = np.arange(len(c))
    seq_start = np.maximum.accumulate(np.where(starts, idx, 0))
    long_term = elapsed[order] > 0  # the secs pipeline's targets (delta_t in days > 0), no outlier filter
    present = set(data.rows["review_th"].to_numpy().tolist())
    review_th = order + 1
    extra = long_term & ~np.isin(review_th, np.fromiter(present, dtype=np.int64, count=len(present)))
    sel = np.flatnonzero(extra)
    extra_rows = pd.DataFrame({"card_id": c[sel], "review_th": review_th[sel],
                               "delta_t": elapsed[order][sel].astype(np.float64),
                               "y": (rating[order][sel] > 1).astype(np.int64), "seq_start": seq_start[sel],
                               "seq_pos": sel - seq_start[sel]})
    return LSTMData(data.rows, data.seq_delta_t, data.seq_rating, np.maximum(secs[order] / 86400.0, 0.0),
                    duration[order], extra_rows.sort_values("review_th", kind="stable").reset_index(drop=True),
                    np.sort(data.rows["review_th"].to_numpy()))


def equalized_train(train: LSTMData) -> ReviewData:
    """The fold's training rows plus the secs pipeline's extra rows before the fold's first test review."""
    if getattr(train, "extra_rows", None) is None or len(train.extra_rows) == 0:
        return train
    rt = train.rows["review_th"].to_numpy()
    full = train.full_review_th
    n = len(rt)
    if n < len(full) and np.array_equal(np.sort(rt), full[:n]):
        test_start = full[n]  # train is the prefix of the user's rows before the test fold
    else:
        test_start = rt.max() + 1 if n else 0
    extra = train.extra_rows[train.extra_rows["review_th"] < test_start]
    rows = pd.concat([train.rows, extra], ignore_index=True).sort_values("review_th", kind="stable")
    return LSTMData(rows.reset_index(drop=True), train.seq_delta_t, train.seq_rating, train.seq_secs,
                    train.seq_duration, None, None)


# ----------------------------------------------------------------------------------------------- network

def lstm_features(data) -> np.ndarray:
    """(Δt in fractional days, duration in ms, rating) of every sequence position."""
    if getattr(data, "seq_secs", None) is None:
        raise ValueError("the LSTM needs fractional intervals and durations (models/lstm.attach_sequences)")
    return np.stack([data.seq_secs, data.seq_duration, np.asarray(data.seq_rating, dtype=np.float64)], axis=1)


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


class LSTMNet(CompiledCardNet):
    """Fine-tuned and predicted compiled (models/lstm_kernels.py, float64); the torch methods below are the
    reference path (tests, `--trainer upstream`, Reptile pretraining)."""

    card_loss = lstm_cards_loss

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

    def model_consts(self) -> tuple:
        """lstm_cards_loss's `model`: the input standardisation (mean, mean, std, std)."""
        mean, std = self.input_mean.tolist(), self.input_std.tolist()
        return float(mean[0]), float(mean[1]), float(std[0]), float(std[1])

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
    def step_features(self, data):
        return lstm_features(data)

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


def piecewise_lr(k: int, start: float, middle: float, end: float, warmup: int, total: int) -> float:
    if k < warmup:
        return start + (middle - start) * k / warmup
    return middle + (end - middle) * (k - warmup) / (total - warmup)


def _batch_loss(net: LSTMNet, batch, exp: float) -> Tensor:
    if isinstance(batch, CardBatch):
        p, y, w = net.predict_batch(batch), batch.t_y, batch.t_w
    else:
        x, lengths, dt, y, w = batch
        p = net.forward_padded(x, lengths, dt)
    vec = F.binary_cross_entropy(p, y, reduction="none") * w
    return vec.mean() * vec.shape[0] ** exp


def finetune_recipe() -> tuple:
    """The fine-tune's optimizer recipe for the compiled loop (card_fit.recipe): the piecewise-linear lr per pass
    times 16000^(1 − batch_size_exp), AdamW(betas (0, 0.999)), loss mean·B^batch_size_exp + the pull towards the
    pretrained weights, gradient norm clipped."""
    fp = FINETUNE
    scale = 16000 ** (1.0 - fp["batch_size_exp"])
    lrs = [scale * piecewise_lr(k, fp["lr_start"], fp["lr_middle"], fp["lr_end"], fp["warmup"], fp["passes"])
           for k in range(fp["passes"])]
    return recipe(lrs, betas=INNER_BETAS, weight_decay=fp["weight_decay"], size_exp=fp["batch_size_exp"],
                  reg_scale=fp["reg_scale"], clip_norm=fp["clip_norm"])


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
    fp = FINETUNE
    n = len(train)
    x = np.linspace(0, 1, n)
    weights = 1.0 + fp["recency_weight"] * np.power(x, fp["recency_degree"])
    weights *= n / weights.sum()
    keep = train.rows["seq_pos"].to_numpy() <= 64
    keep &= train.rows["seq_pos"].to_numpy() >= 1
    if not keep.any():
        raise InadequateData("Training data is inadequate.")
    rng = np.random.RandomState(fp["shuffle_seed"])
    if layout in ("compiled", "cards"):
        cards = CardSet(net, train, keep, weights)
        order = rng.permutation(cards.n_cards)
        if layout == "compiled":  # the same card order every pass
            net.fit_compiled(cards, np.tile(order, (fp["passes"], 1)), batch_size, finetune_recipe(),
                             flat_opt_state(net, opt_state))
            net.eval()
            return
        batches = cards.batches(batch_size, order)
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


def inner_recipe(lr: float) -> tuple:
    """Reptile's inner learner for the compiled loop (card_fit.recipe): one pass over at most inner_steps groups,
    AdamW(betas (0, 0.999)) at a constant lr, loss mean·B^batch_size_exp + the pull towards the meta weights."""
    rp = REPTILE
    return recipe([lr], betas=INNER_BETAS, weight_decay=rp["inner_weight_decay"], size_exp=rp["batch_size_exp"],
                  reg_scale=rp["reg_scale"], clip_norm=rp["clip_norm"], max_groups=rp["inner_steps"])


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


# ----------------------------------------------------------------------------------------------- the Model

class LSTM(NeuralModel):
    name = "LSTM"
    net_class = LSTMNet
    builtin_flags = ("secs", "duration", "equalize_test_with_non_secs")  # its published mode, always on

    @classmethod
    def weights_name(cls, cfg) -> str:
        return "LSTM"  # its flags are fixed (short, secs, duration, equalized test set)

    @classmethod
    def pretrain_command(cls, cfg) -> str:
        return "python pretrain.py --model LSTM --data PATH --users 9000-9099"

    @classmethod
    def restrict_targets(cls, data: ReviewData, root: Path, user_id: int) -> LSTMData:
        """Runner hook (once per user, before the split): attach the LSTM's inputs and equalized rows."""
        from data_loader import load_revlogs

        return attach_sequences(data, load_revlogs(root, user_id))

    def new_net(self) -> LSTMNet:
        net = super().new_net()
        path = pretrain_path("LSTM_opt")
        if not path.exists():
            raise FileNotFoundError(f"pretrained optimizer state {path} not found; make it with: "
                                    f"{self.pretrain_command(self.cfg)}")
        self.opt_state = torch.load(path, map_location="cpu", weights_only=True)
        return net

    def fit(self, train: ReviewData) -> "LSTM":
        if self.cfg.default:
            return self
        data = equalized_train(train)
        if len(data) == 0:
            raise InadequateData("no training rows")
        layout = "compiled" if getattr(self.cfg, "trainer", "fast") == "fast" else "targets"
        finetune(self.net, data, self.opt_state, layout)
        return self

    @staticmethod
    def pretrain_users(net: LSTMNet, users: list[ReviewData], *, n_epoch: int, out: Path, log=print) -> LSTMNet:
        """Reptile (n_epoch = outer steps); writes the inner optimizer state next to the weights."""
        state = reptile(net, users, n_epoch, log)
        out.parent.mkdir(parents=True, exist_ok=True)
        torch.save(state, out.with_name(out.stem + "_opt.pth"))
        return net
