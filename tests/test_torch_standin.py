"""engine/torch_standin.py: a first run traces the package models (FSRS v1-v4, 4.5, FSRS-7, SBD) without importing
torch, into the same generated sources as tracing with torch itself; a function that needs more of torch than the
stand-in has is traced with torch, the same as before."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch  # noqa: F401 (this process traces with torch itself: the reference)

from trace_probe import source

ROOT = Path(__file__).resolve().parents[1]
MODELS = ["models.fsrs_v1:FSRSv1", "models.fsrs_v2:FSRSv2", "models.fsrs_v3:FSRSv3", "models.fsrs_v4:FSRSv4",
          "models.fsrs_v45:FSRS45", "models.fsrs7", "models.sbd", "standin_fallback:Model"]


def test_package_models_trace_without_torch_into_torchs_sources():
    """A fresh process traces FSRS v1-v4, 4.5, FSRS-7 (with its clip hook) and SBD with torch never imported
    (v1 takes torch.relu, torch.pow of a number and a torch.tensor table; v4 torch.where and torch.exp; FSRS-7
    torch.minimum and torch.maximum; SBD torch.logaddexp, softplus and nan_to_num), each into the plug-in and lane sources that tracing with torch gives here;
    then a function using torch.as_tensor, which the stand-in does not have, is traced with torch itself (imported
    only then), again into torch's sources."""
    out = subprocess.run([sys.executable, "tests/trace_probe.py", *MODELS], cwd=ROOT, capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")])))
    assert out.returncode == 0, out.stderr
    rows = [line.split() for line in out.stdout.splitlines()]
    assert [r[0] for r in rows] == MODELS
    assert [r[2] for r in rows] == ["False"] * (len(MODELS) - 1) + ["True"]
    for spec, digest, _ in rows:
        assert digest == source(spec), spec
