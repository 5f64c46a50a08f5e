"""The per-user job and the run loop shared by `script.py` and `other.py`.

One user: load → features → TimeSeriesSplit folds → fit/predict per partition → metrics → one result record.
The run: users not yet in `result/<name>.jsonl`, largest first, go to a process pool (or to a Dask cluster with
`--executor dask`); each finished user is appended as one complete line by this process alone (a single write,
flushed and fsynced), so a run killed at any instant loses at most the users in flight, and a torn last line from
such a kill is dropped on the next start. A worker that dies (out-of-memory killer, kill -9) costs only the user it
was running: the pool is rebuilt and that user retried; a user that kills its worker twice is reported as failed.
GRU-family runs with `--batch-users K > 1` or on CUDA take users in chunks instead: the same phases per user
(prepare_user, finish_user), every fold's fine-tune of a chunk trained in one batched pass (evaluate_chunk,
docs/gpu.md).
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
import time
import uuid
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

import metrics
import models
from config import RunConfig
from data_loader import DataError, list_user_ids, load_partitions, load_revlogs, resolve_data_root, review_counts
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
        revlogs = load_revlogs(root, user_id)
        part = load_partitions(root, user_id, cfg.partitions, revlogs["card_id"])
        n_bad = int((~revlogs["rating"].isin([1, 2, 3, 4])).sum())
        warning = f"dropped {n_bad} review(s) with a rating outside 1-4" if n_bad else None
        data = build_features(revlogs, FeatureConfig.from_run(cfg), part)
        # Optional model hook: the targets upstream's code path for this model evaluates, chosen before the split
        # (e.g. SM2/Ebisu-v2 drop cards missing from the cards/decks tables; see models/sm2.py).
        restrict = getattr(models.model_class(cfg.algo), "restrict_targets", None)
        if restrict is not None:
            data = restrict(data, root, user_id)
        folds = time_series_folds(len(data), cfg.n_splits)
    except NotEnoughData as exc:
        return UserOutcome(user_id, skipped=str(exc))
    except DataError as exc:
        return UserOutcome(user_id, error=str(exc).removeprefix(f"user {user_id}: "))
    except Exception as exc:  # anything unexpected in a user's data
        return UserOutcome(user_id, error=f"{type(exc).__name__}: {exc}")
    return PreparedUser(user_id, data, folds, warning, start)


def fit_predict_fold(cfg: RunConfig, train: ReviewData, test: ReviewData):
    """The per-user path of one fold: a model per partition. Returns the predictions and test rows of each test
    partition and the fitted models' parameters."""
    fitted = {}
    for p in pd.unique(train.rows["partition"]):
        fitted[p] = _fit_partition(cfg, train.subset((train.rows["partition"] == p).to_numpy()), train)
    p_parts, row_parts = [], []
    for p in pd.unique(test.rows["partition"]):
        part_test = test.subset((test.rows["partition"] == p).to_numpy())
        model = fitted.get(p) or models.create(cfg)
        p_parts.append(np.asarray(model.predict(part_test), dtype=np.float64))
        row_parts.append(part_test.rows)
    return p_parts, row_parts, {int(p): m.parameters() for p, m in fitted.items() if m.parameters() is not None}


def finish_user(prep: PreparedUser, cfg: RunConfig, p_parts: list[np.ndarray], row_parts: list[pd.DataFrame],
                last_params: dict, seconds: float | None = None) -> UserOutcome:
    """Metrics and the result record from the test predictions of every fold (and the raw/--file extras).
    `seconds`: the user's time when it was not measured from prep.start (users trained together share it)."""
    p = np.concatenate(p_parts)
    rows = pd.concat(row_parts, ignore_index=True)
    record = {"metrics": metrics.evaluate(rows["y"].to_numpy(), p, rows), "user": int(prep.user),
              "size": int(len(rows))}
    if last_params:
        record["parameters"] = {str(k): [round(float(x), 6) for x in v] for k, v in last_params.items()}
    seconds = time.perf_counter() - prep.start if seconds is None else seconds
    record["time_ms"] = round(seconds * 1000, 1)
    if prep.warning:
        record["warning"] = prep.warning
    outcome = UserOutcome(prep.user, record=record)
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
        for train, test in prep.splits():
            ps, rows, last_params = fit_predict_fold(cfg, train, test)  # the last fold's parameters are kept
            p_parts += ps
            row_parts += rows
        return finish_user(prep, cfg, p_parts, row_parts, last_params)
    except Exception as exc:
        return UserOutcome(user_id, error=f"{type(exc).__name__}: {exc}")


