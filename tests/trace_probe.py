"""The sources engine/traced.py generates for a model, as one digest (tests/test_torch_standin.py): run as a script
in a fresh process, it prints each model's digest and whether torch itself was imported by then. Imports no torch."""

from __future__ import annotations

import hashlib
import importlib
import sys

from engine.traced import _fn
from engine.traced_codegen import generate, trace_model
from engine.traced_lanes import generate_lanes


def source(spec: str) -> str:
    """The plug-in's and its lanes' sources, hashed: a package model ("module:Class", its kernels module without a
    clip hook, as SeqModel.plugin traces it) or a one-file model ("module", with its clip hook: FSRS-7)."""
    module_name, _, cls = spec.partition(":")
    m = importlib.import_module(module_name)
    model = getattr(m, cls) if cls else None
    if model is not None:
        m = importlib.import_module(model.kernels)
    n_w = len(model.default_w) if model is not None else len(m.DEFAULT_W)
    traces = trace_model(_fn(m, "init"), _fn(m, "step"), _fn(m, "curve"), n_w,
                         None if model is not None else getattr(m, "clip", None),
                         options=(m, tuple(getattr(m, "RUN_OPTIONS", ()))))
    return hashlib.sha1((generate(traces, "x", "lanes") + generate_lanes(traces, "x")).encode()).hexdigest()


if __name__ == "__main__":
    for spec in sys.argv[1:]:
        print(spec, source(spec), hasattr(sys.modules.get("torch"), "__version__"))
