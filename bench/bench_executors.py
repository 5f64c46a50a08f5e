"""Dask executor overhead against the local process pool, and the projected wall time of the whole table.

    python bench/bench_executors.py overhead [--row FSRS-6-upstream-trainer] [--processes 2] [--repeat 2]
    python bench/bench_executors.py project  [--rows all] [--cores 8,32,128]

overhead: one row over the same simulated set (bench/simulate.py; --n-users users, --reviews raw reviews in all,
sizes log-uniform, seed fixed), as a user runs it: `python other.py --model ... --processes P --executor local` and
`... --executor dask` (a LocalCluster of P single-threaded workers), each in a fresh process with an empty result
folder, alternating, best of --repeat. Reports both whole-command wall times and their ratio (dask / local),
and the users' own time (sum of the result lines' time_ms) under each executor. The numba cache is warmed by one
untimed run first.

project: per-user cost of each row, measured on a small simulated set as the CPU time of `runner.evaluate_user` in
this process (one thread; the smallest and the largest user run once untimed per row first, so compilation is
not counted, also on the paths a user's size switches on; CPU time, so other jobs on the machine do not inflate
it): cost = a + b·reviews fitted per row by least squares over the users.
The whole table on the full data set (10,000 users, 727.7M raw reviews: the anki-revlogs-10k card) costs
Σ_rows (10,000·a + b·727.7M) CPU-seconds; on N cores with largest-first scheduling the wall time is that / N, as
long as the largest user fits (it does by far at these sizes). The fit is linear in reviews; a row whose cost
grows faster than linearly is underestimated, so the script also prints each row's largest measured user.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FULL_USERS = 10_000
FULL_REVIEWS = 727_738_650  # anki-revlogs-10k revlogs rows (dataset card)


def make_set(out: Path, n_users: int, total: int, seed: int, lo: int = 1000, hi: int = 60000) -> dict[int, int]:
    """Simulated users with log-uniform sizes scaled to `total` raw reviews; returns id → reviews."""
    from bench.simulate import write_users

    rng = np.random.default_rng(seed)
    sizes = np.exp(rng.uniform(np.log(lo), np.log(hi), n_users))
    sizes = np.maximum(300, np.round(sizes / sizes.sum() * total)).astype(int)
    for k, n in enumerate(sizes):
        write_users(out, int(n), 1, seed=seed + k, first_id=k + 1)
        write_decks(out, k + 1, seed + k)
    from data_loader import review_counts

    return review_counts(out, list(range(1, n_users + 1)))


def write_decks(root: Path, user: int, seed: int, n_decks: int = 6, n_presets: int = 3) -> None:
    """cards/ and decks/ tables for a simulated user (cards spread over decks, decks over presets), so that the
    -preset and -deck rows and the models that join these tables run as on real collections."""
    import pandas as pd

    from bench.sim_decks import write_tables

    rng = np.random.default_rng(seed)
    card_ids = pd.read_parquet(root / "revlogs" / f"user_id={user}")["card_id"].unique()
    cards = pd.DataFrame({"card_id": card_ids, "note_id": card_ids, "deck_id": rng.integers(0, n_decks, len(card_ids))})
    decks = pd.DataFrame({"deck_id": np.arange(n_decks), "parent_id": -1,
                          "preset_id": rng.integers(0, n_presets, n_decks)})
    write_tables(root, user, cards, decks)


def row_command(row_name: str) -> list[str]:
    import rows

    return ["other.py", *rows.BY_NAME[row_name].args()]


def run_row(row_name: str, data: Path, result_dir: Path, processes: int, executor: str = "local",
            users: str | None = None, cpu: list | None = None) -> tuple[float, list[dict]]:
    """Wall seconds of the whole command and its result lines; `cpu` gets the CPU seconds of the command and all
    its processes (workers included), which other jobs on the machine do not inflate."""
    cmd = [sys.executable, *row_command(row_name), "--data", str(data), "--result-dir", str(result_dir),
           "--processes", str(processes), "--executor", executor, "--quiet"]
    if users:
        cmd += ["--users", users]
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if cpu is not None:
        cpu.append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
    if proc.returncode != 0:
        raise RuntimeError(f"{row_name} ({executor}): exit {proc.returncode}\n{proc.stderr[-3000:]}")
    from runner import read_results

    return wall, read_results(result_dir / f"{row_name}.jsonl")[0]


def overhead(args) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        sizes = make_set(data, args.n_users, args.reviews, args.seed)
        print(f"set: {len(sizes)} simulated users, {sum(sizes.values()):,} raw reviews "
              f"(largest {max(sizes.values()):,}); row {args.row}; {args.processes} processes; "
              f"{os.cpu_count()} CPUs", flush=True)
        run_row(args.row, data, Path(tmp) / "warm", 1, users="1")  # numba cache
        best = {"local": (float("inf"), 0.0, 0.0), "dask": (float("inf"), 0.0, 0.0)}
        for rep in range(args.repeat):
            for executor in ("local", "dask"):
                out, cpu = Path(tmp) / f"{executor}-{rep}", []
                wall, lines = run_row(args.row, data, out, args.processes, executor, cpu=cpu)
                work = sum(l["time_ms"] for l in lines) / 1000
                print(f"  {executor:5s} run {rep + 1}: wall {wall:7.2f} s, CPU {cpu[0]:7.2f} s, users' time "
                      f"{work:7.2f} s, {len(lines)} users; load average {os.getloadavg()[0]:.1f}", flush=True)
                if wall < best[executor][0]:
                    best[executor] = (wall, cpu[0], work)
        (lw, lc, lwork), (dw, dc, dwork) = best["local"], best["dask"]
        print(f"best of {args.repeat}: wall local {lw:.2f} s, dask {dw:.2f} s → ratio dask/local {dw / lw:.3f}; "
              f"CPU local {lc:.1f} s, dask {dc:.1f} s → ratio {dc / lc:.3f} "
              f"(users' own time: local {lwork:.1f} s, dask {dwork:.1f} s)")


def project(args) -> None:
    import rows
    import local_pool
    import runner
    from config import RunConfig

    selected = [r for r in rows.select(args.rows) if rows.skip_reason(r) is None]
    cores = [int(c) for c in args.cores.split(",")]
    fits = []
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        sizes = make_set(data, args.n_users, args.reviews, args.seed)
        order = sorted(sizes, key=sizes.get)
        print(f"sample: {len(sizes)} simulated users, {sum(sizes.values()):,} raw reviews "
              f"({min(sizes.values()):,}–{max(sizes.values()):,} per user); CPU seconds per user in one process; "
              f"projection to {FULL_USERS:,} users / {FULL_REVIEWS:,} reviews", flush=True)
        print("| row | a (ms per user) | b (ms per 1k reviews) | largest user: reviews, CPU s | CPU-hours, 10k users |")
        print("|---|---|---|---|---|")
        local_pool.init_worker(1)
        base = RunConfig(data=data, processes=1, quiet=True)
        for row in selected:
            cfg = rows.config_for(row, base)
            try:
                # warm-up (imports, compilation, caches) at both ends: some paths start at a size (lowess ≥ 2,000)
                for user in dict.fromkeys((order[0], order[-1])):
                    runner.evaluate_user(user, cfg, data)
                n, t = [], []
                for user in order:
                    t0 = time.process_time()
                    outcome = runner.evaluate_user(user, cfg, data)
                    dt = time.process_time() - t0
                    if outcome.error:
                        raise RuntimeError(f"user {user}: {outcome.error}")
                    if outcome.record is not None:
                        n.append(sizes[user])
                        t.append(dt * 1000)
            except Exception as exc:
                print(f"| {row.name} | failed: {str(exc).splitlines()[0][:100]} | | | |", flush=True)
                continue
            n, t = np.array(n, dtype=float), np.array(t, dtype=float)
            (a, b), *_ = np.linalg.lstsq(np.stack([np.ones_like(n), n], axis=1), t, rcond=None)
            if b < 0 or a < 0:  # keep the fit physical: fall back to a pure per-review cost
                a, b = 0.0, float(t.sum() / n.sum())
            cpu_s = (FULL_USERS * a + b * FULL_REVIEWS) / 1000
            big = int(np.argmax(n))
            fits.append((row.name, cpu_s))
            print(f"| {row.name} | {a:.0f} | {b * 1000:.2f} | {int(n[big]):,}, {t[big] / 1000:.2f} | "
                  f"{cpu_s / 3600:.2f} |", flush=True)
    total = sum(c for _, c in fits)
    print(f"\nwhole table ({len(fits)} rows): {total / 3600:.1f} CPU-hours")
    for c in cores:
        print(f"  on {c} cores: {total / c / 3600:.2f} h wall ({total / c / 60:.0f} min)")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": dict(fits), "total_cpu_s": total}, indent=1))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    o = sub.add_parser("overhead", help="dask vs local wall time on one row",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    o.add_argument("--row", default="FSRS-6-upstream-trainer", help="row (rows.py) to run")
    o.add_argument("--processes", type=int, default=os.cpu_count() or 1)
    o.add_argument("--n-users", type=int, default=40)
    o.add_argument("--reviews", type=int, default=600_000, help="raw reviews in the simulated set, in all")
    o.add_argument("--repeat", type=int, default=2, help="runs per executor (alternating); the best counts")
    o.add_argument("--seed", type=int, default=11)
    p = sub.add_parser("project", help="per-row cost and the whole table's projected wall time",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--rows", default=None, help="rows to measure (rows.py names); default: every runnable row")
    p.add_argument("--n-users", type=int, default=6)
    p.add_argument("--reviews", type=int, default=120_000, help="raw reviews in the sample set, in all")
    p.add_argument("--cores", default="8,32,64,128", help="core counts to project to")
    p.add_argument("--seed", type=int, default=5)
    p.add_argument("--json", default=None, help="also write the per-row CPU seconds here")
    args = ap.parse_args(argv)
    overhead(args) if args.what == "overhead" else project(args)


if __name__ == "__main__":
    main()
