"""How long the README tables' BCa bootstrap takes for a full benchmark: 10,000 users × 35 models.

    python bench/bench_bootstrap.py                       # fast path, all models; scipy's call for one column
    python bench/bench_bootstrap.py --users 2000 --models 8 --write /tmp/demo   # also write demo result files

Generated per-user results: lognormal review counts, Log Loss ≈ 0.35 ± 0.1 per user plus a per-model offset,
RMSE(bins), AUC (null for ~0.5% of users). Each table needs 3 metrics × 2 weightings per model, each a 9999-resample
BCa interval. Reported: seconds per model (all 6 intervals) and peak memory (tracemalloc: numpy buffers).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import evaluate  # noqa: E402

DEMO_NAMES = ["LSTM", "GRU-P-short", "FSRS-6-recency", "FSRS-rs", "FSRS-6", "FSRS-6-preset", "GRU-P",
              "FSRS-6-binary", "FSRS-5", "FSRS-6-deck", "FSRS-4.5", "FSRSv4", "DASH-short", "FSRS-6-S0", "DASH",
              "DASH[MCM]", "GRU", "DASH[ACT-R]", "FSRS-6-default", "ACT-R", "AVG", "FSRSv3", "FSRSv2", "NN-17",
              "FSRSv1", "Anki-trainable", "HLR", "HLR-short", "SM2-trainable", "Transformer", "Ebisu-v2", "Anki",
              "SM2-short", "SM2", "RMSE-BINS-EXPLOIT"]


def make_results(n_users: int = 10_000, n_models: int = 35, seed: int = 0):
    """Per-model dict of arrays (users, size, LogLoss, RMSE(bins), AUC) that look like a real benchmark run."""
    rng = np.random.default_rng(seed)
    users = np.arange(1, n_users + 1)
    size = np.maximum(6, np.round(rng.lognormal(7.5, 1.5, n_users))).astype(np.int64)
    base = np.clip(rng.normal(0.35, 0.1, n_users), 0.05, None)
    base_bins = np.clip(rng.normal(0.07, 0.03, n_users), 0.005, None)
    base_auc = np.clip(rng.normal(0.68, 0.06, n_users), 0.3, 0.98)
    auc_null = rng.random(n_users) < 0.005
    offsets = np.sort(np.concatenate([[0.0], rng.gamma(1.2, 0.03, n_models - 1)]))
    names = (DEMO_NAMES + [f"model-{i}" for i in range(len(DEMO_NAMES), n_models)])[:n_models]
    models = {}
    for j, name in enumerate(names):
        small = 1 / np.sqrt(size / 1000 + 0.2)  # small collections are noisier
        ll = np.clip(base + offsets[j] * (1 + 0.5 * rng.standard_normal(n_users)) +
                     0.02 * small * rng.standard_normal(n_users), 0.02, None)
        rb = np.clip(base_bins + offsets[j] * 0.4 + 0.01 * small * rng.standard_normal(n_users), 0.001, None)
        auc = np.clip(base_auc - offsets[j] * 0.5 + 0.02 * rng.standard_normal(n_users), 0.2, 1.0)
        models[name] = {"users": users, "size": size, "LogLoss": np.round(ll, 6), "RMSE(bins)": np.round(rb, 6),
                        "AUC": np.where(auc_null, np.nan, np.round(auc, 6)), "n_params": None}
    return models


def write_results(models: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, d in models.items():
        with open(out / f"{name}.jsonl", "w") as fh:
            for i, u in enumerate(d["users"]):
                auc = d["AUC"][i]
                fh.write(json.dumps({"metrics": {"RMSE": 0.0, "LogLoss": d["LogLoss"][i],
                                                 "RMSE(bins)": d["RMSE(bins)"][i],
                                                 "AUC": None if np.isnan(auc) else auc, "ICI": 0.0, "MBE": 0.0},
                                     "user": int(u), "size": int(d["size"][i])}) + "\n")


def to_model_results(models: dict) -> list[evaluate.ModelResults]:
    return [evaluate.ModelResults(name, d["users"], d["size"].astype(float),
                                  {k: d[k] for k in ("LogLoss", "RMSE(bins)", "AUC")}) for name, d in models.items()]


def measure(fn):
    tracemalloc.start()
    t = time.perf_counter()
    out = fn()
    elapsed = time.perf_counter() - t
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return out, elapsed, peak / 2**20


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--users", type=int, default=10_000)
    ap.add_argument("--models", type=int, default=35)
    ap.add_argument("--batch", type=int, default=500, help="resamples per batch in the fast path")
    ap.add_argument("--no-scipy", action="store_true", help="skip timing scipy's own (vectorised) call")
    ap.add_argument("--scipy-loop", action="store_true",
                    help="also time scipy with a non-vectorised statistic (one column; slow)")
    ap.add_argument("--write", type=Path, default=None, help="also write the generated result files here")
    args = ap.parse_args(argv)

    models = make_results(args.users, args.models)
    if args.write:
        write_results(models, args.write)
        print(f"wrote {len(models)} result files to {args.write}")
    results = to_model_results(models)
    print(f"{args.users:,} users × {args.models} models; 3 metrics × 2 weightings = "
          f"{6 * args.models} BCa intervals of 9999 resamples")

    cells = {}

    def fast():
        for weighted in (True, False):
            cells[weighted] = evaluate.compute_table_cells(results, weighted=weighted, batch=args.batch)

    _, t_fast, mem_fast = measure(fast)
    print(f"fast path (evaluate.weighted_mean_cis): {t_fast:.1f} s in all, {t_fast / args.models:.2f} s per model "
          f"(6 intervals), peak {mem_fast:.0f} MiB")

    if not args.no_scipy:
        first = results[0]
        v, w = first.metrics["LogLoss"], first.size
        (lo, hi), t_sp, mem_sp = measure(lambda: evaluate.weighted_mean_ci_scipy(v, w, vectorized=True))
        print(f"scipy.stats.bootstrap, vectorised statistic (upstream's newer call): {t_sp:.1f} s per interval, "
              f"{6 * t_sp:.1f} s per model, peak {mem_sp:.0f} MiB")
        (lo_b, hi_b), t_spb, mem_spb = measure(
            lambda: evaluate.weighted_mean_ci_scipy(v, w, vectorized=True, batch=1000))
        print(f"  same with batch=1000: {t_spb:.1f} s per interval, peak {mem_spb:.0f} MiB")
        fast_cell = cells[True][(first.name, "LogLoss")]
        _, flo, fhi = evaluate.weighted_mean_cis(v, w)
        print(f"  agreement with the fast path: |Δlow| = {abs(lo - flo):.1e}, |Δhigh| = {abs(hi - fhi):.1e}, "
              f"batch=1000 |Δ| = {max(abs(lo_b - flo), abs(hi_b - fhi)):.1e}; ± = {fast_cell.text}")
        if args.scipy_loop:
            (lo2, hi2), t_loop, mem_loop = measure(lambda: evaluate.weighted_mean_ci_scipy(v, w, vectorized=False))
            print(f"scipy.stats.bootstrap, non-vectorised statistic: {t_loop:.1f} s per interval, "
                  f"{6 * t_loop:.0f} s per model, peak {mem_loop:.0f} MiB; |Δ| vs fast = "
                  f"{max(abs(lo2 - flo), abs(hi2 - fhi)):.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
