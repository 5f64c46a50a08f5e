"""The card-sequence trainer shared by the neural models: one pass of the network per card sequence.

Why: every target of a card is a prefix of the card's review sequence (`ReviewData`), so a recurrent network gets
the predictions of ALL of a card's targets from the states along ONE run over the card. Upstream (srs-benchmark's
`other.py` Trainer with fsrs-optimizer's BatchDataset) instead pads every target's whole history into its own
column, so a card with n reviews costs 1 + 2 + ... + n steps per epoch instead of n.

How a network plugs in (`CardSeqNet`, a torch module):
- `step_features(data)`: the input vector of every review of data's concatenated card sequences, [N, F];
- `n_steps(pos)`: how many of a card's steps a target with history length `pos` needs (default: pos);
- `card_states(x, c_steps)`: x is [L, C, F] (time-major, card c zero-padded beyond its c_steps[c] steps); returns
  the states [L + 1, C, ...] where index k is the state after the card's first k steps (index 0: the initial
  state); states beyond a card's length are never read;
- `target_p(states, batch)`: P(recall) of every target of the batch from the states of its card;
- `forward_batch(batch)`: the same predictions computed upstream's way, each target from its own padded history
  (`training.Batch`): used by `--trainer upstream` and by the tests that check the one-pass path against it.

Fine-tuning (`fit_cards`) follows upstream's recipe (spec models.md §0.4, §2) with cards as the unit of batching:
- training rows whose history is longer than max_seq_len are left out of the loss (upstream's BatchDataset drops
  them), and each card is run only as far as its longest kept target needs;
- batches are groups of whole cards holding ≈ batch_size targets (a card joins the group in which its first target
  falls), the cards regrouped in a new random order every epoch (torch.randperm on a generator seeded 2023). Cutting
  length-sorted cards once and shuffling only the order of the groups, as upstream does with its length-sorted
  target batches, was measured worse (bench/bench_neural.py, two simulated users): a group of long cards is a
  handful of cards, its gradient far noisier than upstream's 512 distinct cards (GRU-P 0.2850 vs upstream's trainer
  0.2753, GRU 0.3040 vs 0.2854); shuffled groups mix long and short cards and match upstream's trainer (0.2743,
  0.2818);
- optimizer from the network (AdamW(lr, weight_decay=wd) for GRU/GRU-P/Transformer, Adam for NN-17);
  CosineAnnealingLR(T_max = groups·epochs) stepped every group; loss = Σ weight·BCE (a sum, torch's BCE clamps its
  logs at −100) over all targets of the group's cards, from one forward and one backward pass;
- the weights after the LAST epoch are kept. This reproduces upstream's effective behaviour: its Trainer "keeps the
  best epoch" by storing `model.state_dict()`, which for an nn.Module aliases the live tensors, so the returned
  "best" weights are always the final ones (spec models.md §12.9; SB other.py@00c9de57 `Trainer.train/eval`).

Compiled networks (`CompiledCardNet`): GRU, GRU-P (models/gru_kernels.py), NN-17 (models/nn17_kernels.py) and the
LSTM (models/lstm_kernels.py) give their loss and gradient as a compiled `card_loss`, and fit_cards runs this whole
recipe (the same groups, Adam/AdamW, cosine schedule, clip box) in one numba call in float64 (models/card_fit.py),
because for these small networks torch's per-operation cost (autograd nodes per time step, every optimizer step,
parameter conversions) far exceeded the arithmetic. The compiled loop is tested equal to this recipe stepped in torch
(tests/test_neural.py, tests/test_nn17_compiled.py, tests/test_lstm_compiled.py).

Per model: the Transformer keeps upstream's per-target windows (its no-mask quirk, models/transformer.py); the LSTM
runs its own Reptile-style fine-tune over the same whole-card batches (models/lstm.py), through the same compiled
loop with its own recipe (card_fit.recipe).

Prediction (`predict_cards`) runs the same pass over every card of the test rows (no length limit), in groups of
cards with ≈ 16,384 targets. Everything is deterministic on CPU for a given seed.

Pretrained weights live in pretrain/<name>.pth (state dicts written by pretrain.py); `load_pretrained` raises a clear
error naming the command that makes a missing file.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import training
from models.base import InadequateData, Model, ReviewData
from models.card_fit import group_bounds, loop_for, recipe
from models.torch_rng import SHUFFLE_SEED

TORCH_SEED = 42
PREDICT_TARGETS = 16384
PRETRAIN_DIR = Path(__file__).resolve().parents[1] / "pretrain"


class CardBatch:
    """A group of whole cards and all their (selected) targets, as numpy arrays (float64) with torch views made on
    first use in the network's dtype.

    x_packed holds the inputs of card c's steps in rows c_off[c] .. c_off[c+1]−1 (c_steps[c] of them); `x` is the same
    zero-padded and time-major: x[k, c] is the input of step k of card c. Target j belongs to
    card t_card[j] and has history length t_pos[j] (its history is the card's reviews 0..t_pos[j]−1), elapsed time
    t_dt[j], last history rating t_last_g[j], label t_y[j] and weight t_w[j]; t_row[j] is its row in the ReviewData
    the batch was built from.
    """

    def __init__(self, x_packed, c_steps, t_card, t_pos, t_dt, t_last_g, t_y, t_w, t_row, dtype=torch.float32):
        self.x_packed, self.c_steps, self.t_row, self.dtype = x_packed, c_steps, t_row, dtype
        self.c_off = np.concatenate([[0], np.cumsum(c_steps)]).astype(np.int64)
        self.t_card_np, self.t_pos_np, self.t_dt_np = t_card, t_pos, t_dt
        self.t_last_g_np, self.t_y_np, self.t_w_np = t_last_g, t_y, t_w

    def __len__(self) -> int:
        return len(self.t_pos_np)

    def _t(self, name, arr, dtype=None):
        cache = self.__dict__.setdefault("_torch", {})
        if name not in cache:
            cache[name] = torch.as_tensor(arr, dtype=dtype or self.dtype)
        return cache[name]

    @property
    def x_np(self) -> np.ndarray:
        """The inputs zero-padded, time-major [L, C, F]."""
        if "_x_np" not in self.__dict__:
            width = int(self.c_steps.max()) if len(self.c_steps) else 0
            padded = np.zeros((len(self.c_steps), width, self.x_packed.shape[1]))
            padded[np.arange(width)[None, :] < self.c_steps[:, None]] = self.x_packed
            self._x_np = np.ascontiguousarray(padded.transpose(1, 0, 2))
        return self._x_np

    x = property(lambda self: self._t("x", self.x_np))
    t_card = property(lambda self: self._t("t_card", self.t_card_np, torch.long))
    t_pos = property(lambda self: self._t("t_pos", self.t_pos_np, torch.long))
    t_dt = property(lambda self: self._t("t_dt", self.t_dt_np))
    t_last_g = property(lambda self: self._t("t_last_g", self.t_last_g_np))
    t_y = property(lambda self: self._t("t_y", self.t_y_np))
    t_w = property(lambda self: self._t("t_w", self.t_w_np))


class CardSeqNet(training.TrainableModule):
    """Base class of the neural models (see the module docstring for the contract)."""

    lr: float = 4e-2
    wd: float = 1e-5
    optimizer: str = "adamw"  # "adamw" (AdamW with wd) or "adam" (upstream BaseModel: Adam, wd ignored)

    # --- contract ---------------------------------------------------------------------------------------------
    def step_features(self, data: ReviewData) -> np.ndarray:
        raise NotImplementedError

    def n_steps(self, pos: np.ndarray) -> np.ndarray:
        return pos

    def card_states(self, x: Tensor, c_steps: np.ndarray):
        raise NotImplementedError

    def target_p(self, states, batch: CardBatch) -> Tensor:
        raise NotImplementedError

    # --- shared -----------------------------------------------------------------------------------------------
    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    def loss_and_grad(self, batch: CardBatch) -> tuple[float, list[np.ndarray]] | None:
        """Optional compiled Σ weight·BCE of a batch and its gradient per parameter (in `parameters()` order);
        None: fit_cards uses autograd on predict_batch."""
        return None

    def predict_np(self, batch: CardBatch) -> np.ndarray:
        """P(recall) of the batch's targets as float64 numpy (no gradient); compiled models override it."""
        return self.predict_batch(batch).double().numpy()

    def predict_batch(self, batch: CardBatch) -> Tensor:
        return self.target_p(self.card_states(batch.x, batch.c_steps), batch)

    def make_optimizer(self, lr: float) -> torch.optim.Optimizer:
        if self.optimizer == "adam":
            return torch.optim.Adam(self.parameters(), lr=lr, betas=(0.9, 0.999), fused=True)
        return torch.optim.AdamW(self.parameters(), lr=lr, weight_decay=self.wd, fused=True)

    def n_params(self) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad)

    def clip_params_(self) -> None:
        """Project the parameters into their allowed box after every optimizer step (default: nothing)."""

    def clip_(self) -> None:
        """training.py's hook after every optimizer step: clip, and under `fit_upstream` record the live weights so
        that the final epoch's weights can be returned (the aliasing quirk, see the module docstring)."""
        self.clip_params_()
        if getattr(self, "_record_last", False):
            self._last_state = {k: v.detach().clone() for k, v in self.state_dict().items()}


