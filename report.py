"""Which algorithm fits my collection? One command from an Anki export to one page a person reads.

    python report.py my.colpkg                      # → report/index.html (self-contained) and report/report.md
    python report.py a.apkg b.colpkg --models all   # several collections: the README's tables over them
    python report.py --data ../anki-revlogs-10k     # a data folder (or fsspec URL) in the anki-revlogs-10k layout
    python report.py my.colpkg --parameters         # only FSRS-6's parameters, fitted on all reviews

The inputs become a data folder (build_dataset.py) under `<out>/.work/<key>/`, keyed by the files' content (a rerun,
or a renamed copy of the same file, reuses everything already computed). Each model runs through the runner like
`other.py` (progress bars, resumable, per-user errors kept), with its test predictions written per user. The page
(report_page.py) is made from those result files alone: the ranking table shows evaluate.py's numbers, for one
collection with 99% intervals from resampling whole cards (resample.py), then calibration, head to head, FSRS-6's
parameters fitted on all reviews, and where the collection's reviews went. Nothing of the card text is read or
written: only ids, times and ratings.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

RECOMMENDED = ["FSRS-6", "FSRS-6-default", "FSRS-5", "FSRS-4.5", "FSRSv3", "GRU-P", "DASH", "ACT-R", "HLR",
               "Anki-default", "Anki", "SM2", "Ebisu-v2", "AVG"]


class InputError(Exception):
    """An input file or folder that cannot be used: reported in one line, exit code 2."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Which spaced-repetition algorithm predicts your Anki reviews best? Runs the benchmark's models "
                    "on your collection(s) and writes one page: report/index.html and report/report.md.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("inputs", nargs="*", metavar="FILE",
                   help="Anki exports: .colpkg, .apkg, collection.anki2 / .anki21, .anki21b (several: one user each); "
                        "or one data folder / fsspec URL in the anki-revlogs-10k layout (same as --data)")
    p.add_argument("--data", default=None, metavar="DIR_OR_URL",
                   help="instead of files: a data folder or fsspec URL in the anki-revlogs-10k layout")
    p.add_argument("--out", type=Path, default=Path("report"), help="folder of the page (index.html, report.md)")
    p.add_argument("--models", default="recommended",
                   help="recommended (" + ", ".join(RECOMMENDED) + "), all (every row of the table), or a comma-"
                        "separated list of rows by result name or README name")
    p.add_argument("--processes", type=int, default=os.cpu_count() or 1,
                   help="worker processes; default: all cores (%(default)s on this machine)")
    p.add_argument("--executor", choices=["local", "dask"], default="local", help="as in other.py")
    p.add_argument("--scheduler", default=None, help="with --executor dask: the scheduler address")
    p.add_argument("--resamples", type=int, default=2000, help="card resamples for one collection's intervals")
    p.add_argument("--parameters", action="store_true",
                   help="only fit FSRS-6 on all reviews and print its 21 parameters (per preset too), no page")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    return p


# ------------------------------------------------------------------------------------------------------- inputs

@dataclasses.dataclass
class Inputs:
    root: Path | str  # the data folder the models read
    work: Path  # <out>/.work/<key>: results, test rows, parameters
    collections: dict  # user id → {"name", "dropped" (conversion), "notes", "dates"}


