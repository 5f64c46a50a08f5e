"""`@inlined`: a numba helper that LLVM inlines into each compiled caller, compiled under that caller's flags.

Why not numba's own `inline="always"`: it inlines at the level of numba's IR, before type inference, and copies the
helper's IR once per block of it at every call site (each copy deep-copies the whole variable scope), so a kernel
built from nested helpers costs time quadratic in their size: two thirds of FSRS-6's first-run compile (~20 of
~34 s) was numba copying IR. Here the helper is compiled once per argument types and flags, like any function, and
marked `alwaysinline` for LLVM (numba's `forceinline`), which inlines it into the caller's machine code: the same
code at run time, compiled in time linear in its size, and cached on disk for every later caller.

What keeps the results bit-identical to `inline="always"`: IR-inlined code was compiled under the CALLER's flags
(its fast-math set, fused multiply-adds included, and its error model), whatever the helper declared. A numba
dispatcher keeps one compiled version per argument types only, so a helper shared by callers with different flags
(vec_math.exp1 under FSRS-6's lanes with "contract" and under exact kernels without) would keep whichever compiled
first. So the decorator returns a router: each call from compiled code is resolved by a dispatcher of its own for
the caller's (fastmath, error_model), compiled with exactly those flags and cached under its own name; a call from
Python uses the flags given to the decorator (what tests of a helper alone see).
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Callable

from numba import njit
from numba.core import event
from numba.core.registry import CPUDispatcher
from numba.core.targetconfig import ConfigStack


def _caller_flags(default):
    """(fast-math flags, error model) of the function being compiled now, or `default` outside a compilation."""
    top = ConfigStack.top_or_none()
    if top is None:
        return default
    return frozenset(top.fastmath.flags) if top.fastmath else frozenset(), top.error_model


# Fast-math flags under which LLVM's inlining of the separately compiled helper gives the caller the same machine code
# as numba's IR inlining did (every row's result lines on the embedded and upstream-check data: identical). Under any
# other (reassoc, ...), LLVM optimises the helper alone before inlining it and may associate its sums differently
# than in the caller's whole expression (the Transformer's AUC moved by 2e-5): there the call is IR-inlined still.
LLVM_INLINE_FLAGS = frozenset({"contract"})


def _inline_in_ir(expr, caller_ir, callee_ir) -> bool:
    """numba's inlining cost-model hook, asked at each call site before typing: IR-inline under reassoc & co."""
    fastmath, _ = _caller_flags((frozenset(), "python"))
    return bool(fastmath - LLVM_INLINE_FLAGS)


class InlinedDispatcher(CPUDispatcher):
    """Routes typing and lowering of a call to the variant of the helper for the caller's flags (module docstring)."""

    def _variant(self):
        variants = self.__dict__.setdefault("_variants", {})
        key = _caller_flags(self.__dict__.get("_declared", (frozenset(), "python")))
        variant = variants.get(key)
        if variant is None:
            f = self.py_func
            clone = types.FunctionType(f.__code__, f.__globals__, f.__name__, f.__defaults__, f.__closure__)
            fastmath, error_model = key
            # its own qualified name: numba names the cache files after it, one per variant
            clone.__qualname__ = f"{f.__qualname__}__{'_'.join(sorted(fastmath)) or 'exact'}_{error_model}"
            clone.__doc__ = f.__doc__
            variant = njit(cache=True, forceinline=True, fastmath=set(fastmath) or False,
                           error_model=error_model)(clone)
            variants[key] = variant
        return variant

    def get_call_template(self, args, kws):
        return self._variant().get_call_template(args, kws)

    def get_overload(self, sig):
        return self._variant().get_overload(sig)

    def __call__(self, *args, **kws):
        return self._variant()(*args, **kws)

    @property
    def variants(self) -> dict:
        """The compiled variants so far: {(fast-math flags, error model): dispatcher}."""
        return dict(self.__dict__.get("_variants", {}))


def inlined(fn=None, *, fastmath=False, error_model="python"):
    """Decorator: `fn` as a helper inlined by LLVM into compiled callers, under each caller's flags. `fastmath` and
    `error_model` apply to direct calls from Python only."""
    def wrap(f):
        dispatcher = InlinedDispatcher(f, targetoptions={"nopython": True, "inline": _inline_in_ir})
        fm = frozenset(fastmath) if isinstance(fastmath, (set, frozenset, list, tuple)) else \
            (frozenset({"fast"}) if fastmath else frozenset())
        dispatcher.__dict__["_declared"] = (fm, error_model)
        return dispatcher
    return wrap(fn) if fn is not None else wrap


class _WouldCompile(Exception):
    """Raised by `ready`'s listener at the start of a compilation, to abort it."""


class _RefuseCompile(event.Listener):
    def on_start(self, ev):
        raise _WouldCompile

    def on_end(self, ev):
        pass


def ready(dispatcher, sig) -> bool:
    """Whether `dispatcher` runs for the signature `sig` without compiling: compiled in this process already, or
    loaded now from numba's disk cache. A compilation it would start is aborted at its first event (numba's
    event API), so the check costs at most a read of the cache index."""
    with event.install_listener("numba:compile", _RefuseCompile()):
        try:
            dispatcher.compile(sig)
        except _WouldCompile:
            return False
    return True


@dataclass(frozen=True)
class Unit:
    """A piece of compiled code a model needs, compiled (or loaded from numba's disk cache) by calling `build`:
    independent of the other units of its model, so that a first run's workers compile them side by side
    (warmup.py). `label` names what it compiles (unique: two models sharing it share the unit); `seconds`, about
    what compiling it costs, so that the longest start first."""
    label: str
    seconds: float
    build: Callable[[], object]
