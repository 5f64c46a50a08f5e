"""The run loop shared by `script.py`, `other.py` and `run_table.py`: every user of a config not yet in its
result file, on an executor, each outcome written as it comes back.

Where things live (docs/architecture.md): one user's pipeline in pipeline.py, the result files and their lock in
result_store.py, the local process pool (per-user and batched, surviving dead workers) in local_pool.py, the Dask
executor in dask_executor.py. This module wires them: it checks the flags, takes the result file's lock, picks the
users (largest first when they run in parallel), hands them to an executor and writes each outcome; the names
other code imports from here (run, main, evaluate_user, read_results, ...) stay importable from here.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass, field

import models
from config import SECS_FAST_ONLY, RunConfig
from dask_executor import dask_client, run_dask
from data_loader import DataError, list_user_ids, resolve_data_root, review_counts
from local_pool import MAX_WORKER_DEATHS, device_slots, run_pool
from pipeline import (PreparedUser, UserOutcome, evaluate_chunk, evaluate_user, finish_user, fit_predict_fold, log,
                      prepare_user)
from result_store import append_line, locked, read_results, rewrite_sorted, set_aside

__all__ = ["run", "main", "RunSummary", "per_user_reason", "UserOutcome", "PreparedUser", "prepare_user",
           "fit_predict_fold", "finish_user", "evaluate_user", "evaluate_chunk", "read_results", "append_line",
           "rewrite_sorted", "dask_client", "device_slots", "MAX_WORKER_DEATHS"]


@dataclass
class RunSummary:
    """What a run did: users done now, skipped (too little data) and failed (user → reason), and already done."""
    done: int = 0
    skipped: dict = field(default_factory=dict)
    failed: dict = field(default_factory=dict)
    already: int = 0

    @property
    def exit_code(self) -> int:
        return 1 if self.failed else 0


def per_user_reason(cfg: RunConfig) -> str | None:
    """Why this run cannot use the batched trainer (None: it can)."""
    from neural import neural_batched

    if not neural_batched.supports(cfg.algo):
        return f"{cfg.algo} has no batched trainer ({', '.join(neural_batched.BATCHED)} do)"
    for flag, on in (("--partitions", cfg.partitions != "none"),
                     (f"--trainer {cfg.trainer}", cfg.trainer != "fast"),
                     ("--dry", cfg.default), ("--executor dask", cfg.executor == "dask")):
        if on:
            return f"{flag} runs users one by one"
    return None


# The models upstream's other.py hands to their own functions before its fold loop (SM2/Ebisu process_untrainable,
# baseline, rmse_bins_exploit, moving_avg, fsrs_one_step): --no_test_same_day/--no_train_same_day/--train_equals_test
# are refused for them (split.protocol_folds follows the fold loop's handling only).
SPLIT_FLAGS_REFUSED = ("SM2", "Ebisu-v2", "AVG", "RMSE-BINS-EXPLOIT", "MOVING-AVG", "FSRS-6-one-step")
# --causal (split.causal_folds) runs every model through the fold loop with folds that need not be whole blocks; the
# ones upstream runs outside the loop work there as they do here (no training, a mean, an online pass or one SGD
# pass over the fold's training rows), except RMSE-BINS-EXPLOIT, whose pass recovers the first test row from
# TimeSeriesSplit's block sizes (models/baselines.py)
CAUSAL_REFUSED = ("RMSE-BINS-EXPLOIT",)
VERSION_KEY = "model_sha1"  # a model file's result lines: the sha1 of the file that produced them (its first 12)


def model_version(cfg: RunConfig) -> str | None:
    """The content digest of a model file (`--model path/to/file.py`), None for a registered model."""
    from engine.own_model import file_version, is_model_path

    return file_version(cfg.algo) if is_model_path(cfg.algo) else None


def run(cfg: RunConfig, client=None) -> RunSummary:
    """Run every user of `cfg` not yet in its result file. `client`: an open distributed.Client to reuse with
    `--executor dask` (run_table.py runs every row on one cluster); by default one is made for this run.
    Another run writing the same result file is a DataError (exit 2) before any work."""
    if cfg.scheduler and cfg.executor != "dask":
        raise DataError("--scheduler is for --executor dask")
    from engine.own_model import ModelFileError

    try:
        cls = models.model_class(cfg.algo)
    except ModelFileError as exc:
        raise DataError(str(exc)) from None
    if cfg.trainer == "autograd" and not getattr(cls, "autograd", False):
        raise DataError(f"{cfg.algo}: --trainer autograd needs a model with torch step functions (a SeqModel whose "
                        "kernels module has torch_init/torch_step/torch_curve, or a model file: docs/own-model.md)")
    builtin = cfg.builtin_flags
    refused = cfg.refused_secs_flags(getattr(cls, "accepts_secs", False))
    if refused:
        raise DataError(f"{cfg.algo}: --{', --'.join(refused)} not implemented for this model (the models that "
                        "accept upstream's secs mode declare accepts_secs; --duration is the LSTM's only)")
    if cfg.secs_mode and cfg.algo in SECS_FAST_ONLY and cfg.trainer != "fast":
        raise DataError(f"{cfg.algo}: --secs runs on the fast trainer only (its torch steps keep day mode's s_min); "
                        f"drop --trainer {cfg.trainer}")
    if cfg.sched_penalties and not getattr(cls, "accepts_sched_penalties", False):
        raise DataError(f"{cfg.algo}: --sched_penalties is FSRS-7's only (upstream's scheduling penalties)")
    if cfg.equalize_test_with_non_secs and "equalize_test_with_non_secs" not in builtin and not cfg.secs_mode:
        raise DataError("--equalize_test_with_non_secs needs --secs")
    split_flags = [f for f in ("no_test_same_day", "no_train_same_day", "train_equals_test") if getattr(cfg, f)]
    if split_flags and cfg.algo in SPLIT_FLAGS_REFUSED:
        # upstream runs these models through their own functions (model_processors.py), not other.py's fold
        # loop that applies the flags; what those do with the flags is not reproduced here
        raise DataError(f"{cfg.algo}: --{', --'.join(split_flags)} not implemented for this model")
    if cfg.causal and cfg.algo in CAUSAL_REFUSED:
        raise DataError(f"{cfg.algo}: --causal not implemented for this model (its online pass starts at the "
                        "first test review, which it infers from the whole-history fold sizes)")
    if cfg.causal and cfg.train_equals_test:
        raise DataError("--causal with --train_equals_test: that probe trains on its own test reviews")
    if cfg.batch_users is not None and cfg.batch_users < 1:
        raise DataError("--batch-users must be at least 1")
    slots = device_slots(cfg)
    root, where = resolve_data_root(cfg.data)
    cfg.result_dir.mkdir(parents=True, exist_ok=True)
    result_path = cfg.result_dir / f"{cfg.name}.jsonl"
    raw_path = cfg.raw_dir / f"{cfg.name}.jsonl"
    if cfg.raw:
        cfg.raw_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as held:  # from the opening rewrite to the closing one: no other run on these files
        for path in [result_path] + ([raw_path] if cfg.raw else []):
            held.enter_context(locked(path))
        print(where, file=sys.stderr)
        return _run_locked(cfg, root, slots, result_path, raw_path, client)


def _run_locked(cfg: RunConfig, root, slots: list[str], result_path, raw_path, client) -> RunSummary:
    """The run once its files are this process's: resume, pick the users, run them, write each outcome."""
    from tqdm import tqdm

    dropped = rewrite_sorted(result_path)
    if dropped:
        print(f"{result_path}: dropped {dropped} unreadable line(s) left by an interrupted run", file=sys.stderr)
    if cfg.raw:
        rewrite_sorted(raw_path)
    version = model_version(cfg)
    if version:  # a model file's results belong to its content: an edited file's old ones are set aside, not reused
        for path in [result_path] + ([raw_path] if cfg.raw else []):
            for aside, n in set_aside(path, lambda obj: obj.get(VERSION_KEY), version).items():
                print(f"{cfg.name}: {n} result(s) in {path.name} came from another version of {cfg.algo}: moved to "
                      f"{aside.name}; those users run again", file=sys.stderr)
    finished = {int(obj["user"]) for obj in read_results(result_path)[0]}

    users = list_user_ids(root)
    if cfg.users is not None:
        wanted = set(cfg.users)
        users = [u for u in users if u in wanted]
    if cfg.max_user_id is not None:
        users = [u for u in users if u <= cfg.max_user_id]
    summary = RunSummary(already=sum(u in finished for u in users))
    todo = [u for u in users if u not in finished]
    batched = False
    if cfg.on_cuda or cfg.users_per_chunk > 1:
        why = per_user_reason(cfg)
        batched = why is None
        if why:
            print(f"{cfg.name}: {why}: the per-user path on the CPU", file=sys.stderr)
    sizes = {}
    if len(todo) > 1 and (cfg.executor == "dask" or cfg.processes > 1 or batched):
        sizes = review_counts(root, todo)  # parquet footers only
        todo.sort(key=lambda u: -sizes[u])  # largest first, so the slowest collection does not start last
    print(f"{cfg.name}: {len(todo)} user(s) to run, {summary.already} already in {result_path}", file=sys.stderr)

    def handle(outcome: UserOutcome) -> None:
        if outcome.error:
            summary.failed[outcome.user] = outcome.error
            log(f"user {outcome.user}: error: {outcome.error}")
        elif outcome.skipped:
            summary.skipped[outcome.user] = outcome.skipped
            log(f"user {outcome.user}: skipped: {outcome.skipped}")
        else:
            if version:
                outcome.record[VERSION_KEY] = version
                if outcome.raw is not None:
                    outcome.raw[VERSION_KEY] = version
            if outcome.raw is not None:
                append_line(raw_path, outcome.raw)
            if outcome.table is not None:
                out_dir = cfg.evaluation_dir / cfg.name
                out_dir.mkdir(parents=True, exist_ok=True)
                outcome.table.to_csv(out_dir / f"{outcome.user}.tsv", sep="\t", index=False)
            if outcome.record.get("warning"):
                log(f"user {outcome.user}: warning: {outcome.record['warning']}")
            append_line(result_path, outcome.record)  # last: the line marks the user as done
            summary.done += 1

    if todo and cfg.executor != "dask" and not batched:  # a first run compiles its kernels on every worker first
        from warmup import ICI_KERNEL_REVIEWS, ici_unit, is_done, warm_up

        ici = ici_unit()  # with a run of many reviews (counted only while the kernel is not compiled)
        big = not is_done(ici) and len(todo) > 1 and \
            sum((sizes or review_counts(root, todo)).values()) >= ICI_KERNEL_REVIEWS
        warm_up([cfg], cfg.processes, cfg.quiet, extra=[ici] if big else [])
    bar = tqdm(total=len(todo), desc=cfg.name, unit="user", disable=cfg.quiet or not todo, file=sys.stderr)
    try:
        if cfg.executor == "dask" and todo:  # (never batched: per_user_reason)
            run_dask(cfg, root, todo, handle, bar, client)
        elif batched:
            k = cfg.users_per_chunk
            run_pool(cfg, root, [todo[i:i + k] for i in range(0, len(todo), k)], handle, bar, slots, batched=True)
        else:
            run_pool(cfg, root, [[u] for u in todo], handle, bar, ["cpu"] * max(1, cfg.processes), batched=False)
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
