"""A traced model's loss and gradient over one fit's mini-batches, and its whole 5-fold fit: the scalar generated
plug-in (one card at a time) against its lane form (engine/traced_lanes.py, LANES cards side by side), paired in
one process (alternating, medians of CPU time).

    python bench/bench_traced_lanes.py [--model fsrs7] [--root /tmp/big45] [--user 1] [--pairs 7] [--fits 3]
        [--recency]

Batches: as bench/bench_fsrs6_lanes.py (the engine's whole-card batches of the last fold's training rows, one
epoch per timed call, no Adam steps; the lane kernel without its loss). The fit: the engine's Adam over every
fold's training rows from the same initial weights (models/fsrs7.initial_weights, not timed), the plug-in with
LANE_KERNELS against the one without (traced.compile_module(..., lanes=False)). Prints per-state times, old/new
ratios per pair, and the largest relative differences of the loss, the gradient and the fitted weights.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path

os.environ.setdefault("NUMBA_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from bench.bench_fsrs6_lanes import compare_epoch, paired_cpu, ratios_text  # noqa: E402


def folds(root: Path, user: int, algo: str, recency: bool):
    """[(training rows, initial weights, row weights)] of the user's folds as the model's row trains them."""
    from config import RunConfig
    from pipeline import prepare_user

    cfg = RunConfig(algo=algo, recency=recency)
    prep = prepare_user(user, cfg, root)
    mod = importlib.import_module("models.fsrs7")
    out = []
    for train, _ in prep.splits():
        w0 = np.array(mod.initial_weights(train, cfg), dtype=np.float64)
        weights = mod.recency_weights(len(train)) if recency else None
        out.append((train, w0, weights))
    return out, cfg


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="fsrs7")
    ap.add_argument("--root", type=Path, default=Path("/tmp/big45"))
    ap.add_argument("--user", type=int, default=1)
    ap.add_argument("--pairs", type=int, default=7)
    ap.add_argument("--fits", type=int, default=3)
    ap.add_argument("--recency", action="store_true")
    args = ap.parse_args()
    from engine.autograd_engine import Recipe
    from engine.seq_engine import SeqEngine, training_cards
    from engine.traced import compile_module

    mod = importlib.import_module(f"models.{args.model}")
    recipe = Recipe.from_dict(mod.RECIPE)
    new_name, old_name = compile_module(mod), compile_module(mod, lanes=False)
    new_eng = SeqEngine(new_name, mod.LOWER, mod.UPPER)
    old_eng = SeqEngine(old_name, mod.LOWER, mod.UPPER)
    lm = importlib.import_module(sys.modules[new_name].LANE_KERNELS)
    data, cfg = folds(args.root, args.user, mod.NAME, args.recency)

    # ---- one epoch's batches of the last fold
    train, w, weights = data[-1]
    cards = training_cards(train, weights, 64, None)
    items, orders, bounds, n_batches = new_eng._card_batches(cards, 1, recipe.batch_size, 2023)
    compare_epoch(f"{mod.NAME}{' recency' if args.recency else ''}, user {args.user}", old_eng.k,
                  new_eng.k.precompute, lm.lanes_loss_grad, new_eng.opts, cards, w, items, orders[0], bounds[0],
                  int(n_batches[0]), args.pairs)

    # ---- the 5-fold fit
    def fit(eng):
        out = []
        for tr, w0, wts in data:
            out.append(eng.fit(w0, tr, cfg_run(eng), w_init=w0, sigma=mod.SIGMA, lr=recipe.lr,
                               betas=tuple(recipe.betas), seed=recipe.seed, keep_last=True, weights=wts,
                               prior_scale=float(recipe.prior_weight)))
        return out

    from types import SimpleNamespace

    def cfg_run(eng):
        n_epoch, batch_size = recipe.epochs_and_batch(cfg)
        return SimpleNamespace(n_epoch=n_epoch, batch_size=batch_size, max_seq_len=64, recency=False)

    wo, wn = fit(old_eng), fit(new_eng)
    print(f"fitted weights: largest |new − old| / max(|old|, 1e-3) "
          f"{max(np.max(np.abs(a - b) / np.maximum(np.abs(a), 1e-3)) for a, b in zip(wo, wn)):.2e}")
    f_old, f_new, ratios = paired_cpu(lambda: fit(old_eng), lambda: fit(new_eng), args.fits)
    print(f"5-fold fit: old {np.median(f_old) * 1e3:.0f} ms, new {np.median(f_new) * 1e3:.0f} ms; "
          f"{ratios_text(ratios)}")


if __name__ == "__main__":
    main()
