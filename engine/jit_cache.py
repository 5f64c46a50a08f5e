"""Where the compiled kernels are kept: numba's disk cache in the user's cache folder, one folder per version of the
sources and per CPU, shared by every clone, worker process and (on a shared disk) Dask worker of this version.

Why a folder per version of the sources: numba checks a cached function against its own file only; a kernel that
calls an @njit function of another module (every engine plug-in does, and the engine kernels call the plug-ins)
would otherwise keep running the old machine code after that other module changed. So the folder is named after
the sources of the code packages (PACKAGES) and lowess.py (and Python's version, and the CPU): any edit starts from an
empty folder (compiled again once, then reused), and two clones of the same version share one. Why in the user's
cache folder rather than the clone: a second clone, a CI run on a warm machine, a cluster node's workers all find
the kernels compiled. Folders of other versions unused for PRUNE_DAYS are removed.

Where: $SRS_BENCH_CACHE, else $XDG_CACHE_HOME/srs-bench, else ~/.cache/srs-bench; the temp folder if none of them
is writable; NUMBA_CACHE_DIR, when set, wins over all of them (docs/cluster.md: one folder for a cluster). This
module imports no numba (the rows that need none start without it).
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

PRUNE_DAYS = 30
PACKAGES = ("models", "engine", "lane_kernels", "neural", "upstream")  # the folders whose sources numba compiles
_ROOT = Path(__file__).resolve().parents[1]


def cpu_fields() -> dict[str, str] | None:
    """/proc/cpuinfo's first value of each field (None where it cannot be read)."""
    try:
        info = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    fields: dict[str, str] = {}
    for line in info.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


def _cpu() -> str:
    """The CPU's model name and instruction-set flags (numba compiles for the host's), as text."""
    fields = cpu_fields()
    if fields is None:
        return f"{platform.machine()} {platform.processor()}"
    return f"{platform.machine()} {fields.get('model name', '')} {fields.get('flags', fields.get('Features', ''))}"


def version_digest() -> str:
    """12 hex digits of the sources that numba compiles (PACKAGES' *.py, lowess.py), Python's version and the CPU.
    (numba's own version needs no place here: numba discards a cache index written by another version.)"""
    digest = hashlib.sha1()
    for path in sorted(p for folder in PACKAGES for p in (_ROOT / folder).glob("*.py")) + [_ROOT / "lowess.py"]:
        digest.update(str(path.relative_to(_ROOT)).encode() + path.read_bytes())
    digest.update(f"{sys.version} {_cpu()}".encode())
    return digest.hexdigest()[:12]


def cache_bases() -> list[Path]:
    """The srs-bench cache folders to try, in order (module docstring: where)."""
    if os.environ.get("SRS_BENCH_CACHE"):
        return [Path(os.environ["SRS_BENCH_CACHE"])]
    xdg = os.environ.get("XDG_CACHE_HOME")
    return [Path(xdg) / "srs-bench" if xdg else Path.home() / ".cache" / "srs-bench",
            Path(tempfile.gettempdir()) / "srs-bench-cache"]


def _prune(base: Path, keep: Path) -> None:
    """Remove the folders of other versions untouched for PRUNE_DAYS (nothing of this version)."""
    cutoff = time.time() - PRUNE_DAYS * 86400
    try:
        for old in base.glob("numba-*"):
            if old != keep and old.stat().st_mtime < cutoff:
                shutil.rmtree(old, ignore_errors=True)
    except OSError:
        pass


def use_cache_folder() -> str | None:
    """Point numba's disk cache (NUMBA_CACHE_DIR, and numba's config if it is loaded) at this version's folder,
    creating it; returns the folder (None: NUMBA_CACHE_DIR was set, or no folder could be written)."""
    if os.environ.get("NUMBA_CACHE_DIR"):
        return None
    name = f"numba-{version_digest()}"
    for base in cache_bases():
        target = base / name
        try:
            target.mkdir(parents=True, exist_ok=True)
            os.utime(target)  # in use: not pruned
        except OSError:
            continue
        if os.access(target, os.W_OK):
            os.environ["NUMBA_CACHE_DIR"] = str(target)
            if "numba" in sys.modules:  # read when each @njit(cache=True) function is defined
                sys.modules["numba"].config.CACHE_DIR = str(target)
            _prune(base, target)
            return str(target)
    return None


def folder() -> Path | None:
    """numba's cache folder of this process (NUMBA_CACHE_DIR, as use_cache_folder set it), without importing numba."""
    return Path(os.environ["NUMBA_CACHE_DIR"]) if os.environ.get("NUMBA_CACHE_DIR") else None


@dataclass(frozen=True)
class Unit:
    """A piece of compiled code a model needs, compiled (or loaded from numba's disk cache) by calling `build`:
    independent of the other units of its model, so that a first run's workers compile them side by side
    (warmup.py). `label` names what it compiles (unique: two models sharing it share the unit); `seconds`, about
    what compiling it costs, so that the longest start first; `after`, the labels of units whose compiled code it
    loads from the cache rather than compiling it again (it starts once they are done: a kernel after its parts)."""
    label: str
    seconds: float
    build: Callable[[], object]
    after: tuple[str, ...] = ()
