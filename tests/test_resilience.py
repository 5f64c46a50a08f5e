"""Runs that survive dead workers (local pool and Dask), largest-first scheduling, and data read from S3.

Every kill here is a real SIGKILL of a real worker process: from the test (kill -9 of a pool worker mid-user), or
by the worker itself on a chosen user (forked pool workers inherit the test's monkeypatch; Dask workers get a
WorkerPlugin that the scheduler hands to every worker, restarted ones included).
"""

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from distributed.diagnostics.plugin import WorkerPlugin

import local_pool
import pipeline
import runner
from config import EMBEDDED_DATA, RunConfig
from data_loader import list_user_ids, review_counts
from revlog_factory import make_revlog, write_user

EVALUATED = [1, 2, 3, 5, 6, 7]  # embedded users with enough data; user 4 is skipped (no line) by every model
ALL_USERS = [1, 2, 3, 4, 5, 6, 7]  # every embedded user


def cfg_for(tmp_path, **kw):
    kw.setdefault("data", EMBEDDED_DATA)
    return RunConfig(algo=kw.pop("algo", "AVG"), processes=kw.pop("processes", 2),
                     result_dir=tmp_path / "result", raw_dir=tmp_path / "raw",
                     evaluation_dir=tmp_path / "evaluation", quiet=True, **kw)


