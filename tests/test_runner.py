"""The run loop: results, resume, a run killed mid-way, and every kind of bad input."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from config import RunConfig
from runner import read_results, run
from revlog_factory import make_revlog, write_user

REPO = Path(__file__).resolve().parents[1]


def user_revlog(seed: int, n_cards: int = 60) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    cards = []
    for _ in range(n_cards):
        day, reviews, ivl = int(rng.integers(0, 30)), [], 1
        reviews.append((day, int(rng.choice([1, 3, 4], p=[0.2, 0.7, 0.1]))))
        for _ in range(int(rng.integers(3, 8))):
            day += ivl
            reviews.append((day, int(rng.choice([1, 2, 3, 4], p=[0.1, 0.1, 0.7, 0.1]))))
            ivl = max(1, ivl * 2 if reviews[-1][1] > 1 else 1)
        cards.append(reviews)
    return make_revlog(cards)


@pytest.fixture
def dataset(tmp_path):
    root = tmp_path / "data"
    for user in (1, 2, 3):
        write_user(root, user, user_revlog(user))
    return root


def cfg_for(root, tmp_path, **kw):
    return RunConfig(algo=kw.pop("algo", "AVG"), data=root, processes=1, result_dir=tmp_path / "result",
                     raw_dir=tmp_path / "raw", evaluation_dir=tmp_path / "evaluation", quiet=True, **kw)


def test_run_writes_one_line_per_user_and_resumes(dataset, tmp_path):
    cfg = cfg_for(dataset, tmp_path, raw=True, file=True)
    summary = run(cfg)
    assert summary.exit_code == 0 and summary.done == 3
    lines, bad = read_results(tmp_path / "result" / "AVG.jsonl")
    assert bad == 0 and [l["user"] for l in lines] == [1, 2, 3]
    for line in lines:
        assert set(line) >= {"metrics", "user", "size", "time_ms"}
        assert line["size"] % 5 == 0 and line["size"] > 0
        assert list(line["metrics"]) == ["RMSE", "LogLoss", "RMSE(bins)", "smECE", "AUC", "ICI", "precision@90",
                                         "recall@90", "MBE"]
    raw, _ = read_results(tmp_path / "raw" / "AVG.jsonl")
    assert [len(r["p"]) for r in raw] == [l["size"] for l in lines]
    tsv = pd.read_csv(tmp_path / "evaluation" / "AVG" / "1.tsv", sep="\t")
    assert len(tsv) == lines[0]["size"] and {"p", "y", "t_history", "r_history"} <= set(tsv.columns)
    before = (tmp_path / "result" / "AVG.jsonl").read_bytes()
    again = run(cfg)
    assert again.done == 0 and again.already == 3
    assert (tmp_path / "result" / "AVG.jsonl").read_bytes() == before


def test_resume_drops_a_torn_line_and_redoes_that_user(dataset, tmp_path):
    cfg = cfg_for(dataset, tmp_path)
    run(cfg)
    path = tmp_path / "result" / "AVG.jsonl"
    lines = path.read_text().splitlines()
    path.write_text(lines[0] + "\n" + lines[1][: len(lines[1]) // 2])  # user 2 torn mid-write, user 3 missing
    summary = run(cfg)
    assert summary.done == 2 and summary.already == 1
    no_time = lambda text: [{k: v for k, v in json.loads(l).items() if k != "time_ms"} for l in text]
    assert no_time(path.read_text().splitlines()) == no_time(lines)


def test_run_killed_mid_way_loses_only_users_in_flight(tmp_path):
    root = tmp_path / "data"
    for user in range(1, 41):
        write_user(root, user, user_revlog(user, n_cards=40))
    cmd = [sys.executable, "other.py", "--model", "AVG", "--data", str(root), "--processes", "1", "--quiet",
           "--result-dir", str(tmp_path / "result")]
    proc = subprocess.Popen(cmd, cwd=REPO, stderr=subprocess.DEVNULL, start_new_session=True)
    path = tmp_path / "result" / "AVG.jsonl"
    deadline = time.time() + 60
    while time.time() < deadline and (not path.exists() or path.read_text().count("\n") < 3):
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    partial, bad = read_results(path)
    assert bad <= 1 and 3 <= len(partial) < 40
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines, bad = read_results(path)
    assert bad == 0 and [l["user"] for l in lines] == list(range(1, 41))


GATED_RUN = """
import os, sys, time
import pipeline, runner
original = pipeline.evaluate_user
def gated(user, cfg, root):
    while user > 1 and not os.path.exists(sys.argv[1]):
        time.sleep(0.02)  # user 1 done, the rest held until the test opens the gate
    return original(user, cfg, root)
