"""The LSTM's torch-free description (models/lstm.py's docstring has the model, its data and recipes): the constants,
the data (LSTMData: the per-position inputs and the equalized training rows), the network's description (LSTMSpec:
the flat layout of neural/lstm_kernels.py under the torch module's parameter names, its inputs) and its FlatNet
twin, and the fine-tune's and Reptile's compiled recipes. Below both the torch module (neural/lstm_torch.py) and the
model class (models/lstm.py, which re-exports these names), so that neither imports the other upwards.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from models.base import InadequateData, ReviewData
from neural.card_fit import recipe
from neural.card_net import CardSet, CompiledNet, FlatNet
from neural.lstm_kernels import SHAPES, encode_rows, lstm_cards_loss, plan_memo

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


def attach_sequences(data: ReviewData, revlogs: pd.DataFrame, max_seq_len: int = 64,
                     secs: bool = False) -> LSTMData:
    """`data` (built by features.build_features with same-day histories) with the LSTM's per-position inputs and the
    equalized extra training rows. The sequence order is recomputed as features.py builds it (stable sort by card,
    ratings 1–4, each card's first 2·max_seq_len reviews, same-day reviews kept) and checked against `data`.
    `secs`: `data` is the secs pipeline's (its intervals fractional): no extra rows, `data`'s rows are the targets."""
    card = revlogs["card_id"].to_numpy(np.int64)
    rating = revlogs["rating"].to_numpy(np.int64)
    elapsed = revlogs["elapsed_days"].to_numpy(np.int64)
    secs_col = revlogs["elapsed_seconds"].to_numpy(np.float64)
    duration = revlogs["duration"].to_numpy(np.float64) if "duration" in revlogs else np.zeros(len(revlogs))
    order = np.argsort(card, kind="stable")
    order = order[(rating[order] >= 1) & (rating[order] <= 4)]
    c = card[order]
    starts = np.ones(len(c), dtype=bool)
    starts[1:] = c[1:] != c[:-1]
    idx = np.arange(len(c))
    run_start = np.maximum.accumulate(np.where(starts, idx, 0))
    order = order[idx - run_start < 2 * max_seq_len]
    expected_dt = np.maximum(secs_col[order] / 86400.0, 0.0) if secs else np.maximum(elapsed[order], 0)
    if (len(order) != len(data.seq_delta_t) or not np.array_equal(expected_dt, data.seq_delta_t)
            or not np.array_equal(rating[order], data.seq_rating)):
        raise ValueError("LSTM: the revlog sequences do not match the feature pipeline's (same-day histories "
                         "expected)")
    if secs:
        return LSTMData(data.rows, np.maximum(elapsed[order], 0).astype(data.seq_delta_t.dtype), data.seq_rating,
                        expected_dt, duration[order], None, None)
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
    return LSTMData(data.rows, data.seq_delta_t, data.seq_rating, np.maximum(secs_col[order] / 86400.0, 0.0),
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


# state-dict keys of LSTMNet.parameters() in order, one per lstm_kernels.SHAPES entry (same order and shapes)
_LSTM_KEYS = ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0")
TORCH_NAMES = ("process.0.weight", "process.0.bias", "process.2.weight", "process.3.weight", "process.3.bias",
               "process.5.module.0.weight", *(f"process.5.module.1.module.{n}" for n in _LSTM_KEYS),
               "process.6.module.0.weight", "process.6.module.0.bias",
               *(f"process.6.module.1.module.{n}" for n in _LSTM_KEYS),
               "process.7.module.0.weight", "process.7.module.1.weight", "process.7.module.1.bias",
               "process.7.module.3.weight", "process.7.module.4.weight", "process.7.module.4.bias",
               "process.8.weight", "process.9.weight", "process.9.bias",
               "w_fc.weight", "w_fc.bias", "s_fc.weight", "s_fc.bias", "d_fc.weight", "d_fc.bias")
BUFFERS = ("input_mean", "input_std")  # the input standardisation, fixed at pretraining (state-dict buffers)


class LSTMSpec(CompiledNet):
    """The LSTM's description: the flat layout of neural/lstm_kernels.py under the torch module's parameter names,
    its inputs, and the kernel's constants (the input standardisation, from `normalisation()`)."""

    card_loss = lstm_cards_loss
    precision = "float64"  # the kernels' arithmetic: "float64" or "float32" (see neural/lstm_kernels.py)

    def param_shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        return [(name, shape) for name, (_, shape) in zip(TORCH_NAMES, SHAPES, strict=True)]

    def normalisation(self) -> tuple[list[float], list[float]]:
        """(input_mean, input_std) as Python floats."""
        raise NotImplementedError

    def model_consts(self) -> tuple:
        """lstm_cards_loss's `model`: the input standardisation (mean, mean, std, std) and a zero of the dtype the
        kernels compute in (numba compiles one version per dtype)."""
        mean, std = self.normalisation()
        return float(mean[0]), float(mean[1]), float(std[0]), float(std[1]), np.dtype(self.precision).type(0)

    def step_features(self, data):
        return lstm_features(data)

    def kernel_layout(self, cards: CardSet, repeat: bool = False) -> tuple:
        """cards.layout() with the network's 6 inputs of every sequence position in place of the raw features,
        encoded once (lstm_kernels.encode_rows; kept on `cards` for these constants) rather than in each of the
        fine-tune's 20 passes; the kernel then copies them (same values, same rounding). With `repeat` (the
        fine-tune: one card order for all passes) a memo of each group's chunk plans follows (lstm_kernels.plan_memo):
        made in the first pass, reused in the other 19."""
        layout, model = cards.layout(), self.model_consts()
        cached = cards.__dict__.get("_lstm_inputs")
        key = (*model[:4], np.dtype(type(model[4])).name)  # the inputs are stored in the kernels' dtype
        if cached is None or cached[0] != key:
            cached = cards._lstm_inputs = (key, encode_rows(layout[0], model))
        return (cached[1], *layout[1:]) + ((plan_memo(self.precision),) if repeat else ())


    def predict_layout(self, cards: CardSet) -> tuple:
        """The fine-tune's layout (the inputs encoded in the kernels' dtype, and a plan memo, which predictions never
        fill: they call with want=False), so that predictions run the kernel the fine-tune compiled: with the raw
        layout numba compiled lstm_cards_loss once more for float64 inputs, 11 s of CPU in a first run. The kernel
        encodes raw inputs as encode_rows does, so the predictions are the same to the bit."""
        return self.kernel_layout(cards, repeat=True)


class LSTMFlat(LSTMSpec, FlatNet):
    """The LSTM without torch; the state dict's two buffers are kept beside the flat parameters."""

    def __init__(self, state: dict | None = None):
        self.buffers = {"input_mean": np.zeros(2, np.float32), "input_std": np.ones(2, np.float32)}
        super().__init__(state)

    def load_state(self, state: dict) -> None:
        self.buffers = {k: np.asarray(state[k], dtype=np.float32).copy() for k in BUFFERS}
        super().load_state({k: v for k, v in state.items() if k not in BUFFERS})

    def state_dict(self) -> dict[str, np.ndarray]:
        return {**{k: v.copy() for k, v in self.buffers.items()}, **super().state_dict()}

    def normalisation(self):
        return self.buffers["input_mean"].tolist(), self.buffers["input_std"].tolist()


# ----------------------------------------------------------------------------------------------- training

def piecewise_lr(k: int, start: float, middle: float, end: float, warmup: int, total: int) -> float:
    if k < warmup:
        return start + (middle - start) * k / warmup
    return middle + (end - middle) * (k - warmup) / (total - warmup)


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


def finetune_rows(train: ReviewData) -> tuple[np.ndarray, np.ndarray, np.random.RandomState]:
    """The fine-tune's row weights (recency, mean 1), the rows it trains on (history 1..64) and its shuffle
    generator; raises InadequateData when no row is left."""
    fp = FINETUNE
    n = len(train)
    x = np.linspace(0, 1, n)
    weights = 1.0 + fp["recency_weight"] * np.power(x, fp["recency_degree"])
    weights *= n / weights.sum()
    keep = train.rows["seq_pos"].to_numpy() <= 64
    keep &= train.rows["seq_pos"].to_numpy() >= 1
    if not keep.any():
        raise InadequateData("Training data is inadequate.")
    return weights, keep, np.random.RandomState(fp["shuffle_seed"])


def finetune_compiled(net: LSTMSpec, train: ReviewData, flat_state: tuple | None, batch_size: int = BATCH) -> None:
    """SB reptile_trainer.finetune in one compiled call (card_fit.fit_card_groups): whole cards, the same random
    card order every pass; `flat_state` = the inner optimizer's (exp_avg, exp_avg_sq, step) or None. In place."""
    weights, keep, rng = finetune_rows(train)
    cards = CardSet(net, train, keep, weights)
    order = rng.permutation(cards.n_cards)
    net.fit_compiled(cards, np.tile(order, (FINETUNE["passes"], 1)), batch_size, finetune_recipe(), flat_state)
    net.eval()


def inner_recipe(lr: float) -> tuple:
    """Reptile's inner learner for the compiled loop (card_fit.recipe): one pass over at most inner_steps groups,
    AdamW(betas (0, 0.999)) at a constant lr, loss mean·B^batch_size_exp + the pull towards the meta weights."""
    rp = REPTILE
    return recipe([lr], betas=INNER_BETAS, weight_decay=rp["inner_weight_decay"], size_exp=rp["batch_size_exp"],
                  reg_scale=rp["reg_scale"], clip_norm=rp["clip_norm"], max_groups=rp["inner_steps"])
