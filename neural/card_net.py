"""The torch-free half of the card-sequence neural models (neural/neural_seq.py has the contract and the torch half).

Why a separate module: the default run of GRU, GRU-P and NN-17 fine-tunes and predicts entirely in compiled code on
a flat float64 parameter vector (neural/card_fit.py), so torch (~1.5–2 s to import per process, plus per-user
module construction, state-dict loading and torch.randperm) bought nothing there. This module holds everything that
path reads, none of it importing torch:
- `CompiledNet`: a network's description (flat parameter layout in the torch module's parameters() order,
  model_consts, param_bounds, step_features, n_steps, lr / wd / optimizer, card_loss) and the compiled
  fit/predict calls on a flat vector. The torch modules (neural_seq.CompiledCardNet subclasses) inherit the same
  description, so it is written once;
- `FlatNet`: a CompiledNet holding its parameters in a numpy vector stored in float32, as the torch module's
  default-dtype parameters are, so the weights between fine-tune and prediction round exactly as they do there;
- `CardSet` / `CardBatch`: the targets of a ReviewData grouped by card (CardBatch makes torch views only when a
  torch path asks);
- fit_cards / predict_cards / epoch_orders (torch.randperm reproduced by upstream/torch_rng.py);
- the pretrained weights as pretrain/<name>.npz (the .pth state dict's tensors as float32 arrays under the same
  keys; pretrain.py writes both, tests/test_torch_free.py holds the shipped pairs equal);
- `NeuralModel`: the Model; it builds a FlatNet when the run is the default compiled trainer on the CPU, one user
  per process, and the torch module (`net_class`, imported on first use) otherwise (`--trainer upstream|autograd`,
  `--device cuda`, `--batch-users`, pretrain.py).
This module never imports neural_seq (which imports it): the torch paths here (loading a torch module's weights,
its upstream trainer, its predictions without a compiled loss) are methods of that module (neural_seq.CardSeqNet).
"""

from __future__ import annotations

from functools import lru_cache

import importlib
import os
from pathlib import Path

import numpy as np

from models.base import InadequateData, Model, ReviewData, recency_weights
from neural.card_fit import group_bounds, loop_for, recipe
from upstream.torch_rng import SHUFFLE_SEED, TorchGenerator

TORCH_SEED = 42
PREDICT_TARGETS = 16384
PRETRAIN_DIR = Path(__file__).resolve().parents[1] / "pretrain"


# ----------------------------------------------------------------------------------------------- the network

class CompiledNet:
    """A network whose loss and gradient are a compiled `card_loss` (neural/card_fit.py's contract) over a flat
    float64 parameter vector: its description plus fit_compiled / predict_compiled. Storage (theta / set_theta) is
    the subclass's: FlatNet here, torch parameters in neural_seq.CompiledCardNet."""

    lr: float = 4e-2
    wd: float = 1e-5
    optimizer: str = "adamw"  # "adamw" (AdamW with wd) or "adam" (upstream BaseModel: Adam, wd ignored)
    card_loss = None  # an @njit function (model, layout, cards, theta, want, grad, p_out) -> loss

    # --- description ------------------------------------------------------------------------------------------
    def param_shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        """(state-dict key, shape) of every parameter, in the torch module's parameters() order: the flat layout."""
        raise NotImplementedError

    def model_consts(self) -> tuple:
        raise NotImplementedError

    def step_features(self, data: ReviewData) -> np.ndarray:
        raise NotImplementedError

    def n_steps(self, pos: np.ndarray) -> np.ndarray:
        return pos

    def n_flat(self) -> int:
        return sum(int(np.prod(shape)) for _, shape in self.param_shapes())

    def param_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """Box applied after every optimizer step (flat, like theta); default: none."""
        n = self.n_flat()
        return np.full(n, -np.inf), np.full(n, np.inf)

    # --- storage ----------------------------------------------------------------------------------------------
    def theta(self) -> np.ndarray:
        raise NotImplementedError

    def set_theta(self, theta: np.ndarray) -> None:
        raise NotImplementedError

    # --- compiled calls ---------------------------------------------------------------------------------------
    def kernel_layout(self, cards: "CardSet", repeat: bool = False) -> tuple:
        """The layout fit_compiled hands the kernel: cards.layout(), unless the network prepares its inputs once per
        fit (the LSTM: models/lstm.py); `repeat`: every epoch visits the cards in the same order, so the same groups
        come back (the LSTM then keeps each group's set-up)."""
        return cards.layout()

    def predict_layout(self, cards: "CardSet") -> tuple:
        """The layout predict_compiled hands the kernel: cards.layout(), unless the network's predictions should run
        the very kernel its fine-tune compiled (the LSTM: neural/lstm_spec.py)."""
        return cards.layout()

    def _call(self, layout, cards, theta, grad, p_out) -> float:
        want = grad is not None
        return type(self).card_loss(self.model_consts(), layout, np.asarray(cards, np.int64), theta, want,
                                    grad if want else np.zeros(0), p_out)

    def predict_compiled(self, cards: "CardSet", chunk: int) -> np.ndarray:
        """P(recall) of every target of the CardSet (in its `order`), cards in groups of ≈ chunk targets."""
        layout, theta, order = self.predict_layout(cards), self.theta(), cards.card_order()
        bounds = group_bounds(cards.c_count[order], chunk)
        p = np.empty(len(cards.t_pos))
        for g in range(len(bounds) - 1):
            self._call(layout, order[bounds[g]:bounds[g + 1]], theta, None, p)
        return p

    def fit_compiled(self, cards: "CardSet", orders: np.ndarray, batch_size: int, recipe: tuple,
                     state: tuple | None = None) -> tuple[np.ndarray, np.ndarray, int]:
        """A fine-tune loop in one compiled call (card_fit.fit_card_groups with card_fit.recipe()), then the weights
        back into storage; `state` = the optimizer's (exp_avg, exp_avg_sq, step), flat (default: a fresh
        optimizer). Returns the optimizer's state after the loop (new arrays)."""
        theta = self.theta()
        lower, upper = self.param_bounds()
        m, v, step = (np.zeros(len(theta)), np.zeros(len(theta)), 0) if state is None else state
        m, v = np.array(m, dtype=np.float64), np.array(v, dtype=np.float64)
        orders = np.ascontiguousarray(orders, dtype=np.int64)
        repeat = len(orders) > 1 and bool((orders == orders[:1]).all())
        steps = loop_for(type(self).card_loss)(self.model_consts(), self.kernel_layout(cards, repeat),
                                               orders, int(batch_size), theta,
                                               lower, upper, recipe, m, v, int(step))
        self.set_theta(theta)
        return m, v, int(step) + int(steps)


