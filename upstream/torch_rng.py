"""torch's seeded shuffles without torch: `randperm` draws the permutations `torch.randperm(n, generator=g)` draws
from a `torch.Generator().manual_seed(seed)`.

Why: upstream's trainer orders its batches with torch.randperm on a generator seeded 2023, and the compiled
trainers that replay those batches (engine/seq_engine.py, "length" batching) would otherwise import torch (~1.5 s
per process) for a few dozen integers. torch's CPU generator is the standard 32-bit Mersenne Twister seeded by
init_genrand (numpy's legacy MT19937 seeding), and its randperm for n < 2³²/20 is the Fisher–Yates pass
`for i in 0..n−2: swap(r[i], r[i + random() % (n − i)])`, one 32-bit draw per swap. tests/test_torch_rng.py checks
it against torch itself.

`BernoulliStream` draws what `tensor.bernoulli_(p)` draws from torch's DEFAULT generator after
torch.manual_seed(seed), on CPUs where torch takes its portable path: one Bernoulli per element in memory order,
each from a 64-bit draw (two 32-bit words, the first the high half) whose low 53 bits u give u·2⁻⁵³ < p. On Intel
CPUs an MKL build of torch may draw instead from MKL's own stream (seeded by one draw of the generator), which is
not reproduced: `portable_bernoulli()` says whether the emulation applies here (an AMD CPU; elsewhere measured once
against torch itself and remembered in the cache folder: torch 2.13's CPU wheel takes the portable path on this
project's Intel machines too), and callers draw with torch where it does not. Why: the Transformer's compiled trainer needs ~10⁷ dropout-mask elements per user, and
torch's element-by-element draw (~10 ns each) cost as much as the network itself; the twister here is compiled
(~1 ns an element, `_compare_pairs`). tests/test_torch_rng.py checks it against numpy's MT19937,
tests/test_transformer_compiled.py against torch.
"""

from __future__ import annotations

import os
import sys
from functools import lru_cache

import numpy as np
from numba import njit

from engine.jit import inlined

SHUFFLE_SEED = 2023  # upstream's batch-order seed (upstream/training.py)
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
    the portable path (module docstring). The Mersenne Twister runs in numba (`_fill_bernoulli`) on a copy of the
    state numpy's legacy seeding makes: numpy's own draws cost ~12 ns an element (two raw words or one uint64, a
    mask and a compare, each a pass over a temporary array), ~4 s of a 36-user Transformer run; the fused loop
    ~3 ns, ~1 ns since `_compare_pairs` tempers two words a lane. Every draw takes two words, so the state's
    position stays even between calls, as the loop needs."""

    def __init__(self, seed: int):
        if not _LITTLE_ENDIAN:  # _compare_pairs reads the state's word pairs as little-endian uint64s
            raise NotImplementedError("BernoulliStream: little-endian machines only")
        bits = np.random.MT19937(0)
        bits._legacy_seeding(int(seed) & 0xFFFFFFFF)
        state = bits.state["state"]
        self._key = np.array(state["key"], dtype=np.uint32)
        self._pos = int(state["pos"])  # 624: the first draw twists

    def bernoulli(self, n: int, p: float) -> np.ndarray:
        """torch.empty(n, dtype=torch.uint8).bernoulli_(p).numpy() (reshape for other shapes: memory order)."""
        if not 0.0 <= p < 1.0:
            raise ValueError(f"p = {p}: the emulation covers 0 <= p < 1")
        out = np.empty(int(n), dtype=np.uint8)
        self._pos = _fill_bernoulli(self._key, self._pos, out, np.uint64(int(p * 2.0 ** 53)))
        return out


_MT_N, _MT_M = 624, 397


@inlined
def _twist_word(mt, i, j, k):
    """Word i of the Mersenne Twister's regeneration from words i, j = i + 1 and k = i + 397 (mod 624)."""
    y = (np.uint64(mt[i]) & np.uint64(0x80000000)) | (np.uint64(mt[j]) & np.uint64(0x7FFFFFFF))
    mt[i] = np.uint32(np.uint64(mt[k]) ^ (y >> np.uint64(1)) ^ (np.uint64(0x9908B0DF) * (y & np.uint64(1))))


@njit(cache=True)
def _twist(mt):
    """The regeneration of all 624 words (MT19937's reference recurrence), in its three index ranges so that the
    first two loops have no wrap-around (and vectorise)."""
    for i in range(_MT_N - _MT_M):
        _twist_word(mt, i, i + 1, i + _MT_M)
    for i in range(_MT_N - _MT_M, _MT_N - 1):
        _twist_word(mt, i, i + 1, i + _MT_M - _MT_N)
    _twist_word(mt, _MT_N - 1, 0, _MT_M - 1)


# MT19937's output tempering (y ^= y >> 11; y ^= (y << 7) & 0x9D2C5680; y ^= (y << 15) & 0xEFC60000;
# y ^= y >> 18) applied to two 32-bit words at once in one uint64 (word 2i in the low half, 2i + 1 in the high half
# on a little-endian machine): the masks also clear the bits a shift moves across the halves
_PAIR_11 = np.uint64(0x001FFFFF001FFFFF)
_PAIR_B = np.uint64(0x9D2C56809D2C5680)
_PAIR_C = np.uint64(0xEFC60000EFC60000)
_PAIR_18 = np.uint64(0x00003FFF00003FFF)
_LITTLE_ENDIAN = sys.byteorder == "little"


