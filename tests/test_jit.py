"""engine/jit.py: `@inlined` helpers compile under each caller's flags and are inlined by LLVM; `ready` tells
whether a kernel runs without compiling."""

import re
import subprocess
import sys
import textwrap
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from numba import njit

from engine.jit import inlined

ROOT = Path(__file__).resolve().parents[1]


@inlined(llvm=True)
def mul_add(a, b, c):
    return a * b + c


@inlined(error_model="numpy", llvm=True)
def reciprocal(x):
    return 1.0 / x


@inlined
def small_mul_add(a, b, c):
    return a * b + c


@njit(fastmath={"contract"}, error_model="numpy")
def fused_caller(a, b, c):
    return mul_add(a, b, c)


@njit
def exact_caller(a, b, c):
    return mul_add(a, b, c)


@njit(error_model="numpy")
def numpy_model_caller(x):
    return reciprocal(x)


@njit
def python_model_caller(x):
    return reciprocal(x)


def test_a_caller_with_contract_gets_a_fused_multiply_add_and_an_exact_caller_two_roundings():
    a, b, c = 0.1, 10.0, -1.0
    fma = float(Fraction(a) * Fraction(b) + Fraction(c))  # one rounding of the exact value
    assert fma == 2.0 ** -54  # the double nearest 0.1 is 0.1 + 2^-54/10: what a fused multiply-add keeps of 0.1·10 − 1
    assert exact_caller(a, b, c) == a * b + c == 0.0
    assert fused_caller(a, b, c) == fma
    assert mul_add(a, b, c) == 0.0  # from Python: the flags given to the decorator (none)


def test_the_error_model_is_the_callers():
    assert numpy_model_caller(0.0) == np.inf
    with pytest.raises(ZeroDivisionError):
        python_model_caller(0.0)
    assert reciprocal(0.0) == np.inf  # from Python: error_model="numpy" as declared


def test_each_flag_set_is_a_variant_of_its_own_and_llvm_inlines_it():
    exact_caller(1.0, 2.0, 3.0)
    fused_caller(1.0, 2.0, 3.0)
    variants = mul_add.variants
    assert (frozenset({"contract"}), "numpy") in variants and (frozenset(), "python") in variants
    names = {v.py_func.__qualname__ for v in variants.values()}
    assert names >= {"mul_add__contract_numpy", "mul_add__exact_python"}  # numba's cache files are named after these
    for (fastmath, error_model), variant in variants.items():  # numba's forceinline: LLVM's alwaysinline
        assert variant.targetoptions["forceinline"] is True
        assert variant.targetoptions["error_model"] == error_model
        assert (variant.targetoptions["fastmath"] or set()) == set(fastmath)


def test_ready_loads_a_cached_kernel_and_refuses_to_compile(tmp_path):
    """In a fresh process: not ready before any compile (and nothing compiled by asking); ready once compiled;
    ready in another process from numba's disk cache alone."""
    module = tmp_path / "kern.py"
    module.write_text(textwrap.dedent("""
        from numba import njit, types
        @njit(cache=True)
        def twice(x):
            return 2.0 * x
        SIG = (types.float64,)
    """))
    script = textwrap.dedent(f"""
        import sys
        sys.path[:0] = [{str(tmp_path)!r}, {str(ROOT)!r}]
        from engine.jit import ready
        import kern
        print(ready(kern.twice, kern.SIG), len(kern.twice.stats.cache_hits), kern.twice.signatures)
        if sys.argv[1] == "compile":
            kern.twice(1.0)
            print(ready(kern.twice, kern.SIG))
    """)
    env = {"NUMBA_CACHE_DIR": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"}

    def run(mode):
        return subprocess.run([sys.executable, "-c", script, mode], env=env, capture_output=True, text=True,
                              check=True).stdout.split("\n")

    assert run("compile")[:2] == ["False 0 []", "True"]
    assert run("ask")[0] == "True 1 [(float64,)]"


@njit(fastmath={"reassoc", "contract"})
def reassoc_caller(a, b, c):
    return mul_add(a, b, c)


@njit(fastmath={"contract"}, error_model="numpy")
def small_fused_caller(a, b, c):
    return small_mul_add(a, b, c)


def test_a_small_helper_is_inlined_by_numba_under_its_callers_flags():
    """Below IR_INLINE_MAX instructions numba copies the helper's IR into the caller (typed with its flags): the
    same fused multiply-add, no variant compiled."""
    assert small_fused_caller(0.1, 10.0, -1.0) == float(Fraction(0.1) * Fraction(10.0) + Fraction(-1.0))
    assert small_mul_add.variants == {}


def test_under_reassoc_the_helper_is_inlined_by_numba_as_before():
    """A caller whose flags let LLVM reassociate takes the helper's IR into its own (numba's inline="always"):
    no variant is compiled for those flags."""
    assert reassoc_caller(0.1, 10.0, -1.0) == float(Fraction(0.1) * Fraction(10.0) + Fraction(-1.0))
    assert not any("reassoc" in flags for flags, _ in mul_add.variants)
