"""Users per second of the batched neural path (`--batch-users K`, neural/neural_batched.py: GRU-P, GRU, NN-17, LSTM,
Transformer) vs the per-user path.

    python -m bench.bench_gpu --models GRU-P,GRU --users 16 --reviews 10000 --device cpu --batch-users 4,16
    python -m bench.bench_gpu --device cuda --users 256 --batch-users 16,64,256        # on a GPU machine

Both paths evaluate every user as `other.py` does (features, TimeSeriesSplit(5), one fine-tune per fold from the
pretrained weights, predictions, metrics), in this process. Per-user: runner.evaluate_user, compiled on the CPU,
one thread (a run multiplies it by --processes). Batched: runner.evaluate_chunk over chunks of K users on --device
(CPU: one thread too). Users are simulated (bench/simulate.py, seeds --seed, --seed+1, ...) unless --data is given.
First-call costs (numba cache, torch, CUDA context) are paid outside the timing. Reported: users/s, seconds per
100,000 raw reviews, mean Log Loss, and the largest per-user Log Loss difference from the per-user path.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench.simulate import add_user_set_args, open_user_set  # noqa: E402
from config import RunConfig  # noqa: E402
from data_loader import review_counts  # noqa: E402
from runner import evaluate_chunk, evaluate_user  # noqa: E402


def timed(fn) -> tuple[float, dict[int, float]]:
    """(wall seconds, user → LogLoss) of fn() → outcomes."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    outcomes = fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    bad = [f"user {o.user}: {o.error or o.skipped}" for o in outcomes if o.record is None]
    if bad:
        raise SystemExit("; ".join(bad))
    return wall, {o.user: o.record["metrics"]["LogLoss"] for o in outcomes}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--models", default="GRU-P,GRU,NN-17,LSTM,Transformer",
                    help="comma-separated, of the models with a batched trainer: GRU-P, GRU, NN-17, LSTM, Transformer")
    add_user_set_args(ap, users=8, reviews=10_000)
    ap.add_argument("--device", default="cpu", help="device of the batched path: cpu, cuda, cuda:N")
    ap.add_argument("--batch-users", default="4,8", help="comma-separated chunk sizes K to time")
    ap.add_argument("--no-per-user", action="store_true", help="time the batched path only")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    sizes = [int(k) for k in a.batch_users.split(",") if k.strip()]
    with tempfile.TemporaryDirectory() as tmp:
        root, users, what = open_user_set(a, tmp)
        reviews = sum(review_counts(root, users).values())
        gpu = torch.cuda.get_device_name(torch.device(a.device)) if a.device.startswith("cuda") else "CPU, 1 thread"
        print(f"data: {what}; "
              f"batched on {a.device} ({gpu}); per-user path: CPU, 1 thread")
        print("| model | path | K | users/s | s per 100k reviews | mean LogLoss | max abs ΔLogLoss vs per-user |")
        print("|---|---|---|---|---|---|---|")
        for name in [m.strip() for m in a.models.split(",") if m.strip()]:
            cfg = RunConfig(algo=name, processes=1, quiet=True, device=a.device)
            evaluate_user(users[0], cfg, root)  # warm-up of both paths, outside the timing
            evaluate_chunk(users[:1], cfg, root, a.device)
            ref = None
            if not a.no_per_user:
                wall, ref = timed(lambda: [evaluate_user(u, cfg, root) for u in users])
                print(f"| {name} | per-user | 1 | {len(users) / wall:.2f} | {wall * 1e5 / reviews:.2f} | "
                      f"{sum(ref.values()) / len(ref):.6f} | |", flush=True)
            for k in sizes:
                chunks = [users[i:i + k] for i in range(0, len(users), k)]
                wall, got = timed(lambda: [o for c in chunks for o in evaluate_chunk(c, cfg, root, a.device)])
                diff = "" if ref is None else f"{max(abs(got[u] - ref[u]) for u in users):.1e}"
                print(f"| {name} | batched | {k} | {len(users) / wall:.2f} | {wall * 1e5 / reviews:.2f} | "
                      f"{sum(got.values()) / len(got):.6f} | {diff} |", flush=True)


if __name__ == "__main__":
    main()
