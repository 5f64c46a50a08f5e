"""Whole-user cost of the neural models: our one-pass-per-card fine-tune vs upstream's per-target padded one.

    python -m bench.bench_neural --models GRU-P,GRU --users 3 --reviews 20000
    python -m bench.bench_neural --models GRU-P --data tests/fixtures/upstream-check   # real users

For each model and trainer, every user is evaluated exactly as `other.py` does it (runner.evaluate_user: features,
TimeSeriesSplit(5), one fine-tune per fold from the pretrained weights, predictions, metrics), in this process, with
one thread (torch, numba, BLAS). `--trainer fast` is ours (neural/neural_seq.py: groups of whole cards, one pass per
card); `--trainer upstream` is srs-benchmark's trainer (upstream/training.py: per-target histories padded per batch of 512
sorted by length, the same network stepped by torch's nn.GRU), so the ratio isolates the training layout. Users
default to simulated ones (bench/simulate.py, seeds --seed, --seed+1, ...; their cards run up to the 128-review cap,
where one pass per card matters most). Reported: seconds per 100,000 raw reviews (wall and CPU; CPU time is the
steadier number on a shared machine) and the mean Log Loss of each trainer (they should agree closely).
"""

from __future__ import annotations

import os

for _var in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from bench.simulate import add_user_set_args, open_user_set  # noqa: E402
from config import RunConfig  # noqa: E402
from data_loader import load_revlogs  # noqa: E402
from runner import evaluate_user  # noqa: E402


def measure(cfg: RunConfig, root: Path, users: list[int]) -> tuple[float, float, float, int]:
    """(wall s, CPU s, mean Log Loss, raw reviews) over the users."""
    evaluate_user(users[0], cfg, root)  # first-call costs (numba cache load, torch) outside the timing
    wall = cpu = 0.0
    losses, reviews = [], 0
    for u in users:
        t0, c0 = time.perf_counter(), time.process_time()
        out = evaluate_user(u, cfg, root)
        wall += time.perf_counter() - t0
        cpu += time.process_time() - c0
        if out.record is None:
            raise SystemExit(f"user {u}: {out.error or out.skipped}")
        losses.append(out.record["metrics"]["LogLoss"])
        reviews += len(load_revlogs(root, u))
    return wall, cpu, sum(losses) / len(losses), reviews


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--models", default="GRU-P,GRU", help="comma-separated neural models")
    add_user_set_args(ap, users=3, reviews=20_000)
    ap.add_argument("--short", action="store_true", help="same-day reviews in the histories (e.g. GRU-P-short)")
    ap.add_argument("--no-upstream", action="store_true", help="time our trainer only")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        root, users, what = open_user_set(a, tmp)
        print(f"data: {what}; CPU, one thread")
        print("| model | trainer | reviews | wall s | CPU s | CPU s per 100k reviews | mean LogLoss | speed-up (CPU) |")
        print("|---|---|---|---|---|---|---|---|")
        for name in [m.strip() for m in a.models.split(",") if m.strip()]:
            ours = None
            for trainer in ("fast",) if a.no_upstream else ("fast", "upstream"):
                cfg = RunConfig(algo=name, short=a.short, trainer=trainer, processes=1, quiet=True)
                wall, cpu, ll, reviews = measure(cfg, root, users)
                ours = cpu if trainer == "fast" else ours
                ratio = "" if trainer == "fast" else f"{cpu / ours:.1f}x"
                print(f"| {cfg.name} | {trainer} | {reviews:,} | {wall:.2f} | {cpu:.2f} | {cpu * 1e5 / reviews:.2f} | "
                      f"{ll:.5f} | {ratio} |", flush=True)


if __name__ == "__main__":
    main()
