"""torch's seeded shuffles without torch: `randperm` draws the permutations `torch.randperm(n, generator=g)` draws
from a `torch.Generator().manual_seed(seed)`.

Why: upstream's trainer orders its batches with torch.randperm on a generator seeded 2023, and the compiled
trainers that replay those batches (models/seq_engine.py, "length" batching) would otherwise import torch (~1.5 s
per process) for a few dozen integers. torch's CPU generator is the standard 32-bit Mersenne Twister seeded by
init_genrand (numpy's legacy MT19937 seeding), and its randperm for n < 2³²/20 is the Fisher–Yates pass
`for i in 0..n−2: swap(r[i], r[i + random() % (n − i)])`, one 32-bit draw per swap. tests/test_torch_rng.py checks
it against torch itself.
"""

from __future__ import annotations

import numpy as np
from numba import njit

SHUFFLE_SEED = 2023  # upstream's batch-order seed (training.py)
_SMALL_N = (1 << 32) // 20  # torch switches to 64-bit draws above this size


class TorchGenerator:
    """The stream of a `torch.Generator().manual_seed(seed)` as far as randperm uses it."""

    def __init__(self, seed: int = SHUFFLE_SEED):
        self._bits = np.random.MT19937(0)
        self._bits._legacy_seeding(int(seed) & 0xFFFFFFFF)

    def randperm(self, n: int) -> np.ndarray:
        """torch.randperm(n, generator=<this generator>), as int64."""
        if n >= _SMALL_N:
            raise ValueError(f"randperm({n}): torch uses 64-bit draws from this size on (not reproduced)")
        out = np.arange(n, dtype=np.int64)
        if n < 2:
            return out
        draws = (self._bits.random_raw(n - 1) % np.arange(n, 1, -1, dtype=np.uint64)).astype(np.int64)
        _swap_pass(out, draws)
        return out


@njit(cache=True)
def _swap_pass(r, draws):
    """The Fisher–Yates pass: swap r[i] with r[i + draws[i]] for i = 0, 1, ... (compiled: a Python loop cost ~0.3 s
    per million rows, which LogisticRegression's 10 shuffles per fold of every training row made visible)."""
    for i in range(len(draws)):
        j = i + draws[i]
        r[i], r[j] = r[j], r[i]
