"""Shared by the lane-kernel tests: the code a lanes_loss_grad compiles to, checked for AVX2 or AVX-512 vectors."""

from __future__ import annotations

import numpy as np
import pytest


def lane_code(fresh, wc, cards, items) -> tuple[str, str]:
    """Run `fresh` (a lanes_loss_grad compiled afresh: numba shows no assembly for cached code) on every work item
    of `cards` and return its LLVM IR and assembly, having checked the loops use vectors of 4 doubles (AVX2) or 8
    (AVX-512: LLVM's choice on e.g. AMD Zen 4) (skips on a CPU without AVX2)."""
    fresh(wc, cards.seq_dt, cards.seq_g, cards.c_start, cards.t_pos, cards.t_dt, cards.t_y, cards.t_wt, items,
          np.arange(len(items)), cards.max_n, np.zeros(len(wc)), True, True)
    llvm_ir = "".join(fresh.inspect_llvm().values())
    asm = "".join(fresh.inspect_asm().values())
    if "ymm" not in asm and "zmm" not in asm:
        pytest.skip("no AVX2 on this CPU")
    assert "<4 x double>" in llvm_ir or "<8 x double>" in llvm_ir
    return llvm_ir, asm
