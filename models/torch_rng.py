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
        r = out.tolist()
        for i, z in enumerate(draws.tolist()):
            j = i + z
            r[i], r[j] = r[j], r[i]
        return np.array(r, dtype=np.int64)


_MT_N, _MT_M = 624, 397


@njit(cache=True, inline="always")
def _mt_mix(key, i, j, k):
    """key[i] from words i, j = i + 1 and k = i + 397 (mod 624)."""
    y = (key[i] & np.uint32(0x80000000)) | (key[j] & np.uint32(0x7FFFFFFF))
    v = key[k] ^ (y >> np.uint32(1))
    if y & np.uint32(1):
        v ^= np.uint32(0x9908B0DF)
    key[i] = v


@njit(cache=True)
def _mt_twist(key):
    """The Mersenne Twister's state transition (624 words in place), its indices unrolled out of the modulo."""
    for i in range(_MT_N - _MT_M):
        _mt_mix(key, i, i + 1, i + _MT_M)
    for i in range(_MT_N - _MT_M, _MT_N - 1):
        _mt_mix(key, i, i + 1, i + _MT_M - _MT_N)
    _mt_mix(key, _MT_N - 1, 0, _MT_M - 1)


@njit(cache=True, inline="always")
def _mt_temper(y):
    y ^= y >> np.uint32(11)
    y ^= (y << np.uint32(7)) & np.uint32(0x9D2C5680)
    y ^= (y << np.uint32(15)) & np.uint32(0xEFC60000)
    y ^= y >> np.uint32(18)
    return y


@njit(cache=True)
def _bernoulli_fill(key, pos, out, threshold):
    """out[i] = 1 where the i-th 64-bit draw's low 53 bits are < threshold (= p·2⁵³, an integer for a double p <
    1), else 0; returns the new position in the state."""
    for i in range(len(out)):
        if pos >= _MT_N:
            _mt_twist(key)
            pos = 0
        hi = np.uint64(_mt_temper(key[pos]))
        pos += 1
        if pos >= _MT_N:
            _mt_twist(key)
            pos = 0
        lo = np.uint64(_mt_temper(key[pos]))
        pos += 1
        u = ((hi & np.uint64(0x1FFFFF)) << np.uint64(32)) | lo
        out[i] = 1 if u < threshold else 0
    return pos


class BernoulliStream:
    """torch's default generator after torch.manual_seed(seed), as far as bernoulli_(p) with a scalar p uses it on
    the portable path (module docstring)."""

    def __init__(self, seed: int):
        bits = np.random.MT19937(0)
        bits._legacy_seeding(int(seed) & 0xFFFFFFFF)
        state = bits.state["state"]
        self._key = np.array(state["key"], dtype=np.uint32)
        self._pos = int(state["pos"])

    def bernoulli(self, n: int, p: float) -> np.ndarray:
        """torch.empty(n, dtype=torch.uint8).bernoulli_(p).numpy() (reshape for other shapes: memory order)."""
        if not 0.0 <= p < 1.0:
            raise ValueError(f"p = {p}: the emulation covers 0 <= p < 1")
        out = np.empty(int(n), dtype=np.uint8)
        self._pos = _bernoulli_fill(self._key, self._pos, out, np.uint64(int(p * 2.0 ** 53)))
        return out


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
