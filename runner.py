"""The per-user job and the run loop shared by `script.py` and `other.py`.

One user: load → features → TimeSeriesSplit folds → fit/predict per partition → metrics → one result record.
The run: users not yet in `result/<name>.jsonl` go to a process pool; each finished user is appended as one
complete line (a single write, flushed and fsynced), so a run killed at any instant loses at most the users in
flight, and a torn last line from such a kill is dropped on the next start.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

import metrics
import models
from config import RunConfig
from data_loader import DataError, list_user_ids, load_partitions, load_revlogs, resolve_data_root
from features import FeatureConfig, NotEnoughData, build_features, history_strings
from models.base import InadequateData, ReviewData
from split import time_series_folds


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


def evaluate_user(user_id: int, cfg: RunConfig, root: Path) -> UserOutcome:
    """Everything for one user; errors are returned, never raised, so one bad user cannot stop a run."""
    start = time.perf_counter()
    try:
        revlogs = load_revlogs(root, user_id)
        part = load_partitions(root, user_id, cfg.partitions, revlogs["card_id"])
        n_bad = int((~revlogs["rating"].isin([1, 2, 3, 4])).sum())
        warning = f"dropped {n_bad} review(s) with a rating outside 1-4" if n_bad else None
        data = build_features(revlogs, FeatureConfig.from_run(cfg), part)
    except NotEnoughData as exc:
        return UserOutcome(user_id, skipped=str(exc))
    except DataError as exc:
        return UserOutcome(user_id, error=str(exc).removeprefix(f"user {user_id}: "))
    except Exception as exc:  # anything unexpected in a user's data
        return UserOutcome(user_id, error=f"{type(exc).__name__}: {exc}")

    try:
        p_all, test_parts, last_params = [], [], {}
        for train_idx, test_idx in time_series_folds(len(data), cfg.n_splits):
            train, test = data.subset(train_idx), data.subset(test_idx)
            fitted = {}
            for p in pd.unique(train.rows["partition"]):
                fitted[p] = _fit_partition(cfg, train.subset((train.rows["partition"] == p).to_numpy()), train)
            for p in pd.unique(test.rows["partition"]):
                sel = (test.rows["partition"] == p).to_numpy()
                part_test = test.subset(sel)
                model = fitted.get(p) or models.create(cfg)
                p_all.append(np.asarray(model.predict(part_test), dtype=np.float64))
                test_parts.append(part_test.rows)
            last_params = {int(p): m.parameters() for p, m in fitted.items() if m.parameters() is not None}
        p = np.concatenate(p_all)
        rows = pd.concat(test_parts, ignore_index=True)
        record = {"metrics": metrics.evaluate(rows["y"].to_numpy(), p, rows), "user": int(user_id),
                  "size": int(len(rows))}
        if last_params:
            record["parameters"] = {str(k): [round(float(x), 6) for x in v] for k, v in last_params.items()}
        record["time_ms"] = round((time.perf_counter() - start) * 1000, 1)
        if warning:
            record["warning"] = warning
        outcome = UserOutcome(user_id, record=record)
        if cfg.raw:
            outcome.raw = {"user": int(user_id), "p": [round(float(x), 4) for x in p],
                           "y": [int(x) for x in rows["y"]]}
        if cfg.file:
            table = rows.drop(columns=["seq_start", "seq_pos"]).copy()
            table["t_history"], table["r_history"] = history_strings(ReviewData(rows, data.seq_delta_t,
                                                                                data.seq_rating))
            table["p"] = p
            outcome.table = table
        return outcome
    except Exception as exc:
        return UserOutcome(user_id, error=f"{type(exc).__name__}: {exc}")


# ----------------------------------------------------------------------------------------------- result files

def read_results(path: Path) -> tuple[list[dict], int]:
    """Valid result lines of a file and the number of unreadable ones (e.g. a line torn by a killed run)."""
    if not path.exists():
        return [], 0
    good, bad = [], 0
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                int(obj["user"])
                good.append(obj)
            except (ValueError, KeyError, TypeError):
                bad += 1
    return good, bad


def rewrite_sorted(path: Path) -> int:
    """Sort a JSONL file by user (one line per user, torn lines dropped), atomically; returns lines dropped."""
    lines, bad = read_results(path)
    if not lines and not bad:
        return 0
    by_user = {int(obj["user"]): obj for obj in lines}
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        for user in sorted(by_user):
            fh.write(json.dumps(by_user[user]) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return bad


def append_line(path: Path, obj: dict) -> None:
    """One complete line per write, flushed to disk before the next user is reported done."""
    data = (json.dumps(obj) + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


# ----------------------------------------------------------------------------------------------------- the run

@dataclass
class RunSummary:
    done: int = 0
    skipped: dict = field(default_factory=dict)
    failed: dict = field(default_factory=dict)
    already: int = 0

    @property
    def exit_code(self) -> int:
        return 1 if self.failed else 0


def _init_worker(threads: int) -> None:
    """Each worker uses `threads` threads in every native pool (torch, OpenBLAS, OpenMP). Pools created before a
    fork keep the parent's size, so they are capped here: otherwise two workers on two cores run 4 threads and
    each user takes twice as long."""
    os.environ["OMP_NUM_THREADS"] = str(threads)
    import torch
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(threads)
    threadpool_limits(threads)


def _pool_context(cfg: RunConfig):
    """Fork where available, after importing the model's modules here, so workers start warm (importing torch and
    loading compiled kernels costs ~2 s per spawned process, more than a typical user). Nothing in this process has
    started torch or numba threads at this point, which is what makes forking safe."""
    if "fork" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    models.create(cfg)  # imports the model's module (torch, numba kernels) without running anything
    if cfg.trainer == "fast":
        from models import fsrs6_fast  # noqa: F401  (compiled kernels are loaded from numba's cache on first use)
    return multiprocessing.get_context("fork")


def _log(msg: str) -> None:
    from tqdm import tqdm

    tqdm.write(msg, file=sys.stderr)


def run(cfg: RunConfig) -> RunSummary:
    from tqdm import tqdm

    root, where = resolve_data_root(cfg.data)
    print(where, file=sys.stderr)
    cfg.result_dir.mkdir(parents=True, exist_ok=True)
    result_path = cfg.result_dir / f"{cfg.name}.jsonl"
    raw_path = cfg.raw_dir / f"{cfg.name}.jsonl"
    dropped = rewrite_sorted(result_path)
    if dropped:
        print(f"{result_path}: dropped {dropped} unreadable line(s) left by an interrupted run", file=sys.stderr)
    if cfg.raw:
        cfg.raw_dir.mkdir(parents=True, exist_ok=True)
        rewrite_sorted(raw_path)
    finished = {int(obj["user"]) for obj in read_results(result_path)[0]}

    users = list_user_ids(root)
    if cfg.users is not None:
        wanted = set(cfg.users)
        users = [u for u in users if u in wanted]
    if cfg.max_user_id is not None:
        users = [u for u in users if u <= cfg.max_user_id]
    summary = RunSummary(already=sum(u in finished for u in users))
    todo = [u for u in users if u not in finished]
    print(f"{cfg.name}: {len(todo)} user(s) to run, {summary.already} already in {result_path}", file=sys.stderr)

    def handle(outcome: UserOutcome) -> None:
        if outcome.error:
            summary.failed[outcome.user] = outcome.error
            _log(f"user {outcome.user}: error: {outcome.error}")
        elif outcome.skipped:
            summary.skipped[outcome.user] = outcome.skipped
            _log(f"user {outcome.user}: skipped: {outcome.skipped}")
        else:
            if outcome.raw is not None:
                append_line(raw_path, outcome.raw)
            if outcome.table is not None:
                out_dir = cfg.evaluation_dir / cfg.name
                out_dir.mkdir(parents=True, exist_ok=True)
                outcome.table.to_csv(out_dir / f"{outcome.user}.tsv", sep="\t", index=False)
            if outcome.record.get("warning"):
                _log(f"user {outcome.user}: warning: {outcome.record['warning']}")
            append_line(result_path, outcome.record)  # last: the line marks the user as done
            summary.done += 1

    bar = tqdm(total=len(todo), desc=cfg.name, unit="user", disable=cfg.quiet or not todo, file=sys.stderr)
    try:
        if cfg.processes <= 1 or len(todo) <= 1:
            _init_worker(cfg.torch_num_threads)
            for user in todo:
                handle(evaluate_user(user, cfg, root))
                bar.update()
        else:
            ctx = _pool_context(cfg)
            with ProcessPoolExecutor(max_workers=min(cfg.processes, len(todo)), mp_context=ctx,
                                     initializer=_init_worker, initargs=(cfg.torch_num_threads,)) as pool:
                futures = {pool.submit(evaluate_user, u, cfg, root): u for u in todo}
                for fut in as_completed(futures):
                    try:
                        handle(fut.result())
                    except Exception as exc:  # a worker died (out of memory, killed)
                        handle(UserOutcome(futures[fut], error=f"worker failed: {type(exc).__name__}: {exc}"))
                    bar.update()
    finally:
        bar.close()
        rewrite_sorted(result_path)
        if cfg.raw:
            rewrite_sorted(raw_path)

    parts = [f"{summary.done} done"]
    if summary.skipped:
        parts.append(f"{len(summary.skipped)} skipped (too little data)")
    if summary.failed:
        parts.append(f"{len(summary.failed)} failed: users {', '.join(map(str, sorted(summary.failed)))}")
    print(f"{cfg.name}: " + ", ".join(parts) + f" → {result_path}", file=sys.stderr)
    return summary


def main(argv: list[str] | None, description: str, default_algo: str, algo_choices: list[str] | None) -> int:
    from config import build_parser, config_from_args

    args = build_parser(description, default_algo, algo_choices).parse_args(argv)
    cfg = config_from_args(args)
    try:
        return run(cfg).exit_code
    except DataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