@njit(cache=True)
def _compare_pairs(words, out, threshold):
    """out[i] = (low 53 bits of (temper(words[2i]) << 32 | temper(words[2i + 1]))) < threshold. `words` starts at
    an even position of the state, so its pairs are aligned uint64s (read as one, little-endian: the first word in
    the low half); both words are tempered in one 64-bit lane and the comparison is a signed one (both sides
    < 2^53), so the loop vectorises 4 draws an instruction: the fill ~1.45x faster than tempering word by word
    (1.51 -> 1.04 ns a draw, same bits; tests/test_torch_rng.py)."""
    pairs = words.view(np.uint64)
    th = np.int64(threshold)
    for i in range(len(out)):
        y = pairs[i]
        y ^= (y >> np.uint64(11)) & _PAIR_11
        y ^= (y << np.uint64(7)) & _PAIR_B
        y ^= (y << np.uint64(15)) & _PAIR_C
        y ^= (y >> np.uint64(18)) & _PAIR_18
        u = np.int64(((y & np.uint64(0x1FFFFF)) << np.uint64(32)) | (y >> np.uint64(32)))
        out[i] = np.uint8(u < th)


@njit(cache=True)
def _fill_bernoulli(mt, pos, out, threshold):
    """out[i] = 1 if u_i < threshold else 0, u_i the low 53 bits of the i-th 64-bit draw (first word high, as
    torch builds it) from the state (mt, pos); returns the new pos. pos is even (draws come in pairs), so a
    draw never straddles a twist."""
    done, n = 0, len(out)
    while done < n:
        if pos >= _MT_N:
            _twist(mt)
            pos = 0
        cnt = min((_MT_N - pos) // 2, n - done)
        _compare_pairs(mt[pos:pos + 2 * cnt], out[done:done + cnt], threshold)
        pos += 2 * cnt
        done += cnt
    return pos


def _torch_tag() -> str | None:
    """torch's installed version and location, read without importing it (None: no torch)."""
    import importlib.util

    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        return None
    try:
        from importlib.metadata import version

        ver = version("torch")
    except Exception:  # noqa: BLE001 - no metadata: the location alone
        ver = "?"
    return f"{ver} {spec.origin}"


TORCH_SEED_CHECK = 42  # any seed: the check draws from a private generator


def bernoulli_matches_torch() -> bool:
    """Whether torch's own bernoulli_(p) here draws what BernoulliStream draws: several sizes and probabilities,
    consecutive calls on one generator seeded as torch.manual_seed seeds the default one (a private generator:
    the default generator's state is not touched). Imports torch."""
    import torch

    gen = torch.Generator().manual_seed(TORCH_SEED_CHECK)
    stream = BernoulliStream(TORCH_SEED_CHECK)
    for n, p in ((1, 0.9), (7, 0.9), (1000, 0.9), (4099, 0.5), (70001, 0.9), (3, 0.1)):
        ours = stream.bernoulli(n, p)
        theirs = torch.empty(n, dtype=torch.uint8).bernoulli_(p, generator=gen).numpy()
        if not np.array_equal(ours, theirs):
            return False
    return True



@lru_cache(maxsize=None)
def portable_bernoulli() -> bool:
    """Whether torch's CPU bernoulli_ takes the portable mt19937 path here, i.e. BernoulliStream draws what it
    draws. On AMD CPUs it does (torch's MKL branch is for Intel CPUs only). On Intel CPUs MKL builds of torch used
    MKL's own stream (VSL MCG31, not reproduced); the torch pinned in requirements.txt (2.13.0, CPU wheel) takes
    the portable path on this project's Intel machines too. So on a CPU that is not AMD the answer is measured:
    `bernoulli_matches_torch` (imports torch once), its verdict kept in the user's srs-bench cache folder per torch
    version and location, CPU vendor and model, and read from there by later processes without importing torch
    (the Transformer's default run then imports none; ~1.5 s a process). Anything that fails counts as not
    portable (torch then draws the masks, as before)."""
    from engine.jit_cache import cache_bases, cpu_fields

    fields = cpu_fields() or {}
    if fields.get("vendor_id") == "AuthenticAMD":
        return True
    tag = _torch_tag()
    if tag is None:
        return False
    import hashlib

    key = hashlib.sha1(f"{tag} {fields.get('vendor_id', '')} {fields.get('model name', '')} "
                       f"{sys.byteorder}".encode()).hexdigest()[:12]
    name = f"torch-bernoulli-{key}.txt"
    for base in cache_bases():
        try:
            verdict = (base / name).read_text(encoding="ascii").strip()
        except OSError:
            continue
        if verdict in ("portable", "mkl"):
            return verdict == "portable"
    try:
        portable = bernoulli_matches_torch()
    except Exception:  # noqa: BLE001 - torch missing or failing here: torch draws (callers import it and say why)
        return False
    for base in cache_bases():
        try:
            base.mkdir(parents=True, exist_ok=True)
            tmp = base / f"{name}.{os.getpid()}"
            tmp.write_text("portable\n" if portable else "mkl\n", encoding="ascii")
            os.replace(tmp, base / name)
            break
        except OSError:
            continue
    return portable
