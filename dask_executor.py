"""The Dask executor (`--executor dask`): one task per user on a Dask cluster, a LocalCluster by default
(docs/cluster.md). Results come back to the run's process, which alone writes the result file; a worker that dies
mid-task is the scheduler's to retry, and a user that exhausts its retries is reported as failed."""

from __future__ import annotations

import contextlib
import dataclasses
import uuid

import pipeline
from config import RunConfig
from data_loader import DataError
from local_pool import MAX_WORKER_DEATHS, init_worker, _times
from pipeline import UserOutcome, log

_DASK_WORKER_THREADS: int | None = None


def _dask_task(user: int, cfg: RunConfig, root) -> UserOutcome:
    """One user on a Dask worker (threads capped once per worker process, as the local pool's initializer does)."""
    global _DASK_WORKER_THREADS
    if _DASK_WORKER_THREADS != cfg.torch_num_threads:
        init_worker(cfg.torch_num_threads)
        _DASK_WORKER_THREADS = cfg.torch_num_threads
    return pipeline.evaluate_user(user, cfg, root)


def _dask_entry():
    """The function submitted to Dask, made here so that cloudpickle ships it by value: the scheduler deserializes
    every task, and a task that referred to this repository's modules (or carried a RunConfig) would need the code
    on the scheduler too. Only the workers need it; the config travels as a dict of plain values."""
    def run_user(user: int, cfg_fields: dict, root):
        import dask_executor
        from config import RunConfig

        return dask_executor._dask_task(user, RunConfig(**cfg_fields), root)

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
    def probe(root):  # nested: cloudpickle ships it by value, so it runs even where srs-bench cannot be imported
        import importlib
        import os

        try:  # what every task imports first (_dask_entry's run_user), and with it the pipeline and the models
            importlib.import_module("dask_executor")
        except Exception as exc:
            return f"cannot import srs-bench's dask_executor ({exc}); start the worker from the repository with " \
                   f"PYTHONPATH=<repo> (docs/cluster.md)"
        if "://" not in str(root) and not os.path.isdir(os.path.join(str(root), "revlogs")):
            return f"the data folder {root} is not visible on this worker: use a shared file system or an " \
                   f"object-store URL (--data s3://...)"
        return None

    if not client.scheduler_info().get("workers"):
        log("waiting for a Dask worker to join the scheduler ...")
        client.wait_for_workers(1)
    problems = {addr: msg for addr, msg in client.run(probe, root).items() if msg}
    if problems:
        raise DataError("Dask worker(s) not ready: " + "; ".join(f"{a}: {m}" for a, m in problems.items()))


def run_dask(cfg: RunConfig, root, todo: list[int], handle, bar, client=None) -> None:
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
