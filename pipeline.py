"""The per-user pipeline: one user from revlogs to one result record.

prepare_user (load → features → the model's target hook → TimeSeriesSplit folds), fit_predict_fold (a model per
partition, fitted on the fold's train rows, predicting its test rows), finish_user (metrics and the record).
evaluate_user chains them for one user; evaluate_chunk does the same for several users of a model with a batched
trainer, every (user, fold) fine-tune in one batched pass (docs/gpu.md). Nothing here knows about processes or
result files: the executors (local_pool.py, dask_executor.py) call these, runner.py writes what they return.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

import metrics
import models
from config import RunConfig
from data_loader import DataError, load_partitions, load_revlogs
from features import FEATURE_COLUMNS, FeatureConfig, NotEnoughData, build_features, history_strings
from models.base import InadequateData, ReviewData, column
from split import causal_folds, equalized_folds, protocol_folds, time_series_folds


def log(msg: str) -> None:
    """A line on stderr that does not break the progress bar."""
    from tqdm import tqdm

    tqdm.write(msg, file=sys.stderr)


@dataclass
class UserOutcome:
    user: int
    record: dict | None = None  # the result line; None when skipped or failed
    raw: dict | None = None
    table: pd.DataFrame | None = None  # test rows with p, for --file
    skipped: str | None = None
    error: str | None = None


def _fit_partition(cfg: RunConfig, train: ReviewData, whole_train: ReviewData):
    """Fit on one partition; fall back to the whole training split, then to default parameters (upstream order)."""
    for data in ((train,) if len(train) == len(whole_train) else (train, whole_train)):
        model = models.create(cfg)
        try:
            return model.fit(data)
        except InadequateData:
            continue
    return models.create(cfg)  # unfitted: default parameters


@dataclass
class PreparedUser:
    """A user after the steps every path shares: revlogs → features → the model's target hook → the folds."""
    user: int
    data: ReviewData
    folds: list[tuple[np.ndarray, np.ndarray]]  # (train rows, test rows) per TimeSeriesSplit fold
    warning: str | None
    start: float  # perf_counter at the start, for time_ms

    def splits(self):
        """(train, test) data of each fold, made one at a time (a large user's subsets are not all held at once)."""
        for tr, te in self.folds:
            yield self.data.subset(tr), self.data.subset(te)


def prepare_user(user_id: int, cfg: RunConfig, root: Path) -> PreparedUser | UserOutcome:
    """The user's folds, or the outcome (skipped / error) that ends the user here."""
    start = time.perf_counter()
    try:
        revlogs = load_revlogs(root, user_id, FEATURE_COLUMNS)
        part = load_partitions(root, user_id, cfg.partitions, revlogs["card_id"])
        rating = column(revlogs, "rating")  # integers (load_revlogs checks): outside 1-4 is < 1 or > 4
        n_bad = int(((rating < 1) | (rating > 4)).sum())
        warning = f"dropped {n_bad} review(s) with a rating outside 1-4" if n_bad else None
        fcfg = FeatureConfig.from_run(cfg)
        causal = {} if cfg.causal else None  # --causal: the outlier rule's inputs (split.causal_folds)
        data = build_features(revlogs, fcfg, part, causal_inputs=causal)
        # Optional model hook: the targets upstream's code path for this model evaluates, chosen before the split
        # (e.g. SM2/Ebisu-v2 drop cards missing from the cards/decks tables; see models/sm2.py).
        restrict = getattr(models.model_class(cfg.algo), "restrict_targets", None)
        if restrict is not None:
            data = restrict(data, root, user_id, cfg=cfg)
        if cfg.causal:
            folds = _causal_folds(cfg, fcfg, revlogs, part, data, causal)
        elif fcfg.equalize:  # the day-mode pipeline's test reviews (split.equalized_folds)
            day = build_features(revlogs, replace(fcfg, secs=False, equalize=False), part)
            folds = equalized_folds(data.rows["review_th"].to_numpy(), day.rows["review_th"].to_numpy(),
                                    cfg.n_splits)
        else:
            folds = time_series_folds(len(data), cfg.n_splits)
        if cfg.train_equals_test or cfg.no_test_same_day or cfg.no_train_same_day:  # upstream's split flags
            folds = protocol_folds(folds, data.rows["review_th"].to_numpy(), data.rows["elapsed_days"].to_numpy(),
                                   cfg.n_splits, train_equals_test=cfg.train_equals_test,
                                   no_test_same_day=cfg.no_test_same_day, no_train_same_day=cfg.no_train_same_day)
    except NotEnoughData as exc:
        return UserOutcome(user_id, skipped=str(exc))
    except DataError as exc:
        return UserOutcome(user_id, error=str(exc).removeprefix(f"user {user_id}: "))
    except Exception as exc:  # anything unexpected in a user's data
        return UserOutcome(user_id, error=f"{type(exc).__name__}: {exc}")
    return PreparedUser(user_id, data, folds, warning, start)


