"""Writes tests/fixtures/numpy-avx512/argsort-numpy<version>.json: this numpy's np.argsort(keys, kind="quicksort")
on an AVX-512 CPU, for the keys that `case_keys` builds (equal keys, few distinct values, history lengths, sorted and
reversed runs; n up to 200,000). Run it with numpy 1.26 and with numpy 2.2 (2.0 and 2.1 give the same orders) on a
CPU with AVX-512; tests/test_legacy_sort.py holds upstream/legacy_sort_avx512.py to both files.

    /path/to/numpy-1.26-env/bin/python bench/tie_order_fixture.py
    /path/to/numpy-2.2-env/bin/python bench/tie_order_fixture.py

The keys come from numpy's legacy RandomState, whose streams are frozen across numpy versions, so the test rebuilds
them under numpy 2; each permutation is stored as the SHA-256 of its int64 bytes (a few small ones in full).
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "numpy-avx512"


def cases() -> list[list]:
    """[kind, n, parameter, seed] of every case."""
    out = [["equal", n, 0, 0] for n in [*range(60, 140), 255, 256, 257, 300, 511, 1000, 1031, 5000, 20000]]
    for seed, n in enumerate([65, 100, 129, 255, 256, 257, 300, 1000, 3000, 10000, 50000]):
        out += [["uniform", n, d, seed] for d in (2, 3, 10, 50, 1000)]
        out += [["lengths", n, 60, seed], ["sorted", n, 20, seed], ["reversed", n, 20, seed], ["cyclic", n, 7, 0]]
    out += [["lengths", 200000, 200, 99], ["uniform", 200000, 5000, 99]]
    return out


def case_keys(kind: str, n: int, parameter: int, seed: int) -> np.ndarray:
    rng = np.random.RandomState(seed)
    if kind == "equal":
        keys = np.zeros(n)
    elif kind == "uniform":
        keys = rng.randint(0, parameter, n)
    elif kind == "lengths":  # like history lengths: geometric, capped
        keys = np.minimum(rng.geometric(0.05 if n > 100000 else 0.2, n), parameter)
    elif kind == "sorted":
        keys = np.sort(rng.randint(0, parameter, n))
    elif kind == "reversed":
        keys = np.sort(rng.randint(0, parameter, n))[::-1]
    elif kind == "cyclic":
        keys = np.arange(n) % parameter
    else:
        raise ValueError(kind)
    return np.ascontiguousarray(keys, dtype=np.int64)


def digest(order: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(order, dtype=np.int64).tobytes()).hexdigest()


def main() -> None:
    version = ".".join(np.__version__.split(".")[:2])
    if version not in ("1.26", "2.2"):
        sys.exit(f"run this with numpy 1.26 or 2.2, not {np.__version__}")
    try:
        from numpy._core._multiarray_umath import __cpu_features__
    except ImportError:  # numpy 1.x
        from numpy.core._multiarray_umath import __cpu_features__
    if not __cpu_features__.get("AVX512_SKX"):
        sys.exit("this CPU has no AVX-512: numpy would not run x86-simd-sort's AVX-512 argsort")
    out = FIXTURES / f"argsort-numpy{version}.json"
    rows = []
    for kind, n, parameter, seed in cases():
        order = np.argsort(case_keys(kind, n, parameter, seed), kind="quicksort")
        row = {"case": [kind, n, parameter, seed], "sha256": digest(order)}
        if kind == "equal" and n in (65, 100, 300):  # a few in full, readable
            row["order"] = order.tolist()
        rows.append(row)
    out.parent.mkdir(parents=True, exist_ok=True)
    lines = ",\n".join(json.dumps(row) for row in rows)  # one case per line
    out.write_text(f'{{"numpy": "{np.__version__}", "cases": [\n{lines}\n]}}\n')
    print(f"{len(rows)} cases -> {out}")


if __name__ == "__main__":
    main()
