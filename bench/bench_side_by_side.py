"""Our row and upstream's row, whole process, side by side on the same data folder.

    python bench/bench_side_by_side.py --data ../anki-revlogs-10k --models AVG,SM2,HLR,FSRSv4
    python bench/bench_side_by_side.py --data /tmp/sim --models AVG --upstream ../srs-benchmark \\
        --upstream-python ../srs-benchmark/.venv/bin/python

Each model runs as a user runs it (`python other.py --model M --data D --processes 1`, interpreter start, imports,
every user, result file) in a fresh process with an empty result folder. With `--upstream PATH` (a checkout of
upstream's srs-benchmark, run by its own interpreter `--upstream-python`), upstream runs the same row on the same
folder (`other.py --model M`; FSRS-5 is its `script.py`), alternating with ours (ours, upstream, ours, upstream,
...) so that both see the same machine in the same minute; the ratio is taken run pair by run pair and its median
printed, for wall time (what a user waits for) and for CPU time (user + system: the fairer figure on a shared
machine). Each pair's result files are compared too: the per-user `size` must be equal (the row is the same
protocol), and the mean Log Loss of both is printed. Without `--upstream` only our times are printed. One untimed
run of ours first (numba's disk cache of compiled kernels, the OS file cache); upstream has no compiled cache to
warm, and `--upstream-warmup` gives it an untimed run too.

Tested with upstream's January-2025 code (github:1DWalker/srs-benchmark @ 39935416, 18 January 2025) in a
virtualenv of its own: `python -m venv --system-site-packages .venv && .venv/bin/pip install
fsrs-optimizer==5.7.3 pandas==2.2.3 numpy==1.26.4 pyarrow==17.0.0` (its pandas code predates pandas 3).

Upstream writes `result/`, `raw/` and `evaluation/` under its working directory and skips users already there, so
it runs in a temporary folder that links every other entry of the checkout (its modules, pretrained weights): the
checkout itself is never written to.
"""

from __future__ import annotations

import argparse
import json
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
UPSTREAM_OUTPUTS = {"result", "raw", "evaluation"}  # what upstream writes under its working directory


def timed(cmd: list[str], cwd: Path) -> tuple[float, float]:
    """(wall, cpu) seconds of one whole process; cpu = user + system of the child and anything it waited for."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"exit {proc.returncode}: {shlex.join(cmd)}\n{proc.stderr[-2000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def upstream_program(model: str) -> list[str]:
    """Upstream's command for our row `model`: FSRS-5 is its script.py (fsrs-optimizer), every other row other.py."""
    return ["script.py"] if model == "FSRS-5" else ["other.py", "--model", model]


def ours_cmd(model: str, data: Path, result_dir: Path) -> list[str]:
    return [sys.executable, str(ROOT / "other.py"), "--model", model, "--data", str(data), "--processes", "1",
            "--quiet", "--result-dir", str(result_dir)]


def upstream_workdir(upstream: Path, tmp: Path) -> Path:
    """A folder that looks like the checkout (links) but where upstream's outputs start empty."""
    work = tmp / "upstream"
    work.mkdir()
    for entry in upstream.iterdir():
        if entry.name not in UPSTREAM_OUTPUTS:
            (work / entry.name).symlink_to(entry.resolve())
    return work


def clear(folder: Path, names) -> None:
    """Remove the run's outputs (temporary folders only) so the next run starts from no result."""
    import shutil

    for name in names:
        shutil.rmtree(folder / name, ignore_errors=True)