class CompiledCardNet(CardSeqNet):
    """A CardSeqNet whose loss and gradient are a compiled `card_loss` (models/card_fit.py's contract) over a flat
    float64 copy of `flat_params()`: fit_cards runs the whole fine-tune in one compiled call (card_fit.fit_card_groups)
    and predict_cards one compiled pass per group of cards. Subclasses set card_loss and model_consts()."""

    card_loss = None  # an @njit function (model, layout, cards, theta, want, grad, p_out) -> loss

    def model_consts(self) -> tuple:
        raise NotImplementedError

    def flat_params(self) -> list[nn.Parameter]:
        return list(self.parameters())

    def param_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """Box applied after every optimizer step (flat, like theta); default: none."""
        n = len(self.theta())
        return np.full(n, -np.inf), np.full(n, np.inf)

    def theta(self) -> np.ndarray:
        return np.concatenate([p.detach().double().numpy().ravel() for p in self.flat_params()])

    def set_theta(self, theta: np.ndarray) -> None:
        with torch.no_grad():
            k = 0
            for p in self.flat_params():
                p.copy_(torch.from_numpy(theta[k:k + p.numel()]).view_as(p))
                k += p.numel()

    def _call(self, layout, cards, theta, grad, p_out) -> float:
        want = grad is not None
        return type(self).card_loss(self.model_consts(), layout, np.asarray(cards, np.int64), theta, want,
                                    grad if want else np.zeros(0), p_out)

    def _batch(self, batch: CardBatch, grad: np.ndarray | None) -> tuple[float, np.ndarray]:
        """(loss, p) of a CardBatch: its cards are packed one after another; targets regrouped card by card."""
        t_order = np.argsort(batch.t_card_np, kind="stable")
        counts = np.bincount(batch.t_card_np, minlength=len(batch.c_steps))
        layout = (batch.x_packed, batch.c_off[:-1], batch.c_steps, np.cumsum(counts) - counts, counts,
                  batch.t_pos_np[t_order], batch.t_dt_np[t_order], batch.t_last_g_np[t_order],
                  batch.t_y_np[t_order], batch.t_w_np[t_order])
        p = np.empty(len(batch))
        loss = self._call(layout, np.arange(len(batch.c_steps)), self.theta(), grad, p)
        out = np.empty(len(batch))
        out[t_order] = p
        return loss, out

    def loss_and_grad(self, batch: CardBatch):
        grad = np.zeros(len(self.theta()))
        loss, _ = self._batch(batch, grad)
        flat, k = {}, 0
        for p in self.flat_params():
            flat[id(p)] = grad[k:k + p.numel()].reshape(tuple(p.shape))
            k += p.numel()
        return loss, [flat[id(p)] for p in self.parameters()]

    def predict_np(self, batch: CardBatch) -> np.ndarray:
        return self._batch(batch, None)[1]

    def predict_compiled(self, cards: "CardSet", chunk: int) -> np.ndarray:
        """P(recall) of every target of the CardSet (in its `order`), cards in groups of ≈ chunk targets."""
        layout, theta, order = cards.layout(), self.theta(), cards.card_order()
        bounds = group_bounds(cards.c_count[order], chunk)
        p = np.empty(len(cards.t_pos))
        for g in range(len(bounds) - 1):
            self._call(layout, order[bounds[g]:bounds[g + 1]], theta, None, p)
        return p

    def fit_compiled(self, cards: "CardSet", orders: np.ndarray, batch_size: int, recipe: tuple,
                     state: tuple | None = None) -> tuple[np.ndarray, np.ndarray, int]:
        """A fine-tune loop in one compiled call (card_fit.fit_card_groups with card_fit.recipe()), then the weights
        back into the torch parameters; `state` = the optimizer's (exp_avg, exp_avg_sq, step), flat (default:
        a fresh optimizer). Returns the optimizer's state after the loop (new arrays)."""
        theta = self.theta()
        lower, upper = self.param_bounds()
        m, v, step = (np.zeros(len(theta)), np.zeros(len(theta)), 0) if state is None else state
        m, v = np.array(m, dtype=np.float64), np.array(v, dtype=np.float64)
        steps = loop_for(type(self).card_loss)(self.model_consts(), cards.layout(),
                                               np.ascontiguousarray(orders, dtype=np.int64), int(batch_size), theta,
                                               lower, upper, recipe, m, v, int(step))
        self.set_theta(theta)
        return m, v, int(step) + int(steps)