# ------------------------------------------------------------------------------ users trained together (docs/gpu.md)

def evaluate_chunk(users: list[int], cfg: RunConfig, root: Path, device: str = "cpu") -> list[UserOutcome]:
    """evaluate_user's phases for several users of a model with a batched trainer (models/neural_batched.py): each
    user is prepared and finished as alone, and every (user, fold) fine-tune runs in one batched pass on `device`.
    A user whose data fails is reported as evaluate_user reports it; if the batched pass itself fails, the chunk's
    users are run one by one on the per-user path."""
    from models import neural_batched

    start = time.perf_counter()
    preps = [prepare_user(u, cfg, root) for u in users]
    ready = [p for p in preps if isinstance(p, PreparedUser)]
    try:
        preds = neural_batched.fit_predict(cfg, [s for p in ready for s in p.splits()], device) if ready else []
    except Exception as exc:
        _log(f"batched pass over users {', '.join(str(p.user) for p in ready)} failed ({type(exc).__name__}: "
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


def device_slots(cfg: RunConfig) -> list[str]:
    """The device of each worker of a batched run (cpu, cuda:N, ...). Asking for CUDA where torch has none is a
    DataError (exit 2) before any work."""
    if not cfg.on_cuda:
        return ["cpu"]
    import torch

    if not torch.cuda.is_available():
        asked = f"--gpus {cfg.gpus}" if cfg.gpus is not None else f"--device {cfg.device}"
        raise DataError(f"{asked}: CUDA is not available here (torch {torch.__version__}, CUDA build: "
                        f"{torch.version.cuda or 'none'}); run with --device cpu")
    count = torch.cuda.device_count()
    if cfg.gpus is None:
        ids = [int(cfg.device.split(":")[1]) if ":" in cfg.device else torch.cuda.current_device()]
    elif cfg.gpus.strip() == "all":
        ids = list(range(count))
    else:
        try:
            ids = [int(x) for x in cfg.gpus.split(",") if x.strip()]
        except ValueError:
            raise DataError(f"--gpus {cfg.gpus}: expected device indices such as 0,1 or all") from None
    if not ids or not all(0 <= i < count for i in ids):
        raise DataError(f"CUDA device(s) {cfg.gpus or cfg.device}: this machine has {count} (0-{count - 1})")
    return [f"cuda:{i}" for i in ids]


def per_user_reason(cfg: RunConfig) -> str | None:
    """Why this run cannot use the batched trainer (None: it can)."""
    from models import neural_batched

    if not neural_batched.supports(cfg.algo):
        return f"{cfg.algo} has no batched trainer (GRU-P and GRU do)"
    for flag, on in (("--partitions", cfg.partitions != "none"), ("--trainer upstream", cfg.trainer != "fast"),
                     ("--dry", cfg.default), ("--executor dask", cfg.executor == "dask")):
        if on:
            return f"{flag} runs users one by one"
    return None


_WORKER_DEVICE = "cpu"


def _init_device_worker(slots, threads: int) -> None:
    """A batched-path worker takes its device from the queue (one worker per slot)."""
    global _WORKER_DEVICE
    _WORKER_DEVICE = slots.get()
    _init_worker(threads)
    if _WORKER_DEVICE.startswith("cuda"):
        import torch

        torch.cuda.set_device(_WORKER_DEVICE)  # CUDA's context on this worker's device only


def _device_chunk(users: list[int], cfg: RunConfig, root) -> list[UserOutcome]:
    return evaluate_chunk(users, cfg, root, _WORKER_DEVICE)


def _run_batched(cfg: RunConfig, root, todo: list[int], handle, bar, slots: list[str]) -> None:
    """Chunks of --batch-users users (in todo's order, largest first) on one worker per slot (per CUDA device, or
    --processes of them on the CPU); a worker takes the next chunk when it is free. One slot runs in this process.
    A worker that dies fails the users it had not returned (the result file is resumable: a new run redoes them)."""
    if slots == ["cpu"]:
        slots = slots * max(1, cfg.processes)
    k = cfg.users_per_chunk
    chunks = [todo[i:i + k] for i in range(0, len(todo), k)]

    def report(outcomes):
        for outcome in outcomes:
            handle(outcome)
            bar.update()

    if len(slots) == 1:
        _init_worker(cfg.torch_num_threads)
        for chunk in chunks:
            report(evaluate_chunk(chunk, cfg, root, slots[0]))
        return
    ctx = multiprocessing.get_context("spawn") if cfg.on_cuda else _pool_context(cfg)  # no CUDA after fork
    queue = ctx.Queue()
    for slot in slots:
        queue.put(slot)
    with ProcessPoolExecutor(max_workers=len(slots), mp_context=ctx, initializer=_init_device_worker,
                             initargs=(queue, cfg.torch_num_threads)) as pool:
        futures = {pool.submit(_device_chunk, chunk, cfg, root): chunk for chunk in chunks}
        for fut in as_completed(futures):
            try:
                report(fut.result())
            except Exception as exc:
                report(UserOutcome(u, error=f"worker failed: {type(exc).__name__}: {exc}") for u in futures[fut])


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
    from threadpoolctl import threadpool_limits

    if "torch" in sys.modules:  # a torch imported later reads OMP_NUM_THREADS; models without torch skip its ~1.5 s
        sys.modules["torch"].set_num_threads(threads)
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


# ------------------------------------------------------------------------------------- surviving dead workers

MAX_WORKER_DEATHS = 2  # a user whose task kills its worker this many times is reported as failed


def _death_reason(exitcode: int | None) -> str:
    """A dead worker's exit status in words: "signal 9 (SIGKILL)", "exit code 3"."""
    if exitcode is None:
        return "unknown exit status"
    if exitcode < 0:
        try:
            return f"signal {-exitcode} ({signal.Signals(-exitcode).name})"
        except ValueError:
            return f"signal {-exitcode}"
    return f"exit code {exitcode}"


def _times(n: int) -> str:
    return {1: "once", 2: "twice"}.get(n, f"{n} times")


def _death_message(reasons: list[str]) -> str:
    """The error reported for a user whose task kept killing its worker."""
    distinct = list(dict.fromkeys(reasons))
    msg = f"worker killed, {', '.join(distinct)}, {_times(len(reasons))}"
    return msg + (" — out of memory?" if any("SIGKILL" in r for r in reasons) else "")


def _pool_task(user: int, cfg: RunConfig, root, marker_dir: str) -> UserOutcome:
    """One user in a pool worker. While it runs, `<marker_dir>/<worker pid>` names the user, so that after a crash
    the parent can tell which user the dead worker was running."""
    marker = os.path.join(marker_dir, str(os.getpid()))
    with open(marker, "w") as fh:
        fh.write(str(user))
    try:
        return evaluate_user(user, cfg, root)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(marker)


def _dead_workers(procs: dict, marker_dir: str) -> dict[int, str]:
    """user → exit status, for the users that were running in a worker that died on its own. After one worker
    dies the executor terminates the others (SIGTERM), so those are not blamed; if no worker can be blamed (exit
    statuses unreadable, or the killer used SIGTERM too), every user that was mid-task is."""
    running: dict[int, int] = {}  # pid → user
    for name in os.listdir(marker_dir):
        with contextlib.suppress(ValueError, OSError):
            running[int(name)] = int(Path(marker_dir, name).read_text())
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(marker_dir, name))
    codes = {}
    for pid, proc in procs.items():
        with contextlib.suppress(Exception):
            proc.join(5)
            codes[pid] = proc.exitcode
    blamed = {user: _death_reason(codes[pid]) for pid, user in running.items()
              if codes.get(pid) not in (None, 0, -signal.SIGTERM)}
    return blamed or {user: _death_reason(codes.get(pid)) for pid, user in running.items()}


