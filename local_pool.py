"""The local executor: users on a pool of worker processes on this machine, surviving dead workers.

A task is a chunk of users: one user on the per-user path (pipeline.evaluate_user), or --batch-users of them
trained together on the worker's device (pipeline.evaluate_chunk; one worker per CUDA device with --gpus, or
--processes workers on the CPU). A worker that dies (out-of-memory killer, kill -9) breaks the whole pool
(concurrent.futures' rule): the chunks whose results were lost go to a new pool, and every user of the chunk the
dead worker was running is charged one death and retried alone, so that a user that kills its worker
MAX_WORKER_DEATHS times is found, reported as failed with the reason, and the run goes on without it.
With one worker (or one chunk) the users run in this process.
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import models
import pipeline
from config import RunConfig
from data_loader import DataError
from pipeline import UserOutcome, log

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


def keep_freed_memory() -> None:
    """glibc's malloc hands allocations above 128 KiB (a user's numpy columns, its features' temporaries) to fresh
    mmaps and gives freed heap back to the system, so the next user faults the same pages in again, zero-filled by
    the kernel: ~2,900 page faults and 8 of the 38 ms of AVG's whole run on a 45k-review user were that. A worker
    runs user after user of similar sizes, so it keeps freed memory for the next one instead (arrays up to 32 MiB
    from the heap, up to 128 MiB of free heap kept); peak memory is unchanged. glibc only; elsewhere a no-op."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD
        libc.mallopt(-1, 128 << 20)  # M_TRIM_THRESHOLD
    except (OSError, AttributeError):
        pass


def init_worker(threads: int) -> None:
    """Each worker uses `threads` threads in every native pool (torch, OpenBLAS, OpenMP). Pools created before a
    fork keep the parent's size, so they are capped here: otherwise two workers on two cores run 4 threads and
    each user takes twice as long. RAYON_NUM_THREADS: the Rust libraries' pool (fsrs-rs-python links rayon; its
    benchmark() ran on the calling thread in our measurements, so this only guards a pool made later). Freed
    memory is kept for the next user (keep_freed_memory)."""
    keep_freed_memory()
    os.environ["OMP_NUM_THREADS"] = str(threads)
    os.environ["RAYON_NUM_THREADS"] = str(threads)
    from threadpoolctl import threadpool_limits

    if "torch" in sys.modules:  # a torch imported later reads OMP_NUM_THREADS; models without torch skip its ~1.5 s
        sys.modules["torch"].set_num_threads(threads)
    threadpool_limits(threads)


def _pool_context(cfg: RunConfig):
    """Fork where available, after importing the model's modules here, so workers start warm (importing torch and
    loading compiled kernels costs ~2 s per spawned process, more than a typical user). Nothing in this process has
    started torch or numba threads at this point, which is what makes forking safe. The caller then freezes the
    garbage collector's view of what is imported (gc.freeze): a full collection, which a user's allocations trigger
    several times, no longer walks the hundreds of thousands of objects of numba, pandas and the kernels, and forked
    workers do not copy those pages by touching their GC headers (whole runs 0.85x CPU on the embedded data set,
    FSRS-6 and the Transformer; results identical)."""
    if "fork" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    models.create(cfg)  # imports the model's module (torch, numba kernels) without running anything
    if cfg.trainer == "fast":
        from models import fsrs6  # noqa: F401  (compiled kernels are loaded from numba's cache on first use)
        from engine.kernel_math import warm_numba

        warm_numba()  # numba's one-time set-up, once here rather than once per worker (FSRS-rs predicts with it)
    return multiprocessing.get_context("fork")


def device_slots(cfg: RunConfig) -> list[str]:
    """The device of each worker: --processes CPU workers, or one per CUDA device. Asking for CUDA where torch has
    none is a DataError (exit 2) before any work."""
    if not cfg.on_cuda:
        return ["cpu"] * max(1, cfg.processes)
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


_WORKER_DEVICE = "cpu"  # the device of this worker process (set by _init_pool_worker)


def _init_pool_worker(slots, threads: int) -> None:
    """A worker takes its device from the queue (one slot per worker) and caps its threads."""
    global _WORKER_DEVICE
    _WORKER_DEVICE = slots.get()
    init_worker(threads)
    if _WORKER_DEVICE.startswith("cuda"):
        import torch

        torch.cuda.set_device(_WORKER_DEVICE)  # CUDA's context on this worker's device only


def _run_chunk(chunk: list[int], cfg: RunConfig, root, batched: bool, device: str) -> list[UserOutcome]:
    if batched:
        return pipeline.evaluate_chunk(chunk, cfg, root, device)
    return [pipeline.evaluate_user(user, cfg, root) for user in chunk]


def _pool_task(chunk: list[int], cfg: RunConfig, root, batched: bool, marker_dir: str) -> list[UserOutcome]:
    """One chunk in a pool worker. While it runs, `<marker_dir>/<worker pid>` names its users, so that after a
    crash the parent can tell which users the dead worker was running."""
    marker = os.path.join(marker_dir, str(os.getpid()))
    with open(marker, "w") as fh:
        fh.write(" ".join(map(str, chunk)))
    try:
        return _run_chunk(chunk, cfg, root, batched, _WORKER_DEVICE)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(marker)