# ----------------------------------------------------------------------------------------------- batching

def _card_layout(data: ReviewData, net: CardSeqNet, keep: np.ndarray | None):
    """Targets sorted by (card, history length) and the cards they belong to, each with the steps it needs."""
    rows = data.rows
    start = rows["seq_start"].to_numpy(np.int64)
    pos = rows["seq_pos"].to_numpy(np.int64)
    sel = np.arange(len(rows)) if keep is None else np.flatnonzero(keep)
    sel = sel[pos[sel] >= 1]  # a first review has no history: never a target
    order = sel[np.lexsort((pos[sel], start[sel]))]
    if len(order) == 0:
        empty = np.zeros(0, dtype=np.int64)
        return order, empty, empty, empty, empty
    st = start[order]
    first = np.ones(len(order), dtype=bool)
    first[1:] = st[1:] != st[:-1]
    t_card = np.cumsum(first) - 1  # card number of each target
    c_first = np.flatnonzero(first)
    c_last = np.append(c_first[1:], len(order)) - 1
    c_start = st[c_first]
    c_steps = np.asarray(net.n_steps(pos[order][c_last]), dtype=np.int64)
    c_count = c_last - c_first + 1
    return order, t_card, c_start, c_steps, c_count


class CardSet:
    """The selected targets of `data` grouped by card, ready to be cut into batches of whole cards."""

    def __init__(self, net: CardSeqNet, data: ReviewData, keep: np.ndarray | None = None,
                 weights: np.ndarray | None = None):
        self.order, self.t_card, self.c_start, self.c_steps, self.c_count = _card_layout(data, net, keep)
        self.n_cards = len(self.c_start)
        self.c_tfirst = np.cumsum(self.c_count) - self.c_count  # card c's targets: c_tfirst[c] .. + c_count[c] − 1
        self.dtype = net.dtype
        self.feats = np.asarray(net.step_features(data), dtype=np.float64)
        rows = data.rows
        r = self.order
        pos = rows["seq_pos"].to_numpy(np.int64)[r]
        start = rows["seq_start"].to_numpy(np.int64)[r]
        w = np.ones(len(rows)) if weights is None else np.asarray(weights, dtype=np.float64)
        # per selected target (in `order`): history length, delta_t, last history rating, y, weight
        self.t_pos = pos
        self.t_dt = rows["delta_t"].to_numpy(np.float64)[r]
        self.t_last_g = data.seq_rating[start + pos - 1].astype(np.float64) if len(r) else np.zeros(0)
        self.t_y = rows["y"].to_numpy(np.float64)[r]
        self.t_w = w[r]

    def batches(self, batch_size: int, card_order: np.ndarray | None = None) -> list[CardBatch]:
        """Consecutive groups of cards in `card_order` (default: by the number of steps they need, so padding is
        small) holding ≈ batch_size targets each: a card joins the group where its first target falls."""
        if self.n_cards == 0:
            return []
        c_order = self.card_order(card_order)
        g_bounds = group_bounds(self.c_count[c_order], max(1, int(batch_size)))
        out = []
        for g in range(len(g_bounds) - 1):
            cards = c_order[g_bounds[g]:g_bounds[g + 1]]
            steps = self.c_steps[cards]
            off = np.cumsum(steps) - steps
            idx = np.repeat(self.c_start[cards] - off, steps) + np.arange(int(steps.sum()))
            counts = self.c_count[cards]
            t = np.repeat(self.c_tfirst[cards] - (np.cumsum(counts) - counts), counts) + np.arange(int(counts.sum()))
            out.append(CardBatch(
                x_packed=self.feats[idx], c_steps=steps, t_card=np.repeat(np.arange(len(cards)), counts),
                t_pos=self.t_pos[t], t_dt=self.t_dt[t], t_last_g=self.t_last_g[t], t_y=self.t_y[t], t_w=self.t_w[t],
                t_row=self.order[t], dtype=self.dtype))
        return out

    def layout(self) -> tuple:
        """The card layout of the compiled kernels (models/card_fit.py)."""
        return (self.feats, self.c_start, self.c_steps, self.c_tfirst, self.c_count, self.t_pos, self.t_dt,
                self.t_last_g, self.t_y, self.t_w)

    def card_order(self, card_order: np.ndarray | None = None) -> np.ndarray:
        """The given card order, or by default the cards sorted by the number of steps they need."""
        return np.argsort(self.c_steps, kind="stable") if card_order is None else np.asarray(card_order, np.int64)

    def n_groups(self, batch_size: int, card_order: np.ndarray | None = None) -> int:
        return len(group_bounds(self.c_count[self.card_order(card_order)], max(1, int(batch_size)))) - 1