def _run_local_pool(cfg: RunConfig, root, todo: list[int], handle, bar) -> None:
    """`todo` on a process pool, in order. A dead worker breaks the whole pool (concurrent.futures' rule): the users
    whose results were lost are resubmitted to a new pool; the one the dead worker was running is charged one
    death, and reported as failed after MAX_WORKER_DEATHS."""
    ctx = _pool_context(cfg)
    deaths: dict[int, list[str]] = {}
    pending = list(todo)
    fruitless = 0  # consecutive pool breaks that neither finished a user nor could blame one
    marker_dir = tempfile.mkdtemp(prefix="srs-bench-pool-")
    try:
        while pending:
            pool = ProcessPoolExecutor(max_workers=min(cfg.processes, len(pending)), mp_context=ctx,
                                       initializer=_init_worker, initargs=(cfg.torch_num_threads,))
            futures: dict = {}
            handled: set[int] = set()
            try:
                with contextlib.suppress(BrokenProcessPool):  # a worker may die while 10,000 users are submitted
                    for u in pending:
                        futures[pool.submit(_pool_task, u, cfg, root, marker_dir)] = u
                procs = dict(getattr(pool, "_processes", None) or {})  # pid → Process: exit statuses after a crash
                for fut in as_completed(futures):
                    user = futures[fut]
                    try:
                        outcome = fut.result()
                    except BrokenProcessPool:  # a worker died: this user's result (if it had started) is lost
                        continue
                    except Exception as exc:  # the result could not be sent back
                        outcome = UserOutcome(user, error=f"worker failed: {type(exc).__name__}: {exc}")
                    handle(outcome)
                    bar.update()
                    handled.add(user)
            finally:
                pool.shutdown(wait=True, cancel_futures=True)
            lost = {u for u in pending if u not in handled}
            if not lost:
                break
            progressed = bool(handled)
            blamed = {u: r for u, r in _dead_workers(procs, marker_dir).items() if u in lost}
            gave_up = set()
            for user, reason in blamed.items():
                deaths.setdefault(user, []).append(reason)
                if len(deaths[user]) >= MAX_WORKER_DEATHS:
                    gave_up.add(user)
                    handle(UserOutcome(user, error=_death_message(deaths[user])))
                    bar.update()
                else:
                    _log(f"user {user}: its worker died ({reason}); retrying it on a fresh worker")
            fruitless = 0 if (progressed or blamed) else fruitless + 1
            pending = [u for u in pending if u in lost and u not in gave_up]
            if fruitless >= 3:  # e.g. workers that die before running anything: do not loop for ever
                for user in pending:
                    handle(UserOutcome(user, error="the process pool broke 3 times in a row without finishing or "
                                                   "starting a user (workers dying at start-up?)"))
                    bar.update()
                break
            if pending:
                _log(f"process pool rebuilt after a worker died; {len(pending)} unfinished user(s) resubmitted")
    finally:
        shutil.rmtree(marker_dir, ignore_errors=True)