def _content_key(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
        h.update(b"\0")
    return h.hexdigest()[:16]


def prepare_inputs(files: list[str], data: str | None, out: Path) -> Inputs:
    """Converted collections (or the given data folder) and the work folder of this exact input."""
    from data_loader import is_url, list_user_ids

    if data is None and len(files) == 1 and (is_url(files[0]) or Path(files[0]).is_dir()):
        data, files = files[0], []  # `report.py DIR` is `report.py --data DIR`
    if data is not None:
        if files:
            raise InputError("give Anki files or --data, not both")
        root = data if is_url(data) else Path(data)
        if not is_url(data) and not (Path(data) / "revlogs").is_dir():
            raise InputError(f"{data}: not a data folder (no revlogs/ inside; expected the anki-revlogs-10k layout)")
        key = hashlib.sha256(str(root if is_url(data) else Path(data).resolve()).encode()).hexdigest()[:16]
        work = out / ".work" / key
        users = list_user_ids(root)
        if not users:
            raise InputError(f"{data}: no users in revlogs/")
        return Inputs(root, work, {u: {"name": f"user {u}"} for u in users})
    if not files:
        raise InputError("no input: give one or more Anki files (.colpkg, .apkg, .anki2, .anki21, .anki21b) or --data")
    paths = [Path(f) for f in files]
    for path in paths:
        if not path.is_file():
            raise InputError(f"{path}: no such file")
    work = out / ".work" / _content_key(paths)
    meta_path = work / "collections.json"
    if meta_path.exists():  # converted before: same content, whatever the names are now
        meta = {int(k): v for k, v in json.loads(meta_path.read_text()).items()}
        for user, path in enumerate(paths, start=1):
            meta[user].update(name=path.name, path=str(path))
        return Inputs(work / "data", work, meta)
    import build_dataset as bd

    collections = {}
    for user, path in enumerate(paths, start=1):
        try:
            revlogs, cards, decks, notes = bd.convert_collection(path)
        except bd.ConversionError as exc:
            raise InputError(f"{path}: {exc}") from None
        except OSError as exc:
            raise InputError(f"{path}: {exc.strerror or exc}") from None
        bd.write_user(work / "data", user, revlogs, cards, decks)
        collections[user] = {"name": path.name, "path": str(path), "dropped": notes.dropped, "notes": list(notes),
                             "dates": notes.dates}
    meta_path.write_text(json.dumps(collections, indent=1))
    return Inputs(work / "data", work, collections)


def select_rows(spec: str):
    import rows

    chosen = [rows.BY_NAME[n] for n in RECOMMENDED] if spec.strip().lower() == "recommended" else rows.select(spec)
    why = {r.name: rows.skip_reason(r) for r in chosen}
    return [r for r in chosen if why[r.name] is None], [(r.name, why[r.name]) for r in chosen if why[r.name]]


# ----------------------------------------------------------------------------------------------------- running

def run_models(chosen, inputs: Inputs, args) -> dict[str, dict]:
    """Each row through the runner; returns name → {"error": run-level error or None, "failed": {user: why},
    "skipped": {user: why}, "seconds": wall time of this call}."""
    import rows
    import runner
    from config import RunConfig
    from tqdm import tqdm

    base = RunConfig(data=inputs.root, processes=args.processes, executor=args.executor, scheduler=args.scheduler,
                     result_dir=inputs.work / "result", evaluation_dir=inputs.work / "evaluation", file=True,
                     quiet=args.quiet)
    runs = {}
    if args.executor == "local":  # a first run compiles every chosen model's kernels at once, on every worker
        from warmup import warm_up

        warm_up([rows.config_for(row, base) for row in chosen], args.processes, args.quiet, name="models")
    overall = tqdm(chosen, desc="models", unit="model", disable=args.quiet, file=sys.stderr, position=0)
    for row in overall:
        overall.set_postfix_str(row.name)
        start = time.perf_counter()
        try:
            summary = runner.run(rows.config_for(row, base))
            runs[row.name] = {"error": None, "failed": summary.failed, "skipped": summary.skipped}
        except Exception as exc:  # one model's failure is reported on the page; the others still run
            runs[row.name] = {"error": f"{type(exc).__name__}: {exc}", "failed": {}, "skipped": {}}
        runs[row.name]["seconds"] = time.perf_counter() - start
    overall.close()
    return runs


MIN_PRESET_REVIEWS = 100  # a preset with fewer reviews gets no parameters of its own (the defaults would show)


def fsrs6_parameters(root, user: int) -> dict:
    """FSRS-6 fitted on ALL of a user's reviews (no split): {"all": [21 floats], "presets": {preset: [...]}, ...}.
    Per preset only when the collection has several presets with reviews; a preset with too little data is noted."""
    import models
    from config import RunConfig
    from data_loader import load_partitions, load_revlogs
    from features import FeatureConfig, NotEnoughData, build_features
    from models.base import InadequateData

    cfg = RunConfig(algo="FSRS-6")
    revlogs = load_revlogs(root, user)
    fcfg = FeatureConfig.from_run(cfg)
    try:
        data = build_features(revlogs, fcfg, load_partitions(root, user, "preset", revlogs["card_id"]))
    except NotEnoughData as exc:
        return {"error": str(exc)}
    out = {"all": models.create(cfg).fit(data).parameters(), "reviews": len(data), "presets": {}, "too_few": {}}
    parts = data.rows["partition"].to_numpy()
    if len(np.unique(parts)) > 1:
        for preset in np.unique(parts):
            subset = data.subset(parts == preset)
            if len(subset) < MIN_PRESET_REVIEWS:
                out["too_few"][int(preset)] = f"{len(subset)} reviews"
                continue
            try:
                out["presets"][int(preset)] = {"w": models.create(cfg).fit(subset).parameters(),
                                               "reviews": len(subset)}
            except InadequateData as exc:
                out["too_few"][int(preset)] = f"{len(subset)} reviews: {exc}"
    return out


MAX_PARAMETER_USERS = 20  # a data set of thousands of users gets no per-user parameters on the page


def parameters_of(inputs: Inputs, users=None) -> dict:
    """FSRS-6's parameters per user, cached in the work folder (they depend only on the data)."""
    path = inputs.work / "fsrs6-parameters.json"
    cached = json.loads(path.read_text()) if path.exists() else {}
    for user in inputs.collections if users is None else users:
        if str(user) not in cached:
            try:
                cached[str(user)] = fsrs6_parameters(inputs.root, user)
            except Exception as exc:
                cached[str(user)] = {"error": f"{type(exc).__name__}: {exc}"}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(cached))
    return {int(k): v for k, v in cached.items() if users is None or int(k) in users}


# ------------------------------------------------------------------------------------------------------ main

def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        inputs = prepare_inputs(args.inputs, args.data, args.out)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    import report_page

    if args.parameters:
        for user, params in parameters_of(inputs).items():
            print(f"{inputs.collections[user]['name']}:")
            if "error" in params:
                print(f"  no parameters: {params['error']}")
                continue
            print(f"  all reviews ({params['reviews']:,}): {report_page.anki_text(params['all'])}")
            for preset, p in params["presets"].items():
                name = report_page.preset_name(preset)
                print(f"  {name} ({p['reviews']:,} reviews): {report_page.anki_text(p['w'])}")
        return 0
    try:
        chosen, unavailable = select_rows(args.models)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    runs = run_models(chosen, inputs, args)
    users = list(inputs.collections)[:MAX_PARAMETER_USERS]
    page = report_page.build(inputs, [r.name for r in chosen], runs, parameters_of(inputs, users), args,
                             unavailable=unavailable)
    print(page.headline)
    print(f"report: {page.html_path.resolve()} (and {page.md_path.name})")
    failed = any(r["error"] or r["failed"] for r in runs.values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
