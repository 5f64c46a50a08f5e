"""Whole per-user evaluation cost: features, 5 folds of FSRS-6 training and prediction, metrics.

Prints Markdown tables:
1. per user size: feature-pipeline throughput (raw reviews/s), whole-user wall time with each trainer,
   peak RSS of a fresh process doing one user (the memory a worker needs);
2. scaling: wall time of a run over several users with --processes 1 and 2.

Usage: python bench/bench_user.py [--sizes 10000,100000,400000] [--upstream-max 20000] [--scaling-users 8]
Numba kernels are compiled (or loaded from cache) before timing; one thread per process throughout.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("NUMBA_NUM_THREADS", "1")

ONE_USER = r"""
import json, os, resource, sys, time
sys.path.insert(0, {repo!r})
import torch; torch.set_num_threads(1)
from config import RunConfig
from runner import evaluate_user
from pathlib import Path
cfg = RunConfig(algo="FSRS-6", trainer={trainer!r}, processes=1)
if {trainer!r} == "fast":
    from models import fsrs6; fsrs6.warmup()
t = time.perf_counter()
out = evaluate_user({user}, cfg, Path({root!r}))
wall = time.perf_counter() - t
peak = int([l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1]) / 1024
print(json.dumps({{"wall": wall, "peak_mb": peak, "size": out.record["size"] if out.record else None,
                  "logloss": out.record["metrics"]["LogLoss"] if out.record else None, "error": out.error}}))
"""


def one_user(root: Path, user: int, trainer: str) -> dict:
    code = ONE_USER.format(repo=str(REPO), trainer=trainer, user=user, root=str(root))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def feature_rate(revlogs) -> float:
    from features import FeatureConfig, build_features

    build_features(revlogs, FeatureConfig(short=True))
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        build_features(revlogs, FeatureConfig(short=True))
        best = min(best, time.perf_counter() - t)
    return len(revlogs) / best


def scaling(root: Path, users: list[int], processes: int, trainer: str) -> float:
    result = Path(tempfile.mkdtemp()) / "result"
    cmd = [sys.executable, str(REPO / "script.py"), "--data", str(root), "--users", ",".join(map(str, users)),
           "--processes", str(processes), "--trainer", trainer, "--quiet", "--result-dir", str(result)]
    t = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    return time.perf_counter() - t


def main() -> None:
    from bench.simulate import write_users

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="10000,100000,400000", help="raw reviews per simulated user")
    ap.add_argument("--upstream-max", type=int, default=20000,
                    help="also time the upstream-style torch trainer for users up to this size")
    ap.add_argument("--scaling-users", type=int, default=8, help="users for the 1-vs-2 process run")
    ap.add_argument("--scaling-trainer", choices=["fast", "upstream"], default="fast",
                    help="trainer used in the scaling run")
    ap.add_argument("--scaling-reviews", type=int, default=100000, help="raw reviews per user in the scaling run")
    args = ap.parse_args()

    from models import fsrs6

    fsrs6.warmup()  # compile once so that the subprocesses load the cache
    tmp = Path(tempfile.mkdtemp(prefix="srsbench-"))
    print(f"machine: {os.cpu_count()} cores, {os.uname().machine}; one thread per process\n")
    print("| raw reviews | evaluated | features (M reviews/s) | whole user, fast (s) | peak RSS fast (MB) "
          "| whole user, upstream trainer (s) | Log Loss fast / upstream |")
    print("|---|---|---|---|---|---|---|")
    for k, n in enumerate(int(x) for x in args.sizes.split(",")):
        root = tmp / f"u{n}"
        write_users(root, n, 1, seed=100 + k)
        from data_loader import load_revlogs

        rate = feature_rate(load_revlogs(root, 1))
        fast = one_user(root, 1, "fast")
        up = one_user(root, 1, "upstream") if n <= args.upstream_max else None
        up_time = f"{up['wall']:.2f}" if up else "—"
        ll = f"{fast['logloss']:.4f} / {up['logloss']:.4f}" if up else f"{fast['logloss']:.4f} / —"
        print(f"| {n:,} | {fast['size']:,} | {rate / 1e6:.2f} | {fast['wall']:.2f} | {fast['peak_mb']:.0f} "
              f"| {up_time} | {ll} |", flush=True)

    if args.scaling_users:
        root = tmp / "scaling"
        write_users(root, args.scaling_reviews, args.scaling_users, seed=7)
        users = list(range(1, args.scaling_users + 1))
        t1 = scaling(root, users, 1, args.scaling_trainer)
        t2 = scaling(root, users, 2, args.scaling_trainer)
        print(f"\n| {args.scaling_users} users × {args.scaling_reviews:,} reviews, {args.scaling_trainer} trainer | --processes 1 | --processes 2 | speed-up |")
        print("|---|---|---|---|")
        print(f"| wall time (s) | {t1:.1f} | {t2:.1f} | {t1 / t2:.2f}× |")


if __name__ == "__main__":
    main()