# ------------------------------------------------------------------------------------------------- Dask executor

_DASK_WORKER_THREADS: int | None = None


def _dask_task(user: int, cfg: RunConfig, root) -> UserOutcome:
    """One user on a Dask worker (threads capped once per worker process, as the local pool's initializer does)."""
    global _DASK_WORKER_THREADS
    if _DASK_WORKER_THREADS != cfg.torch_num_threads:
        _init_worker(cfg.torch_num_threads)
        _DASK_WORKER_THREADS = cfg.torch_num_threads
    return evaluate_user(user, cfg, root)


def _dask_entry():
    """The function submitted to Dask, made here so that cloudpickle ships it by value: the scheduler deserializes
    every task, and a task that referred to this repository's modules (or carried a RunConfig) would need the code
    on the scheduler too. Only the workers need it; the config travels as a dict of plain values."""
    def run_user(user: int, cfg_fields: dict, root):
        import runner
        from config import RunConfig

        return runner._dask_task(user, RunConfig(**cfg_fields), root)

    return run_user


@contextlib.contextmanager
def dask_client(cfg: RunConfig, n_workers: int | None = None):
    """A `distributed.Client`: connected to `cfg.scheduler`, or to a LocalCluster of single-threaded worker
    processes on 127.0.0.1 (closed on exit). The LocalCluster's scheduler holds queued users back until a worker
    is free (worker-saturation 1.0: one task per single-threaded worker, so a dead worker takes only the user it
    was running with it; Dask queues a group of tasks larger than twice the cluster's threads) and fails a task
    after MAX_WORKER_DEATHS workers died running it (allowed-failures); a remote scheduler uses its own settings
    (docs/cluster.md)."""
    import logging

    import dask
    from distributed import Client, LocalCluster

    if cfg.scheduler:
        try:
            client = Client(cfg.scheduler, timeout="30s")
        except (OSError, TimeoutError) as exc:
            raise DataError(f"cannot connect to the Dask scheduler at {cfg.scheduler}: {exc}") from None
        try:
            yield client
        finally:
            client.close()
        return
    with dask.config.set({"distributed.scheduler.allowed-failures": MAX_WORKER_DEATHS - 1,
                          "distributed.scheduler.worker-saturation": 1.0,
                          # the statistical profiler (for the dashboard, off here) samples the task thread every
                          # 10 ms: ~4% of a busy worker's CPU, and it slows the user it interrupts
                          "distributed.worker.profile.enabled": False}):
        cluster = LocalCluster(n_workers=max(1, n_workers or cfg.processes), threads_per_worker=1, processes=True,
                               host="127.0.0.1", dashboard_address=None, silence_logs=logging.CRITICAL)
    client = Client(cluster)
    try:
        yield client
    finally:
        client.close()
        cluster.close()