def bench_model(model: str, a, tmp: Path, work: Path | None) -> dict:
    """Median wall and cpu seconds of each side, and the median of the pairwise wall ratios."""
    ours = ours_cmd(model, a.data, tmp / "ours-result")
    theirs = [a.upstream_python, *upstream_program(model), "--data", str(a.data.resolve()), "--processes", "1",
              *shlex.split(a.upstream_args)]
    runs: dict[str, list[tuple[float, float]]] = {"ours": [], "upstream": []}
    for k in range(a.repeat + 1):  # run 0 is the untimed warm-up
        clear(tmp, ["ours-result"])
        t_ours = timed(ours, ROOT)
        if k:
            runs["ours"].append(t_ours)
        if work is not None and (k or a.upstream_warmup):
            clear(work, UPSTREAM_OUTPUTS)
            t_up = timed(theirs, work)
            if k:
                runs["upstream"].append(t_up)
    out = {side: (statistics.median(w for w, _ in r), statistics.median(c for _, c in r))
           for side, r in runs.items() if r}
    if work is not None:
        pairs = list(zip(runs["ours"], runs["upstream"]))
        out["ratio"] = statistics.median(o[0] / u[0] for o, u in pairs)
        out["cpu_ratio"] = statistics.median(o[1] / u[1] for o, u in pairs)
        out["check"] = compare_results(next((tmp / "ours-result").glob("*.jsonl")),
                                       next((work / "result").glob("*.jsonl")))
    return out


def compare_results(ours: Path, theirs: Path) -> str:
    """'sizes equal, LogLoss a vs b' over the users both sides evaluated, or which users' sizes differ."""
    def load(path):
        return {d["user"]: d for d in map(json.loads, path.read_text().splitlines()) if d.get("metrics")}

    a, b = load(ours), load(theirs)
    users = sorted(set(a) & set(b))
    differ = [u for u in users if a[u]["size"] != b[u]["size"]]
    if differ or set(a) != set(b):
        return f"DIFFERENT users/sizes: {differ[:5]}, only ours {sorted(set(a) - set(b))[:5]}, " \
               f"only upstream {sorted(set(b) - set(a))[:5]}"
    la = statistics.mean(a[u]["metrics"]["LogLoss"] for u in users)
    lb = statistics.mean(b[u]["metrics"]["LogLoss"] for u in users)
    return f"{len(users)} users, sizes equal; LogLoss {la:.4f} vs {lb:.4f}"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--data", type=Path, required=True, help="dataset root in the anki-revlogs-10k layout")
    ap.add_argument("--models", default="AVG,SM2,HLR,FSRSv4", help="comma-separated registry names")
    ap.add_argument("--upstream", type=Path, default=None, help="a checkout of upstream's srs-benchmark")
    ap.add_argument("--upstream-python", default=sys.executable, help="the interpreter of upstream's environment")
    ap.add_argument("--upstream-args", default="", help="extra arguments for upstream's other.py")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs of each side (after one untimed run of ours)")
    ap.add_argument("--upstream-warmup", action="store_true", help="an untimed run of upstream's side first too")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="srs-bench-side-") as tmp_name:
        tmp = Path(tmp_name)
        work = upstream_workdir(a.upstream, tmp) if a.upstream else None
        if work is None:
            print("| model | ours, wall s | ours, cpu s |\n|---|---|---|")
        else:
            print("| model | ours, wall s | upstream, wall s | ratio (wall) | ours, cpu s | upstream, cpu s | "
                  "ratio (cpu) | results |\n|---|---|---|---|---|---|---|---|")
        for model in a.models.split(","):
            r = bench_model(model.strip(), a, tmp, work)
            (ow, oc) = r["ours"]
            if work is None:
                print(f"| {model} | {ow:.2f} | {oc:.2f} |", flush=True)
            else:
                (uw, uc) = r["upstream"]
                print(f"| {model} | {ow:.2f} | {uw:.2f} | {r['ratio']:.3f} ({1 / r['ratio']:.0f}×) | {oc:.2f} | "
                      f"{uc:.2f} | {r['cpu_ratio']:.3f} ({1 / r['cpu_ratio']:.0f}×) | {r['check']} |", flush=True)
    print(f"\n{a.repeat} timed run(s) per side, medians; data: {a.data}", file=sys.stderr)


if __name__ == "__main__":
    main()
