"""models/torch_rng.py draws torch.randperm's permutations without torch: checked against torch itself."""

import numpy as np
import pytest
import torch

from models.torch_rng import SHUFFLE_SEED, TorchGenerator


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

    code = ("import sys; from models.torch_rng import TorchGenerator; TorchGenerator().randperm(9); "
            "import models.act_r, models.dash, models.anki, models.hlr; assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
