"""Our row and upstream's row, whole process, side by side on the same data folder.

    python bench/bench_side_by_side.py --data ../anki-revlogs-10k --models AVG,SM2,HLR,FSRSv4
    python bench/bench_side_by_side.py --data /tmp/sim --models AVG,GRU-P-short,FSRS-5-preset \\
        --upstream ../srs-benchmark --upstream-python ../srs-benchmark/.venv/bin/python

Each row runs as a user runs it (the row's own command from rows.py, e.g. `python other.py --model GRU-P --short
--data D --processes 1`: interpreter start, imports, every user, result file) in a fresh process with an empty
result folder. With `--upstream PATH` (a checkout of upstream's srs-benchmark, run by its own interpreter
`--upstream-python`), upstream runs its own command for the same row on the same folder (UPSTREAM_COMMANDS below:
`other.py --model M`, with `--short` or `--dry` for the -short rows and Anki-SM-2; FSRS-5 and its variants are
`script.py` with its Era A flags), alternating with ours (ours, upstream, ours, upstream, ...) so that both see the
same machine in the same minute; the ratio is taken run pair by run pair and its median printed, for wall time
(what a user waits for) and for CPU time (user + system: the fairer figure on a shared machine). A row upstream's
January-2025 code cannot run (FSRS-6/7, SBD, ...) is skipped with the reason, nothing run, and so is one whose
upstream command reads the cards and decks tables (the preset and deck rows; SM2 and Ebisu-v2, whose upstream code
joins them in) when the data folder has none (bench/sim_decks.py adds them to simulated data). Each pair's result
files are compared too: the per-user `size` must be equal (the row is the same protocol), and the mean Log Loss of
both is printed. Without `--upstream` only our times are printed. One untimed run of ours first (numba's disk
cache of compiled kernels, the OS file cache); upstream has no compiled cache to warm, and `--upstream-warmup`
gives it an untimed run too.

Tested with upstream's January-2025 code (github:1DWalker/srs-benchmark @ 39935416, 18 January 2025) in a
virtualenv of its own: `python -m venv --system-site-packages .venv && .venv/bin/pip install
fsrs-optimizer==5.7.3 pandas==2.2.3 numpy==2.2.6 pyarrow==17.0.0` (its pandas code predates pandas 3; numpy 2.2 on
an AVX-512 CPU is the environment of upstream's published results, numpy==1.26.4 works too). Upstream's trainers
sort rows with numpy's unstable quicksort, whose tie order depends on the numpy version and the CPU: the script asks
upstream's interpreter and sets our SRS_BENCH_TIE_ORDER to match (`match_tie_order`).

Known failures of that code in that environment, on every user (the row then prints `failed` and upstream's
traceback): script.py --dry (FSRS-5-default) reads `optimizer.init_w`, which fsrs-optimizer 5.7.3 sets only in
define_model/pretrain; script.py --partitions (FSRS-5-preset, -deck) keeps the revlogs' categorical `user_id` column
and its `fillna(-1)` raises on it under pandas 2.2.3; other.py's FSRSv1 raises in its own predict().
`--upstream-program 'other.py --model FSRS-5 --dry'` (or `--partitions preset`) times upstream's other.py FSRS-5
instead, which drops that column and builds its own default weights.

Upstream writes `result/`, `raw/` and `evaluation/` under its working directory and skips users already there, so
it runs in a temporary folder that links every other entry of the checkout (its modules, pretrained weights): the
checkout itself is never written to.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script, sys.path[0] is bench/ (project modules: imported lazily)
    sys.path.insert(0, str(ROOT))
UPSTREAM_OUTPUTS = {"result", "raw", "evaluation"}  # what upstream writes under its working directory


def timed(cmd: list[str], cwd: Path) -> tuple[float, float]:
    """(wall, cpu) seconds of one whole process; cpu = user + system of the child and anything it waited for."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        # upstream prints each failed user's traceback to stdout (tqdm.write), its own crash to stderr
        raise RuntimeError(f"exit {proc.returncode}: {shlex.join(cmd)}\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


# Our row (rows.py) → upstream's January-2025 command for the same row: its program and flags. other.py runs every
# non-FSRS-5 model (`--model M`, `--short` keeps same-day reviews in histories, `--dry` evaluates default
# parameters); FSRS-5 and its variants are script.py (fsrs-optimizer), whose flags are named as in Era A:
# --dry = our --default, --pretrain = our --S0, --binary = our --binary.
_OTHER = ["FSRS-4.5", "FSRSv4", "FSRSv3", "FSRSv2", "FSRSv1", "DASH", "DASH[MCM]", "DASH[ACT-R]", "GRU", "GRU-P",
          "Transformer", "NN-17", "ACT-R", "AVG", "90%", "Anki", "HLR", "SM2-trainable", "Ebisu-v2", "SM2",
          "RMSE-BINS-EXPLOIT"]
UPSTREAM_COMMANDS: dict[str, list[str]] = {
    **{row: ["other.py", "--model", row] for row in _OTHER},
    **{f"{m}-short": ["other.py", "--model", m, "--short"] for m in ("GRU-P", "DASH", "HLR", "SM2")},
    "Anki-default": ["other.py", "--model", "Anki", "--dry"],  # the README's "Anki-SM-2" (Anki-dry-run)
    "FSRS-5": ["script.py"],
    "FSRS-5-recency": ["script.py", "--recency"],
    "FSRS-5-preset": ["script.py", "--partitions", "preset"],
    "FSRS-5-deck": ["script.py", "--partitions", "deck"],
    "FSRS-5-binary": ["script.py", "--binary"],
    "FSRS-5-S0": ["script.py", "--pretrain"],
    "FSRS-5-default": ["script.py", "--dry"],
    "FSRS-5-disable_short_term": ["script.py", "--disable_short_term"],
    # the same-day table's rows (`--with_same_day`): upstream's `--short --secs`. Its January-2025 secs mode still
    # dropped same-day reviews as targets, so it evaluates fewer reviews than ours (the size check says so): a timing
    # of the same command, ours doing more work
    **{f"{m}-short-secs": ["other.py", "--model", m, "--short", "--secs"]
       for m in ("FSRS-4.5", "FSRSv4", "FSRSv3", "FSRSv2", "DASH", "DASH[MCM]", "DASH[ACT-R]", "ACT-R", "AVG", "HLR",
                 "Ebisu-v2", "RMSE-BINS-EXPLOIT", "GRU", "GRU-P")},
    "FSRS-5-short-secs": ["script.py", "--secs"],
}
# Rows of ours that upstream's January-2025 code has no command for, and why (anything else unknown is skipped too).
_LATER = "added to upstream after January 2025"
NOT_IN_UPSTREAM: dict[str, str] = {
    "LSTM": "upstream's January LSTM is its older RNN-class model, not the README's 8,869-parameter LSTM row",
    "FSRS-rs": "that version's script.py --rust optimises FSRS-5 through fsrs-rs-python, not the FSRS-6 FSRS-rs row",
    "FSRS-6-upstream-trainer": "an srs-bench row (FSRS-6 with the upstream-style trainer); FSRS-6 is " + _LATER,
    "SBD-recency": f"SBD is {_LATER}",
    "LogisticRegression": f"LogisticRegression is {_LATER}",
    "MOVING-AVG": f"MOVING-AVG is {_LATER}",
    "RWKV": "trained once on 5,000 users, not per user; not an srs-bench row",
    "RWKV-P": "trained once on 5,000 users, not per user; not an srs-bench row",
    "LSTM-short-secs-duration": "upstream's January LSTM is its older RNN-class model (and srs-bench does not run "
                                "this row)",
    "LogisticRegression-short-secs-recency": f"LogisticRegression is {_LATER}",
    "MOVING-AVG-short-secs": f"MOVING-AVG is {_LATER}",
    "FSRSv1-short-secs": "that version's other.py FSRSv1 raises in its own predict() on every user",
    "GRU-short-secs-equalize_test_with_non_secs": "that version's GRU on the secs pipeline is not its current "
                                                  "GRU row",
}


def reads_decks(command: list[str]) -> bool:
    """Whether upstream's command reads the cards and decks tables besides the revlogs: every --partitions run, and
    other.py's untrainable SM2 and Ebisu-v2 (its process_untrainable joins both tables, unused, for every user)."""
    return "--partitions" in command or command[:3] in (["other.py", "--model", "SM2"],
                                                        ["other.py", "--model", "Ebisu-v2"])


def upstream_program(model: str) -> list[str] | None:
    """Upstream's program and flags for our row `model`, or None when its January-2025 code cannot run the row."""
    return list(UPSTREAM_COMMANDS[model]) if model in UPSTREAM_COMMANDS else None


def skip_reason(model: str) -> str:
    """Why `model` has no upstream counterpart to time (only asked when upstream_program gave None)."""
    if model in NOT_IN_UPSTREAM:
        reason = NOT_IN_UPSTREAM[model]
    elif model.startswith(("FSRS-6", "FSRS-7")):
        reason = f"{model.split('-')[0]}-{model.split('-')[1]} is {_LATER}"
    else:
        reason = "no upstream January-2025 command is known for this row (bench_side_by_side.UPSTREAM_COMMANDS)"
    return f"skipped: {reason}"


def our_args(model: str) -> list[str]:
    """Our other.py arguments for the row `model` (rows.py: model and flags, e.g. GRU-P-short is `--model GRU-P
    --short`); a name that is not a row is taken as a registry model name."""
    import rows

    row = rows.BY_NAME.get(model)
    return row.args() if row else ["--model", model]


def ours_cmd(model: str, data: Path, result_dir: Path) -> list[str]:
    return [sys.executable, str(ROOT / "other.py"), *our_args(model), "--data", str(data), "--processes", "1",
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


def bench_model(model: str, program: list[str], a, tmp: Path, work: Path | None) -> dict:
    """Median wall and cpu seconds of each side, and the median of the pairwise wall ratios; `program` is
    upstream's program and flags for the row (used only with --upstream)."""
    ours = ours_cmd(model, a.data, tmp / "ours-result")
    theirs = [a.upstream_python, *program, "--data", str(a.data.resolve()),
              "--processes", "1", *shlex.split(a.upstream_args)]
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
        ours_file, theirs_file = next((tmp / "ours-result").glob("*.jsonl")), next((work / "result").glob("*.jsonl"))
        out["check"] = compare_results(ours_file, theirs_file)
        if a.keep:  # both sides' result lines, for a per-user look
            a.keep.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(ours_file, a.keep / f"{model}-ours.jsonl")
            shutil.copyfile(theirs_file, a.keep / f"{model}-upstream.jsonl")
    return out


def compare_results(ours: Path, theirs: Path) -> str:
    """'sizes equal, LogLoss a vs b, per user ≤ d' over the users both sides evaluated (d: the largest per-user
    Log Loss difference: means can agree while users do not), or which users' sizes differ."""
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
    worst = max(abs(a[u]["metrics"]["LogLoss"] - b[u]["metrics"]["LogLoss"]) for u in users)
    return f"{len(users)} users, sizes equal; LogLoss {la:.4f} vs {lb:.4f}, per user ≤ {worst:.1e}"


def match_tie_order(upstream_python: str) -> str:
    """Set our SRS_BENCH_TIE_ORDER to the tie order of upstream's environment (upstream/legacy_sort.py): numpy
    1.26 → "cpu" (numpy 1.26 as it runs on this CPU), numpy 2.0–2.2 on an AVX-512 CPU → "published" (our default);
    anything else has no re-implementation here, and the rows that replay upstream's batches (ACT-R, DASH, HLR, ...)
    will differ. A value already set in the environment is kept. Returns a line saying what was chosen."""
    from upstream.legacy_sort import TIE_ORDER_ENV

    if TIE_ORDER_ENV in os.environ:
        return f"tie order: {os.environ[TIE_ORDER_ENV]} (from the environment)"
    probe = ("import numpy as np\ntry:\n    from numpy._core._multiarray_umath import __cpu_features__ as f\n"
             "except ImportError:\n    from numpy.core._multiarray_umath import __cpu_features__ as f\n"
             "print(np.__version__, bool(f.get('AVX512_SKX')))")
    out = subprocess.run([upstream_python, "-c", probe], capture_output=True, text=True)
    if out.returncode != 0:
        return f"tie order: ours by default (could not ask upstream's numpy: {out.stderr.strip()[-200:]})"
    version, avx512 = out.stdout.split()
    major_minor = tuple(int(x) for x in version.split(".")[:2])
    if major_minor == (1, 26):
        os.environ[TIE_ORDER_ENV] = "cpu"
    elif (2, 0) <= major_minor <= (2, 2) and avx512 == "True":
        os.environ[TIE_ORDER_ENV] = "published"
    else:
        return (f"tie order: upstream's numpy {version} (AVX-512: {avx512}) sorts ties in an order this project does "
                "not reproduce; the rows that replay upstream's batches will differ (use numpy 1.26.4 or 2.2.6)")
    return f"tie order: {os.environ[TIE_ORDER_ENV]}, matching upstream's numpy {version} (AVX-512: {avx512})"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--data", type=Path, required=True, help="dataset root in the anki-revlogs-10k layout")
    ap.add_argument("--models", default="AVG,SM2,HLR,FSRSv4",
                    help="comma-separated row names (rows.py: GRU-P-short, FSRS-5-preset, ...); with --upstream, "
                         "rows upstream's January-2025 code has no command for are skipped with the reason")
    ap.add_argument("--upstream", type=Path, default=None, help="a checkout of upstream's srs-benchmark")
    ap.add_argument("--upstream-python", default=sys.executable, help="the interpreter of upstream's environment")
    ap.add_argument("--upstream-args", default="", help="extra arguments for upstream's program (other.py or "
                                                         "script.py)")
    ap.add_argument("--upstream-program", default="",
                    help="upstream's program and flags instead of UPSTREAM_COMMANDS' (e.g. 'other.py --model FSRS-5 "
                         "--dry' where script.py --dry fails with fsrs-optimizer 5.7.3); for every row in --models")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs of each side (after one untimed run of ours)")
    ap.add_argument("--keep", type=Path, default=None, metavar="DIR",
                    help="copy each row's two result files (last run) to DIR/<row>-ours.jsonl and <row>-upstream.jsonl")
    ap.add_argument("--upstream-warmup", action="store_true", help="an untimed run of upstream's side first too")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="srs-bench-side-") as tmp_name:
        tmp = Path(tmp_name)
        work = upstream_workdir(a.upstream, tmp) if a.upstream else None
        if work is not None:
            print(match_tie_order(a.upstream_python), file=sys.stderr, flush=True)
        if work is None:
            print("| model | ours, wall s | ours, cpu s |\n|---|---|---|")
        else:
            print("| model | ours, wall s | upstream, wall s | ratio (wall) | ours, cpu s | upstream, cpu s | "
                  "ratio (cpu) | results |\n|---|---|---|---|---|---|---|---|")
        for model in (m.strip() for m in a.models.split(",")):
            program = shlex.split(a.upstream_program) or upstream_program(model)  # None: upstream lacks the row
            if work is not None and program is None:
                print(f"| {model} | {skip_reason(model)} |", flush=True)
                continue
            if work is not None and reads_decks(program) and not all((a.data / t).is_dir() for t in ("cards", "decks")):
                print(f"| {model} | skipped: upstream's command reads the cards and decks tables, which {a.data} "
                      "lacks (bench/sim_decks.py writes them for simulated data) |", flush=True)
                continue
            try:
                r = bench_model(model, program or [], a, tmp, work)
            except RuntimeError as exc:  # e.g. upstream's January-2025 FSRSv1 fails in its own predict()
                print(f"| {model} | failed: {str(exc).splitlines()[0]} |", flush=True)
                print(exc, file=sys.stderr)
                continue
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
