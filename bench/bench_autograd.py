"""The card-major autograd trainer against the upstream-style per-target trainer (and the compiled engine where a
model has one), side by side on the same model and the same training rows.

    python bench/bench_autograd.py                                  # 10k and 100k reviews, every model
    python bench/bench_autograd.py --sizes 10000 --models FSRS-5 SBD

For each size: one simulated user (bench/simulate.py, seed --seed) → features.build_features (same-day reviews in
the histories for FSRS-5/6, as they run) → the first 5/6 of the rows in time order, i.e. the last fold's training
set. Each trainer fits it in this process with one torch thread; the time is the fit call (S0 initialisation
included where the model has one). "loss" is the mean BCE of the fitted weights on the held-out last 1/6, computed
by the model itself, so equal trainers print equal losses.

Trainers per model ("traced": the compiled engine on the plug-in engine/traced.py generates from the same torch
functions, no hand-written gradient; its one-off numba compile is done by the warm-up, outside the timings):
- FSRS-5, HLR: `--trainer autograd` (engine/autograd_engine.py on the module's torch_init/step/curve), `--trainer
  upstream` (upstream/training.py: every target's own padded history, length-sorted batches; float32 as upstream) and the
  default compiled engine (FSRS-5: hand-written numba step VJPs; HLR: the generated plug-in, its counts computed
  once per fit because they read no weight, where the "traced" column replays each target's card: data_state=False).
- FSRS-6: its torch equations (models/fsrs6.py) on the autograd engine, with `--trainer upstream`, and on the
  compiled engine (the plug-in engine/traced.py generates from them: its default).
- SBD (models/sbd.py): full-batch L-BFGS on the autograd engine (one forward pass over all cards per evaluation),
  on its traced plug-in (its default: torch's L-BFGS on the compiled loss and gradient), and over per-target
  histories in batches of 8192 (upstream's way; `--trainer upstream`).
"""

from __future__ import annotations

import os

for _var in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODELS = ["FSRS-5", "FSRS-6", "HLR", "SBD"]


def held_out_loss(p: np.ndarray, y: np.ndarray) -> float:
    p = np.clip(p, 1e-7, 1 - 1e-7)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log1p(-p)))


def trainers(name: str, train, test):
    """(trainer label, fit-and-predict callable) pairs for one model; each callable returns held-out predictions."""
    import models
    from config import RunConfig

    if name == "FSRS-6":
        from models import fsrs6
        from engine.autograd_engine import AutogradEngine
        from models.fsrs6 import CLIP_HI, CLIP_LO, SIGMA, FSRS6

        def autograd():  # FSRS6.fit's S0 initialisation, then the autograd engine
            from models.fsrs6 import DEFAULT_W, S_MIN, forgetting_curve
            from models.fsrs_init import initialize_s0

            decay = DEFAULT_W[20]
            s0 = initialize_s0(train.rows, lambda t, s: forgetting_curve(t, s, decay), DEFAULT_W[:4], S_MIN)
            w_init = list(s0) + DEFAULT_W[4:]
            engine = AutogradEngine(fsrs6, CLIP_LO, CLIP_HI)
            w = engine.fit(w_init, train, RunConfig(algo="FSRS-6"), w_init=w_init, sigma=SIGMA)
            return lambda: fsrs6.predict(w, test)

        def per_model(trainer):
            def run():
                model = FSRS6(RunConfig(algo="FSRS-6", trainer=trainer)).fit(train)
                return lambda: model.predict(test)
            return run

        return [("autograd", autograd), ("upstream", per_model("upstream")), ("compiled", per_model("fast"))]

    def per_trainer(trainer):
        def run():
            model = models.model_class(name)(RunConfig(algo=name, trainer=trainer)).fit(train)
            return lambda: model.predict(test)
        return run

    def traced():  # the compiled engine on the plug-in generated from the module's torch functions
        import importlib

        from engine.seq_engine import SeqEngine
        from engine.traced import compile_module

        model = models.model_class(name)(RunConfig(algo=name))
        plugin = compile_module(importlib.import_module(model.kernels), n_w=len(model.default_w), data_state=False)
        model.engine = SeqEngine(plugin, model.lower, model.upper)
        model.fit(train)
        return lambda: model.predict(test)

    if name == "SBD":  # a model file: its default trainer is the traced plug-in (L-BFGS on the compiled loss)
        return [("autograd", per_trainer("autograd")), ("traced", per_trainer("fast")),
                ("upstream", per_trainer("upstream"))]
    return [("autograd", per_trainer("autograd")), ("traced", traced), ("upstream", per_trainer("upstream")),
            ("compiled", per_trainer("fast"))]


def bench_size(n_reviews: int, names: list[str], seed: int) -> list[dict]:
    from bench.simulate import simulate_user
    from features import FeatureConfig, build_features

    revlog = simulate_user(n_reviews, seed)
    out = []
    for name in names:
        data = build_features(revlog, FeatureConfig(short=name in ("FSRS-5", "FSRS-6")))
        cut = len(data) * 5 // 6
        train, test = data.subset(np.arange(cut)), data.subset(np.arange(cut, len(data)))
        y = test.rows["y"].to_numpy(np.float64)
        row = {"size": n_reviews, "model": name, "train rows": cut}
        for label, fit in trainers(name, train, test):
            t0 = time.perf_counter()
            predict = fit()
            row[label] = time.perf_counter() - t0
            row[f"{label} loss"] = held_out_loss(predict(), y)
            print(f"  {n_reviews:>7,} {name:<7} {label:<9} {row[label]:8.2f} s  held-out loss "
                  f"{row[f'{label} loss']:.6f}", file=sys.stderr, flush=True)
        out.append(row)
    return out


def warm(names: list[str]) -> None:
    """Compile (or load) every numba kernel and touch torch once, outside the timings."""
    bench_size(2000, names, 1)


def table(rows: list[dict]) -> str:
    lines = ["| reviews | model | train rows | autograd (s) | traced (s) | upstream-style (s) | upstream / autograd "
             "| upstream / traced | compiled (s) | held-out loss autograd / traced / upstream / compiled |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        compiled = f"{r['compiled']:.2f}" if "compiled" in r else "—"
        traced = f"{r['traced']:.2f}" if "traced" in r else "—"
        ratio = f"{r['upstream'] / r['traced']:.1f}×" if "traced" in r else "—"
        losses = " / ".join(f"{r[k + ' loss']:.4f}" for k in ("autograd", "traced", "upstream", "compiled")
                            if k in r)
        lines.append(f"| {r['size']:,} | {r['model']} | {r['train rows']:,} | {r['autograd']:.2f} | {traced} | "
                     f"{r['upstream']:.2f} | {r['upstream'] / r['autograd']:.2f}× | {ratio} | {compiled} | "
                     f"{losses} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000], help="reviews per simulated user")
    ap.add_argument("--models", nargs="+", default=MODELS, choices=MODELS)
    ap.add_argument("--seed", type=int, default=100)
    a = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    warm(a.models)
    rows = []
    for size in a.sizes:
        rows += bench_size(size, a.models, a.seed)
    print(table(rows))


if __name__ == "__main__":
    main()
