"""Online baselines (0 parameters, spec/models.md §8): RMSE-BINS-EXPLOIT and MOVING-AVG.

Upstream runs both as ONE online pass over all of a user's rows in time order (no TimeSeriesSplit training) and
records predictions from the first test row on (`other.py: rmse_bins_exploit`, `moving_avg`, January 2025; Era B
`model_processors.py`). In our fit/predict protocol, fit(train) receives every row before the test block and
predict(test) the block, so each fold's model replays the online pass over the training rows and then continues it
through the test rows, predicting each row before learning its label. The state never resets between folds
(fold k's replay covers folds 0..k−1's test rows, exactly as upstream's single pass did); only the starting row
differs between the two models:

- MOVING-AVG: an online logit x, starting at 1.2 at the user's FIRST row; p = σ(x); after every row (training rows
  included) one SGD step on the log loss with lr 0.3: x += 0.3/(e^x + 1) if y = 1, else x −= 0.3·e^x/(e^x + 1).
- RMSE-BINS-EXPLOIT: its running state starts at the FIRST TEST row (upstream skips the earlier rows entirely, so
  the first test row is predicted 0.5). Each row's bin is the RMSE(bins) key (lapse bin, interval bin on delta_t,
  i bin; `metrics.py`); per bin it tracks Σp and Σy. Prediction: 0.5 before any row was seen (not added to Σp),
  else p = clip(Σy_bin + ȳ − Σp_bin, 0, 1) with ȳ the running mean y of the rows seen; p is added to Σp_bin, then
  y to Σy_bin and to ȳ. Where the first test row lies is not visible to fit(), so the pass runs in predict(): the
  first test index is n − n_splits·⌊n/(n_splits+1)⌋, recovered from the training and test sizes (unique whenever
  the test block has more than n_splits rows, i.e. users with ≥ 6·(n_splits+1) rows); for smaller users, from the
  training size of fold 0 of the current pass over the user's folds (fold 0's training set ends exactly there; the
  runner fits a user's folds in order, each on a larger training set).

Neither model supports --partitions (upstream runs them without partitions; a partition's subset would break the
online pass).
"""

from __future__ import annotations


import numpy as np
import pandas as pd

import metrics
from config import ACCEPTS_SECS
from models.base import Model, ReviewData

MA_X0 = 1.2  # the online logit's starting value (its step size, MA_LR, is in models/baseline_kernels.py)


def _check_partitions(cfg, name: str) -> None:
    if cfg is not None and getattr(cfg, "partitions", "none") != "none":
        raise ValueError(f"{name} is an online pass over all of a user's rows; it does not support --partitions")


# ------------------------------------------------------------------------------------------------------- MOVING-AVG

class MovingAvg(Model):
    name = "MOVING-AVG"
    accepts_secs = name in ACCEPTS_SECS  # --short --secs: same-day rows in the online pass
    n_params = 0

    def __init__(self, cfg=None):
        _check_partitions(cfg, self.name)
        self.x = MA_X0

    def fit(self, train: ReviewData) -> "MovingAvg":
        from models.baseline_kernels import _moving_avg

        self.x, _ = _moving_avg(MA_X0, train.rows["y"].to_numpy(np.int64), False)
        return self

    def predict(self, test: ReviewData) -> np.ndarray:
        from models.baseline_kernels import _moving_avg

        # the model keeps learning inside the test block, as upstream's single pass does
        _, p = _moving_avg(self.x, test.rows["y"].to_numpy(np.int64), True)
        return p


# ------------------------------------------------------------------------------------------------ RMSE-BINS-EXPLOIT

def bin_keys(rows) -> np.ndarray:
    """Integer id of each row's RMSE(bins) bin (lapse, interval on delta_t, review count), as the metric bins."""
    key = np.zeros(len(rows), dtype=np.int64)
    for values in (metrics.lapse_bin(rows["rmse_bins_lapse"].to_numpy()),
                   metrics.interval_bin(rows["delta_t"].to_numpy()),
                   metrics.review_count_bin(rows["i"].to_numpy())):
        uniq, inv = np.unique(values, return_inverse=True)
        key = key * len(uniq) + inv.reshape(-1)
    return np.unique(key, return_inverse=True)[1].reshape(-1).astype(np.int64)


def first_test_candidates(n_train: int, n_test: int, n_splits: int) -> list[int]:
    """Possible first test indices (n − n_splits·⌊n/(n_splits+1)⌋) given one fold's training and test sizes."""
    out = []
    for k in range(n_splits):  # this test block is fold k
        first = n_train - k * n_test
        n = first + n_splits * n_test
        if first >= 0 and n // (n_splits + 1) == n_test:
            out.append(first)
    return out


# [seq_delta_t, seq_rating, first training size, last training size] of the current pass over a user's folds in this
# process. Folds are fitted in order, so a fit with a smaller training set than the previous one (or other arrays)
# starts a new pass; the first training size of a pass is its fold 0's, i.e. the first test index.
_FOLD_PASS: list = []


class RMSEBinsExploit(Model):
    name = "RMSE-BINS-EXPLOIT"
    accepts_secs = name in ACCEPTS_SECS  # --short --secs: bins on the fractional delta_t
    n_params = 0

    def __init__(self, cfg=None):
        _check_partitions(cfg, self.name)
        self.n_splits = getattr(cfg, "n_splits", 5) if cfg is not None else 5
        self.train: ReviewData | None = None

    def fit(self, train: ReviewData) -> "RMSEBinsExploit":
        self.train = train
        p = _FOLD_PASS
        if p and p[0] is train.seq_delta_t and p[1] is train.seq_rating and len(train) >= p[3]:
            p[3] = len(train)
        else:
            p[:] = [train.seq_delta_t, train.seq_rating, len(train), len(train)]
        return self

    def _first_test_index(self, n_train: int, n_test: int) -> int:
        cands = first_test_candidates(n_train, n_test, self.n_splits)
        if len(cands) == 1:
            return cands[0]
        p, t = _FOLD_PASS, self.train
        if t is not None and p and p[0] is t.seq_delta_t and p[1] is t.seq_rating and p[2] in cands:
            return p[2]
        if not cands:  # not a TimeSeriesSplit fold: treat every training row as already evaluated
            return 0
        raise ValueError(f"cannot tell where the evaluation starts from a fold with {n_train} training and {n_test} "
                         f"test rows (candidates {cands}); fit fold 0 first")

    def predict(self, test: ReviewData) -> np.ndarray:
        if self.train is None or len(self.train) == 0:
            rows, n_skip = test.rows, 0
        else:
            n_train = len(self.train)
            first = self._first_test_index(n_train, len(test))
            rows = pd.concat([self.train.rows.iloc[first:], test.rows], ignore_index=True)
            n_skip = n_train - first
        ids = bin_keys(rows)
        n_bins = int(ids.max()) + 1 if len(ids) else 0
        from models.baseline_kernels import _exploit

        return _exploit(ids, rows["y"].to_numpy(np.float64), n_bins, n_skip)


class Constant90(Model):
    """Upstream's "90%" debugging baseline (`ConstantModel`): p = 0.9 for every review, no training."""

    name = "90%"
    n_params = 0

    def __init__(self, cfg=None):
        pass

    def predict(self, test: ReviewData) -> np.ndarray:
        return np.full(len(test), 0.9)
