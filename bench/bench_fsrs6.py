"""FSRS-6 training speed and held-out Log Loss: our fast trainer vs fsrs-rs-python vs the upstream-style trainer.

    python bench/bench_fsrs6.py                          # 100k reviews
    python bench/bench_fsrs6.py --sizes 10000 100000 400000 --optimizer --repeat 3

For each size: one simulated user (bench/simulate.py, seed --seed) → features.build_features (same-day reviews in
histories, as FSRS-6 runs) → rows in time order; the first 5/6 train, the last 1/6 is held out. Every trainer runs in
its own child process with one thread (torch.set_num_threads(1), NUMBA_NUM_THREADS=1, RAYON_NUM_THREADS=1), so peak
RSS is per trainer (it includes the interpreter and imports: torch alone is ~300 MB). Times are the best of
--repeat runs of the training call only (data preparation for the peers, e.g. building FSRSItems, is not timed;
our fit's own preparation is). JIT: our kernels are loaded/compiled before timing; the cold compile time (empty
numba cache) is measured once in a separate process and printed below the table.

Trainers:
- fast (ours): S0 initialisation (models/fsrs_init.py, as the upstream trainer) + models.fsrs6.fit (the engine's Adam,
  cards in mini-batches). "fit" is the fit alone, "S0+fit" includes the initialisation (what fsrs-rs's
  `benchmark` does internally). Also timed (progress lines): one forward pass (predict) and one loss+gradient
  over the training rows at the initial weights.
- fast-lbfgs: same objective, full-batch L-BFGS-B (for comparison).
- rust: fsrs_rs_python `FSRS([]).benchmark(items)` with one FSRSItem per training target (history + target);
  it always recency-weights and floors same-day Hard at 1 (G >= 2), so its held-out Log Loss is computed with
  that rule.
- upstream: models.fsrs6.FSRS6 with trainer="upstream" (torch float32, Adam minibatches, 5 epochs).
- fsrs-optimizer (--optimizer): Optimizer.initialize_parameters + train(), fsrs-optimizer 6.5.0.

Held-out Log Loss = mean BCE over the held-out rows, predicted in float64 with the trained weights.
"""

from __future__ import annotations

import os

