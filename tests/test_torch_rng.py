"""upstream/torch_rng.py draws torch.randperm's permutations without torch: checked against torch itself."""

import numpy as np
import pytest
import torch

from upstream.torch_rng import SHUFFLE_SEED, TorchGenerator


@pytest.mark.parametrize("seed", [SHUFFLE_SEED, 0, 42, 2**32 + 7])
def test_randperm_stream_equals_torch(seed):
    """Successive draws of several sizes from one generator (as upstream's epochs draw them), sizes 0 and 1
    included (torch draws nothing for them)."""
    generator = torch.Generator().manual_seed(seed)
    ours = TorchGenerator(seed)
    for n in [5, 0, 1, 2, 3, 97, 1, 513, 4096, 12, 150_001]:
        np.testing.assert_array_equal(ours.randperm(n), torch.randperm(n, generator=generator).numpy())


def test_length_batching_imports_no_torch():
    """The compiled trainer's upstream-style batch order (ACT-R, DASH[ACT-R]) runs in a process without torch."""
    import subprocess
    import sys

    code = ("import sys; from upstream.torch_rng import TorchGenerator; TorchGenerator().randperm(9); "
            "import models.act_r, models.dash, models.anki, models.hlr; assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def _numpy_bernoulli(bits: np.random.MT19937, n: int, p: float) -> np.ndarray:
    """The Bernoulli rule on numpy's own MT19937 words, written independently of upstream/torch_rng.py: draw i is
    (word 2i << 32) | word 2i+1, its low 53 bits compared with p·2⁵³."""
    words = bits.random_raw(2 * n).astype(np.uint64)
    u = ((words[0::2] << np.uint64(32)) | words[1::2]) & np.uint64(2**53 - 1)
    return (u < np.uint64(int(p * 2.0 ** 53))).astype(np.uint8)


@pytest.mark.parametrize("seed", [42, 0, 2**32 + 3])
def test_bernoulli_stream_equals_numpys_mersenne_twister(seed):
    """BernoulliStream's compiled twister against numpy's MT19937 (legacy seeding, as torch.manual_seed): calls of
    sizes that end just before, on and just after the 624-word regenerations (312 draws each), so the state
    carries from call to call; p 0.9 (dropout's keep), 0.3 and 0 (nothing kept)."""
    from upstream.torch_rng import BernoulliStream

    bits = np.random.MT19937(0)
    bits._legacy_seeding(seed & 0xFFFFFFFF)
    ours = BernoulliStream(seed)
    for n, p in [(1, 0.9), (310, 0.9), (1, 0.3), (312, 0.9), (313, 0.9), (0, 0.9), (5000, 0.3), (100_003, 0.9),
                 (7, 0.0)]:
        np.testing.assert_array_equal(ours.bernoulli(n, p), _numpy_bernoulli(bits, n, p))


def test_portable_verdict_is_measured_once_and_read_without_torch(tmp_path):
    """On a CPU that is not AMD, portable_bernoulli() measures torch's own bernoulli_ against BernoulliStream once,
    keeps the verdict in the cache folder, and a later process reads it without importing torch; its verdict is
    torch's own answer here (checked directly against torch's default generator, as the module draws)."""
    import os
    import subprocess
    import sys

    from engine.jit_cache import cpu_fields
    from upstream.torch_rng import BernoulliStream

    torch.manual_seed(42)
    theirs = torch.empty(5000, dtype=torch.uint8).bernoulli_(0.9).numpy()
    expected = bool(np.array_equal(BernoulliStream(42).bernoulli(5000, 0.9), theirs))
    env = {**os.environ, "SRS_BENCH_CACHE": str(tmp_path)}
    code = ("import sys; from upstream.torch_rng import portable_bernoulli; "
            "print(portable_bernoulli(), 'torch' in sys.modules)")
    first = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True)
    second = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True)
    if (cpu_fields() or {}).get("vendor_id") == "AuthenticAMD":  # decided by the vendor alone, nothing measured
        assert expected and first.stdout.split() == second.stdout.split() == ["True", "False"]
        return
    assert first.stdout.split() == [str(expected), "True"]
    assert second.stdout.split() == [str(expected), "False"]
    verdicts = list(tmp_path.glob("torch-bernoulli-*.txt"))
    assert len(verdicts) == 1 and verdicts[0].read_text().strip() == ("portable" if expected else "mkl")
    # a kept verdict is what later processes follow (here the opposite one, written by hand)
    verdicts[0].write_text("mkl\n" if expected else "portable\n")
    third = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True)
    assert third.stdout.split() == [str(not expected), "False"]
