"""A first run compiles its kernels before its users, on all its workers at once, and says so.

The models' compiled kernels are numba's, cached on disk (engine/jit.py says where), so every run after the first
loads them in milliseconds. The first run (a fresh clone, an edited model, a new machine) has to compile them, and
left to itself each worker would compile every kernel its first user needs, all workers the same ones at the same
time. Instead, before any user starts, the kernels are split into units (engine/jit_cache.Unit: a model's lane kernel,
its trainer's and predictions' loops, or for a model without such units one run of the model on a small user of
the embedded data set), which the workers compile side by side, the longest chain first (a kernel after its parts); the progress line reads
"FSRS-6: compiling, first run only". A unit done once leaves a marker beside numba's cache, so later runs skip
all of this. `report.py` and `run_table.py` warm every row they will run in one go.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import sys
import tempfile
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from functools import partial
from pathlib import Path

import models
from config import EMBEDDED_DATA, RunConfig
from engine.jit_cache import Unit

TOY_USER = 3  # the embedded data set's smallest user with evaluated reviews for every row (224 raw reviews)


def _toy_run(cfg: RunConfig) -> None:
    """The row on the embedded data set's smallest user: compiles (or loads) whatever its fits, predictions and
    metrics need, with the types real users give them."""
    import pipeline

    outcome = pipeline.evaluate_user(TOY_USER, cfg, EMBEDDED_DATA)
    if outcome.error:
        raise RuntimeError(outcome.error)


def _source_tag(cfg: RunConfig) -> str:
    """A model file's content digest (registered models: numba's cache folder already follows their sources)."""
    from engine.own_model import file_version, is_model_path

    return f" {file_version(cfg.algo)}" if is_model_path(cfg.algo) and Path(cfg.algo).is_file() else ""


def units(cfg: RunConfig) -> list[Unit]:
    """What a run of `cfg` compiles, as units: the model's own (Model.compile_units), else one toy run of the row."""
    model = models.create(cfg)
    own = model.compile_units()
    if own:
        return own
    if not (EMBEDDED_DATA / "revlogs" / f"user_id={TOY_USER}").exists():
        return []
    seconds = getattr(model, "first_run_seconds", 3.0)
    return [Unit(f"toy run of {cfg.name}{_source_tag(cfg)}", seconds, partial(_toy_run, cfg))]


# A run of at least this many reviews compiles the ICI's lowess kernel in its warm-up (metrics.ici: below
# LOWESS_KERNEL_MIN_COLD predictions a user takes statsmodels' loop while the kernel is not compiled, ~0.6 ms more
# per 1k predictions): what its ~2.5 s on a worker costs a first run, the later runs of such a data set win back.
ICI_KERNEL_REVIEWS = 200_000


def _compile_ici() -> None:
    import lowess

    lowess.lowess_sorted.compile(lowess.SIGNATURE)


def ici_unit() -> Unit:
    """The ICI's lowess kernel (lowess.py), compiled for the types metrics.ici passes (numba imported only to
    build it: the rows that need no numba start without it)."""
    return Unit("the ICI's lowess kernel", 2.5, _compile_ici)


def _marker(unit: Unit) -> Path:
    """Beside numba's cache (without importing numba: the rows that need none start without it)."""
    from engine.jit_cache import folder

    base = folder() or Path(tempfile.gettempdir()) / "srs-bench-cache"
    return base / "warm" / hashlib.sha1(unit.label.encode()).hexdigest()[:20]


def is_done(unit: Unit) -> bool:
    """Whether the unit was compiled (its marker is there)."""
    return _marker(unit).exists()


def pending(cfgs: list[RunConfig], extra: list[Unit] = ()) -> list[Unit]:
    """The units of these runs (and `extra`) not compiled yet (no marker), each once, the longest chain first (_chains)."""
    found: dict[str, Unit] = {u.label: u for u in extra}
    for cfg in cfgs:
        try:
            for unit in units(cfg):
                found.setdefault(unit.label, unit)
        except Exception as exc:  # the run itself reports what is wrong with its model, user by user
            print(f"{cfg.name}: not compiled beforehand ({type(exc).__name__}: {exc})", file=sys.stderr)
    todo = [u for u in found.values() if not is_done(u)]
    chain = _chains(todo)
    return sorted(todo, key=lambda u: -chain[u.label])


