"""Which plug-in engine/traced.py generated for a model module, remembered per version of the sources, so that a
later run imports the generated files directly, without tracing (a first run traces without torch too, with
engine/torch_standin.py, when the model's torch functions import torch only when called, as FSRS v1-v4.5's do).

Only for modules inside the code packages (engine/jit_cache.PACKAGES): their sources, and the tracer's, are in
jit_cache.version_digest, which names the remembered entry, so any edit traces afresh. A researcher's model file
outside them is traced every run (it imports torch itself). An entry is a small text file beside the generated
modules (seq_engine's engine folder): the plug-in's module name and its lane module's; a missing file traces again.
"""

from __future__ import annotations

import hashlib
import os
import sys
from functools import lru_cache
from pathlib import Path

from engine.jit_cache import PACKAGES, version_digest

_ROOT = Path(__file__).resolve().parents[1]


@lru_cache(maxsize=1)
def _digest() -> str:
    return version_digest()


def _entry(module, n_w: int, use_clip: bool, lanes: bool) -> Path | None:
    """The entry's file for these arguments, or None when the module is not one of the packages' files."""
    from engine.seq_engine import _engine_dir

    path = Path(getattr(module, "__file__", "") or "").resolve()
    if path.parent.parent != _ROOT or path.parent.name not in PACKAGES:
        return None
    key = f"{_digest()}|{module.__name__}|{n_w}|{use_clip}|{lanes}"
    return _engine_dir() / f"traced_index_{hashlib.sha1(key.encode()).hexdigest()[:16]}.txt"


def plugin_for(module, n_w: int, use_clip: bool = True, lanes: bool = True) -> str:
    """traced.compile_module(module, n_w, use_clip, lanes): the generated plug-in's module name, imported; read
    from this version's entry when there is one, else traced and remembered."""
    from engine.seq_engine import load_generated

    entry = _entry(module, n_w, use_clip, lanes)
    if entry is not None and entry.exists():
        stems = entry.read_text(encoding="utf-8").split()
        if stems and all(load_generated(stem) is not None for stem in reversed(stems)):  # the lane module first
            return stems[0]
    from engine.traced import compile_module

    name = compile_module(module, n_w=n_w, use_clip=use_clip, lanes=lanes)
    if entry is not None:
        lane_module = getattr(sys.modules[name], "LANE_KERNELS", None) if lanes else None  # none: a data-only state
        stems = [name] + ([lane_module] if lane_module else [])
        tmp = entry.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text("\n".join(stems) + "\n", encoding="utf-8")
        os.replace(tmp, entry)
    return name