def _check_dask_workers(client, root) -> None:
    """Every worker must import this repository's code and see the data; say so clearly before submitting."""
    def probe(root):  # nested: cloudpickle ships it by value, so it runs even where `runner` cannot be imported
        import importlib
        import os

        try:
            importlib.import_module("runner")
        except Exception as exc:
            return f"cannot import srs-bench's runner ({exc}); start the worker from the repository with " \
                   f"PYTHONPATH=<repo> (docs/cluster.md)"
        if "://" not in str(root) and not os.path.isdir(os.path.join(str(root), "revlogs")):
            return f"the data folder {root} is not visible on this worker: use a shared file system or an " \
                   f"object-store URL (--data s3://...)"
        return None

    if not client.scheduler_info().get("workers"):
        _log("waiting for a Dask worker to join the scheduler ...")
        client.wait_for_workers(1)
    problems = {addr: msg for addr, msg in client.run(probe, root).items() if msg}
    if problems:
        raise DataError("Dask worker(s) not ready: " + "; ".join(f"{a}: {m}" for a, m in problems.items()))


def _run_dask(cfg: RunConfig, root, todo: list[int], handle, bar, client=None) -> None:
    """`todo` as Dask tasks, one per user, in order (largest first). Results come back here and only here are
    they written. A worker that dies mid-task is the scheduler's to retry (allowed-failures); a user that
    exhausts it (KilledWorker) or fails in any other way is reported as failed, never dropped."""
    from distributed import KilledWorker
    from distributed import as_completed as dask_as_completed

    cm = contextlib.nullcontext(client) if client is not None else dask_client(cfg, min(cfg.processes, len(todo)))
    with cm as client:
        _check_dask_workers(client, root)
        token = uuid.uuid4().hex[:8]
        # One map call: the tasks run in list order (largest first), and they arrive as one group, so a run of
        # more users than twice the cluster's threads is queued on the scheduler and each worker holds only the
        # user it is running (a death then counts against that user alone).
        mapped = client.map(_dask_entry(), todo, key=[f"srs-bench-{cfg.name}-user{u}-{token}" for u in todo],
                            pure=False, cfg_fields=dataclasses.asdict(cfg), root=root)
        futures = dict(zip(mapped, todo))
        for fut in dask_as_completed(list(futures)):
            user = futures[fut]
            try:
                outcome = fut.result()
            except KilledWorker as exc:
                outcome = UserOutcome(user, error=f"worker killed {_times(exc.allowed_failures + 1)} running this "
                                                  f"user (Dask KilledWorker) — out of memory? see the workers' logs")
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException as exc:  # the task raised, was cancelled, or the scheduler went away
                outcome = UserOutcome(user, error=f"dask task failed: {type(exc).__name__}: {exc}")
            fut.release()
            handle(outcome)
            bar.update()


# ----------------------------------------------------------------------------------------------------- the run

def run(cfg: RunConfig, client=None) -> RunSummary:
    """Run every user of `cfg` not yet in its result file. `client`: an open distributed.Client to reuse with
    `--executor dask` (run_table.py runs every row on one cluster); by default one is made for this run."""
    from tqdm import tqdm

    if cfg.scheduler and cfg.executor != "dask":
        raise DataError("--scheduler is for --executor dask")
    builtin = getattr(models.model_class(cfg.algo), "builtin_flags", ())
    refused = [f for f in ("secs", "duration", "equalize_test_with_non_secs") if getattr(cfg, f) and f not in builtin]
    if refused:
        raise DataError(f"{cfg.algo}: --{', --'.join(refused)} not implemented for this model (upstream's secs mode "
                        "is built into the LSTM row only)")
    if cfg.batch_users is not None and cfg.batch_users < 1:
        raise DataError("--batch-users must be at least 1")
    slots = device_slots(cfg)
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
    batched = False
    if cfg.on_cuda or cfg.users_per_chunk > 1:
        why = per_user_reason(cfg)
        batched = why is None
        if why:
            print(f"{cfg.name}: {why}: the per-user path on the CPU", file=sys.stderr)
    if len(todo) > 1 and (cfg.executor == "dask" or cfg.processes > 1 or batched):
        sizes = review_counts(root, todo)  # parquet footers only
        todo.sort(key=lambda u: -sizes[u])  # largest first, so the slowest collection does not start last
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
        if batched and todo:
            _run_batched(cfg, root, todo, handle, bar, slots)
        elif cfg.executor == "dask" and todo:
            _run_dask(cfg, root, todo, handle, bar, client)
        elif cfg.processes <= 1 or len(todo) <= 1:
            _init_worker(cfg.torch_num_threads)
            for user in todo:
                handle(evaluate_user(user, cfg, root))
                bar.update()
        else:
            _run_local_pool(cfg, root, todo, handle, bar)
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