class FlatNet(CompiledNet):
    """A CompiledNet without torch: the parameters as one vector, stored in float32 like the torch module's
    (float64 → float32 → float64 rounds the same in numpy and torch, so fine-tuned weights predict identically)."""

    store_dtype = np.float32

    def __init__(self, state: dict | None = None):
        self._flat = np.zeros(self.n_flat(), dtype=self.store_dtype)
        if state is not None:
            self.load_state(state)

    def load_state(self, state: dict) -> None:
        """Parameters from a state dict of arrays (keys and shapes of param_shapes(); extra keys are an error, as
        torch's strict load_state_dict)."""
        names = [name for name, _ in self.param_shapes()]
        if set(state) != set(names):
            raise KeyError(f"{type(self).__name__}: state keys {sorted(state)} != parameters {names}")
        parts = []
        for name, shape in self.param_shapes():
            value = np.asarray(state[name])
            if value.shape != tuple(shape):
                raise ValueError(f"{type(self).__name__}.{name}: shape {value.shape} != {tuple(shape)}")
            parts.append(value.astype(self.store_dtype).ravel())
        self._flat = np.concatenate(parts)

    def state_dict(self) -> dict[str, np.ndarray]:
        out, k = {}, 0
        for name, shape in self.param_shapes():
            n = int(np.prod(shape))
            out[name] = self._flat[k:k + n].reshape(shape).copy()
            k += n
        return out

    def theta(self) -> np.ndarray:
        return self._flat.astype(np.float64)

    def set_theta(self, theta: np.ndarray) -> None:
        self._flat = np.asarray(theta, dtype=np.float64).astype(self.store_dtype)

    def n_params(self) -> int:
        return self.n_flat()

    def eval(self) -> "FlatNet":
        return self


# ----------------------------------------------------------------------------------------------- batching

