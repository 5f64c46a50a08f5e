"""engine/trace_cache.py and the traced contract's run-time options (RUN_OPTIONS): a model whose equations are torch
functions (FSRS v2, v3) runs on its generated plug-in without importing torch, traced once per version, and
the plug-in's precompute takes the lower clamp of S as a run-time option (day mode 0.01, upstream's --secs 1e-4)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from engine.seq_engine import instantiate
from models.fsrs_v3 import FSRSv3

ROOT = Path(__file__).resolve().parents[1]
PROBE = ("import sys; from models.fsrs_v3 import FSRSv3; name = FSRSv3().plugin(); "
         "print(name, sys.modules[name].LANE_KERNELS, 'torch' in sys.modules, 'engine.traced_codegen' in sys.modules)")


def test_a_traced_model_imports_no_torch_once_this_version_traced_it(tmp_path):
    """Two fresh processes on an empty cache: the first traces (with engine/torch_standin.py, so no torch either)
    and writes the entry, the second finds it and imports the same generated modules without importing the tracer;
    a deleted generated file is traced again."""
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "XDG_CACHE_HOME")}
    env.update(SRS_BENCH_CACHE=str(tmp_path / "cache"), SRS_BENCH_ENGINE_DIR=str(tmp_path / "engines"))

    def probe():
        out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        return out.stdout.split()

    first = probe()
    entries = list((tmp_path / "engines").glob("traced_index_*.txt"))
    assert len(entries) == 1 and entries[0].read_text().split() == first[:2]
    second = probe()  # the same modules, not traced: the tracer not even imported
    assert first[:3] == second[:3] and first[2:] == ["False", "True"] and second[3] == "False"
    (tmp_path / "engines" / f"{first[0]}.py").unlink()
    assert probe() == first  # traced again, the same content


def test_the_lower_clamp_of_s_is_a_run_time_option():
    """FSRS v3's first stability S0 = clamp(w0 + w1·(G − 1), s_min, 36500): with w0 = 0.003 and an Again (G = 1),
    S0 = 0.01 in day mode, 0.003 with --secs' s_min = 1e-4, 0.01 with no option given (the module's value)."""
    k = instantiate(FSRSv3().plugin())
    w = np.array(FSRSv3.default_w, dtype=np.float64)
    w[0] = 0.003

    def s0(opts):
        state = np.zeros(k.N_STATE)
        k.init(k.precompute(w, np.array(opts, dtype=np.float64)), 1, 0.0, state)
        return state[0]

    assert s0([0.01]) == 0.01
    assert s0([1e-4]) == 0.003
    assert s0([]) == 0.01
