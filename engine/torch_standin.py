"""A stand-in for the torch namespace while a model's torch functions are traced (engine/traced_codegen.trace_model),
so that a first run traces a package model without importing torch (~1.5 s, more than the tracing itself).

Why it can be this small: the tracer's proxies already receive every torch function through torch's own dispatch
protocol (`__torch_function__`, which torch calls for an argument that defines it). Each function here does that
call itself, with a stand-in function of the same name, so a proxy records exactly the node that torch would have
handed it. What is here: every other name as such a function (`__getattr__`: which ones trace is the tracer's
business), `torch.tensor` of a list of numbers (a constant table, FSRS v1's 0.25·2^(G−1)), the dtypes, `no_grad`
and `device`. What the stand-in cannot do (a tensor of anything but numbers, a function called with no traced
operand, a constant such as torch.pi) raises; the tracer then imports torch and traces with torch itself, so a
model never depends on this module's coverage. tests/test_torch_standin.py holds the stand-in's generated sources byte-identical to torch's.

`standing_in()` puts it in sys.modules["torch"] while a trace runs, so that the `import torch` inside a model's
functions (models/fsrs_v4.py: a default run does not import torch) finds it; only when torch is not imported yet,
and it is removed again afterwards.
"""

from __future__ import annotations

import builtins
import sys
import types
from contextlib import contextmanager, nullcontext

import numpy as np


class dtype:  # noqa: N801 (torch's name: the tracer reads a dtype by its str(), "torch.float64")
    def __init__(self, name: str):
        self.name = name

    def __repr__(self):
        return f"torch.{self.name}"


bool = dtype("bool")  # noqa: A001 (torch's names)
int32 = dtype("int32")
int64 = dtype("int64")
float32 = dtype("float32")
float64 = dtype("float64")
long, double = int64, float64


class Tensor:
    """A constant of numbers (`tensor([...])`): the tracer reads it as a table or a one-element constant."""

    def __init__(self, values: list, dtype_: dtype):
        self.values, self.dtype = values, dtype_

    def dim(self) -> int:
        return 1 if isinstance(self.values, list) else 0

    def numel(self) -> int:
        return len(self.values) if isinstance(self.values, list) else 1

    def __len__(self):
        return len(self.values)

    def item(self):
        if isinstance(self.values, list):
            if len(self.values) != 1:
                _refuse("item() of a table")
            return self.values[0]
        return self.values

    @property
    def shape(self):
        return (len(self.values),) if isinstance(self.values, list) else ()

    def __getitem__(self, key):
        if isinstance(key, (int, np.integer)) and not isinstance(key, builtins.bool):
            return Tensor(self.values[int(key)], self.dtype)
        return _dispatch(_named("__getitem__"), (self, key), {})


def _refuse(what: str):
    raise NotImplementedError(f"the torch stand-in has no {what}: traced with torch itself")


def _convert(value, dt: dtype):
    if dt.name == "bool":
        return builtins.bool(value)
    if dt.name in ("int32", "int64"):
        return int(value)
    return float(np.float32(value)) if dt.name == "float32" else float(value)


def tensor(data, dtype=None):  # noqa: A002 (torch's keyword)
    """A constant: a number or a flat list of numbers, float64 unless told (the tracer refuses float32 arithmetic)."""
    values = data if isinstance(data, (list, tuple)) else [data]
    if not all(isinstance(v, (int, float, np.integer, np.floating)) for v in values):
        _refuse("tensor() of anything but numbers")
    dt = dtype or (float64 if any(isinstance(v, (float, np.floating)) for v in values) else int64)
    converted = [_convert(v, dt) for v in values]
    return Tensor(converted if isinstance(data, (list, tuple)) else converted[0], dt)


def _dispatch(func, args, kwargs):
    """torch's protocol: the first argument whose type defines __torch_function__ handles the call."""
    for a in list(args) + list(kwargs.values()):
        handler = getattr(type(a), "__torch_function__", None)
        if handler is not None:
            return handler(func, (type(a),), args, kwargs)
    _refuse(f"{func.__name__} of untraced operands")


def _named(name: str):
    def op(*args, **kwargs):
        return _dispatch(op, args, kwargs)

    op.__name__ = op.__qualname__ = name
    return op


def __getattr__(name: str):
    """torch.<name> for any function name: a stand-in that hands the call to its traced operand, so that which
    functions trace is decided in one place, engine/traced_codegen._torch_function (one it does not handle raises
    a TraceError there, as with torch itself)."""
    if name.startswith("_"):
        raise AttributeError(name)
    return _named(name)


class _Functions:
    """torch.nn.functional, the same way (softplus, relu, sigmoid, ...)."""

    def __getattr__(self, name: str):
        return __getattr__(name)


nn = types.SimpleNamespace(functional=_Functions())
no_grad = nullcontext
Size = tuple


def device(name="cpu"):
    return name


_MODULE = sys.modules[__name__]


@contextmanager
def standing_in():
    """The stand-in as sys.modules["torch"] for the block when torch is not imported; yields whether it is."""
    if "torch" in sys.modules:
        yield False
        return
    sys.modules["torch"] = _MODULE
    try:
        yield True
    finally:
        if sys.modules.get("torch") is _MODULE:
            del sys.modules["torch"]