def _chains(todo: list[Unit]) -> dict[str, float]:
    """Each unit's seconds plus the longest chain of units waiting for it (Unit.after): the longest chain first is
    what keeps the workers busy until the end (a kernel's parts before loops that nothing waits for)."""
    waiting: dict[str, list[Unit]] = {u.label: [] for u in todo}
    for unit in todo:
        for label in unit.after:
            if label in waiting:
                waiting[label].append(unit)
    chain: dict[str, float] = {}

    def length(unit: Unit) -> float:
        if unit.label not in chain:
            chain[unit.label] = unit.seconds + max((length(u) for u in waiting[unit.label]), default=0.0)
        return chain[unit.label]

    for unit in todo:
        length(unit)
    return chain


def _next(todo: list[Unit], started: set[str], finished: set[str]) -> int | None:
    """The index of the first unit of `todo` (the longest chain first) not started whose `after` units are all
    finished (or not to be compiled in this warm-up); None if none is ready now."""
    labels = {u.label for u in todo}
    for i, unit in enumerate(todo):
        if unit.label not in started and all(a in finished or a not in labels for a in unit.after):
            return i
    return None


_TODO: list[Unit] = []  # the units of the warm-up under way: forked workers find them here (nothing is pickled)


def _build(index: int) -> str | None:
    """Compile unit `index` of _TODO (in a worker); the reason when it failed."""
    try:
        _TODO[index].build()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def warm_up(cfgs: list[RunConfig], processes: int, quiet: bool = False, name: str | None = None,
            extra: list[Unit] = ()) -> None:
    """Compile the pending units of `cfgs` (and `extra`) on `processes` workers (forked after importing the models,
    as the user pool is), the longest chain first, a unit once those it comes after are done, with a progress line;
    each unit done leaves its marker. A unit that fails is reported in
    one line and left to the run, which compiles what it needs as it goes."""
    todo = pending(cfgs, extra)
    if not todo:
        return
    from tqdm import tqdm

    name = name or ", ".join(dict.fromkeys(cfg.name for cfg in cfgs))
    bar = tqdm(total=len(todo), desc=f"{name}: compiling, first run only", unit="unit", disable=quiet,
               file=sys.stderr)

    def done(unit: Unit, error: str | None) -> None:
        if error:
            print(f"{unit.label}: not compiled beforehand ({error})", file=sys.stderr)
        else:
            path = _marker(unit)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(unit.label + "\n", encoding="utf-8")
        bar.update()

    _TODO[:] = todo
    try:
        workers = min(max(1, processes), len(todo))
        started: set[str] = set()
        finished: set[str] = set()
        if workers == 1 or "fork" not in multiprocessing.get_all_start_methods():
            while (i := _next(todo, started, finished)) is not None:
                started.add(todo[i].label)
                done(todo[i], _build(i))
                finished.add(todo[i].label)
            return
        with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("fork")) as pool:
            running: dict = {}
            while True:
                while len(running) < workers and (i := _next(todo, started, finished)) is not None:
                    started.add(todo[i].label)
                    running[pool.submit(_build, i)] = todo[i]
                if not running:
                    break
                ready, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in ready:
                    unit = running.pop(future)
                    done(unit, future.result())
                    finished.add(unit.label)  # failed too: what waits for it compiles the part itself
    finally:
        _TODO.clear()
        bar.close()


def main(argv: list[str] | None = None) -> int:
    """`python warmup.py [--rows ...] [--processes N]`: compile rows' kernels now (a cluster node before its
    workers start, a CI image, a machine before a timed run)."""
    import argparse
    import os

    import rows as table_rows

    p = argparse.ArgumentParser(description="Compile the kernels of table rows now, on all cores, into the compiled-"
                                            "code cache (engine/jit_cache.py), so that their runs start warm.",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--rows", default=None,
                   help="comma-separated rows, by result-file name (FSRS-6-default) or README name; default: every "
                        "row of the table (run_table.py --list)")
    p.add_argument("--processes", type=int, default=os.cpu_count() or 1,
                   help="worker processes; default: all cores (%(default)s on this machine)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    try:
        chosen = [r for r in table_rows.select(args.rows) if table_rows.skip_reason(r) is None]
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    cfgs = [table_rows.config_for(row, RunConfig(processes=args.processes)) for row in chosen]
    warm_up(cfgs, args.processes, args.quiet, name=f"{len(cfgs)} row(s)", extra=[ici_unit()])
    left = pending(cfgs, [ici_unit()])
    print(f"compiled-code cache: {os.environ.get('NUMBA_CACHE_DIR')}; "
          + (f"{len(left)} unit(s) not compiled: {', '.join(u.label for u in left)}" if left else "all rows warm"),
          file=sys.stderr)
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
