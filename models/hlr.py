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

Engine plug-in: the counts depend on the data alone, so `target_inputs` computes every target's √successes,
√failures and elapsed time once per fit or prediction, and the card functions (card_loss_grad, card_predict)
read them: a target costs one curve and one BCE, whatever its history. The torch functions (torch_init,
torch_step, torch_curve: the counts as a recurrent state) serve `--trainer autograd` and engine/traced.py.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from numba import njit

from config import ACCEPTS_SECS
from models.base import InadequateData, ReviewData
from engine.jit import inlined
from engine.kernel_math import bce
from engine.seq_engine import NUMPY126
from engine.seq_model import SeqModel

LN2 = math.log(2.0)
NO_LIMIT = 1 << 40  # max_seq_len that keeps every training row (upstream's len(tensor) == 2 for HLR)


# ---------------------------------------------------------------------------------------- numba kernels
# The counts depend on the data alone, so the fast engine gets them once per fit or prediction (`target_inputs`)
# and a target's loss is then one curve and one BCE: no replay of its card's history (see the module docstring).

N_STATE = 1  # card functions below: no per-card state or scratch


@njit(cache=True)
def target_inputs(seq_dt, seq_g, c_start, c_tb, c_te, t_pos, t_dt):
    """[n, 3]: √successes, √failures among each target's previous reviews, and its elapsed time (row j: target j).
    A card's targets come sorted by history length, so one running count per card serves them all (restarted if
    a length ever goes down). The counts are sums of ones in float64, exact, so the square roots are those the
    recurrent form (counts stepped review by review) took."""
    out = np.empty((len(t_pos), 3))
    for c in range(len(c_start)):
        start = c_start[c]
        succ = 0.0
        fail = 0.0
        k = 0
        for j in range(c_tb[c], c_te[c]):
            if t_pos[j] < k:
                succ = 0.0
                fail = 0.0
                k = 0
            while k < t_pos[j]:
                if seq_g[start + k] > 1:
                    succ += 1.0
                elif seq_g[start + k] == 1:
                    fail += 1.0
                k += 1
            out[j, 0] = math.sqrt(succ)
            out[j, 1] = math.sqrt(fail)
            out[j, 2] = t_dt[j]
    return out


@inlined
def card_loss_grad(w, seq_dt, seq_g, start, n, t_pos, t_in, t_y, t_wt, tb, te, buf, gw):
    """Σ weight·BCE of targets tb..te−1 (t_in: target_inputs), adding d/dw into gw, target by target in that order.
    With x = θ·features + b: h = 2^x, p = 0.5^(t/h) = exp(−ln2·t·2^(−x)), dp/dx = p·ln2²·t/h (nothing once p or h
    underflows). Inlined into the engine's loops: upstream's batches make nearly every target its own work item."""
    loss = 0.0
    for j in range(tb, te):
        x1 = t_in[j, 0]
        x2 = t_in[j, 1]
        t = t_in[j, 2]
        h = 2.0 ** (w[0] * x1 + w[1] * x2 + w[2])
        p = 0.5 ** (t / h)
        lo, gp = bce(p, t_y[j], t_wt[j])
        loss += lo
        if p == 0.0 or h == 0.0:
            continue
        gx = gp * p * LN2 * LN2 * t / h
        gw[0] += gx * x1
        gw[1] += gx * x2
        gw[2] += gx
    return loss


@inlined
def card_predict(w, seq_dt, seq_g, start, n, t_pos, t_in, tb, te, buf, out):
    """out[j] = P(recall) of targets tb..te−1: h = 2^(θ1·√n_succ + θ2·√n_fail + b), p = 0.5^(t/h)."""
    for j in range(tb, te):
        h = 2.0 ** (w[0] * t_in[j, 0] + w[1] * t_in[j, 1] + w[2])
        out[j] = 0.5 ** (t_in[j, 2] / h)


# ---------------------------------------------------------------------------------------- torch (reference)

def torch_init(w, g, t):
    return (g > 1).to(w.dtype), (g == 1).to(w.dtype)


def torch_step(w, state, t, g):
    return state[0] + (g > 1).to(w.dtype), state[1] + (g == 1).to(w.dtype)


def torch_curve(w, state, t):
    import torch  # the upstream-style trainer only: a default run does not import torch

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