class CardBatch:
    """A group of whole cards and all their (selected) targets, as numpy arrays (float64) with torch views made on
    first use in the network's dtype (the torch paths only).

    x_packed holds the inputs of card c's steps in rows c_off[c] .. c_off[c+1]−1 (c_steps[c] of them); `x` is the same
    zero-padded and time-major: x[k, c] is the input of step k of card c. Target j belongs to
    card t_card[j] and has history length t_pos[j] (its history is the card's reviews 0..t_pos[j]−1), elapsed time
    t_dt[j], last history rating t_last_g[j], label t_y[j] and weight t_w[j]; t_row[j] is its row in the ReviewData
    the batch was built from.
    """

    def __init__(self, x_packed, c_steps, t_card, t_pos, t_dt, t_last_g, t_y, t_w, t_row, dtype=None):
        self.x_packed, self.c_steps, self.t_row, self.dtype = x_packed, c_steps, t_row, dtype
        self.c_off = np.concatenate([[0], np.cumsum(c_steps)]).astype(np.int64)
        self.t_card_np, self.t_pos_np, self.t_dt_np = t_card, t_pos, t_dt
        self.t_last_g_np, self.t_y_np, self.t_w_np = t_last_g, t_y, t_w

    def __len__(self) -> int:
        return len(self.t_pos_np)

    def _t(self, name, arr, long=False):
        import torch

        cache = self.__dict__.setdefault("_torch", {})
        if name not in cache:
            cache[name] = torch.as_tensor(arr, dtype=torch.long if long else (self.dtype or torch.float32))
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
    t_card = property(lambda self: self._t("t_card", self.t_card_np, long=True))
    t_pos = property(lambda self: self._t("t_pos", self.t_pos_np, long=True))
    t_dt = property(lambda self: self._t("t_dt", self.t_dt_np))
    t_last_g = property(lambda self: self._t("t_last_g", self.t_last_g_np))
    t_y = property(lambda self: self._t("t_y", self.t_y_np))
    t_w = property(lambda self: self._t("t_w", self.t_w_np))


def _card_layout(data: ReviewData, net, keep: np.ndarray | None):
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
    """The selected targets of `data` grouped by card, ready to be cut into batches of whole cards. `net` gives
    step_features and n_steps (a CompiledNet or any neural_seq.CardSeqNet)."""

    def __init__(self, net, data: ReviewData, keep: np.ndarray | None = None, weights: np.ndarray | None = None):
        self.order, self.t_card, self.c_start, self.c_steps, self.c_count = _card_layout(data, net, keep)
        self.n_cards = len(self.c_start)
        self.c_tfirst = np.cumsum(self.c_count) - self.c_count  # card c's targets: c_tfirst[c] .. + c_count[c] − 1
        self.dtype = getattr(net, "dtype", None)  # torch modules: the dtype of CardBatch's torch views
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
        """The card layout of the compiled kernels (neural/card_fit.py)."""
        return (self.feats, self.c_start, self.c_steps, self.c_tfirst, self.c_count, self.t_pos, self.t_dt,
                self.t_last_g, self.t_y, self.t_w)

    def card_order(self, card_order: np.ndarray | None = None) -> np.ndarray:
        """The given card order, or by default the cards sorted by the number of steps they need."""
        return np.argsort(self.c_steps, kind="stable") if card_order is None else np.asarray(card_order, np.int64)

    def n_groups(self, batch_size: int, card_order: np.ndarray | None = None) -> int:
        return len(group_bounds(self.c_count[self.card_order(card_order)], max(1, int(batch_size)))) - 1


def card_first_mask(data: ReviewData) -> np.ndarray:
    """True at the sequence position of each card's first review (cards with at least one target; positions of
    cards without targets belong to no one and are never read)."""
    first = np.zeros(len(data.seq_delta_t), dtype=bool)
    first[data.rows["seq_start"].to_numpy(np.int64)] = True
    return first


# ----------------------------------------------------------------------------------------------- predict / fit

def predict_cards(net, data: ReviewData, chunk: int = PREDICT_TARGETS) -> np.ndarray:
    """P(recall) of every row of `data`, in row order (NaN for a row without history), one pass per card."""
    if not isinstance(net, CompiledNet):  # a torch module stepped in torch (neural_seq.CardSeqNet.predict_torch)
        return net.predict_torch(data, chunk)
    out = np.full(len(data), np.nan)
    net.eval()
    cards = CardSet(net, data)
    if cards.n_cards:
        out[cards.order] = net.predict_compiled(cards, chunk)
    return out


def epoch_orders(n_cards: int, n_epoch: int, seed: int = SHUFFLE_SEED) -> np.ndarray:
    """The card order of every epoch [n_epoch, n_cards]: torch.randperm on one Generator seeded `seed`
    (reproduced without torch, upstream/torch_rng.py)."""
    generator = TorchGenerator(seed)
    return np.stack([generator.randperm(n_cards) for _ in range(n_epoch)])


def fit_cards(net: CompiledNet, data: ReviewData, *, n_epoch: int, batch_size: int = 512, max_seq_len: int = 64,
              lr: float | None = None, weights: np.ndarray | None = None, keep: np.ndarray | None = None,
              seed: int = SHUFFLE_SEED) -> int:
    """Fine-tune a compiled network in place on `data` (neural_seq's docstring has the recipe): the whole recipe in
    one compiled call; returns the number of groups per epoch. Raises InadequateData when no target has a history
    of length 1..max_seq_len. Networks stepped in torch train with neural_seq.fit_upstream (or their own recipe)."""
    if not isinstance(net, CompiledNet):
        raise TypeError(f"fit_cards needs a compiled network, not {type(net).__name__} (use fit_upstream)")
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


