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
Compiled (neural/lstm_kernels.py): the network's forward and reverse pass, one of each per card, and the whole
fine-tune of a fold in one numba call (neural/card_fit.py with `finetune_recipe()`), because stepped in torch the
fine-tune was the slowest row of the table (~47 s per 100k reviews). Predictions run on the same kernel. The
network computes in float32 by default (PRECISION; upstream's torch LSTM is float32 too), the optimizer (AdamW
state, clipping, master weights) in float64; `other.py --precision float64` runs the network in float64 (result
file LSTM-float64). Checked when float32 became the default: on the embedded data (3 users evaluated) and 12
simulated users (bench/simulate.py set of 36, every third) the float32 run's LogLoss, RMSE(bins) and AUC equal the
float64 run's to 4 decimals, sizes identical; the result files' 6-decimal metrics differ by at most 2e−6 (AUC, ICI),
LogLoss and RMSE(bins) not at all. Whole runs (2 users, 28k raw reviews, one process): float32 takes 0.73× the CPU
time of float64 (paired medians, 3 pairs). The torch path stays as the reference, in float64:
`finetune(layout="cards")` is the same recipe stepped by torch.optim.AdamW (tests/test_lstm_compiled.py: equal to
1e−8), `--trainer upstream` the same recipe over upstream's per-target padded batches. Profiled per part
(neural/lstm_kernels.py's docstring: where a pass goes): the two LSTMs' forward and reverse ≈ 50–60% of a pass,
sgemm ≈ 38% of the kernel's samples, the heads ≈ 17%; fewer passes over the rows, the heads' logits as independent
sums with one exp for the pow, and the elementwise layers run flat took ≈ 0.94× per pass (same bits, P(recall)
within 2e−16); the row's projection ≈ 31–33 CPU-hours (≈ 15.5–16.5 s per 100k raw reviews) against ≈ 34–36 for the
kernels before, back to back. Re-projected on 2026-11-24 with this kernel: 26.5–32.1 CPU-hours in five runs (a
six-user fit; its intercept, once 1.5 s per user, is that fit's noise: see below). Then the heads batched over each
chunk's targets (their exp and log over flat arrays, within 1 ulp of libm) and the recurrent weight gradients as one
product: 1.115× per pass (paired in one process); the row's projection, old and new alternated five times:
28.3/25.2/27.9/28.6/27.3 → 25.4/26.6/22.2/25.5/24.5 CPU-hours (medians 27.9 → 25.4; paired ratios' median 1.12); the
result lines of the embedded users and six sim36 users equal (Log Loss, RMSE(bins) to the printed digit, AUC within
4e−6, sizes). A feature-major layout of the LSTMs (cards contiguous: by hand, with BLAS at explicit leading
dimensions, or in step blocks) was measured 1.01–1.3× slower per call and not kept (neural/lstm_kernels.py's
docstring says why). Then FMA (numba's fastmath "contract", per function) and products that add onto their outputs
(gemm with beta = 1: no zeroing, no bias or gradient passes): 1.12–1.15× and 1.04× per pass (paired in one process);
the row's projection, main's and this back to back three times: 28.40/25.59/28.25 → 27.48/23.31/23.47 CPU-hours
(paired ratios 1.03, 1.10, 1.20); result lines equal (one AUC by 1e−6). Then (AMD Zen 4) the LSTMs' elementwise
loops vectorised (σ and tanh flat over a step, the cells and dL/dc in two arrays by step parity, row widths read at
run time), the LayerNorms' parameter gradients taken from the next layer's product, the inputs copied card by card:
1.15× per pass; the row's projection, main's and this back to back twice: 11.62 / 11.85 → 10.35 / 10.44 CPU-hours (≈
5.2 s per 100k raw reviews); result lines identical. Then loops LLVM had left scalar because their arrays could not
be told apart (the SiLU reverse in place, the heads' per-target loops) and per-chunk set-up moved to once per call:
1.03–1.05× per pass, bit-identical; the row's projection, main's code and this back to back twice (a slower day):
10.72 / 10.42 → 10.41 / 10.17 CPU-hours (≈ 5.0–5.15 s per 100k raw reviews). Then whole-row copies, the heads'
last loops over gathered rows and their reverse products in float32: 1.027× per pass (loss and P(recall)
bit-identical); the row's projection, the code before and this back to back twice: 10.90 / 10.51 → 10.32 / 9.99
CPU-hours (≈ 4.9–5.1 s per 100k raw reviews, on a day when the code before measured 2–4% slower than at its stop).
Then each card group's chunk plans (packing, read rows, inputs in packed order) made once per fine-tune instead of
in each of the 20 passes (`kernel_layout`'s memo when the card order repeats): 1.026× per pass, bit-identical; the
row's projection paired twice 52.13 → 48.39 and 57.62 → 55.86 ms per 1k raw reviews on a machine that slowed down
between the pairs (the code before: 49.86 and 49.69 an hour earlier); the next morning, on a quiet machine, three
more pairs: 52.08 → 47.23, 48.93 → 47.76, 49.68 → 49.18 ms per 1k (10.53 / 9.92 / 10.04 → 9.60 / 9.69 / 9.94
CPU-hours; ≈ 4.7–4.9 s per 100k raw reviews on this AMD Zen 4 core, the older AVX2 core ran the same code ≈ 1.9×
slower).

What a user costs (cProfile and section timers of runner.evaluate_user after a warm-up user, simulated users of
2k–45k raw reviews, one core): the fine-tune kernel (card_fit's loop) is 93–96% of it and the prediction kernel ~2%,
both at a near-constant ≈ 3–3.5 µs per packed row per pass (≈ 1.4 µs per row predicted) from folds of 350 rows to
34,000: no per-fold or per-user fixed cost inside. Of a pass, the per-call set-up (chunking, lockstep plan, packing)
is ~1% and encoding the inputs (two logs per row) was another 1–2%, now done once per fit
(`LSTMSpec.kernel_layout`). Outside the kernels ≈ 40–50 ms per user (loading and features twice, the equalized rows,
five CardSets per side, metrics), ~15% of a 2k-review user and ~3% of a 45k one. So the cost is linear with no
intercept: a + b·reviews fitted to six users (bench/bench_executors.py project) gives a ≈ 0 (the fit's intercept
comes out slightly negative, −0.1 s) and b ≈ 133–153 ms per 1k raw reviews (27–31 CPU-hours for 10,000 users; the
spread is the shared machine's noise); an earlier a = 1.5 s per user was that fit's noise on six users, not a cost.

Pretraining (`pretrain.py --model LSTM`, Reptile, SB reptile_trainer.train): input_mean/std from the training users
(every review in the history of each card's last target); then outer steps over the users in turn (task =
step mod users): a learner copy adapts with AdamW(betas (0, 0.999), weight decay 0.03, state carried from task to
task) for up to 15 batches of that user (≤ 16,384 targets each), lr 0.0026945·min(1, step/warm-up), loss
mean(BCE)·B + 0.000244·‖θ_learner − θ‖², clip 7050; the meta "gradient" θ − θ_learner goes to AdamW(lr 0.02, betas
(0.9, 0.999), weight decay 0.03) with a linear warm-up from 1e−4× over the first 10% of the steps and cosine decay
after. Upstream: 100,000 outer steps on users 9000–9099; `--epochs` sets the number of outer steps here. Each
task's inner loop is one compiled call on the fine-tune's kernels (card_fit with `inner_recipe()`, the AdamW state
carried flat from task to task); `reptile(compiled=False)` steps it in torch (the reference).

This module is torch-free: the model class, which picks the trainer, and the reading of LSTM_opt.npz (the inner
optimizer's flat state). The data, the recipes, the network's description (LSTMSpec: flat layout of
neural/lstm_kernels.py, input standardisation, features) and its FlatNet twin, which the default run fine-tunes and
predicts with (neural/card_net.py) reading pretrain/LSTM.npz, are in neural/lstm_spec.py (re-exported here), below
the torch module: LSTMNet, the torch-stepped fine-tune layouts and Reptile, in neural/lstm_torch.py.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np

from config import BUILTIN_FLAGS
from models.base import InadequateData, ReviewData
from neural.card_net import LazyClass, NeuralModel, pretrain_path
from neural.lstm_spec import (BATCH, BUFFERS, FINETUNE, INNER_BETAS, N_CURVES, N_HIDDEN, REPTILE,  # noqa: F401
                              TORCH_NAMES, LSTMData, LSTMFlat, LSTMSpec, attach_sequences, equalized_train,
                              finetune_compiled, finetune_recipe, finetune_rows, inner_recipe, lstm_features,
                              piecewise_lr)

PRECISION = "float32"  # the default run's compiled arithmetic (other.py --precision float64: the other)


def read_opt_state(command: str) -> tuple[np.ndarray, np.ndarray, int] | None:
    """The inner optimizer's flat state from pretrain/LSTM_opt.npz (written by pretrain.py; a .pth alone is read
    through torch); None for a fresh optimizer (no step taken)."""
    npz, pth = pretrain_path("LSTM_opt", ".npz"), pretrain_path("LSTM_opt")
    if npz.exists():
        return _read_opt_npz(str(npz), npz.stat().st_mtime)
    if pth.exists():
        import torch

        from neural.lstm_torch import LSTMNet, flat_opt_state

        return flat_opt_state(LSTMNet(), torch.load(pth, map_location="cpu", weights_only=True))
    raise FileNotFoundError(f"pretrained optimizer state {pth} not found; make it with: {command}")

@lru_cache(maxsize=None)
def _read_opt_npz(path: str, mtime: float) -> tuple[np.ndarray, np.ndarray, int] | None:
    """LSTM_opt.npz's state, read once per process and content (np.load per fold cost ~1 ms of a small user's ~15 ms
    outside the kernels); read-only arrays, which fit_compiled copies."""
    with np.load(path) as f:
        step = int(f["step"])
        if not step:
            return None
        m, v = f["exp_avg"].astype(np.float64), f["exp_avg_sq"].astype(np.float64)
    m.setflags(write=False)
    v.setflags(write=False)
    return m, v, step


def same_day_targets(data: ReviewData, revlogs) -> LSTMData:
    """The rows of upstream's same-day LSTM run (`--short --secs --duration`, not equalized), from the secs
    pipeline's rows (`data`: no outlier filter, its lapse counts and `i`): upstream's LSTM feeds the forgetting
    curve `elapsed_days`, and its target filter (delta_t > 0) then runs on those whole days, so same-day reviews stay
    inputs and are never targets ("this also indirectly causes --no_train_on_same_day and --no_test_on_same_day",
    upstream's LSTM feature code). This row tests fewer reviews than the rest of the same-day table: the reviews
    after a day's first."""
    from features import MIN_ROWS, NotEnoughData

    lstm = attach_sequences(data, revlogs, secs=True)
    rows = lstm.rows[lstm.rows["elapsed_days"].to_numpy() > 0].copy()
    if len(rows) < MIN_ROWS:
        raise NotEnoughData(f"only {len(rows)} evaluation reviews after filtering (need {MIN_ROWS})")
    rows["delta_t"] = rows["elapsed_days"].to_numpy(np.float64)
    return LSTMData(rows.reset_index(drop=True), lstm.seq_delta_t, lstm.seq_rating, lstm.seq_secs,
                    lstm.seq_duration, None, None)


# ----------------------------------------------------------------------------------------------- the Model

class LSTM(NeuralModel):
    name = "LSTM"
    first_run_seconds = 33  # its first run's compiling (warmup.py), measured in an empty cache (32.9 s, 29 Nov 2026)
    net_class = LazyClass("neural.lstm_torch:LSTMNet")
    flat_class = LSTMFlat
    builtin_flags = BUILTIN_FLAGS[name]  # its published mode, always on: secs, duration, equalized test rows

    @classmethod
    def weights_name(cls, cfg) -> str:
        return "LSTM"  # its flags are fixed (short, secs, duration, equalized test set)

    @classmethod
    def pretrain_command(cls, cfg) -> str:
        return "python pretrain.py --model LSTM --data PATH --users 9000-9099"

    @classmethod
    def restrict_targets(cls, data: ReviewData, root: Path, user_id: int, cfg=None) -> LSTMData:
        """Runner hook (once per user, before the split): attach the LSTM's inputs and equalized rows; with
        --with_same_day, the targets of upstream's `--short --secs --duration` run instead (`same_day_targets`)."""
        from data_loader import load_revlogs

        revlogs = load_revlogs(root, user_id)
        if getattr(cfg, "with_same_day", False):  # `data` is the secs pipeline's (config.SECS_SAME_DAY_ONLY)
            return same_day_targets(data, revlogs)
        return attach_sequences(data, revlogs)

    def new_net(self):
        net = super().new_net()
        net.precision = getattr(self.cfg, "precision", "") or PRECISION
        if self.torch_free():
            self.opt_flat = read_opt_state(self.pretrain_command(self.cfg))
            return net
        import torch

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
        if self.torch_free():
            finetune_compiled(self.net, data, self.opt_flat)
            return self
        from neural.lstm_torch import finetune

        layout = "compiled" if getattr(self.cfg, "trainer", "fast") == "fast" else "targets"
        finetune(self.net, data, self.opt_state, layout)
        return self

    @staticmethod
    def pretrain_users(net, users: list[ReviewData], *, n_epoch: int, out: Path, log=print):
        """Reptile (n_epoch = outer steps); writes the inner optimizer state next to the weights (.pth, and its
        flat arrays as .npz for the torch-free runs)."""
        from neural.lstm_torch import reptile, save_opt_state

        state = reptile(net, users, n_epoch, log)
        save_opt_state(net, state, out.with_name(out.stem + "_opt.pth"))
        return net