def result_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def comparable(lines: list[dict]) -> dict[int, tuple]:
    """user → everything of a result line except the wall time."""
    return {l["user"]: (l["size"], json.dumps(l["metrics"], sort_keys=True), json.dumps(l.get("parameters")))
            for l in lines}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The embedded data set run in one process, no pool: what every other executor must reproduce."""
    tmp = tmp_path_factory.mktemp("reference")
    summary = runner.run(cfg_for(tmp, processes=1))
    assert summary.exit_code == 0
    return comparable(result_lines(tmp / "result" / "AVG.jsonl"))


# --------------------------------------------------------------------------------------------- metadata sizes

def test_review_counts_come_from_parquet_metadata_and_users_go_largest_first(tmp_path, monkeypatch):
    root = tmp_path / "data"
    n_cards = {1: 10, 2: 40, 3: 25}  # user 2 has the most reviews, then 3, then 1
    for user, n in n_cards.items():
        write_user(root, user, make_revlog([[(d, 3), (d + 1, 3), (d + 3, 1)] for d in range(n)]))
    counts = review_counts(root, [1, 2, 3])
    # independent count: read every row of the user's partition
    assert counts == {u: pq.read_table(root / "revlogs" / f"user_id={u}").num_rows for u in (1, 2, 3)}
    assert counts == {1: 30, 2: 120, 3: 75}

    seen = {}
    monkeypatch.setattr(runner, "run_pool", lambda cfg, root, chunks, *args, **kw: seen.setdefault("todo", chunks))
    runner.run(cfg_for(tmp_path, data=root))
    assert seen["todo"] == [[2], [3], [1]]


# ------------------------------------------------------------------------------------------------ local pool

def hang_first_attempt(flag) -> None:
    """The first call (the one that creates `flag`) writes its worker's pid there and sleeps until it is killed; a
    retry finds the file and returns at once."""
    try:
        fd = os.open(flag, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    except FileExistsError:
        return
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    time.sleep(60)  # killed long before this ends


def test_kill_minus_9_of_a_pool_worker_costs_only_a_retry(tmp_path, monkeypatch, reference):
    """kill -9 of the worker running user 1, from outside: user 1 is retried on a new pool, every user gets exactly
    one line, identical to the single-process run, and the run succeeds."""
    flag = tmp_path / "user1-first-attempt.pid"
    original = pipeline.evaluate_user

    def slow_first_attempt(user, cfg, root):
        if user == 1:
            hang_first_attempt(flag)
        return original(user, cfg, root)

    monkeypatch.setattr(pipeline, "evaluate_user", slow_first_attempt)

    killed = {}

    def killer():
        deadline = time.time() + 60
        while time.time() < deadline:
            if flag.exists() and flag.read_text():
                pid = int(flag.read_text())
                time.sleep(0.2)  # well inside user 1's task
                os.kill(pid, signal.SIGKILL)
                killed["pid"] = pid
                return
            time.sleep(0.02)

    t = threading.Thread(target=killer)
    t.start()
    summary = runner.run(cfg_for(tmp_path))
    t.join()
    assert killed, "the worker running user 1 was never seen"
    assert summary.exit_code == 0 and summary.failed == {}
    lines = result_lines(tmp_path / "result" / "AVG.jsonl")
    assert sorted(l["user"] for l in lines) == EVALUATED
    assert comparable(lines) == reference


def test_a_user_that_always_kills_its_worker_is_reported_and_the_exit_code_says_so(tmp_path, monkeypatch, capsys,
                                                                                     reference):
    original = pipeline.evaluate_user
    attempts = tmp_path / "attempts"
    attempts.mkdir()

    def deadly_user_2(user, cfg, root):
        if user == 2:
            (attempts / str(os.getpid())).touch()
            os.kill(os.getpid(), signal.SIGKILL)
        return original(user, cfg, root)

    monkeypatch.setattr(pipeline, "evaluate_user", deadly_user_2)
    code = runner.main(["--model", "AVG", "--data", str(EMBEDDED_DATA), "--processes", "2", "--quiet",
                        "--result-dir", str(tmp_path / "result")], "test", "AVG", None)
    assert code == 1
    err = capsys.readouterr().err
    assert "user 2: error: worker killed, signal 9 (SIGKILL), twice — out of memory?" in err
    assert "1 failed: users 2" in err
    assert len(list(attempts.iterdir())) == runner.MAX_WORKER_DEATHS  # tried twice, in two different workers
    lines = result_lines(tmp_path / "result" / "AVG.jsonl")
    assert sorted(l["user"] for l in lines) == [u for u in EVALUATED if u != 2]
    assert comparable(lines) == {u: v for u, v in reference.items() if u != 2}


def test_workers_that_die_before_running_anything_do_not_loop_for_ever(tmp_path, monkeypatch):
    def broken_start(threads):
        os._exit(3)

    monkeypatch.setattr(local_pool, "init_worker", broken_start)
    summary = runner.run(cfg_for(tmp_path))
    assert summary.exit_code == 1 and sorted(summary.failed) == ALL_USERS
    assert all("broke 3 times in a row" in msg for msg in summary.failed.values())
    assert not (tmp_path / "result" / "AVG.jsonl").exists() or result_lines(tmp_path / "result" / "AVG.jsonl") == []


def copies_of_embedded(root: Path, n_users: int) -> Path:
    """Users 1..n_users, user u a copy of embedded user (u - 1) % 4 + 1 (user 4 and its copies are skipped)."""
    import shutil

    for user in range(1, n_users + 1):
        source = EMBEDDED_DATA / "revlogs" / f"user_id={(user - 1) % 4 + 1}"
        shutil.copytree(source, root / "revlogs" / f"user_id={user}")
    return root


def test_batched_pool_survives_kill_minus_9_and_reports_the_user_that_kills_its_worker(tmp_path, monkeypatch):
    """--batch-users 2 on two worker processes, the batched path's own pool: the worker running user 1's chunk is
    killed (kill -9 from the test) on its first attempt, and user 2 kills every worker that prepares it. The run
    goes on: user 2 is reported after MAX_WORKER_DEATHS deaths, exit code 1, every other user has exactly one line,
    as in the same run in one process. (Largest first: the chunks are [1, 5], [2, 6], [3, 7], [4, 8]; user 2 waits
    for user 1's kill, so each death is one worker's; user 6, user 2's chunk-mate, is retried alone.)"""
    data = copies_of_embedded(tmp_path / "data", 8)
    kw = dict(algo="GRU", data=data, batch_users=2, device="cpu")
    assert runner.run(cfg_for(tmp_path / "here", processes=1, **kw)).exit_code == 0
    here = {l["user"]: l for l in result_lines(tmp_path / "here" / "result" / "GRU.jsonl")}

    flag = tmp_path / "user1-first-attempt.pid"
    attempts = tmp_path / "user2-attempts"
    attempts.mkdir()
    original = pipeline.prepare_user

    def prepare(user, cfg, root):
        if user == 1:
            hang_first_attempt(flag)
        if user == 2:
            while not (tmp_path / "user1-killed").exists():
                time.sleep(0.02)
            (attempts / str(os.getpid())).touch()
            os.kill(os.getpid(), signal.SIGKILL)
        return original(user, cfg, root)

    monkeypatch.setattr(pipeline, "prepare_user", prepare)
    killed = {}

    def killer():
        deadline = time.time() + 120
        while time.time() < deadline:
            if flag.exists() and flag.read_text():
                pid = int(flag.read_text())
                time.sleep(0.2)
                os.kill(pid, signal.SIGKILL)
                killed["pid"] = pid
                (tmp_path / "user1-killed").touch()
                return
            time.sleep(0.02)

    t = threading.Thread(target=killer)
    t.start()
    summary = runner.run(cfg_for(tmp_path / "pool", processes=2, **kw))
    t.join()
    assert killed, "the worker running user 1 was never seen"
    assert summary.exit_code == 1
    assert summary.failed == {2: "worker killed, signal 9 (SIGKILL), twice — out of memory?"}
    assert len(list(attempts.iterdir())) == runner.MAX_WORKER_DEATHS
    lines = result_lines(tmp_path / "pool" / "result" / "GRU.jsonl")
    assert sorted(l["user"] for l in lines) == [1, 3, 5, 6, 7]  # once each
    for line in lines:
        assert line["size"] == here[line["user"]]["size"]
        assert abs(line["metrics"]["LogLoss"] - here[line["user"]]["metrics"]["LogLoss"]) <= 1e-4


def test_death_reasons_in_words():
    assert local_pool._death_reason(-9) == "signal 9 (SIGKILL)"
    assert local_pool._death_reason(-11) == "signal 11 (SIGSEGV)"
    assert local_pool._death_reason(3) == "exit code 3"
    assert local_pool._death_message(["signal 11 (SIGSEGV)"] * 3) == "worker killed, signal 11 (SIGSEGV), 3 times"


# ------------------------------------------------------------------------------------------------------ Dask

def test_dask_local_cluster_gives_the_local_executors_results(tmp_path, reference):
    """--executor dask with no scheduler: a LocalCluster of 2 worker processes on 127.0.0.1."""
    summary = runner.run(cfg_for(tmp_path, executor="dask", processes=2))
    assert summary.exit_code == 0 and summary.done == len(EVALUATED) and set(summary.skipped) == {4}
    lines = result_lines(tmp_path / "result" / "AVG.jsonl")
    assert [l["user"] for l in lines] == EVALUATED
    assert comparable(lines) == reference


class KillOnExecute(WorkerPlugin):
    """Worker plugin: SIGKILL this worker process when a chosen user's task starts executing; `once` users only
    the first time (a flag file shared by all workers), `always` users every time."""

    def __init__(self, flag_dir: str, once: set, always: set):
        self.flag_dir, self.once, self.always = flag_dir, once, always

    def transition(self, key, start, finish, **kwargs):
        if finish != "executing" or not str(key).startswith("srs-bench-"):
            return
        user = int(str(key).rsplit("-user", 1)[1].split("-")[0])
        if user in self.once:
            try:
                os.close(os.open(os.path.join(self.flag_dir, f"killed-{user}"), os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                return
        elif user not in self.always:
            return
        with open(os.path.join(self.flag_dir, f"deaths-{user}"), "a") as fh:
            fh.write(f"{os.getpid()}\n")
        os.kill(os.getpid(), signal.SIGKILL)


def set_environ(env: dict) -> None:
    os.environ.update(env)


@pytest.fixture(scope="module")
def dask_cluster(tmp_path_factory):
    """One LocalCluster (2 single-threaded worker processes on 127.0.0.1, the executor's own settings) shared by the
    tests below; the test above starts its own through the default path. This module's functions and classes are
    shipped to the workers by value."""
    import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    with runner.dask_client(cfg_for(tmp_path_factory.mktemp("cluster"), executor="dask", processes=2)) as client:
        yield client


def test_dask_worker_killed_mid_run(tmp_path, reference, dask_cluster):
    """A worker process killed (SIGKILL) while running user 1: the scheduler reruns user 1 elsewhere; user 2 kills
    every worker that runs it: after MAX_WORKER_DEATHS deaths it is reported failed (KilledWorker), exit code 1.
    Every other user has exactly one line.

    Eight users (5-8 are copies of 1-4): more than twice the workers' threads, so the scheduler queues the users and
    a worker holds only the one it is running, and a death counts against that user alone (with fewer users than
    that Dask hands each worker a second task, which a death would count against as well)."""
    data = copies_of_embedded(tmp_path / "data", 8)
    cfg = cfg_for(tmp_path, data=data, executor="dask", processes=2)
    dask_cluster.register_plugin(KillOnExecute(str(tmp_path), once={1}, always={2}), name="kill-on-execute")
    try:
        summary = runner.run(cfg, client=dask_cluster)
    finally:
        dask_cluster.unregister_worker_plugin("kill-on-execute")
    assert summary.exit_code == 1
    assert list(summary.failed) == [2] and "worker killed twice" in summary.failed[2]
    assert "KilledWorker" in summary.failed[2]
    assert len((tmp_path / "deaths-1").read_text().split()) == 1
    assert len((tmp_path / "deaths-2").read_text().split()) == runner.MAX_WORKER_DEATHS
    lines = result_lines(tmp_path / "result" / "AVG.jsonl")
    assert sorted(l["user"] for l in lines) == [1, 3, 5, 6, 7]
    assert comparable(lines) == {u: reference[(u - 1) % 4 + 1] for u in (1, 3, 5, 6, 7)}


# ------------------------------------------------------------------------------------------------ S3 (moto)

@pytest.fixture
def s3_data(monkeypatch):
    """The embedded data set in a bucket of a real S3-compatible server (moto) on 127.0.0.1."""
    from moto.server import ThreadedMotoServer
    import s3fs

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    for key, value in {"AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_ACCESS_KEY_ID": "testing",
                       "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    s3fs.S3FileSystem.clear_instance_cache()
    fs = s3fs.S3FileSystem()
    fs.mkdir("bench-data")
    for path in EMBEDDED_DATA.rglob("*.parquet"):
        fs.put_file(str(path), f"bench-data/anki/{path.relative_to(EMBEDDED_DATA).as_posix()}")
    yield "s3://bench-data/anki"
    s3fs.S3FileSystem.clear_instance_cache()
    server.stop()


def test_data_from_s3_local_pool_and_dask(s3_data, tmp_path, reference, dask_cluster):
    assert list_user_ids(s3_data) == list_user_ids(EMBEDDED_DATA) == ALL_USERS
    assert review_counts(s3_data, ALL_USERS) == review_counts(EMBEDDED_DATA, ALL_USERS)
    code = runner.main(["--model", "AVG", "--data", s3_data, "--processes", "2", "--quiet",
                        "--result-dir", str(tmp_path / "local" / "result")], "test", "AVG", None)
    assert code == 0
    assert comparable(result_lines(tmp_path / "local" / "result" / "AVG.jsonl")) == reference
    # the workers started before the endpoint existed: hand them the test's S3 settings (a real cluster has its own)
    env = {k: os.environ[k] for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                      "AWS_DEFAULT_REGION")}
    dask_cluster.run(set_environ, env)
    summary = runner.run(cfg_for(tmp_path / "dask", data=s3_data, executor="dask", processes=2), client=dask_cluster)
    assert summary.exit_code == 0
    assert comparable(result_lines(tmp_path / "dask" / "result" / "AVG.jsonl")) == reference