def _dead_workers(procs: dict, marker_dir: str) -> dict[int, str]:
    """user → exit status, for the users that were running in a worker that died on its own. After one worker
    dies the executor terminates the others (SIGTERM), so those are not blamed; if no worker can be blamed (exit
    statuses unreadable, or the killer used SIGTERM too), every user that was mid-task is."""
    running: dict[int, list[int]] = {}  # pid → the users of its chunk
    for name in os.listdir(marker_dir):
        with contextlib.suppress(ValueError, OSError):
            running[int(name)] = [int(u) for u in Path(marker_dir, name).read_text().split()]
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(marker_dir, name))
    codes = {}
    for pid, proc in procs.items():
        with contextlib.suppress(Exception):
            proc.join(5)
            codes[pid] = proc.exitcode
    blamed = {user: _death_reason(codes[pid]) for pid, users in running.items() for user in users
              if codes.get(pid) not in (None, 0, -signal.SIGTERM)}
    return blamed or {user: _death_reason(codes.get(pid)) for pid, users in running.items() for user in users}


def run_pool(cfg: RunConfig, root, chunks: list[list[int]], handle, bar, slots: list[str], batched: bool) -> None:
    """`chunks` in order on one worker per slot; each outcome goes to `handle` as it comes back. A user whose
    worker died is retried alone on a fresh pool, and reported as failed after MAX_WORKER_DEATHS deaths."""
    def report(outcomes):
        for outcome in outcomes:
            handle(outcome)
            bar.update()

    if min(len(slots), len(chunks)) <= 1:
        init_worker(cfg.torch_num_threads)
        models.create(cfg)  # the model's modules, imported before the freeze
        gc.freeze()  # see _pool_context
        for chunk in chunks:
            report(_run_chunk(chunk, cfg, root, batched, slots[0]))
        return
    ctx = multiprocessing.get_context("spawn") if cfg.on_cuda else _pool_context(cfg)  # no CUDA after fork
    gc.freeze()  # the imported modules' objects (numba's, pandas') out of every later collection, here and in workers
    deaths: dict[int, list[str]] = {}
    pending = [list(chunk) for chunk in chunks]
    fruitless = 0  # consecutive pool breaks that neither finished a user nor could blame one
    marker_dir = tempfile.mkdtemp(prefix="srs-bench-pool-")
    try:
        while pending:
            workers = min(len(slots), len(pending))
            queue = ctx.Queue()
            for slot in slots[:workers]:
                queue.put(slot)
            pool = ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_init_pool_worker,
                                       initargs=(queue, cfg.torch_num_threads))
            futures: dict = {}
            handled: set[int] = set()
            try:
                with contextlib.suppress(BrokenProcessPool):  # a worker may die while 10,000 users are submitted
                    for chunk in pending:
                        futures[pool.submit(_pool_task, chunk, cfg, root, batched, marker_dir)] = chunk
                procs = dict(getattr(pool, "_processes", None) or {})  # pid → Process: exit statuses after a crash
                for fut in as_completed(futures):
                    try:
                        outcomes = fut.result()
                    except BrokenProcessPool:  # a worker died: this chunk's results (if it had started) are lost
                        continue
                    except Exception as exc:  # the results could not be sent back
                        outcomes = [UserOutcome(u, error=f"worker failed: {type(exc).__name__}: {exc}")
                                    for u in futures[fut]]
                    report(outcomes)
                    handled.update(o.user for o in outcomes)
            finally:
                pool.shutdown(wait=True, cancel_futures=True)
            lost = [c for c in ([u for u in chunk if u not in handled] for chunk in pending) if c]
            if not lost:
                break
            blamed = _dead_workers(procs, marker_dir)
            retry, charged = [], False
            for chunk in lost:
                if not any(u in blamed for u in chunk):
                    retry.append(chunk)  # queued, or on a worker the executor stopped: resubmitted as it was
                    continue
                charged = True
                for user in chunk:  # each user alone from now on, so that only the one that kills is charged again
                    deaths.setdefault(user, []).append(blamed.get(user, "unknown exit status"))
                    if len(deaths[user]) >= MAX_WORKER_DEATHS:
                        report([UserOutcome(user, error=_death_message(deaths[user]))])
                    else:
                        log(f"user {user}: its worker died ({deaths[user][-1]}); retrying it on a fresh worker")
                        retry.append([user])
            fruitless = 0 if (handled or charged) else fruitless + 1
            pending = retry
            if fruitless >= 3:  # e.g. workers that die before running anything: do not loop for ever
                report(UserOutcome(user, error="the process pool broke 3 times in a row without finishing or "
                                               "starting a user (workers dying at start-up?)")
                       for chunk in pending for user in chunk)
                break
            if pending:
                log(f"process pool rebuilt after a worker died; {sum(map(len, pending))} unfinished user(s) "
                    f"resubmitted")
    finally:
        shutil.rmtree(marker_dir, ignore_errors=True)
