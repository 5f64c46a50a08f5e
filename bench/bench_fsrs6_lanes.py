"""A lane model's loss and gradient over one fit's mini-batches: the scalar plug-in (one card at a time) against
its lane kernel (lane_kernels/fsrs_v5_lanes.py, or the generated ones: LANES cards side by side), paired
in one process; with --fit, its whole 5-fold fit (the engine's Adam and objective passes, S0 not timed) with and
without the lanes.

    python bench/bench_fsrs6_lanes.py [--model FSRS-6] [--root /tmp/big45] [--user 1] [--pairs 7] [--fit]

--model: FSRS-6 (default), FSRS-5, FSRS-4.5, FSRSv4, FSRSv3, FSRSv2 or FSRSv1, with --recency for the
recency-weighted rows.

The batches are the engine's (SeqEngine._card_batches: whole cards, shuffled per epoch, >= 512 targets) over the
training rows of the user's last fold; one timed call runs every batch of one epoch (precompute, the cards' loss and
gradient, the fold), as adam_fit's inner loop does, without the Adam steps (the lane kernel without its loss, which
Adam does not read; the scalar kernel computes it on the way). Prints each kernel's median time per
training state (the states the scalar kernel walks), old/new ratios per pair, and the largest relative differences
of the loss and of the gradient (per batch, relative to the batch gradient's largest component).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("NUMBA_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402


def user_folds(root: Path, user: int, algo: str, recency: bool):
    """(the model, the user's (train, test) folds) as the benchmark runs them."""
    import models
    from config import RunConfig
    from pipeline import prepare_user

    cfg = RunConfig(algo=algo, recency=recency)
    model = models.model_class(algo)(cfg)
    return model, list(prepare_user(user, cfg, root).splits())


def user_cards(root: Path, user: int, algo: str = "FSRS-6", recency: bool = False):
    """(Cards of the last fold's training rows as the model trains on them, its default weights)."""
    from models.base import recency_weights
    from engine.seq_engine import training_cards

    model, folds = user_folds(root, user, algo, recency)
    train, _ = folds[-1]
    weights = recency_weights(len(train)) if recency else None
    if algo == "FSRS-6":  # not a SeqModel: all rows, its module's defaults
        from models.fsrs6 import DEFAULT_W
        return training_cards(train, weights, 64, None), np.array(DEFAULT_W)
    return training_cards(train, weights, 64, model.training_rows(train)), np.array(model.default_w, dtype=float)


def scalar_epoch_fn(k):
    """An njit function running one epoch's batches through the engine's scalar card_loss_grad (k: the engine's
    instantiated module); returns (Σ loss, gradient per batch)."""
    from numba import njit

    card_loss_grad, precompute, scratch = k.card_loss_grad, k.precompute, k.scratch

    @njit
    def run(w, opts, seq_dt, seq_g, c_start, t_pos, t_dt, t_y, t_wt, max_n, items, order, bounds, n_b, grads):
        buf = scratch(max_n)
        loss = 0.0
        for b in range(n_b):
            wc = precompute(w, opts)
            gwc = np.zeros(len(wc))
            for pos in range(bounds[b], bounds[b + 1]):
                it = order[pos]
                loss += card_loss_grad(wc, seq_dt, seq_g, c_start[items[it, 0]], items[it, 3], t_pos, t_dt, t_y,
                                       t_wt, items[it, 1], items[it, 2], buf, gwc)
            for j in range(grads.shape[1]):
                grads[b, j] = gwc[j]
        return loss
    return run


def lane_epoch_fn(precompute, lanes_loss_grad):
    """The same through a lane kernel (an njit function; returns Σ loss when want_loss)."""
    from numba import njit

    @njit
    def run(w, opts, seq_dt, seq_g, c_start, t_pos, t_dt, t_y, t_wt, items, order, bounds, n_b, max_n, grads,
            want_loss):
        loss = 0.0
        for b in range(n_b):
            wc = precompute(w, opts)
            gwc = np.zeros(len(wc))
            loss += lanes_loss_grad(wc, seq_dt, seq_g, c_start, t_pos, t_dt, t_y, t_wt, items,
                                    order[bounds[b]:bounds[b + 1]], max_n, gwc, want_loss, True)
            for j in range(grads.shape[1]):
                grads[b, j] = gwc[j]
        return loss
    return run


def paired_cpu(old, new, pairs: int):
    """CPU seconds of old() and new(), alternated `pairs` times: (old times, new times, old/new per pair)."""
    t_old, t_new = [], []
    for _ in range(pairs):
        for fn, acc in ((old, t_old), (new, t_new)):
            t0 = time.process_time()
            fn()
            acc.append(time.process_time() - t0)
    return t_old, t_new, [a / b for a, b in zip(t_old, t_new)]


def ratios_text(ratios) -> str:
    return f"old/new per pair {' '.join(f'{r:.2f}' for r in ratios)} (median {np.median(ratios):.2f})"


def compare_epoch(label: str, scalar_module, precompute, lanes_loss_grad, opts, cards, w, items, order, bnd, n_b,
                  pairs: int) -> None:
    """One epoch's batches (items[order[bnd[b]:bnd[b + 1]]], b < n_b) through the scalar plug-in's card loop and
    through the lane kernel: the lane slots run, the loss and gradient differences, the paired time per state."""
    from engine.lanes import LANES

    states = int(cards.c_n.sum())
    scalar = scalar_epoch_fn(scalar_module)
    lanes = lane_epoch_fn(precompute, lanes_loss_grad)
    common = (w, opts, cards.seq_dt, cards.seq_g, cards.c_start, cards.t_pos, cards.t_dt, cards.t_y, cards.t_wt)
    n_wc = len(precompute(w, opts))
    g_old = np.zeros((n_b, n_wc))
    g_new = np.zeros((n_b, n_wc))

    def old():
        return scalar(*common, cards.max_n, items, order, bnd, n_b, g_old)

    def new(want_loss=False):
        return lanes(*common, items, order, bnd, n_b, cards.max_n, g_new, want_loss)

    lo, ln = old(), new(True)
    slots = 0  # lane-positions the lane kernel runs (padding included)
    for b in range(n_b):
        n = np.sort(items[order[bnd[b]:bnd[b + 1]], 3])
        slots += sum((int(n[i:i + LANES].max()) + 1) * LANES for i in range(0, len(n), LANES))
    print(f"{label}: {len(cards.c_start)} cards, {states} states, {len(cards.t_pos)} targets, {n_b} batches; "
          f"LANES {LANES}, lane slots {slots / states:.2f} x the states")
    print(f"loss old {lo!r} new {ln!r} rel diff {abs(ln - lo) / abs(lo):.2e}")
    scale = np.abs(g_old).max(axis=1, keepdims=True)
    print(f"gradient: largest |new − old| / max|old| per batch {np.max(np.abs(g_new - g_old) / scale):.2e}; "
          f"largest componentwise rel diff {np.max(np.abs(g_new - g_old) / np.maximum(np.abs(g_old), 1e-300)):.2e}")
    t_old, t_new, ratios = paired_cpu(old, new, pairs)
    print(f"loss+gradient per state: old {np.median(t_old) / states * 1e9:.1f} ns, new "
          f"{np.median(t_new) / states * 1e9:.1f} ns; {ratios_text(ratios)}")


def scalar_plugin(kernels: str) -> str:
    """The name of a copy of the plug-in module `kernels` without LANE_KERNELS (the scalar engine), importable."""
    import importlib
    import tempfile

    mod = importlib.import_module(kernels)
    names = [n for n in ("N_ADJ", "N_STATE", "precompute", "precompute_vjp") if hasattr(mod, n)]
    d = Path(tempfile.mkdtemp(prefix="scalar_plugin_"))
    name = f"scalar_{kernels.replace('.', '_')}"
    (d / f"{name}.py").write_text(f"from {kernels} import *  # noqa\nfrom {kernels} import {', '.join(names)}  # noqa\n"
                                  "del LANE_KERNELS  # noqa\n")
    sys.path.insert(0, str(d))
    return name


def fit_pairs(args) -> None:
    """The 5-fold fit with and without the lanes, alternating (S0 fitted once per fold, outside the timing)."""
    from engine.seq_engine import SeqEngine

    model, folds = user_folds(args.root, args.user, args.model, args.recency)
    lanes = model.engine
    scalar = SeqEngine(scalar_plugin(model.plugin()), model.lower, model.upper, opts=lanes.opts)
    setups = []
    for train, _ in folds:
        w_init = model.initial_weights(train)
        keep = model.training_rows(train)
        mask = None
        if model.frozen:
            mask = np.ones(len(w_init))
            mask[list(model.frozen)] = 0.0
        setups.append((w_init, train, keep, mask))

    def run(eng):
        out = []
        for w_init, train, keep, mask in setups:
            out.append(eng.fit(w_init, train, model.cfg, w_init=w_init, sigma=model.sigma, grad_mask=mask, keep=keep,
                               lr=model.lr, batching=model.engine_batching, sort_kind=model.batch_sort))
        return out

    w_l, w_s = run(lanes), run(scalar)  # compile / warm
    print(f"{args.model}{' recency' if args.recency else ''} user {args.user}: {len(folds)} folds; fitted weights "
          f"largest |lanes − scalar| {max(np.abs(a - b).max() for a, b in zip(w_l, w_s)):.1e}")
    t_old, t_new, ratios = paired_cpu(lambda: run(scalar), lambda: run(lanes), args.pairs)
    print(f"5-fold fit: scalar {np.median(t_old) * 1e3:.1f} ms, lanes {np.median(t_new) * 1e3:.1f} ms; "
          f"{ratios_text(ratios)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", type=Path, default=Path("/tmp/big45"))
    ap.add_argument("--user", type=int, default=1)
    ap.add_argument("--pairs", type=int, default=7)
    ap.add_argument("--epoch", type=int, default=0)
    ap.add_argument("--model", default="FSRS-6",
                    choices=["FSRS-6", "FSRS-5", "FSRS-4.5", "FSRSv4", "FSRSv3", "FSRSv2", "FSRSv1"])
    ap.add_argument("--recency", action="store_true")
    ap.add_argument("--fit", action="store_true", help="time the 5-fold fit instead of the kernels")
    args = ap.parse_args()
    if args.fit:
        if args.model == "FSRS-6":
            raise SystemExit("--fit: FSRS-6's fit is timed by bench/bench_fsrs6.py")
        fit_pairs(args)
        return
    if args.model == "FSRS-6":
        from models.fsrs6 import engine
        eng = engine()
    else:
        eng = user_folds(args.root, args.user, args.model, args.recency)[0].engine
    cards, w = user_cards(args.root, args.user, args.model, args.recency)
    items, orders, bounds, n_batches = eng._card_batches(cards, 5, 512, 2023)
    e = args.epoch
    compare_epoch(f"{args.model} user {args.user}", eng.k, eng.k.precompute, eng.k.lanes_loss_grad, eng.opts, cards,
                  w, items, orders[e], bounds[e], int(n_batches[e]), args.pairs)

if __name__ == "__main__":
    main()
