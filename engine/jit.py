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

import dis
import threading
import types

from numba import njit
from numba.core import event
from numba.core.cpu_options import FastMathOptions
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


# A helper of at most this many bytecode instructions is IR-inlined by numba after all (copying it costs little;
# the cost is quadratic in the size of what is copied), and so are the helpers it calls. The per-review and
# per-target helpers of the scalar card loops ran up to ~25% slower when LLVM inlined their separately compiled code
# (DASH's windows_card, 109 instructions; DASH[ACT-R]'s actr_card, 240: whole-row CPU on 36 real users), while the
# large ones, the lane kernels' group passes and the step VJPs (300 to 1,500), are what numba's copying made slow.
IR_INLINE_MAX = 256


class InlinedDispatcher(CPUDispatcher):
    """Routes typing and lowering of a call to the variant of the helper for the caller's flags (module docstring).
    Its `inline` option, which numba reads at each call site before typing, is "always" (numba's IR inlining) for a
    small helper (IR_INLINE_MAX) or while the caller's fast-math flags go beyond LLVM_INLINE_FLAGS, else "never"."""

    @property
    def targetoptions(self):
        fastmath, _ = _caller_flags((frozenset(), "python"))
        ir = self.small or bool(fastmath - LLVM_INLINE_FLAGS)
        return dict(self.__dict__["_options"], inline="always" if ir else "never")

    @property
    def small(self) -> bool:
        """Whether numba inlines it (IR_INLINE_MAX, or inlined(llvm=...)); counted when a caller first compiles, so
        that importing a kernel module costs nothing for it."""
        if self.__dict__.get("_small") is None:
            self.__dict__["_small"] = len(list(dis.get_instructions(self.py_func))) <= IR_INLINE_MAX
        return self.__dict__["_small"]

    @targetoptions.setter
    def targetoptions(self, options):
        self.__dict__["_options"] = options

    def _variant(self, key=None):
        variants = self.__dict__.setdefault("_variants", {})
        key = key or _caller_flags(self.__dict__.get("_declared", (frozenset(), "python")))
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

    def compile_for(self, caller, argtypes) -> None:
        """Compile (or load from the disk cache) the variant that the @njit function `caller` calls, for `argtypes`:
        a large kernel's part compiled by a worker of its own in a first run (warmup.py), which the kernel's own
        compilation then loads from the cache instead of compiling it again."""
        options = caller.targetoptions
        key = (frozenset(FastMathOptions(options.get("fastmath", False)).flags), options.get("error_model", "python"))
        self._variant(key).compile(tuple(argtypes))

    @property
    def variants(self) -> dict:
        """The compiled variants so far: {(fast-math flags, error model): dispatcher}."""
        return dict(self.__dict__.get("_variants", {}))


def inlined(fn=None, *, fastmath=False, error_model="python", llvm: bool | None = None):
    """Decorator: `fn` as a helper inlined into compiled callers, under each caller's flags: by LLVM, or by numba
    for a small one (IR_INLINE_MAX; `llvm` True or False decides instead). `fastmath` and `error_model` apply to
    direct calls from Python only."""
    def wrap(f):
        dispatcher = InlinedDispatcher(f, targetoptions={"nopython": True})
        fm = frozenset(fastmath) if isinstance(fastmath, (set, frozenset, list, tuple)) else \
            (frozenset({"fast"}) if fastmath else frozenset())
        dispatcher.__dict__["_declared"] = (fm, error_model)
        dispatcher.__dict__["_small"] = None if llvm is None else not llvm
        return dispatcher
    return wrap(fn) if fn is not None else wrap


class _WouldCompile(Exception):
    """Raised by `ready`'s listener at the start of a compilation, to abort it."""


class _RefuseCompile(event.Listener):
    """Aborts this thread's compilation of one dispatcher (any other goes on)."""

    def __init__(self, dispatcher):
        self.dispatcher, self.thread = dispatcher, threading.get_ident()

    def on_start(self, ev):
        if ev.data.get("dispatcher") is self.dispatcher and threading.get_ident() == self.thread:
            raise _WouldCompile

    def on_end(self, ev):
        pass


def ready(dispatcher, sig) -> bool:
    """Whether `dispatcher` runs for the signature `sig` without compiling: compiled in this process already, or
    loaded now from numba's disk cache. A compilation it would start is aborted at its first event (numba's
    event API), so the check costs at most a read of the cache index."""
    with event.install_listener("numba:compile", _RefuseCompile(dispatcher)):
        try:
            dispatcher.compile(sig)
        except _WouldCompile:
            return False
    return True
