"""The LSTM kernel's loss + gradient (neural/lstm_kernels.lstm_cards_loss) against another copy of it, paired.

    git worktree add --detach /tmp/lstm4-base main
    python bench/bench_lstm.py --base /tmp/lstm4-base --data /tmp/sim36 --users 19,10,27,5 --pairs 15

For each user: its reviews with the LSTM's inputs (same-day histories), the fine-tune's rows, weights and card order
(models/lstm.py finetune_rows, equalized_train) over the whole user, cut into the fine-tune's groups of ≈ BATCH
targets; one "pass" is lstm_cards_loss (want gradient) on every group, from the pretrained weights. The base copy's
kernel (`--base`: a checkout, e.g. a worktree of main, whose neural/lstm_kernels.py is loaded under another module
name; it imports the shared helpers from this checkout) and this checkout's are alternated `--pairs` times in one
process, one thread, CPU time. Reported per user: rows, medians, every pair's old/new ratio, and how far the new
loss and gradient are from the old (relative to the gradient's largest entry).
"""

from __future__ import annotations

import os

for _var in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_fsrs6_lanes import paired_cpu, ratios_text  # noqa: E402
from data_loader import load_revlogs  # noqa: E402
from features import FeatureConfig, build_features  # noqa: E402
from models import lstm  # noqa: E402
from neural import lstm_kernels
from neural.card_fit import group_bounds  # noqa: E402
from neural.card_net import CardSet, read_weights  # noqa: E402


def load_base(base: Path):
    """The base checkout's lstm_kernels as module `lstm_kernels_base`."""
    spec = importlib.util.spec_from_file_location("lstm_kernels_base", base / "models" / "lstm_kernels.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def user_pass(root: Path, user: int, precision: str):
    """(model consts, layout, the groups' card arrays, theta, n targets, n rows) of one fine-tune pass over user."""
    rev = load_revlogs(root, user)
    data = lstm.equalized_train(lstm.attach_sequences(build_features(rev, FeatureConfig(short=True)), rev))
    net = lstm.LSTMFlat(read_weights("LSTM", "pretrain.py"))
    net.precision = precision
    weights, keep, rng = lstm.finetune_rows(data)
    cards = CardSet(net, data, keep, weights)
    order = rng.permutation(cards.n_cards)
    layout = net.kernel_layout(cards, repeat=True)  # as the fine-tune's: the same groups in every pass
    bounds = group_bounds(layout[4][order], lstm.BATCH)
    groups = [order[bounds[b]:bounds[b + 1]] for b in range(len(bounds) - 1)]
    return net.model_consts(), layout, groups, net.theta(), len(layout[5]), int(layout[2].sum())


def run_pass(fn, model, layout, groups, theta, n_t):
    """loss, gradient summed over the groups (each group's gradient added into its own zeroed vector)."""
    p = np.empty(n_t)
    loss, grad = 0.0, np.zeros(lstm_kernels.N_PARAMS)
    for cards in groups:
        g = np.zeros(lstm_kernels.N_PARAMS)
        loss += fn(model, layout, cards, theta, True, g, p)
        grad += g
    return loss, grad, p


def time_pass(fn, *args) -> float:
    t0 = time.process_time()
    run_pass(fn, *args)
    return time.process_time() - t0


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", type=Path, required=True, help="checkout with the old neural/lstm_kernels.py")
    ap.add_argument("--data", type=Path, default=Path("/tmp/sim36"))
    ap.add_argument("--users", default="19,10,27,5")
    ap.add_argument("--pairs", type=int, default=15)
    ap.add_argument("--precision", default="float32")
    ap.add_argument("--reps", type=int, default=0, help="passes per timed call (0: enough for ≈ 0.1 s)")
    a = ap.parse_args(argv)
    base = load_base(a.base)
    fns = base.lstm_cards_loss, lstm_kernels.lstm_cards_loss
    all_ratios = []
    for user in [int(u) for u in a.users.split(",")]:
        model, layout, groups, theta, n_t, n_rows = user_pass(a.data, user, a.precision)
        # the base copy gets card_fit's 10 entries (a kernel from before the plan memo reads no more)
        layouts = layout[:10], layout
        (l0, g0, p0), (l1, g1, p1) = [run_pass(f, model, lo, groups, theta, n_t) for f, lo in zip(fns, layouts)]
        scale = np.abs(g0).max()
        reps = a.reps or max(1, int(0.1 / (time_pass(fns[0], model, layouts[0], groups, theta, n_t) + 1e-9)))
        t_old, t_new, ratios = paired_cpu(*[lambda f=f, lo=lo: [run_pass(f, model, lo, groups, theta, n_t)
                                                                 for _ in range(reps)]
                                            for f, lo in zip(fns, layouts)], a.pairs)
        t_old, t_new = [t / reps for t in t_old], [t / reps for t in t_new]
        all_ratios += ratios
        print(f"user {user}: {n_rows} rows, {n_t} targets, {len(groups)} groups, {reps} passes a call; "
              f"old {np.median(t_old) * 1e3:.1f} ms "
              f"new {np.median(t_new) * 1e3:.1f} ms per pass ({np.median(t_new) / n_rows * 1e9:.0f} ns per row); "
              f"{ratios_text(ratios)}; loss rel {abs(l1 - l0) / abs(l0):.1e}, gradient max "
              f"{np.abs(g1 - g0).max() / scale:.1e} of its largest, P(recall) {np.abs(p1 - p0).max():.1e}",
              flush=True)
    print(f"all pairs: median old/new {np.median(all_ratios):.3f}")


if __name__ == "__main__":
    main()
