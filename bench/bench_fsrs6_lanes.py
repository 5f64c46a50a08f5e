"""FSRS-6's loss and gradient over one fit's mini-batches: the scalar plug-in (one card at a time) against the lane
kernel (models/fsrs6_lanes.py, LANES cards side by side), paired in one process.

    python bench/bench_fsrs6_lanes.py [--root /tmp/big45] [--user 1] [--pairs 7]

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


def user_cards(root: Path, user: int):
    """(Cards of the last fold's training rows as FSRS-6 trains on them, the post-S0 weights)."""
    from config import RunConfig
    from models.fsrs6 import DEFAULT_W
    from models.seq_engine import training_cards
    from pipeline import prepare_user

    cfg = RunConfig(algo="FSRS-6")
    prep = prepare_user(user, cfg, root)
    train, _ = list(prep.splits())[-1]
    return training_cards(train, None, 64, None), np.array(DEFAULT_W)


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


def lane_epoch_fn():
    from numba import njit

    from models.fsrs6_kernels import precompute
    from models.fsrs6_lanes import lanes_loss_grad

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", type=Path, default=Path("/tmp/big45"))
    ap.add_argument("--user", type=int, default=1)
    ap.add_argument("--pairs", type=int, default=7)
    ap.add_argument("--epoch", type=int, default=0)
    args = ap.parse_args()
    from models import fsrs6_lanes as fl
    from models.fsrs6 import engine

    eng = engine()
    cards, w = user_cards(args.root, args.user)
    items, orders, bounds, n_batches = eng._card_batches(cards, 5, 512, 2023)
    e = args.epoch
    order, bnd, n_b = orders[e], bounds[e], int(n_batches[e])
    states = int(cards.c_n.sum())
    scalar = scalar_epoch_fn(eng.k)
    lanes = lane_epoch_fn()
    common = (w, eng.opts, cards.seq_dt, cards.seq_g, cards.c_start, cards.t_pos, cards.t_dt, cards.t_y, cards.t_wt)
    g_old = np.zeros((n_b, 21))
    g_new = np.zeros((n_b, 21))

    def old():
        return scalar(*common, cards.max_n, items, order, bnd, n_b, g_old)

    def new(want_loss=False):
        return lanes(*common, items, order, bnd, n_b, cards.max_n, g_new, want_loss)

    lo, ln = old(), new(True)
    slots = 0  # lane-positions the lane kernel runs (padding included)
    for b in range(n_b):
        n = np.sort(items[order[bnd[b]:bnd[b + 1]], 3])
        slots += sum((int(n[i:i + fl.LANES].max()) + 1) * fl.LANES for i in range(0, len(n), fl.LANES))
    print(f"lane slots {slots} = {slots / states:.2f} x the states")
    print(f"user {args.user}: {len(cards.c_start)} cards, {states} states, {len(cards.t_pos)} targets, {n_b} batches;"
          f" LANES {fl.LANES}")
    print(f"loss old {lo!r} new {ln!r} rel diff {abs(ln - lo) / abs(lo):.2e}")
    scale = np.abs(g_old).max(axis=1, keepdims=True)
    print(f"gradient: largest |new − old| / max|old| per batch {np.max(np.abs(g_new - g_old) / scale):.2e}; "
          f"largest componentwise rel diff {np.max(np.abs(g_new - g_old) / np.maximum(np.abs(g_old), 1e-300)):.2e}")
    t_old, t_new = [], []
    for _ in range(args.pairs):
        for fn, acc in ((old, t_old), (new, t_new)):
            t0 = time.process_time()
            fn()
            acc.append(time.process_time() - t0)
    ratios = [a / b for a, b in zip(t_old, t_new)]
    print(f"per state: old {np.median(t_old) / states * 1e9:.1f} ns, new {np.median(t_new) / states * 1e9:.1f} ns;"
          f" old/new per pair {' '.join(f'{r:.2f}' for r in ratios)} (median {np.median(ratios):.2f})")


if __name__ == "__main__":
    main()
