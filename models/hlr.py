"""HLR, half-life regression (3 parameters; spec models.md §5), as upstream srs-benchmark runs it.

Upstream (other.py of January 2025, `HLR` + the "HLR" branch of `create_features_helper`; later
features/neural_engineer.py: HLRFeatureEngineer and models/hlr.py@3307aec7): the features of a target are the square
roots of the numbers of successes (ratings 2-4) and failures (rating 1) among ALL its previous reviews, the card's
first review included (`r_item[:-1]` of the cumulative rating list); with `--short` the history keeps the same-day
reviews, so they are counted too (row HLR-short). Then
    h = 2^(θ1·√n_succ + θ2·√n_fail + b),   p = 0.5^(t/h)
with no clamp on h or p and no parameter clipper. init [θ1, θ2, b] = [2.5819, −0.8674, 2.7245].

Training details that differ from the recurrent models: the per-row tensor has length 2, and upstream's
BatchDataset measures a row's "history length" with len(tensor), so no training row is ever dropped by
max_seq_len = 64 and every row has the same sort key. Upstream's state_dict is the raw float list (no rounding).
That constant key is sorted by pandas' quicksort under upstream's numpy 1.26.4, which PERMUTES the time-ordered rows
(numpy >= 2 leaves them in place). The fast trainer replays upstream's training exactly (as DASH's, models/dash.py):
the rows in numpy 1.26's order (upstream/legacy_sort.py), cut every 512, the batches in torch.randperm order, the best
of the full-set losses before every epoch and after the last. It used to train on shuffled whole-card batches and
keep the better of the initial and final weights only: side by side with upstream's own January-2025 code on the
36 simulated users (sizes equal), mean Log Loss HLR-short 0.5068 vs 0.5056 (worse on 21 users), HLR 0.3796 vs
0.3795; now both equal upstream on every user to 1e-6 (0.5056, 0.3795). With the rows in time order instead
HLR-short is 0.5059 (per user up to ±0.0045): the permutation matters. Cost: upstream's batches rarely hold two
targets of one card, so with the counts as a recurrent state each target replayed its card from the first review,
which doubled the fit (whole runs of the 36 users 2.75 / 3.09 s of CPU, 20× / 19× upstream's). The counts depend on
the data alone, so they are now computed once per fit (`target_inputs`) and a target costs one curve and one BCE:
last-fold fit (CPU, best of 11-15, paired with the replaying version; with seq_engine's cheaper batch set-up)
4.0 → 1.5 ms on a simulated user of 7.3k reviews, 8.1 → 2.7 ms on one of 14k, 34 → 11 ms on one of 45k; weights,
predictions and result lines bit-identical. Whole
runs: HLR 2.53 s vs upstream's 61.18 (24×), HLR-short 2.32 vs 60.18 (26×), Log Loss equal. About half of what a fit
still costs is upstream's checkpoint rule: the full-set loss before every epoch and after the last (6 passes, each
as dear per target as a gradient pass). The batching stays "length-shared" (a card's targets within one batch summed
together, card order): the gradient's summation order, hence every bit of the result, is the one it had when the
items replayed cards. The upstream-style trainer
(`--trainer upstream`, torch) sorts its rows the same way (SeqModel.batch_sort); `--trainer autograd` keeps the engine's whole-card batches.
On the upstream-check users the fast trainer gives the published 0.306259 / 0.155947 in the default tie order
(numpy 2.2 with AVX-512, the published results' environment: upstream/legacy_sort.py) and upstream's code run with
numpy 1.26 without AVX-512 (0.298717 / 0.155615) in the "generic" one.

Engine plug-in: HLR's equations are written once, as torch_init / torch_step / torch_curve below (the counts as a
recurrent state), and the compiled engine runs the plug-in engine/traced.py generates from them (`traced`). Because
init and step read no weight, the generator computes the state before every target once per fit or prediction
(`target_inputs`: the counts and the elapsed time) and a target costs one curve and one BCE, whatever its history
(engine/traced_codegen.data_only_state). Until 29 Nov 2026 those card functions were written here by hand; the
generated ones give the same result lines (HLR, HLR-short, HLR-short-secs on data/embedded and upstream-check, every
byte but time_ms), fit in 1.01-1.05x the hand ones' CPU time (the fast trainer on upstream-check users 8 and 12,
best of 9, two rounds alternated), predict in 0.99-1.05x, and whole runs take 1.00-1.01x (whole process, 7 pairs
alternated: data/embedded with 2 processes, a 45k-review simulated user); a first run from an empty cache 5.5 s
for both. tests/test_traced.py holds the card functions to the generated plug-in that replays each card. The torch
functions also serve `--trainer autograd`.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from config import ACCEPTS_SECS
from models.base import InadequateData, ReviewData
from engine.seq_engine import NUMPY126
from engine.seq_model import SeqModel

NO_LIMIT = 1 << 40  # max_seq_len that keeps every training row (upstream's len(tensor) == 2 for HLR)


# ---------------------------------------------------------------------------------------- the equations

def torch_init(w, g, t):
    return (g > 1).to(w.dtype), (g == 1).to(w.dtype)


def torch_step(w, state, t, g):
    return state[0] + (g > 1).to(w.dtype), state[1] + (g == 1).to(w.dtype)


def torch_curve(w, state, t):
    import torch  # while traced, the stand-in (engine/torch_standin.py): a default run does not import torch

    h = 2 ** (w[0] * torch.sqrt(state[0]) + w[1] * torch.sqrt(state[1]) + w[2])
    return 0.5 ** (t / h)


def count_features(data: ReviewData) -> np.ndarray:
    """[n, 2]: √(successes), √(failures) among each target's previous reviews (vectorised prefix sums)."""
    g = np.asarray(data.seq_rating, dtype=np.int64)
    succ = np.concatenate([[0], np.cumsum(g > 1)])
    fail = np.concatenate([[0], np.cumsum(g == 1)])
    start = data.rows["seq_start"].to_numpy(np.int64)
    end = start + data.rows["seq_pos"].to_numpy(np.int64)
    return np.sqrt(np.stack([succ[end] - succ[start], fail[end] - fail[start]], axis=1).astype(np.float64))


