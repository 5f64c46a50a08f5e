"""Fit time and held-out Log Loss per model: our trainer vs the upstream-style trainer, side by side.

    python bench/bench_models.py --models FSRSv4,FSRS-4.5 --sizes 10000 100000
    python bench/bench_models.py --models HLR,DASH --no-upstream      # ours only: seconds per 100k reviews

For each size: one simulated user (bench/simulate.py, seed --seed) → features.build_features with the model's own
feature settings (same-day reviews in histories for FSRS-5/6) → rows in time order; the first 5/6 train, the last
1/6 is held out. For each model, `fit` is timed for `--trainer fast` (ours: the compiled one-pass-per-card engine,
S0 initialisation included) and `--trainer upstream` (srs-benchmark's torch trainer over per-target padded
histories), one thread each (torch, numba, BLAS), best of --repeat. Compilation is done before timing (numba's disk
cache; the first run of a fresh checkout compiles once). Held-out Log Loss is computed from each trained model's own
`predict`. "per 100k" is our fit + predict time for 100,000 raw reviews of the user (the size of the simulated revlog).
"""

from __future__ import annotations

import os

for _var in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from sklearn.metrics import log_loss  # noqa: E402

import models  # noqa: E402
from bench.simulate import simulate_user  # noqa: E402
from config import RunConfig  # noqa: E402
from features import FeatureConfig, build_features  # noqa: E402


def split(data):
    n = len(data)
    cut = n - n // 6
    return data.subset(np.arange(cut)), data.subset(np.arange(cut, n))


def time_fit(cfg, train, test, repeat: int):
    """(fit seconds, fit + predict seconds, held-out Log Loss), best of `repeat`."""
    best, best_total, model = np.inf, np.inf, None
    for _ in range(repeat):
        model = models.create(cfg)
        t0 = time.perf_counter()
        model.fit(train)
        t1 = time.perf_counter()
        p = model.predict(test)
        t2 = time.perf_counter()
        best, best_total = min(best, t1 - t0), min(best_total, t2 - t0)
    p = np.clip(p, 1e-7, 1 - 1e-7)
    return best, best_total, float(log_loss(test.rows["y"], p, labels=[0, 1]))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--models", default="FSRSv4,FSRS-4.5", help="comma-separated registry names")
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000], help="raw reviews per user")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=1, help="timing repeats (best is kept)")
    ap.add_argument("--no-upstream", action="store_true", help="time our trainer only")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    names = [m.strip() for m in a.models.split(",") if m.strip()]
    print("| model | reviews | train rows | ours fit (s) | ours fit+predict per 100k reviews (s) | "
          "upstream-style fit (s) | ratio | held-out LL ours | held-out LL upstream-style |")
    print("|---|---|---|---|---|---|---|---|---|")
    for size in a.sizes:
        revlog = simulate_user(size, seed=a.seed)
        for name in names:
            name, _, flag = name.partition(":")  # e.g. "SM2:short"
            cfg = RunConfig(algo=name, short=flag == "short")
            data = build_features(revlog, FeatureConfig.from_run(cfg))
            train, test = split(data)
            small = train.subset(np.arange(min(len(train), 300)))
            models.create(cfg).fit(small).predict(small)  # compile / load the kernels outside the timing
            if not a.no_upstream:
                models.create(RunConfig(algo=name, trainer="upstream", short=flag == "short")).fit(small)
            ours, total, ll_ours = time_fit(cfg, train, test, a.repeat)
            per100k = total * 100_000 / size
            if a.no_upstream:
                up, ll_up, ratio = float("nan"), float("nan"), float("nan")
            else:
                up_cfg = RunConfig(algo=name, trainer="upstream", short=flag == "short")
                up, _, ll_up = time_fit(up_cfg, train, test, 1)
                ratio = up / ours
            up_cells = "— | — | —" if a.no_upstream else f"{up:.2f} | {ratio:.1f}× | {ll_up:.4f}"
            up_time, up_ratio, up_ll = up_cells.split(" | ")
            print(f"| {name}{'-short' if flag else ''} | {size:,} | {len(train):,} | {ours:.3f} | {per100k:.3f} | "
                  f"{up_time} | {up_ratio} | {ll_ours:.4f} | {up_ll} |", flush=True)


if __name__ == "__main__":
    main()