# ----------------------------------------------------------------------------------------------- weights

def pretrain_path(name: str, suffix: str = ".pth") -> Path:
    """pretrain/<name>.pth (or .npz: the same tensors as numpy arrays); $SRS_BENCH_PRETRAIN_DIR replaces the folder,
    e.g. for experiments and tests."""
    return Path(os.environ.get("SRS_BENCH_PRETRAIN_DIR") or PRETRAIN_DIR) / f"{name}{suffix}"


def read_weights(name: str, command: str) -> dict[str, np.ndarray]:
    """The state dict of pretrain/<name> as numpy arrays, from its .npz; a .pth alone (written by an older
    pretrain.py) is read through torch. Neither: an error naming `command`."""
    npz, pth = pretrain_path(name, ".npz"), pretrain_path(name)
    for path in (npz, pth):
        if path.exists():
            return {k: v.copy() for k, v in _read_weights_file(str(path), path.stat().st_mtime).items()}
    raise FileNotFoundError(f"pretrained weights {pth} not found; make them with: {command}")


@lru_cache(maxsize=None)
def _read_weights_file(path: str, mtime: float) -> dict[str, np.ndarray]:
    """One weights file's arrays, read once per process and content (torch.load costs ~15 ms, once per fold
    otherwise)."""
    if path.endswith(".npz"):
        with np.load(path) as f:
            return {k: f[k] for k in f.files}
    import torch

    return {k: v.numpy() for k, v in torch.load(path, map_location="cpu", weights_only=True).items()}


# ----------------------------------------------------------------------------------------------- the Model

class LazyClass:
    """A class attribute naming "module:Class", imported on first access: lets a torch-free Model point at its
    torch module without importing torch."""

    def __init__(self, ref: str):
        self.ref = ref

    def __get__(self, obj, owner):
        module, name = self.ref.split(":")
        return getattr(importlib.import_module(module), name)


class NeuralModel(Model):
    """fit/predict of a card-sequence network for one (user, fold, partition): start from the pretrained weights,
    fine-tune (`--trainer fast`: one pass per card; `--trainer upstream`: upstream/training.py's per-target padded trainer),
    predict with one pass per card. `--dry` (`--default`) evaluates the pretrained weights without fine-tuning.
    `net_class`: the torch module; `flat_class`: its torch-free twin (a FlatNet) where the model has one."""

    net_class: type = None
    flat_class: type | None = None
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
        """pretrain/<this>.pth: the model name plus upstream's pretraining suffixes (-short, -secs: upstream loads
        pretrain/<its result-file name>_pretrain.pth)."""
        return cls.name + ("-short" if getattr(cfg, "short", False) else "") + \
            ("-secs" if getattr(cfg, "secs_mode", False) else "")

    @classmethod
    def pretrain_command(cls, cfg) -> str:
        short = " --short" if getattr(cfg, "short", False) else ""
        secs = " --secs" if getattr(cfg, "secs_mode", False) else ""
        return f"python pretrain.py --model {cls.name}{short}{secs} --data PATH --users 1-500"

    def torch_free(self) -> bool:
        """The compiled trainer on the CPU, one user at a time: the FlatNet twin (same numbers, no torch)."""
        cfg = self.cfg
        return (self.flat_class is not None and getattr(cfg, "trainer", "fast") == "fast"
                and not getattr(cfg, "on_cuda", False) and getattr(cfg, "users_per_chunk", 1) <= 1)

    def new_net(self):
        name, command = self.weights_name(self.cfg), self.pretrain_command(self.cfg)
        if self.torch_free():
            # torch builds the module from torch.manual_seed(TORCH_SEED) before loading; every parameter of these
            # nets is in the state dict, so that initialisation never reaches a result and is not reproduced here
            return self.flat_class(read_weights(name, command))
        return self.net_class.pretrained(name, command)  # neural_seq.torch_net

    def fit(self, train: ReviewData) -> "NeuralModel":
        if self.cfg.default:
            return self
        if len(train) == 0:
            raise InadequateData("no training rows")
        weights = recency_weights(len(train)) if getattr(self.cfg, "recency", False) else None
        if getattr(self.cfg, "trainer", "fast") == "fast":
            fit_cards(self.net, train, n_epoch=self.n_epoch, batch_size=self.cfg.batch_size,
                      max_seq_len=self.cfg.max_seq_len, weights=weights)
        else:  # the torch module (neural_seq.fit_upstream)
            self.net.fit_upstream(train, self.cfg, n_epoch=self.n_epoch)
        return self

    def predict(self, test: ReviewData) -> np.ndarray:
        return predict_cards(self.net, test)

    def parameters(self):
        return None  # upstream writes no parameter list for torch modules