def __getattr__(name: str):
    """HLRNet (upstream's torch module, upstream/seq_torch.py) is importable from here, loaded with torch only when
    asked for."""
    if name == "HLRNet":
        from upstream.seq_torch import HLRNet

        return HLRNet
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---------------------------------------------------------------------------------------- the model

class HLR(SeqModel):
    name = "HLR"
    accepts_secs = name in ACCEPTS_SECS  # --short --secs: same-day reviews counted and predicted
    kernels = "models.hlr"
    traced = True  # the compiled engine runs the plug-in generated from torch_init / torch_step / torch_curve
    replays_upstream_batches = True  # fit: batching "length-shared"
    default_w = [2.5819, -0.8674, 2.7245]
    lower = [-math.inf] * 3  # upstream has no clipper for HLR
    upper = [math.inf] * 3

    def fit(self, train: ReviewData) -> "HLR":
        if self.cfg.default:
            return self
        if len(train) == 0:
            raise InadequateData("no training rows")
        cfg = dataclasses.replace(self.cfg, max_seq_len=NO_LIMIT)  # upstream drops no HLR row (see docstring)
        w_init = list(self.default_w)
        trainer = getattr(self.cfg, "trainer", "fast")
        if trainer == "fast":  # upstream's batches and best-epoch rule (docstring)
            w = self.engine.fit(w_init, train, cfg, lr=self.lr, batching="length-shared", sort_kind=NUMPY126,
                                equal_lengths=True, check_every_epoch=True)
        elif trainer == "autograd":  # the autograd engine batches whole cards only
            w = self.engine.fit(w_init, train, cfg, lr=self.lr)
        else:
            import upstream.training as training
            from upstream.seq_torch import HLRNet

            net = HLRNet(w_init, count_features(train), dtype=self.torch_dtype)
            # every row gets the same nominal history length, as upstream's sort on len(tensor) == 2 sees them, and
            # batch_sort's tie order (numpy 1.26's quicksort) permutes the time-ordered rows as upstream's did; the
            # net reads the real features by row position
            flat = ReviewData(train.rows.assign(seq_pos=1), train.seq_delta_t, train.seq_rating)
            training.train(net, flat, cfg, lr=self.lr, sort_kind=self.batch_sort, dtype=self.torch_dtype)
            w = net.w.detach().double().numpy()
        self.w = [float(x) for x in w]
        return self