pipeline.evaluate_user = gated
sys.exit(runner.main(sys.argv[2:], "", "AVG", None))
"""


def test_a_second_run_on_the_same_result_file_is_refused_naming_the_first(tmp_path):
    """Two real processes on one result file: the second (a mistaken second start, or a --users shard writing
    into the same folder) refuses with one line naming the first run's pid, exit 2, and touches nothing; the first
    ends with exactly one line per user; after it, the same command finds nothing left to do."""
    root = tmp_path / "data"
    for user in range(1, 6):
        write_user(root, user, user_revlog(user, n_cards=40))
    args = ["--model", "AVG", "--data", str(root), "--processes", "1", "--quiet", "--result-dir",
            str(tmp_path / "result")]
    gate = tmp_path / "gate"
    first = subprocess.Popen([sys.executable, "-c", GATED_RUN, str(gate), *args], cwd=REPO, stderr=subprocess.PIPE,
                             text=True)
    path = tmp_path / "result" / "AVG.jsonl"
    deadline = time.time() + 60
    while time.time() < deadline and not (path.exists() and path.read_text().count("\n") == 1):
        time.sleep(0.02)
    assert path.read_text().count("\n") == 1, "the first run never wrote user 1"
    second = subprocess.run([sys.executable, "other.py", *args, "--users", "1-5"], cwd=REPO, capture_output=True,
                            text=True, timeout=120)
    assert second.returncode == 2
    assert second.stderr.strip() == (f"error: {path} is being written by another run "
                                                      f"(pid {first.pid}); wait for it to end, or give this run "
                                                      f"another --result-dir")
    assert path.read_text().count("\n") == 1  # the refused run wrote nothing
    gate.touch()
    _, err = first.communicate(timeout=120)
    assert first.returncode == 0, err
    lines, bad = read_results(path)
    assert bad == 0 and [l["user"] for l in lines] == [1, 2, 3, 4, 5]
    again = run_cli(root, tmp_path)
    assert again.returncode == 0 and "0 user(s) to run, 5 already in" in again.stderr
    assert read_results(path)[0] == lines


def run_cli(root, tmp_path, *extra):
    cmd = [sys.executable, "other.py", "--model", "AVG", "--data", str(root), "--processes", "1", "--quiet",
           "--result-dir", str(tmp_path / "result"), *extra]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)


def test_missing_data_folder_is_one_clear_error(tmp_path):
    out = run_cli(tmp_path / "nowhere", tmp_path)
    assert out.returncode == 2
    assert "nowhere" in out.stderr and "revlogs" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize("problem, mutate, message", [
    ("renamed column", lambda df: df.rename(columns={"elapsed_days": "ivl"}), "lack column(s) elapsed_days"),
    ("missing column", lambda df: df.drop(columns=["rating"]), "lack column(s) rating"),
    ("negative interval", lambda df: df.assign(elapsed_days=np.where(df.index == 5, -7, df.elapsed_days)),
     "negative elapsed_days"),
    ("NaN interval", lambda df: df.assign(elapsed_days=np.where(df.index == 5, np.nan, df.elapsed_days)),
     "missing (NaN) value(s) in elapsed_days"),
    ("empty user", lambda df: df.iloc[:0], "no reviews"),
])
def test_bad_user_is_reported_and_the_rest_runs(dataset, tmp_path, problem, mutate, message):
    write_user(dataset, 2, mutate(user_revlog(2)))
    out = run_cli(dataset, tmp_path)
    assert out.returncode == 1, problem
    errors = [l for l in out.stderr.splitlines() if "error" in l]
    assert len(errors) == 1 and errors[0].startswith("user 2: error:") and message in errors[0], out.stderr
    assert "Traceback" not in out.stderr
    lines, _ = read_results(tmp_path / "result" / "AVG.jsonl")
    assert [l["user"] for l in lines] == [1, 3]


def test_ratings_outside_1_to_4_are_dropped_with_a_warning(dataset, tmp_path):
    df = user_revlog(2)
    df.loc[[4, 9], "rating"] = [0, 7]
    write_user(dataset, 2, df)
    out = run_cli(dataset, tmp_path)
    assert out.returncode == 0
    assert "user 2: warning: dropped 2 review(s) with a rating outside 1-4" in out.stderr
    lines, _ = read_results(tmp_path / "result" / "AVG.jsonl")
    assert [l["user"] for l in lines] == [1, 2, 3]


def test_corrupt_parquet_and_tiny_user(dataset, tmp_path):
    (dataset / "revlogs" / "user_id=2" / "data.parquet").write_bytes(b"not a parquet file")
    write_user(dataset, 4, make_revlog([[(0, 3), (1, 3)]]))
    out = run_cli(dataset, tmp_path)
    assert out.returncode == 1
    assert "user 2: error: cannot read" in out.stderr
    assert "user 4: skipped: only 0 evaluation reviews" in out.stderr
    lines, _ = read_results(tmp_path / "result" / "AVG.jsonl")
    assert [l["user"] for l in lines] == [1, 3]


def test_process_pool_gives_the_same_lines(dataset, tmp_path):
    one = cfg_for(dataset, tmp_path / "a")
    two = cfg_for(dataset, tmp_path / "b", )
    two.processes = 2
    run(one)
    run(two)
    strip = lambda p: [{k: v for k, v in l.items() if k != "time_ms"} for l in read_results(p)[0]]
    assert strip(tmp_path / "a" / "result" / "AVG.jsonl") == strip(tmp_path / "b" / "result" / "AVG.jsonl")


def test_preset_partitions_train_one_model_per_preset(tmp_path):
    from features import FeatureConfig, build_features
    from split import time_series_folds

    root = tmp_path / "data"
    revlog = user_revlog(5, n_cards=80)
    n_cards = revlog.card_id.nunique()
    cards = pd.DataFrame({"card_id": range(n_cards), "note_id": range(n_cards), "deck_id": [c % 3 for c in range(n_cards)]})
    decks = pd.DataFrame({"deck_id": [0, 1, 2], "parent_id": [-1, -1, -1], "preset_id": [0, 1, 1]})
    write_user(root, 1, revlog, cards, decks)
    cfg = cfg_for(root, tmp_path, partitions="preset", raw=True)
    assert cfg.name == "AVG-preset"
    assert run(cfg).exit_code == 0
    raw = read_results(tmp_path / "raw" / "AVG-preset.jsonl")[0][0]
    # expected: per fold, each test row gets the mean recall of its preset's training rows, grouped by preset
    data = build_features(revlog, FeatureConfig(), np.array([0 if c % 3 == 0 else 1 for c in revlog.card_id]))
    expected = []
    for train, test in time_series_folds(len(data)):
        tr, te = data.rows.iloc[train], data.rows.iloc[test]
        for p in pd.unique(te.partition):
            expected += [round(tr.y[tr.partition == p].mean(), 4)] * int((te.partition == p).sum())
    assert raw["p"] == expected


def test_a_run_freezes_what_it_imported_out_of_the_garbage_collector(tmp_path):
    """The run path freezes the GC's view of the imported modules (local_pool.run_pool), so that full collections
    during users skip them; what a user allocates afterwards is collected as usual."""
    import gc

    from config import EMBEDDED_DATA, RunConfig
    from runner import run

    gc.unfreeze()
    assert gc.get_freeze_count() == 0
    run(RunConfig(algo="AVG", data=EMBEDDED_DATA, users=[3], processes=1, quiet=True, result_dir=tmp_path))
    assert gc.get_freeze_count() > 1000
    cycle = []
    cycle.append(cycle)
    del cycle
    assert gc.collect() >= 1  # a new cycle is still found and freed
