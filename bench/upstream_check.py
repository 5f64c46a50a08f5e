"""Our rows against upstream's own results on the upstream-check users (tests/fixtures/upstream-check).

    python bench/upstream_check.py                       # every model in upstream-results.json that is registered
    python bench/upstream_check.py --models HLR,ACT-R --out check.md

For each model: `size` per user (must be equal) and Log Loss per user from the default (fast) trainer, from
`--trainer upstream` (trainable models), from upstream's code run on a CPU without AVX-512
(upstream-results-no-avx512.json, where recorded: the trainers that sort rows with numpy 1.26's quicksort, whose tie
order is the CPU's; ours follow this CPU's, upstream/legacy_sort.py) and the published ones. Runs the real command line
into a temporary result folder.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import models  # noqa: E402

CHECK = ROOT / "tests" / "fixtures" / "upstream-check"
UNTRAINED = {"SM2", "Ebisu-v2", "RMSE-BINS-EXPLOIT", "AVG", "MOVING-AVG", "FSRS-rs", "GRU-P"}


def run(model: str, extra: list[str], data: Path, out: Path) -> dict:
    cmd = [sys.executable, str(ROOT / "other.py"), "--model", model, "--data", str(data), "--processes", "1",
           "--quiet", "--result-dir", str(out), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}\n{proc.stderr[-1500:]}")
    name = proc.stderr.strip().splitlines()[-1].split(":")[0]
    lines = [json.loads(x) for x in (out / f"{name}.jsonl").read_text().splitlines() if x.strip()]
    return {str(x["user"]): x for x in lines}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=CHECK)
    ap.add_argument("--models", default=None, help="comma-separated (default: all registered ones upstream has)")
    ap.add_argument("--out", type=Path, default=None, help="also write the table here")
    a = ap.parse_args(argv)
    upstream = json.loads((a.data / "upstream-results.json").read_text())
    no_avx512_file = a.data / "upstream-results-no-avx512.json"
    no_avx512 = json.loads(no_avx512_file.read_text()) if no_avx512_file.exists() else {}
    names = a.models.split(",") if a.models else [m for m in upstream if m in models.REGISTRY]
    missing = [m for m in names if m not in upstream]
    if missing:
        print(f"no upstream results for {', '.join(missing)} in {a.data / 'upstream-results.json'}; skipped",
              file=sys.stderr)
        names = [m for m in names if m in upstream]
    rows = ["| model | user | size ours / upstream | Log Loss: ours (fast) | ours (`--trainer upstream`) | "
            "upstream's code without AVX-512 | upstream (published) |",
            "|---|---|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            fast = run(name, [], a.data, Path(tmp))
            slow = None if name in UNTRAINED else run(name, ["--trainer", "upstream"], a.data, Path(tmp))
            for user, ref in sorted(upstream[name].items(), key=lambda kv: int(kv[0])):
                ours = fast.get(user)
                up_ll = ref["metrics"]["LogLoss"]
                cells = [name, user, f"{ours['size'] if ours else '—'} / {ref['size']}",
                         f"{ours['metrics']['LogLoss']:.6f}" if ours else "—",
                         f"{slow[user]['metrics']['LogLoss']:.6f}" if slow and user in slow else "—",
                         f"{no_avx512[name][user]['metrics']['LogLoss']:.6f}" if user in no_avx512.get(name, {}) else "—",
                         f"{up_ll:.6f}"]
                rows.append("| " + " | ".join(cells) + " |")
                print(rows[-1], flush=True)
    if a.out:
        a.out.write_text("\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