def card_batches(net: CardSeqNet, data: ReviewData, batch_size: int, keep: np.ndarray | None = None,
                 weights: np.ndarray | None = None) -> list[CardBatch]:
    """Groups of whole cards with ≈ batch_size targets each, cards sorted by the number of steps they need.
    `keep` selects the targets; `weights` are per row of `data`."""
    return CardSet(net, data, keep, weights).batches(batch_size)


# ----------------------------------------------------------------------------------------------- predict / fit

def predict_cards(net: CardSeqNet, data: ReviewData, chunk: int = PREDICT_TARGETS) -> np.ndarray:
    """P(recall) of every row of `data`, in row order (NaN for a row without history), one pass per card."""
    out = np.full(len(data), np.nan)
    net.eval()
    if isinstance(net, CompiledCardNet):
        cards = CardSet(net, data)
        if cards.n_cards:
            out[cards.order] = net.predict_compiled(cards, chunk)
        return out
    with torch.no_grad():
        for b in card_batches(net, data, chunk):
            out[b.t_row] = net.predict_np(b)
    return out


def batch_loss(net: CardSeqNet, batch: CardBatch) -> Tensor:
    p = net.predict_batch(batch)
    return (F.binary_cross_entropy(p, batch.t_y, reduction="none") * batch.t_w).sum()


