"""engine/torch_standin.py: a first run traces the package models (FSRS v1-v4, 4.5) without importing torch, into
the same generated sources as tracing with torch itself; a function that needs more of torch than the stand-in has
is traced with torch, the same as before."""

from __future__ import annotations

import hashlib
import importlib
import subprocess
import sys
from pathlib import Path

import torch  # noqa: F401 (this process traces with torch itself: the reference)

from engine.traced import _fn
from engine.traced_codegen import generate, trace_model
from engine.traced_lanes import generate_lanes

ROOT = Path(__file__).resolve().parents[1]
MODELS = ["models.fsrs_v1:FSRSv1", "models.fsrs_v2:FSRSv2", "models.fsrs_v3:FSRSv3", "models.fsrs_v4:FSRSv4",
          "models.fsrs_v45:FSRS45", "standin_fallback:Model"]

# the plug-in's and its lanes' sources of each model, and whether torch itself was imported by then
PROBE = """
import hashlib, importlib, sys
sys.path.insert(0, "tests")
from engine.traced import _fn
from engine.traced_codegen import generate, trace_model
from engine.traced_lanes import generate_lanes

def source(spec):
    module_name, cls = spec.split(":")
    model = getattr(importlib.import_module(module_name), cls)
    m = importlib.import_module(model.kernels)
    traces = trace_model(_fn(m, "init"), _fn(m, "step"), _fn(m, "curve"), len(model.default_w),
                         options=(m, tuple(getattr(m, "RUN_OPTIONS", ()))))
    return hashlib.sha1((generate(traces, "x", "lanes") + generate_lanes(traces, "x")).encode()).hexdigest()

for spec in sys.argv[1:]:
    print(spec, source(spec), hasattr(sys.modules.get("torch"), "__version__"))
"""


def _source(spec: str) -> str:
    module_name, cls = spec.split(":")
    model = getattr(importlib.import_module(module_name), cls)
    m = importlib.import_module(model.kernels)
    traces = trace_model(_fn(m, "init"), _fn(m, "step"), _fn(m, "curve"), len(model.default_w),
                         options=(m, tuple(getattr(m, "RUN_OPTIONS", ()))))
    return hashlib.sha1((generate(traces, "x", "lanes") + generate_lanes(traces, "x")).encode()).hexdigest()


def test_package_models_trace_without_torch_into_torchs_sources():
    """A fresh process traces FSRS v1-v4 and 4.5 with torch never imported (v1 takes torch.relu, torch.pow of a
    number and a torch.tensor table; v4 torch.where and torch.exp), each into the plug-in and lane sources that
    tracing with torch gives here; then a function using torch.as_tensor, which the stand-in does not have, is
    traced with torch itself (imported only then), again into torch's sources."""
    out = subprocess.run([sys.executable, "-c", PROBE, *MODELS], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    rows = [line.split() for line in out.stdout.splitlines()]
    assert [r[0] for r in rows] == MODELS
    assert [r[2] for r in rows] == ["False"] * (len(MODELS) - 1) + ["True"]
    for spec, digest, _ in rows:
        assert digest == _source(spec), spec
