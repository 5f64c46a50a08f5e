"""The whole README table in one command: every row (rows.py), then the tables and plots.

    python run_table.py                                   # every row, all cores, then README tables + plots
    python run_table.py --rows FSRS-6,HLR --processes 8
    python run_table.py --executor dask                   # a LocalCluster on this machine
    python run_table.py --executor dask --scheduler tcp://head:8786 --data s3://bucket/anki-revlogs-10k
    python run_table.py --list                            # what each row runs, and whether it can run now

Each row is one `runner.run` (the same code as `other.py --model X ...`): users already in `result/<row>.jsonl`
are skipped, so an interrupted table resumes where it stopped and a finished row costs nothing. Rows whose model is
not registered yet are skipped with a note. With `--executor dask` all rows share one cluster. Afterwards
`evaluate.py --all-tables` rewrites the tables in the README in upstream's current layout (unweighted, without and
with same-day reviews; over every row that has a result file, not only the rows just run) and draws the superiority
and significance plots (over the without-same-day table's rows). The seeds' layout (weighted + unweighted) is
`python evaluate.py --layout seeds`.

Exit code: 0 when every selected runnable row finished every user; 1 when some user failed (see the log: each
failure names the user and the reason); 2 for unusable data, an unreachable scheduler or a bad --rows.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

import rows as table_rows
from config import REPO_ROOT, RunConfig, data_arg, parse_users


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="Run every row of the README table (or --rows), skipping rows and users "
                                            "already done, then regenerate the README tables and the plots.",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--rows", default=None,
                   help="comma-separated rows to run, by result-file name (FSRS-6-default) or README name "
                        "(FSRS-6 default param.); default: every row (see --list)")
    p.add_argument("--list", action="store_true",
                   help="print every row: its single-row command, whether it can run now, users in its result file")
    p.add_argument("--executor", choices=["local", "dask"], default="local",
                   help="local: a process pool on this machine; dask: users as tasks on a Dask cluster")
    p.add_argument("--scheduler", default=None, metavar="ADDRESS",
                   help="with --executor dask: scheduler address (tcp://host:8786); default: a LocalCluster of "
                        "--processes workers on 127.0.0.1")
    p.add_argument("--data", type=data_arg, default=None,
                   help="dataset root (anki-revlogs-10k layout): folder or fsspec URL (s3://, gs://, file://); "
                        "default: ../anki-revlogs-10k if it exists, else the embedded data set")
    p.add_argument("--processes", type=int, default=os.cpu_count() or 1,
                   help="worker processes (local pool, or the LocalCluster's workers); 1 runs in this process; "
                        "default: all cores (%(default)s on this machine)")
    p.add_argument("--users", default=None, help="only these user ids or ranges, e.g. 1-1000,2500")
    p.add_argument("--max-user-id", dest="max_user_id", type=int, default=None, help="only users with id <= N")
    p.add_argument("--result-dir", dest="result_dir", type=Path, default=REPO_ROOT / "result",
                   help="folder of result/<row>.jsonl files")
    p.add_argument("--readme", type=Path, default=REPO_ROOT / "README.md",
                   help="file whose <!-- tables:start/end --> block is rewritten with the tables, in upstream's "
                        "current layout (evaluate.py --all-tables; the seeds' layout is evaluate.py --layout seeds)")
    p.add_argument("--all-rows-doc", dest="all_rows_doc", type=Path, default=REPO_ROOT / "docs" / "results.md",
                   help="file whose <!-- tables:start/end --> block is rewritten with every row without same-day "
                        "reviews that has results, in the seeds' layout (review-weighted and unweighted; evaluate.py "
                        "--layout seeds)")
    p.add_argument("--plots", type=Path, default=REPO_ROOT / "plots",
                   help="folder for plots/Superiority-<n>.png, Wilcoxon-/T-test-<n>-collections.png")
    p.add_argument("--no-tables", dest="tables", action="store_false", default=argparse.SUPPRESS,
                   help="only run the rows: do not touch the README or the plots")
    p.add_argument("--causal", action="store_true",
                   help="every row with --causal, srs-bench's leak-free protocol (each fold's outlier rule from its "
                        "past alone; docs/causal.md): result files <row>-causal.jsonl; rows whose model refuses it "
                        "are skipped; the README tables are not regenerated (compare with evaluate.py --models)")
    p.add_argument("--n-resamples", type=int, default=9999, help="bootstrap resamples for the tables' intervals")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    return p


def base_config(args: argparse.Namespace) -> RunConfig:
    cfg = RunConfig(data=args.data, processes=max(1, args.processes), users=parse_users(args.users),
                    max_user_id=args.max_user_id, result_dir=args.result_dir, quiet=args.quiet,
                    executor=args.executor, scheduler=args.scheduler)
    cfg.raw_dir = cfg.result_dir.parent / "raw"
    cfg.evaluation_dir = cfg.result_dir.parent / "evaluation"
    return cfg


def count_lines(path: Path) -> int:
    from runner import read_results

    return len(read_results(path)[0])


def list_rows(result_dir: Path) -> None:
    from evaluate import current_label

    width = max(len(r.name) for r in table_rows.ROWS)
    for table, title in (("day", "Without same-day reviews"), ("same-day", "With same-day reviews")):
        print(f"# {title}")
        for row in (r for r in table_rows.ROWS if r.table == table):
            reason = table_rows.skip_reason(row)
            done = count_lines(result_dir / f"{row.name}.jsonl")
            state = f"skipped: {reason}" if reason else f"runnable, {done} user(s) in {row.name}.jsonl"
            print(f"{row.name:<{width}}  {current_label(row.name):<28} {row.command():<58} {state}")


def regenerate_tables(args: argparse.Namespace) -> int:
    """The README's tables (upstream's current two, over its current rows) and plots, and every row without
    same-day reviews in the seeds' layout (--all-rows-doc), over the rows that have results."""
    import evaluate

    names = [r.name for r in table_rows.ROWS if count_lines(args.result_dir / f"{r.name}.jsonl") > 0]
    if not names:
        print("no result files yet: tables not regenerated", file=sys.stderr)
        return 0
    current = [n for n in names if table_rows.BY_NAME[n].current]
    common = ["--results", str(args.result_dir), "--n-resamples", str(args.n_resamples)]
    argv = [*common, "--models", ",".join(current or names), "--readme", str(args.readme), "--plots",
            str(args.plots), "--all-tables"]
    if len(current) >= 2:
        args.plots.mkdir(parents=True, exist_ok=True)
        argv += ["--superiority", "--significance"]
    print(f"tables: python evaluate.py {' '.join(argv)}", file=sys.stderr)
    code = evaluate.main(argv)
    if code != 0 or args.all_rows_doc is None or not args.all_rows_doc.exists():
        return code
    day = [n for n in names if table_rows.BY_NAME[n].table == "day"]  # the seeds' tables are day-mode tables
    if not day:
        return code
    argv = [*common, "--models", ",".join(day), "--readme", str(args.all_rows_doc), "--layout", "seeds"]
    print(f"every row: python evaluate.py {' '.join(argv)}", file=sys.stderr)
    return evaluate.main(argv)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.tables = getattr(args, "tables", True)  # --no-tables sets it False
    if args.list:
        list_rows(args.result_dir)
        return 0
    try:
        selected = table_rows.select(args.rows)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.scheduler and args.executor != "dask":
        print("error: --scheduler is for --executor dask", file=sys.stderr)
        return 2

    import contextlib

    import runner
    from data_loader import DataError

    base = base_config(args)
    def skip_reason(row):
        if args.causal and row.algo in runner.CAUSAL_REFUSED:
            return f"{row.algo} refuses --causal"
        return table_rows.skip_reason(row)

    runnable = [r for r in selected if skip_reason(r) is None]
    for row in selected:
        if (reason := skip_reason(row)) is not None:
            print(f"row {row.name}: skipped ({reason})", file=sys.stderr)

    report: list[tuple[str, str]] = []
    failed_rows = 0
    start = time.perf_counter()
    try:
        cluster = runner.dask_client(base) if args.executor == "dask" and runnable else contextlib.nullcontext()
        with cluster as client:
            for k, row in enumerate(runnable, 1):
                cfg = table_rows.config_for(row, base)
                command = row.command()
                if args.causal:  # srs-bench's flag, outside rows.py's upstream names: suffix -causal
                    cfg = dataclasses.replace(cfg, causal=True)
                    command += " --causal"
                print(f"\n[{k}/{len(runnable)}] {cfg.name}: {command}", file=sys.stderr)
                t0 = time.perf_counter()
                try:
                    summary = runner.run(cfg, client=client)
                except DataError:
                    raise
                except Exception as exc:  # the row cannot start (e.g. its model's package is missing)
                    failed_rows += 1
                    report.append((cfg.name, f"error: {type(exc).__name__}: {exc}"))
                    print(f"row {cfg.name}: error: {type(exc).__name__}: {exc}", file=sys.stderr)
                    continue
                line = f"{summary.done} done, {summary.already} already"
                if summary.skipped:
                    line += f", {len(summary.skipped)} skipped (too little data)"
                if summary.failed:
                    failed_rows += 1
                    line += f", {len(summary.failed)} FAILED (users {', '.join(map(str, sorted(summary.failed)))})"
                report.append((cfg.name, f"{line}; {time.perf_counter() - t0:.1f} s"))
    except DataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    print(f"\nwhole table: {len(runnable)} row(s) run, {len(selected) - len(runnable)} skipped, "
          f"{time.perf_counter() - start:.1f} s", file=sys.stderr)
    for name, line in report:
        print(f"  {name}: {line}", file=sys.stderr)
    if args.tables and args.causal:
        print("--causal: README tables not regenerated (they are upstream's protocol); compare with python "
              f"evaluate.py --results {args.result_dir} --models <row>-causal,...", file=sys.stderr)
    elif args.tables:
        code = regenerate_tables(args)
        if code != 0:
            return code
    return 1 if failed_rows else 0


if __name__ == "__main__":
    sys.exit(main())
