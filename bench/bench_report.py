"""Whole-process time of `report.py` on one collection, as an Anki user waits for it.

    python bench/bench_report.py                                  # recommended set and --models all, 9,248 reviews
    python bench/bench_report.py --models recommended --runs 3 --collection my.colpkg

Each run starts from an empty output folder (nothing reused: conversion, every model, the page), after one warm-up
run that fills numba's on-disk cache of compiled kernels (a user's second report and every later one find it warm).
Reported per model set: wall and CPU seconds (the command and its workers), median and range over the runs.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COLLECTION = ROOT / "tests" / "fixtures" / "anki" / "kedarmhaswade-my-anki-decks.anki21"


def one_run(collection: Path, models: str, processes: int) -> tuple[float, float]:
    out = Path(tempfile.mkdtemp(prefix="bench-report-"))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, str(ROOT / "report.py"), str(collection), "--out", str(out), "--models",
                           models, "--processes", str(processes), "--quiet"], capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    shutil.rmtree(out, ignore_errors=True)
    if proc.returncode != 0:
        raise SystemExit(f"report.py failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--collection", type=Path, default=COLLECTION)
    ap.add_argument("--models", default="recommended,all",
                    help="model sets to time, separated by ';' when a set itself is a comma list "
                         "(default: recommended and all)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--processes", type=int, default=os.cpu_count() or 1)
    a = ap.parse_args(argv)
    sets = a.models.split(";") if ";" in a.models else a.models.split(",")
    print("| models | runs | wall (s), median [min–max] | CPU (s), median |")
    print("|---|---|---|---|")
    for models in sets:
        one_run(a.collection, models, a.processes)  # warm-up: compiled kernels into the on-disk cache
        runs = [one_run(a.collection, models, a.processes) for _ in range(a.runs)]
        walls, cpus = [w for w, _ in runs], [c for _, c in runs]
        print(f"| {models} | {a.runs} | {statistics.median(walls):.1f} [{min(walls):.1f}–{max(walls):.1f}] | "
              f"{statistics.median(cpus):.1f} |", flush=True)


if __name__ == "__main__":
    main()