def _causal_folds(cfg: RunConfig, fcfg: FeatureConfig, revlogs, part, data: ReviewData, causal: dict):
    """--causal's folds (split.causal_folds). Day mode: `data` holds the candidate targets, the rule their
    OutlierInputs. Equalize mode (the general secs pipeline, or a model with the equalized test rows built in: the
    LSTM): the boundaries and the rule come from the day-mode candidates, training takes every row before the
    block (the secs pipeline has no outlier filter). Plain --secs: no outlier filter, so the ordinary folds."""
    equalized = fcfg.equalize or "equalize_test_with_non_secs" in cfg.builtin_flags
    if fcfg.secs and not fcfg.equalize:
        return time_series_folds(len(data), cfg.n_splits)
    review_th = data.rows["review_th"].to_numpy()
    if fcfg.secs:  # equalize: the day-mode candidates give the boundaries and the rule
        day = build_features(revlogs, replace(fcfg, secs=False, equalize=False), part, causal_inputs=causal)
        bounds = day.rows["review_th"].to_numpy()
    else:
        bounds = None
    folds = causal_folds(causal["rule"], review_th, cfg.n_splits, boundary_review_th=bounds,
                         filter_train=not equalized)
    if not folds:
        raise NotEnoughData("no evaluation reviews left after the causal outlier rule")
    return folds


def partitions(data: ReviewData) -> list[tuple[int, np.ndarray | None]]:
    """(partition, row mask) in order of first appearance (pd.unique's order); mask None when every row is in it,
    the usual case (no --partitions), which then costs no subset at all."""
    part = column(data.rows, "partition")
    if len(part) == 0:
        return []
    if (part == part[0]).all():
        return [(int(part[0]), None)]
    _, first = np.unique(part, return_index=True)
    return [(int(v), part == v) for v in part[np.sort(first)]]


def _split_by_partition(data: ReviewData) -> list[tuple[int, ReviewData]]:
    """(partition, its rows) in order of first appearance; `data` itself when it is all one partition."""
    return [(p, data if mask is None else data.subset(mask)) for p, mask in partitions(data)]


class PartitionLayout:
    """A user's rows sorted by partition (stably, so each partition's rows stay in time order), made once per user
    when the rows span several partitions (--partitions deck/preset). A fold's train or test rows are a range of
    time positions, and a partition's rows inside a range are then one contiguous block of the sorted table: each
    (fold, partition) subset is a slice instead of a boolean mask and a pandas take (~60 of them per user, most of
    the pipeline's extra cost on the -deck/-preset rows)."""

    def __init__(self, data: ReviewData):
        part = column(data.rows, "partition")
        order = np.argsort(part, kind="stable")
        self.sorted = data.subset(order)
        values, starts = np.unique(part[order], return_index=True)
        bounds = np.append(starts, len(order))
        # per partition: the time positions of its rows (ascending) and where its block starts in the sorted table
        self.blocks = [(int(v), order[bounds[k]:bounds[k + 1]], int(bounds[k])) for k, v in enumerate(values)]

    def split(self, whole: ReviewData, lo: int, hi: int) -> list[tuple[int, ReviewData]]:
        """The rows at time positions lo..hi−1 (`whole`, already cut) per partition, in order of first appearance."""
        found = []
        for p, times, start in self.blocks:
            a, b = np.searchsorted(times, (lo, hi))
            if b > a:
                found.append((int(times[a]), p, start + int(a), start + int(b)))
        if len(found) == 1:
            return [(found[0][1], whole)]
        return [(p, self.sorted.subset(np.arange(a, b))) for _, p, a, b in sorted(found)]  # a slice: contiguous


def _contiguous(index: np.ndarray) -> bool:
    return len(index) > 0 and int(index[-1]) - int(index[0]) == len(index) - 1


def fit_predict_fold(cfg: RunConfig, train: ReviewData, test: ReviewData,
                     train_parts: list | None = None, test_parts: list | None = None):
    """The per-user path of one fold: a model per partition. Returns the predictions and test rows of each test
    partition and the fitted models' parameters. `train_parts` / `test_parts`: the (partition, rows) lists when the
    caller has them (PartitionLayout); otherwise they are cut here."""
    fitted = {}
    for p, part_train in (_split_by_partition(train) if train_parts is None else train_parts):
        fitted[p] = _fit_partition(cfg, part_train, train)
    p_parts, row_parts = [], []
    for p, part_test in (_split_by_partition(test) if test_parts is None else test_parts):
        model = fitted.get(p) or models.create(cfg)
        p_parts.append(np.asarray(model.predict(part_test), dtype=np.float64))
        row_parts.append(part_test.rows)
    return p_parts, row_parts, {int(p): m.parameters() for p, m in fitted.items() if m.parameters() is not None}