def epoch_orders(n_cards: int, n_epoch: int, seed: int = SHUFFLE_SEED) -> np.ndarray:
    """The card order of every epoch [n_epoch, n_cards]: torch.randperm on one Generator seeded `seed`."""
    generator = torch.Generator().manual_seed(seed)
    return np.stack([torch.randperm(n_cards, generator=generator).numpy() for _ in range(n_epoch)])


def fit_cards(net: "CompiledCardNet", data: ReviewData, *, n_epoch: int, batch_size: int = 512,
              max_seq_len: int = 64, lr: float | None = None, weights: np.ndarray | None = None,
              keep: np.ndarray | None = None, seed: int = SHUFFLE_SEED) -> int:
    """Fine-tune a compiled network in place on `data` (see the module docstring): the whole recipe in one compiled
    call; returns the number of groups per epoch. Raises InadequateData when no target has a history of length
    1..max_seq_len. Networks stepped in torch train with fit_upstream (or their own recipe, the LSTM)."""
    if not isinstance(net, CompiledCardNet):
        raise TypeError(f"fit_cards needs a CompiledCardNet, not {type(net).__name__} (use fit_upstream)")
    use = data.rows["seq_pos"].to_numpy() <= max_seq_len
    if keep is not None:
        use &= np.asarray(keep, dtype=bool)
    cards = CardSet(net, data, use, weights)
    if cards.n_cards == 0:
        raise InadequateData("Training data is inadequate.")
    n_batches = cards.n_groups(batch_size, np.arange(cards.n_cards))
    wd = float(net.wd) if net.optimizer == "adamw" else 0.0
    net.fit_compiled(cards, epoch_orders(cards.n_cards, n_epoch, seed), batch_size,
                     recipe(np.full(n_epoch, net.lr if lr is None else lr), max(1, n_batches * n_epoch),
                            weight_decay=wd))
    net.eval()
    return n_batches


def fit_upstream(net: CardSeqNet, data: ReviewData, cfg, *, n_epoch: int, lr: float | None = None) -> None:
    """Upstream's way: training.py's per-target padded trainer (sorted-length batches, randperm(2023) order), then
    the final epoch's weights (upstream's aliased "best" state dict)."""
    from dataclasses import replace

    run_cfg = replace(cfg, n_epoch=n_epoch) if hasattr(cfg, "__dataclass_fields__") else cfg
    net._record_last, net._last_state = True, None
    try:
        training.train(net, data, run_cfg, lr=net.lr if lr is None else lr, dtype=net.dtype)
    finally:
        net._record_last = False
    if net._last_state is not None:
        net.load_state_dict(net._last_state)
    net.eval()


