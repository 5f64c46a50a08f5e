"""A hand-written lane kernel against the lane kernel the tracer generates from the same model's torch equations
(engine/traced.py on the module's torch_init / torch_step / torch_curve), kernel alone, paired in one process.

    python bench/bench_generated_lanes.py [--models FSRS-5] [--cards 20000] [--pairs 15]

Data: random review histories (tests/test_fsrs6_fast.random_data, seed 1), all cards in one batch, loss and gradient
wanted. Each pair calls the two kernels back to back on the same arrays (alternating which goes first); the median
of the per-pair ratios generated / hand is printed, with the largest relative differences of loss and gradient
(through each plug-in's precompute_vjp). Whether a hand kernel stays starts with this ratio (lane_kernels/*.py
docstrings); FSRS v1, v2, v3, v4, 4.5 and 6, whose generated kernels measured 0.80-1.07x here, now run on them.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("NUMBA_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import numpy as np  # noqa: E402

from engine.lanes import card_items  # noqa: E402
from engine.seq_engine import Cards, lane_function  # noqa: E402
from engine.traced import compile_module  # noqa: E402
from engine.traced_codegen import TraceError  # noqa: E402


def plugins(row: str) -> tuple[str, str, np.ndarray]:
    """(hand plug-in, generated plug-in, the model's default weights) of a registered row: the generated plug-in
    traced from the torch equations in the same module (torch_init / torch_step / torch_curve)."""
    import importlib

    import models

    cls = models.model_class(row)
    module = sys.modules[cls.__module__]
    hand = getattr(module, "KERNELS", module.__name__)
    w = np.asarray(getattr(cls, "default_w", None) or importlib.import_module(hand).DEFAULT_W, dtype=np.float64)
    return hand, compile_module(module, n_w=len(w), use_clip=False), w


class Batch:
    """All cards of `data` as one lane batch, and a call of a plug-in's lane kernel on it."""

    def __init__(self, data):
        self.cards = Cards(data, None)
        c = self.cards
        self.items = card_items(c.c_start, c.c_n, c.c_tb, c.c_te)
        self.order = np.arange(len(self.items))

    def kernel(self, plugin: str, w):
        """The plug-in's lane kernel over the batch at weights w: a call returns (loss, gradient of w); the
        run-time options are the defaults (day mode's s_min)."""
        pm, c, opts = sys.modules[plugin], self.cards, np.zeros(0)
        fn = lane_function(pm.LANE_KERNELS)
        wc = pm.precompute(np.asarray(w, float), opts)
        gwc = np.zeros(len(wc))

        def run():
            gwc[:] = 0.0
            loss = fn(wc, c.seq_dt, c.seq_g, c.c_start, c.t_pos, c.t_dt, c.t_y, c.t_wt, self.items, self.order,
                      c.max_n, gwc, True, True)
            gw = np.zeros(len(w))
            pm.precompute_vjp(np.asarray(w, float), opts, wc, gwc, gw)
            return loss, gw
        return run


def main() -> None:
    from test_fsrs6_fast import random_data

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="FSRS-5")
    ap.add_argument("--cards", type=int, default=20000)
    ap.add_argument("--pairs", type=int, default=15)
    args = ap.parse_args()
    batch = Batch(random_data(np.random.default_rng(1), args.cards))
    for name in args.models.split(","):
        import models

        if getattr(models.model_class(name), "traced", False):
            print(f"{name}: runs on the generated kernel (its class's `traced`): no hand kernel to compare")
            continue
        try:
            hand, generated, w = plugins(name)
        except TraceError as exc:
            print(f"{name}: its torch equations do not trace: {exc}")
            continue
        runs = {p: batch.kernel(p, w) for p in (hand, generated)}
        (lh, gh), (lg, gg) = runs[hand](), runs[generated]()
        ratios = []
        for i in range(args.pairs):
            times = {}
            for p in ((hand, generated) if i % 2 == 0 else (generated, hand)):
                t = time.perf_counter()
                runs[p]()
                times[p] = time.perf_counter() - t
            ratios.append(times[generated] / times[hand])
        print(f"{name}: generated / hand {np.median(ratios):.2f}x (min {min(ratios):.2f}, max {max(ratios):.2f}); "
              f"loss rel. diff {abs(lg - lh) / abs(lh):.1e}, gradient {np.abs(gg - gh).max() / np.abs(gh).max():.1e}")



if __name__ == "__main__":
    main()
