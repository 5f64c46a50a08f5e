"""Whole-process run time per model, as a user runs it: `python other.py --model M --processes 1`.

    python bench/bench_whole_run.py --models FSRSv4,FSRS-4.5,HLR
    python bench/bench_whole_run.py --data ../anki-revlogs-10k --users 1-39    # on real collections you have

Without --data it writes a simulated set (bench/simulate.py) shaped like the set upstream's timings were taken on:
39 users, 260k raw reviews in all (sizes drawn log-uniformly, seed fixed), and times each model's whole command
(interpreter start, imports, features, 5 folds of training and prediction, metrics, result file) in a fresh process
with one process and an empty result directory. The kernels' disk cache is warmed by one untimed run first.

The `upstream` column is srs-benchmark's own code on a REAL 39-collection set of 260k reviews, one process, whole
process, as measured for the issues (issues 8 and 9); the ratio against it is therefore indicative: same size and
shape of work, not the same reviews. Run with --data on real collections to compare like with like.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# srs-benchmark's own code, whole process, one process, 39 real collections (260k reviews); seconds.
UPSTREAM_S = {
    "FSRS-6": 175, "FSRSv3": 94, "FSRSv2": 101, "FSRS-4.5": 104, "FSRSv4": 108, "AVG": 44, "SM2": 44, "HLR": 59,
    "RMSE-BINS-EXPLOIT": 59, "SM2-trainable": 64, "DASH[MCM]": 70, "DASH[ACT-R]": 74, "DASH": 77, "ACT-R": 78,
    "Ebisu-v2": 80, "Anki": 82, "GRU-P": 113,
}


def make_set(out: Path, n_users: int, total: int, seed: int) -> None:
    from bench.simulate import write_users

    rng = np.random.default_rng(seed)
    sizes = np.exp(rng.uniform(np.log(500), np.log(30000), n_users))
    sizes = np.maximum(200, np.round(sizes / sizes.sum() * total)).astype(int)
    for k, n in enumerate(sizes):
        write_users(out, int(n), 1, seed=seed + k, first_id=k + 1)


def run_once(model: str, extra: list[str], data: Path, users: str | None) -> float:
    with tempfile.TemporaryDirectory() as res:
        cmd = [sys.executable, str(ROOT / "other.py"), "--model", model, "--processes", "1", "--quiet",
               "--data", str(data), "--result-dir", res, *extra]
        if users:
            cmd += ["--users", users]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        elapsed = time.perf_counter() - t0
        if proc.returncode != 0:
            raise RuntimeError(f"{model}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
        return elapsed


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--models", default="FSRSv4,FSRS-4.5", help="comma-separated registry names; a name may carry "
                    "flags after a colon, e.g. 'SM2:--short'")
    ap.add_argument("--data", type=Path, default=None, help="dataset root (default: a simulated 39-user set)")
    ap.add_argument("--users", default=None, help="user ids/ranges to run (with --data)")
    ap.add_argument("--n-users", type=int, default=39)
    ap.add_argument("--reviews", type=int, default=260_000, help="raw reviews in the simulated set, in all")
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        data = a.data
        if data is None:
            data = Path(tmp) / "sim"
            make_set(data, a.n_users, a.reviews, a.seed)
        print("| model | ours, whole process (s) | upstream, whole process (s) | ratio |")
        print("|---|---|---|---|")
        for spec in a.models.split(","):
            model, _, flags = spec.strip().partition(":")
            extra = flags.split() if flags else []
            run_once(model, extra, data, a.users or "1")  # warm the kernels' disk cache
            ours = run_once(model, extra, data, a.users)
            up = UPSTREAM_S.get(model)
            ratio = f"{up / ours:.1f}×" if up and not extra else "—"
            print(f"| {spec.strip()} | {ours:.1f} | {up if up and not extra else '—'} | {ratio} |", flush=True)


if __name__ == "__main__":
    main()