# ----------------------------------------------------------------------------------------------- weights

def pretrain_path(name: str) -> Path:
    """pretrain/<name>.pth ($SRS_BENCH_PRETRAIN_DIR replaces the folder, e.g. for experiments and tests)."""
    return Path(os.environ.get("SRS_BENCH_PRETRAIN_DIR") or PRETRAIN_DIR) / f"{name}.pth"


@lru_cache(maxsize=None)
def _read_state(path: str, mtime: float) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def load_pretrained(net: nn.Module, name: str, command: str) -> None:
    """Load pretrain/<name>.pth into `net` (cached per process); a missing file is an error naming `command`."""
    path = pretrain_path(name)
    if not path.exists():
        raise FileNotFoundError(f"pretrained weights {path} not found; make them with: {command}")
    state = _read_state(str(path), path.stat().st_mtime)
    net.load_state_dict({k: v.to(net.dtype) if v.is_floating_point() else v for k, v in state.items()})


def save_state(net: nn.Module, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({k: v.detach().float().clone() for k, v in net.state_dict().items()}, path)


# ----------------------------------------------------------------------------------------------- the Model

class NeuralModel(Model):
    """fit/predict of a CardSeqNet for one (user, fold, partition): start from pretrain/<weights_name>.pth, fine-tune
    (`--trainer fast`: one pass per card; `--trainer upstream`: training.py's per-target padded trainer), predict
    with one pass per card. `--dry` (`--default`) evaluates the pretrained weights without fine-tuning."""

    net_class: type = CardSeqNet
    n_epoch: int = 5  # the model's own epoch count (upstream: a class attribute; --n_epoch does not change it)
    pretrain_epochs: int = 32

    def __init__(self, cfg=None):
        if cfg is None:
            from config import RunConfig

            cfg = RunConfig(algo=self.name)
        self.cfg = cfg
        self.net = self.new_net()
        self.n_params = 0 if cfg.default else self.net.n_params()

    @classmethod
    def weights_name(cls, cfg) -> str:
        """pretrain/<this>.pth: the model name plus upstream's pretraining suffixes (-short)."""
        return cls.name + ("-short" if getattr(cfg, "short", False) else "")

    @classmethod
    def pretrain_command(cls, cfg) -> str:
        short = " --short" if getattr(cfg, "short", False) else ""
        return f"python pretrain.py --model {cls.name}{short} --data PATH --users 1-500"

    def new_net(self) -> CardSeqNet:
        torch.manual_seed(TORCH_SEED)
        net = self.net_class()
        load_pretrained(net, self.weights_name(self.cfg), self.pretrain_command(self.cfg))
        return net

    def fit(self, train: ReviewData) -> "NeuralModel":
        if self.cfg.default:
            return self
        if len(train) == 0:
            raise InadequateData("no training rows")
        weights = training.recency_weights(len(train)) if getattr(self.cfg, "recency", False) else None
        if getattr(self.cfg, "trainer", "fast") == "fast":
            fit_cards(self.net, train, n_epoch=self.n_epoch, batch_size=self.cfg.batch_size,
                      max_seq_len=self.cfg.max_seq_len, weights=weights)
        else:
            fit_upstream(self.net, train, self.cfg, n_epoch=self.n_epoch)
        return self

    def predict(self, test: ReviewData) -> np.ndarray:
        return predict_cards(self.net, test)

    def parameters(self):
        return None  # upstream writes no parameter list for torch modules


def card_first_mask(data: ReviewData) -> np.ndarray:
    """True at the sequence position of each card's first review (cards with at least one target; positions of
    cards without targets belong to no one and are never read)."""
    first = np.zeros(len(data.seq_delta_t), dtype=bool)
    first[data.rows["seq_start"].to_numpy(np.int64)] = True
    return first


def concat_data(parts: list[ReviewData]) -> ReviewData:
    """Several users' targets as one data set (upstream's pretraining concatenates the users' feature rows); each
    user's card sequences are shifted so every card keeps its own sequence."""
    import pandas as pd

    rows, dts, gs, offset = [], [], [], 0
    for d in parts:
        r = d.rows.copy()
        r["seq_start"] = r["seq_start"].to_numpy() + offset
        rows.append(r)
        dts.append(d.seq_delta_t)
        gs.append(d.seq_rating)
        offset += len(d.seq_delta_t)
    return ReviewData(pd.concat(rows, ignore_index=True), np.concatenate(dts), np.concatenate(gs))