for _var in ("NUMBA_NUM_THREADS", "RAYON_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import pickle  # noqa: E402
import resource  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TRAINERS = ["fast", "fast-lbfgs", "rust", "upstream", "optimizer"]


def peak_rss_mb() -> float:
    """This process's peak RSS (VmHWM; unlike ru_maxrss it is not inherited from the parent across exec)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def build_split(n_reviews: int, seed: int):
    from bench.simulate import simulate_user
    from features import FeatureConfig, build_features

    revlog = simulate_user(n_reviews, seed)
    data = build_features(revlog, FeatureConfig(short=True, max_seq_len=64))
    n = len(data)
    n_train = n - n // 6
    train = data.subset(np.arange(n_train))
    test = data.subset(np.arange(n_train, n))
    return train, test


def log_loss(p: np.ndarray, y: np.ndarray) -> float:
    p = np.clip(p, 1e-15, 1 - 1e-15)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def _cfg(recency: bool, trainer: str):
    from config import RunConfig

    return RunConfig(trainer=trainer, recency=recency)


def _s0(train, recency):
    from models.fsrs6 import FSRS6

    cfg = _cfg(recency, "upstream")
    cfg.S0 = True
    return np.array(FSRS6(cfg).fit(train).w, dtype=np.float64)


def worker(trainer: str, data_path: str, repeat: int, recency: bool) -> dict:
    """Runs in a child process: time one trainer, return its weights, timings and peak RSS."""
    import torch

    torch.set_num_threads(1)
    with open(data_path, "rb") as fh:
        train, test = pickle.load(fh)
    from models import fsrs6 as ff

    rss0 = peak_rss_mb()
    t0 = time.perf_counter()
    ff.warmup()
    jit = time.perf_counter() - t0
    out: dict = {"trainer": trainer, "jit_load_s": jit, "rss_start_mb": rss0}
    times, s0_times = [], []
    clamp_grade = 3
    w = None
    for _ in range(repeat):
        if trainer in ("fast", "fast-lbfgs"):
            t0 = time.perf_counter()
            w_init = _s0(train, recency)
            t1 = time.perf_counter()
            w = ff.fit(w_init, ff.SIGMA, train, _cfg(recency, "fast"),
                       method="adam" if trainer == "fast" else "lbfgs")
            t2 = time.perf_counter()
            s0_times.append(t1 - t0)
            times.append(t2 - t1)
        elif trainer == "rust":
            from fsrs_rs_python import FSRS, FSRSItem, FSRSReview

            rows = train.rows
            items = []
            for start, pos, dt, g in zip(rows["seq_start"].to_numpy(), rows["seq_pos"].to_numpy(),
                                         rows["delta_t"].to_numpy(), rows["rating"].to_numpy()):
                hist = [FSRSReview(int(r), int(t)) for t, r in zip(train.seq_delta_t[start:start + pos],
                                                                    train.seq_rating[start:start + pos])]
                hist.append(FSRSReview(int(g), int(dt)))
                items.append(FSRSItem(hist))
            t0 = time.perf_counter()
            w = np.array(FSRS([]).benchmark(items), dtype=np.float64)
            times.append(time.perf_counter() - t0)
            clamp_grade = 2
        elif trainer == "upstream":
            from models.fsrs6 import FSRS6

            t0 = time.perf_counter()
            w = np.array(FSRS6(_cfg(recency, "upstream")).fit(train).w, dtype=np.float64)
            times.append(time.perf_counter() - t0)
        elif trainer == "optimizer":
            import contextlib
            import io

            from fsrs_optimizer import Optimizer

            from features import history_strings

            df = train.rows.copy()
            df["t_history"], df["r_history"] = history_strings(train)
            df["review_time"] = df["review_th"]
            df = df[["card_id", "review_time", "t_history", "r_history", "delta_t", "y", "i"]]
            t0 = time.perf_counter()
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                opt = Optimizer()
                opt.define_model()
                opt.initialize_parameters(dataset=df.copy(), verbose=False)
                opt.train(verbose=False, recency_weight=recency)
            times.append(time.perf_counter() - t0)
            w = np.array(opt.w, dtype=np.float64)
            clamp_grade = 2  # fsrs-optimizer 6.5.0 floors same-day SInc for G >= 2
        else:
            raise ValueError(trainer)
    out["time_s"] = min(times)
    out["s0_s"] = min(s0_times) if s0_times else 0.0
    if trainer == "fast":  # one forward pass (predict) and one loss+gradient over the training rows, best of repeat
        w_init = _s0(train, recency)
        fwd, grad = [], []
        for _ in range(max(repeat, 3)):
            t0 = time.perf_counter()
            ff.predict(w_init, train)
            t1 = time.perf_counter()
            ff.loss_and_grad(w_init, w_init, ff.SIGMA, train, max_seq_len=64)
            fwd.append(t1 - t0)
            grad.append(time.perf_counter() - t1)
        out["forward_s"], out["grad_s"] = min(fwd), min(grad)
    y = test.rows["y"].to_numpy(np.float64)
    out["logloss"] = log_loss(ff.predict(w, test, floor_grade=clamp_grade), y)
    out["logloss_g3"] = log_loss(ff.predict(w, test, floor_grade=3), y)
    yt = train.rows["y"].to_numpy(np.float64)
    out["train_logloss"] = log_loss(ff.predict(w, train, floor_grade=clamp_grade), yt)
    if trainer in ("fast", "fast-lbfgs", "upstream"):
        w_init = _s0(train, recency)
        weights = ff.recency_weights(len(train)) if recency else None
        out["objective"] = ff.loss_and_grad(w, w_init, ff.SIGMA, train, weights, max_seq_len=64)[0]
    out["w"] = [float(x) for x in w]
    out["peak_rss_mb"] = peak_rss_mb()
    return out


def cold_compile_seconds() -> float:
    """First-call JIT time of the engine's FSRS-6 kernels with an empty numba cache, in a fresh process."""
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache, PYTHONPATH=str(ROOT))
        code = ("import time; t=time.perf_counter(); from models import fsrs6 as f; f.warmup(); "
                "print(time.perf_counter()-t)")
        res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=ROOT)
        return float(res.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[100_000], help="reviews per simulated user")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--repeat", type=int, default=3, help="timed runs per trainer (best is reported)")
    p.add_argument("--recency", action="store_true", help="recency-weighted objective for ours and upstream")
    p.add_argument("--optimizer", action="store_true", help="also time fsrs-optimizer (slow: ~7 s per 100k)")
    p.add_argument("--no-upstream", action="store_true", help="skip the torch upstream-style trainer")
    p.add_argument("--no-lbfgs", action="store_true", help="skip the L-BFGS-B variant")
    p.add_argument("--worker", nargs=2, metavar=("TRAINER", "DATA"), help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        print(json.dumps(worker(a.worker[0], a.worker[1], a.repeat, a.recency)))
        return

    trainers = ["fast"] + ([] if a.no_lbfgs else ["fast-lbfgs"]) + ["rust"]
    try:
        import models.fsrs6  # noqa: F401

        if not a.no_upstream:
            trainers.append("upstream")
    except ImportError:
        print("(models.fsrs6 not importable: upstream-style trainer skipped)", file=sys.stderr)
    if a.optimizer:
        trainers.append("optimizer")

    lines = ["| reviews | train targets | trainer | S0 init (s) | fit (s) | ratio fit/rust | ratio S0+fit/rust "
             "| objective | train LL | held-out LL | peak RSS (MB) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for n in a.sizes:
        train, test = build_split(n, a.seed)
        with tempfile.NamedTemporaryFile(suffix=".pkl", delete=False) as fh:
            pickle.dump((train, test), fh)
            path = fh.name
        results = {}
        try:
            for tr in trainers:
                rep = 1 if tr in ("upstream", "optimizer") else a.repeat
                cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", tr, path, "--repeat", str(rep)]
                if a.recency:
                    cmd.append("--recency")
                res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
                if res.returncode != 0:
                    print(f"{tr} failed at {n}: {res.stderr[-2000:]}", file=sys.stderr)
                    continue
                results[tr] = json.loads(res.stdout.strip().splitlines()[-1])
                extra = (f", forward {results[tr]['forward_s'] * 1e3:.1f} ms, loss+gradient "
                         f"{results[tr]['grad_s'] * 1e3:.1f} ms" if "forward_s" in results[tr] else "")
                print(f"  {n} {tr}: fit {results[tr]['time_s']:.3f} s, S0 {results[tr]['s0_s'] * 1e3:.1f} ms, "
                      f"LL {results[tr]['logloss']:.5f}{extra}", file=sys.stderr)
        finally:
            os.unlink(path)
        rust_t = results["rust"]["time_s"] if "rust" in results else float("nan")
        for tr, r in results.items():
            total = r["time_s"] + r["s0_s"]
            obj = f"{r['objective']:.2f}" if "objective" in r else "–"
            ll = f"{r['logloss']:.5f}"
            if tr in ("rust", "optimizer"):
                ll += f" ({r['logloss_g3']:.5f} G≥3)"
            lines.append(f"| {n:,} | {len(train):,} | {tr} | {r['s0_s']:.3f} | {r['time_s']:.3f} | "
                         f"{r['time_s'] / rust_t:.2f} | {total / rust_t:.2f} | {obj} | {r['train_logloss']:.5f} | "
                         f"{ll} | {r['peak_rss_mb']:.0f} |")
        if "fast" in results and "upstream" in results:
            diff = results["fast"]["logloss"] - results["upstream"]["logloss"]
            print(f"  {n}: held-out LL fast − upstream = {diff:+.5f} (criterion ≤ +0.0005: "
                  f"{'OK' if diff <= 5e-4 else 'FAIL'})", file=sys.stderr)
    print("\n".join(lines))
    print(f"\nJIT: cold compile of the engine's FSRS-6 kernels (empty cache) {cold_compile_seconds():.1f} s; "
          f"cached load in a new process ≈ {results.get('fast', {}).get('jit_load_s', float('nan')):.2f} s "
          f"(neither is in the fit times).")


if __name__ == "__main__":
    main()
