"""torch's seeded shuffles without torch: `randperm` draws the permutations `torch.randperm(n, generator=g)` draws
from a `torch.Generator().manual_seed(seed)`.

Why: upstream's trainer orders its batches with torch.randperm on a generator seeded 2023, and the compiled
trainers that replay those batches (models/seq_engine.py, "length" batching) would otherwise import torch (~1.5 s
per process) for a few dozen integers. torch's CPU generator is the standard 32-bit Mersenne Twister seeded by
init_genrand (numpy's legacy MT19937 seeding), and its randperm for n < 2³²/20 is the Fisher–Yates pass
`for i in 0..n−2: swap(r[i], r[i + random() % (n − i)])`, one 32-bit draw per swap. tests/test_torch_rng.py checks
it against torch itself.

`BernoulliStream` draws what `tensor.bernoulli_(p)` draws from torch's DEFAULT generator after
torch.manual_seed(seed), on CPUs where torch takes its portable path: one Bernoulli per element in memory order,
each from a 64-bit draw (two 32-bit words, the first the high half) whose low 53 bits u give u·2⁻⁵³ < p. On Intel
CPUs an MKL build of torch draws instead from MKL's own stream (seeded by one draw of the generator), which is not
reproduced: `portable_bernoulli()` says whether this CPU is one where the emulation applies (AMD), and callers draw
with torch elsewhere. Why: the Transformer's compiled trainer needs ~10⁷ dropout-mask elements per user, and
torch's element-by-element draw (~10 ns each) cost as much as the network itself.
"""

from __future__ import annotations

from functools import lru_cache

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


class BernoulliStream:
    """torch's default generator after torch.manual_seed(seed), as far as bernoulli_(p) with a scalar p uses it on
    the portable path (module docstring)."""

    def __init__(self, seed: int):
        self._bits = np.random.MT19937(0)
        self._bits._legacy_seeding(int(seed) & 0xFFFFFFFF)
        self._draw = np.random.Generator(self._bits)

    def bernoulli(self, n: int, p: float) -> np.ndarray:
        """torch.empty(n, dtype=torch.uint8).bernoulli_(p).numpy() (reshape for other shapes: memory order)."""
        if not 0.0 <= p < 1.0:
            raise ValueError(f"p = {p}: the emulation covers 0 <= p < 1")
        if _next64_high_first():  # one full-range uint64 draw per element is torch's 64-bit draw
            u = self._draw.integers(0, 2**64 - 1, size=int(n), dtype=np.uint64, endpoint=True)
        else:
            words = self._bits.random_raw(2 * int(n))
            u = (words[0::2] << np.uint64(32)) | words[1::2]
        return ((u & np.uint64(2**53 - 1)) < np.uint64(int(p * 2.0 ** 53))).view(np.uint8)


@lru_cache(maxsize=None)
def _next64_high_first() -> bool:
    """Whether numpy's MT19937 builds a 64-bit draw as (first word << 32) | second word, as torch does: numpy's C
    code writes both calls in one expression, whose evaluation order is the compiler's choice, so this is checked
    once per process against two raw 32-bit words (the slower raw-word path is used otherwise)."""
    a, b = np.random.MT19937(7), np.random.MT19937(7)
    first, second = (int(w) for w in a.random_raw(2))
    return int(np.random.Generator(b).integers(0, 2**64 - 1, dtype=np.uint64, endpoint=True)) == (first << 32) | second


@lru_cache(maxsize=None)
def portable_bernoulli() -> bool:
    """Whether torch's CPU bernoulli_ takes the portable mt19937 path here: an AMD CPU (Intel: MKL's stream in MKL
    builds; anything not recognised counts as not portable)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip() == "AuthenticAMD"
    except OSError:
        pass
    return False