def finish_user(prep: PreparedUser, cfg: RunConfig, p_parts: list[np.ndarray], row_parts: list[pd.DataFrame],
                last_params: dict, seconds: float | None = None) -> UserOutcome:
    """Metrics and the result record from the test predictions of every fold (and the raw/--file extras).
    `seconds`: the user's time when it was not measured from prep.start (users trained together share it)."""
    p = np.concatenate(p_parts)
    # the four columns the metrics read, not the whole frame (pd.concat of every column was ~2 ms per 20k rows)
    cols = {c: np.concatenate([column(r, c) for r in row_parts]) for c in metrics.ROW_COLUMNS}
    record = {"metrics": metrics.evaluate(cols["y"], p, cols), "user": int(prep.user),
              "size": int(len(cols["y"]))}
    if last_params:
        record["parameters"] = {str(k): [round(float(x), 6) for x in v] for k, v in last_params.items()}
    seconds = time.perf_counter() - prep.start if seconds is None else seconds
    record["time_ms"] = round(seconds * 1000, 1)
    if prep.warning:
        record["warning"] = prep.warning
    outcome = UserOutcome(prep.user, record=record)
    if cfg.raw or cfg.file:
        rows = pd.concat(row_parts, ignore_index=True)
    if cfg.raw:
        outcome.raw = {"user": int(prep.user), "p": [round(float(x), 4) for x in p],
                       "y": [int(x) for x in rows["y"]]}
    if cfg.file:
        table = rows.drop(columns=["seq_start", "seq_pos"]).copy()
        table["t_history"], table["r_history"] = history_strings(ReviewData(rows, prep.data.seq_delta_t,
                                                                            prep.data.seq_rating))
        table["p"] = p
        outcome.table = table
    return outcome


def evaluate_user(user_id: int, cfg: RunConfig, root: Path) -> UserOutcome:
    """Everything for one user; errors are returned, never raised, so one bad user cannot stop a run."""
    prep = prepare_user(user_id, cfg, root)
    if isinstance(prep, UserOutcome):
        return prep
    try:
        p_parts, row_parts, last_params = [], [], {}
        part = column(prep.data.rows, "partition")
        layout = PartitionLayout(prep.data) if len(part) and (part != part[0]).any() else None
        for (tr, te), (train, test) in zip(prep.folds, prep.splits()):
            cut = {}
            if layout is not None and _contiguous(tr) and _contiguous(te):
                cut = {"train_parts": layout.split(train, int(tr[0]), int(tr[-1]) + 1),
                       "test_parts": layout.split(test, int(te[0]), int(te[-1]) + 1)}
            ps, rows, last_params = fit_predict_fold(cfg, train, test, **cut)  # the last fold's parameters are kept
            p_parts += ps
            row_parts += rows
        return finish_user(prep, cfg, p_parts, row_parts, last_params)
    except Exception as exc:
        return UserOutcome(user_id, error=f"{type(exc).__name__}: {exc}")


def evaluate_chunk(users: list[int], cfg: RunConfig, root: Path, device: str = "cpu") -> list[UserOutcome]:
    """evaluate_user's phases for several users of a model with a batched trainer (neural/neural_batched.py): each
    user is prepared and finished as alone, and every (user, fold) fine-tune runs in one batched pass on `device`.
    A user whose data fails is reported as evaluate_user reports it; if the batched pass itself fails, the chunk's
    users are run one by one on the per-user path."""
    from neural import neural_batched

    start = time.perf_counter()
    preps = [prepare_user(u, cfg, root) for u in users]
    ready = [p for p in preps if isinstance(p, PreparedUser)]
    try:
        preds = neural_batched.fit_predict(cfg, [s for p in ready for s in p.splits()], device) if ready else []
    except Exception as exc:
        log(f"batched pass over users {', '.join(str(p.user) for p in ready)} failed ({type(exc).__name__}: "
             f"{exc}); running them one by one on the CPU")
        return [p if isinstance(p, UserOutcome) else evaluate_user(p.user, cfg, root) for p in preps]
    share = (time.perf_counter() - start) / max(1, len(ready))  # time_ms: an equal share of the chunk's time
    outcomes = []
    for p in preps:
        if isinstance(p, PreparedUser):
            mine, preds = preds[:len(p.folds)], preds[len(p.folds):]
            try:
                p = finish_user(p, cfg, mine, [p.data.rows.iloc[te] for _, te in p.folds], {}, seconds=share)
            except Exception as exc:
                p = UserOutcome(p.user, error=f"{type(exc).__name__}: {exc}")
        outcomes.append(p)
    return outcomes
