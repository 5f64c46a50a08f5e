"""The tracer and the code generator behind engine/traced.py (whose docstring explains both): a contract model's
init / step / curve traced with proxies into an expression graph (`trace_model`), differentiated by torch's own
derivative rules, and written out as the numba source of an engine plug-in (`generate`), in the scalar dialect
and, for engine/traced_lanes.py, the lane dialect. Below both traced.py (which compiles and runs the plug-ins and
re-exports these names) and traced_lanes.py, so that neither imports the other upwards.
"""

from __future__ import annotations

import math
import os
import re
import sys
import traceback

import numpy as np

from engine import torch_standin


class TraceError(RuntimeError):
    """The model uses something the tracer does not handle; the message names it. `batchable` False: the model
    turns a tensor into a Python value (an `if` on it, float(), .item(), an index), which no engine can run either
    (the autograd engine's batches of cards make that value ambiguous): own_model refuses such a file up front.
    `frames`: the call stack where it was raised, to name the model file's line (`where`)."""

    def __init__(self, message: str, batchable: bool = True):
        super().__init__(message)
        self.batchable = batchable
        self.frames = traceback.extract_stack()[:-1]

    def where(self, path: str) -> str | None:
        """"file:line (`source`)" of the innermost frame in the file `path` when it raised, or None."""
        path = os.path.realpath(path)
        for frame in reversed(self.frames):
            if os.path.realpath(frame.filename) == path:
                return f"{frame.filename}:{frame.lineno} (`{(frame.line or '').strip()}`)"
        return None


# --------------------------------------------------------------------------------------------------- dtypes
_CAT = {"b": 0, "i": 1, "f4": 2, "f8": 2}
_DTYPE_NAME = {"b": "bool", "i": "int64", "f4": "float32", "f8": "float64"}
_KIND = {"torch.bool": "b", "torch.int64": "i", "torch.int32": "i", "torch.float32": "f4", "torch.float64": "f8"}


def _torch():
    """The torch the traced functions see: torch itself once imported, else the stand-in (engine/torch_standin.py,
    which trace_model installs so that a first run traces without importing torch)."""
    return sys.modules.get("torch") or torch_standin


def _is_tensor(x) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _kind_of(dtype) -> str | None:
    """The graph's dtype letter for a torch dtype (torch's or the stand-in's, both printed "torch.float64")."""
    return _KIND.get(str(dtype))


def _promote(operands: list[tuple[str, int]]) -> str:
    """torch.result_type over (dtype, priority) pairs: priority 2 = a [B] tensor, 1 = 0-dim, 0 = Python number.
    The highest category wins; within it the highest priority group decides; a Python float alone gives float32
    (torch's default dtype)."""
    top = max(_CAT[d] for d, _ in operands)
    prio = max(p for d, p in operands if _CAT[d] == top)
    group = {d for d, p in operands if _CAT[d] == top and p == prio}
    if top == 2:
        return "f4" if prio == 0 or group == {"f4"} else "f8"
    return "i" if top == 1 else "b"


# --------------------------------------------------------------------------------------------------- the graph
class Graph:
    """Nodes (op, args, attr, dtype, prio); args are node ids; identical nodes are created once."""

    def __init__(self):
        self.nodes: list[tuple] = []
        self._ids: dict = {}

    def add(self, op: str, args: tuple, attr, dtype: str, prio: int) -> "Proxy":
        key = (op, args, attr)
        nid = self._ids.get(key)
        if nid is None:
            nid = len(self.nodes)
            self.nodes.append((op, args, attr, dtype, prio))
            self._ids[key] = nid
        return Proxy(self, nid)

    def const(self, value, prio: int = 0, dtype: str | None = None) -> "Proxy":
        if dtype is None:
            dtype = "b" if isinstance(value, bool) else "i" if isinstance(value, int) else "f8"
        value = bool(value) if dtype == "b" else int(value) if dtype == "i" else float(value)
        return self.add("const", (), (repr(value), value, prio), dtype, prio)


def _is_number(x) -> bool:
    return isinstance(x, (bool, int, float, np.bool_, np.integer, np.floating))


class Proxy:
    """One card's traced scalar (0-dim when it depends only on weights and constants)."""

    __slots__ = ("graph", "id")

    def __init__(self, graph: Graph, nid: int):
        self.graph, self.id = graph, nid

    # ---- node facts
    @property
    def node(self):
        return self.graph.nodes[self.id]

    @property
    def kind(self) -> str:
        return self.node[3]

    @property
    def prio(self) -> int:
        return self.node[4]

    @property
    def dtype(self):
        return getattr(_torch(), _DTYPE_NAME[self.kind])

    @property
    def device(self):
        return _torch().device("cpu")

    # ---- Python protocol: refused where a traced value would steer Python
    def __bool__(self):
        raise TraceError("Python control flow on a traced value (bool()/if/and/or); use torch.where", batchable=False)

    def __float__(self):
        raise TraceError("float() of a traced value", batchable=False)

    def __int__(self):
        raise TraceError("int() of a traced value", batchable=False)

    def __index__(self):
        raise TraceError("a traced value used as a Python index", batchable=False)

    def item(self):
        raise TraceError(".item() of a traced value", batchable=False)

    def __len__(self):
        raise TraceError("len() of a traced value")

    def __iter__(self):
        raise TraceError("iterating over a traced value")

    def __getitem__(self, key):
        if key is Ellipsis or key == slice(None):  # x[:] / x[...]: the same cards
            return self
        raise TraceError("indexing a per-card value")

    def __getattr__(self, name):
        raise TraceError(f"tensor attribute or method .{name} is not traced")

    # ---- arithmetic
    def __add__(self, o): return _binary("add", self, o)
    def __radd__(self, o): return _binary("add", o, self)
    def __sub__(self, o): return _binary("sub", self, o)
    def __rsub__(self, o): return _binary("sub", o, self)
    def __mul__(self, o): return _binary("mul", self, o)
    def __rmul__(self, o): return _binary("mul", o, self)
    def __truediv__(self, o): return _binary("div", self, o)
    def __rtruediv__(self, o): return _binary("div", o, self)
    def __pow__(self, o): return _pow(self, o)
    def __rpow__(self, o): return _pow(o, self)
    def __neg__(self): return _unary("neg", self)
    def __pos__(self): return self
    def __abs__(self): return _unary("abs", self)
    def __lt__(self, o): return _binary("lt", self, o)
    def __le__(self, o): return _binary("le", self, o)
    def __gt__(self, o): return _binary("gt", self, o)
    def __ge__(self, o): return _binary("ge", self, o)
    def __eq__(self, o): return _binary("eq", self, o)  # noqa: E704
    def __ne__(self, o): return _binary("ne", self, o)
    def __and__(self, o): return _logical("and", self, o)
    def __rand__(self, o): return _logical("and", o, self)
    def __or__(self, o): return _logical("or", self, o)
    def __ror__(self, o): return _logical("or", o, self)
    def __invert__(self):
        if self.kind != "b":
            raise TraceError("~ on a non-boolean traced value")
        return self.graph.add("not", (self.id,), None, "b", self.prio)
    __hash__ = object.__hash__

    # ---- tensor methods
    def exp(self): return _unary("exp", self)
    def log(self): return _unary("log", self)
    def log1p(self): return _unary("log1p", self)
    def sqrt(self): return _unary("sqrt", self)
    def sigmoid(self): return _unary("sigmoid", self)
    def relu(self): return _relu(self)
    def tanh(self): return _unary("tanh", self)
    def abs(self): return _unary("abs", self)
    def neg(self): return _unary("neg", self)
    def pow(self, e): return _pow(self, e)
    def clamp(self, min=None, max=None): return _clamp(self, min, max)
    def clip(self, min=None, max=None): return _clamp(self, min, max)
    def clamp_min(self, m): return _clamp(self, m, None)
    def clamp_max(self, m): return _clamp(self, None, m)
    def minimum(self, o): return _minmax("minimum", self, o)
    def maximum(self, o): return _minmax("maximum", self, o)
    def long(self): return _cast(self, "i")
    def int(self): return _cast(self, "i")
    def bool(self): return _cast(self, "b")
    def float(self): return _cast(self, "f4")
    def double(self): return _cast(self, "f8")
    def clone(self): return self
    def detach(self): raise TraceError(".detach() (a stopped gradient is not traced)")

    def to(self, *args, **kwargs):
        dtype = kwargs.get("dtype")
        for a in args:
            if type(a).__name__ == "dtype":  # torch.dtype, or the stand-in's
                dtype = a
            elif isinstance(a, Proxy) or _is_tensor(a):
                dtype = a.dtype
        if dtype is None:
            return self
        if _kind_of(dtype) is None:
            raise TraceError(f".to({dtype})")
        return _cast(self, _kind_of(dtype))

    def type_as(self, other):
        return _cast(self, _kind_of(other.dtype))

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return _torch_function(func, args, kwargs or {})


class WeightVector:
    """The traced weight vector w (or a slice of it, or its clone in a clip hook): its elements as 0-dim proxies."""

    def __init__(self, graph: Graph, elems: list[Proxy]):
        self.graph, self.elems = graph, elems

    @property
    def dtype(self):
        return _torch().float64

    @property
    def device(self):
        return _torch().device("cpu")

    def __len__(self):
        return len(self.elems)

    @property
    def shape(self):
        return _torch().Size([len(self.elems)])

    def __getitem__(self, key):
        if isinstance(key, slice):
            return WeightVector(self.graph, self.elems[key])
        if isinstance(key, Proxy):
            return _gather(key, self.elems)
        if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
            return self.elems[int(key)]
        raise TraceError(f"indexing the weights with {type(key).__name__}")

    def __setitem__(self, key, value):
        if not isinstance(key, (int, np.integer)) or isinstance(key, bool):
            raise TraceError(f"assigning into the weights at {type(key).__name__}")
        self.elems[int(key)] = _cast(_as_proxy(self.graph, value), "f8")

    def clone(self):
        return WeightVector(self.graph, list(self.elems))

    def detach(self):
        return self

    def __getattr__(self, name):
        raise TraceError(f"whole-vector operation .{name} on the weights")

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        if name in ("clone", "detach") and isinstance(args[0], WeightVector):
            return args[0].clone()
        if name == "__getitem__" and isinstance(args[0], WeightVector):
            return args[0][args[1]]
        raise TraceError(f"whole-vector operation {name} on the weights")


def _graph_of(*xs) -> Graph:
    for x in xs:
        if isinstance(x, (Proxy, WeightVector)):
            return x.graph
    raise TraceError("no traced operand")


def _as_proxy(graph: Graph, x) -> Proxy:
    if isinstance(x, Proxy):
        return x
    if _is_number(x):
        return graph.const(x.item() if hasattr(x, "item") else x)
    if _is_tensor(x) and x.numel() == 1:
        kind = _kind_of(x.dtype)
        if kind is None:
            raise TraceError(f"a constant tensor of dtype {x.dtype}")
        return graph.const(x.item(), 1 if x.dim() == 0 else 2, kind)
    raise TraceError(f"an operand of type {type(x).__name__}" + (f" and shape {tuple(x.shape)}"
                                                                  if _is_tensor(x) else ""))


def _result(op: str, xs: list[Proxy], dtype: str, attr=None) -> Proxy:
    if dtype == "f4" and op != "cast":
        raise TraceError(f"{op} computed in float32 (torch's promotion of an int/float32 tensor with a Python "
                         "float or a 0-dim float64); make it float64 (.double(), or a float64 operand)")
    return xs[0].graph.add(op, tuple(x.id for x in xs), attr, dtype, max(1, max(x.prio for x in xs)))


def _binary(op: str, a, b) -> Proxy:
    g = _graph_of(a, b)
    a, b = _as_proxy(g, a), _as_proxy(g, b)
    kinds = [(a.kind, a.prio), (b.kind, b.prio)]
    dtype = _promote(kinds)
    if op in ("lt", "le", "gt", "ge", "eq", "ne"):
        return _result(op, [a, b], "b")
    if dtype == "b" and op in ("add", "sub", "mul"):
        raise TraceError(f"{op} of two booleans")
    if op == "div" and _CAT[dtype] < 2:
        dtype = "f4"  # torch's true division of integers gives the default float dtype
    return _result(op, [a, b], dtype)


def _logical(op: str, a, b) -> Proxy:
    g = _graph_of(a, b)
    a, b = _as_proxy(g, a), _as_proxy(g, b)
    if a.kind != "b" or b.kind != "b":
        raise TraceError(f"bitwise {op} of non-boolean values")
    return _result(op, [a, b], "b")


def _unary(op: str, x) -> Proxy:
    if op in ("neg", "abs"):
        return _result(op, [x], x.kind if x.kind != "b" else "i")
    dtype = x.kind if x.kind in ("f4", "f8") else ("f8" if x.prio == 0 else "f4")
    return _result(op, [x], dtype)


def _pow(a, b) -> Proxy:
    g = _graph_of(a, b)
    if _is_number(b) and not isinstance(b, bool):  # pow.Tensor_Scalar
        dtype = _promote([(a.kind, a.prio), ("f8" if isinstance(b, float) else "i", 0)])
        return _result("powc", [a], dtype, float(b) if dtype != "i" else int(b))
    if _is_number(a) and not isinstance(a, bool):  # pow.Scalar (a number to a tensor power)
        dtype = _promote([("f8" if isinstance(a, float) else "i", 0), (b.kind, b.prio)])
        return _result("rpowc", [_as_proxy(g, b)], dtype, float(a) if dtype != "i" else int(a))
    a, b = _as_proxy(g, a), _as_proxy(g, b)
    dtype = _promote([(a.kind, a.prio), (b.kind, b.prio)])
    if dtype == "i":
        raise TraceError("integer ** integer tensor")
    return _result("pow", [a, b], dtype)


def _clamp(x, lo, hi) -> Proxy:
    g = _graph_of(x)
    x = _as_proxy(g, x)
    if lo is None and hi is None:
        raise TraceError("clamp without bounds")
    parts = [x] + [_as_proxy(g, b) for b in (lo, hi) if b is not None]
    dtype = _promote([(p.kind, p.prio) for p in parts])
    attr = (lo is not None, hi is not None)
    op, args, x_attr, x_dtype, _ = x.node
    if (op == "clamp" and x_attr == attr and x_dtype == dtype and args[1:] == tuple(p.id for p in parts[1:])
            and all(g.nodes[b][0] == "const" for b in args[1:])):
        # clamp(clamp(x, lo, hi), lo, hi) with the same constant bounds is clamp(x, lo, hi), value and gradient
        # (the outer clamp's input is always inside its bounds, or NaN either way): one node, so that e.g. SBD's
        # step, which clamps t before a helper that clamps it again, shares its recall with the curve's
        return x
    return _result("clamp", parts, dtype, attr)


def _minmax(op: str, a, b) -> Proxy:
    g = _graph_of(a, b)
    a, b = _as_proxy(g, a), _as_proxy(g, b)
    return _result(op, [a, b], _promote([(a.kind, a.prio), (b.kind, b.prio)]))


def _where(c, a, b) -> Proxy:
    g = _graph_of(c, a, b)
    c, a, b = _as_proxy(g, c), _as_proxy(g, a), _as_proxy(g, b)
    if c.kind != "b":
        raise TraceError("torch.where with a non-boolean condition")
    dtype = _promote([(a.kind, a.prio), (b.kind, b.prio)])
    if dtype == "f4":  # torch.where(c, 0.5, 1.0): float32 values, exact only when both numbers are float32's
        for x in (a, b):
            op, _, attr, _, _ = x.node
            if op != "const" or float(np.float32(attr[1])) != attr[1]:
                raise TraceError("torch.where computed in float32 (two Python numbers or float32 values); "
                                 "make a branch float64")
    return g.add("where", (c.id, a.id, b.id), None, dtype, max(1, c.prio, a.prio, b.prio))


def _relu(x) -> Proxy:
    """torch.relu: x where x > 0, else 0 (NaN stays NaN), of x's own dtype (an integer count stays an integer)."""
    x = _as_proxy(_graph_of(x), x)
    if x.kind == "b":
        raise TraceError("relu of a boolean")
    return _result("relu", [x], x.kind)


def _float_op(op: str, xs: list, attr=None) -> Proxy:
    """logaddexp / softplus / nan_to_num: float64 operands only (their float32 arithmetic is not reproduced)."""
    g = _graph_of(*xs)
    xs = [_as_proxy(g, x) for x in xs]
    if any(x.kind != "f8" for x in xs):
        raise TraceError(f"{op} of a non-float64 value")
    return _result(op, xs, "f8", attr)


def _cast(x: Proxy, kind: str) -> Proxy:
    if x.kind == kind:
        return x
    if kind == "f4" and x.kind == "f8":
        raise TraceError("a float64 value cast to float32")
    return x.graph.add("cast", (x.id,), kind, kind, x.prio)


def _gather(idx: Proxy, elems: list) -> Proxy:
    if idx.kind != "i":
        raise TraceError("indexing with a non-integer traced value")
    g = idx.graph
    elems = [_as_proxy(g, e) for e in elems]
    dtype = _promote([(e.kind, max(1, e.prio)) for e in elems])
    return g.add("gather", (idx.id,) + tuple(e.id for e in elems), None, dtype, 2 if idx.prio == 2 else 1)


def _full_like(x, value, dtype=None) -> Proxy:
    """torch.full_like(x, value[, dtype]): x's dtype (a Python number's, torch's promotion, for an integer x), or
    `dtype` when given (float64 only: SM2-trainable's zeros_like(g, dtype=w.dtype))."""
    if dtype is not None and _kind_of(dtype) != "f8":
        raise TraceError(f"{dtype} made by full_like / zeros_like / ones_like (only float64 is traced)")
    if dtype is None and x.kind != "f8":
        return _as_proxy(_graph_of(x), value)
    return x.graph.const(float(value), x.prio, "f8")


_UNARY_FUNCS = {"exp", "log", "log1p", "sqrt", "sigmoid", "tanh", "abs", "neg", "negative"}
_REVERSED = {"__radd__": "add", "__rsub__": "sub", "__rmul__": "mul", "__rtruediv__": "div", "__rdiv__": "div"}
_FORWARD = {"__add__": "add", "__sub__": "sub", "__mul__": "mul", "__truediv__": "div", "__div__": "div",
            "add": "add", "sub": "sub", "subtract": "sub", "mul": "mul", "multiply": "mul", "div": "div",
            "true_divide": "div", "divide": "div", "__lt__": "lt", "__le__": "le", "__gt__": "gt", "__ge__": "ge",
            "__eq__": "eq", "__ne__": "ne", "lt": "lt", "le": "le", "gt": "gt", "ge": "ge", "eq": "eq", "ne": "ne"}


def _torch_function(func, args, kwargs):
    """torch.<op>(...) / Tensor.<op>(...) with a proxy among the arguments."""
    name = getattr(func, "__name__", str(func))
    if name in _UNARY_FUNCS and len(args) == 1 and not kwargs:
        return _unary("neg" if name == "negative" else name, _as_proxy(_graph_of(args[0]), args[0]))
    if name in _FORWARD and len(args) == 2 and not kwargs:
        return _binary(_FORWARD[name], args[0], args[1])
    if name in _REVERSED and len(args) == 2:
        return _binary(_REVERSED[name], args[1], args[0])
    if name in ("pow", "__pow__", "float_power") and len(args) == 2 and not kwargs:
        if name == "float_power":
            raise TraceError("torch.float_power")
        return _pow(args[0], args[1])
    if name == "__rpow__":
        return _pow(args[1], args[0])
    if name in ("clamp", "clip"):
        lo = kwargs.get("min", args[1] if len(args) > 1 else None)
        hi = kwargs.get("max", args[2] if len(args) > 2 else None)
        return _clamp(args[0], lo, hi)
    if name in ("clamp_min", "clamp_max"):
        b = kwargs.get("min", kwargs.get("max", args[1] if len(args) > 1 else None))
        return _clamp(args[0], b, None) if name == "clamp_min" else _clamp(args[0], None, b)
    if name in ("minimum", "maximum", "fmin", "fmax") and len(args) == 2:
        if name.startswith("f"):
            raise TraceError(f"torch.{name}")
        return _minmax(name, args[0], args[1])
    if name in ("max", "min") and len(args) == 2 and not kwargs and not _is_number(args[1]):
        # torch.max(a, b) of two tensors is torch.maximum, forward and backward (a tie splits the gradient)
        return _minmax("maximum" if name == "max" else "minimum", args[0], args[1])
    if name == "where" and len(args) == 3:
        return _where(*args)
    if name == "relu" and len(args) == 1 and not kwargs:
        return _relu(args[0])
    if name == "leaky_relu" and len(args) in (1, 2) and set(kwargs) <= {"negative_slope", "inplace"}:
        slope = kwargs.get("negative_slope", args[1] if len(args) > 1 else 0.01)
        if not _is_number(slope) or kwargs.get("inplace"):
            raise TraceError("leaky_relu in place or with a traced slope")
        # torch's kernel: x > 0 ? x : x·slope, and its backward grad or grad·slope on the same test (NaN: x·slope)
        return _where(_binary("gt", args[0], 0), args[0], _binary("mul", args[0], float(slope)))
    if name in ("__and__", "logical_and", "bitwise_and"):
        return _logical("and", args[0], args[1])
    if name in ("__or__", "logical_or", "bitwise_or"):
        return _logical("or", args[0], args[1])
    if name in ("zeros_like", "ones_like") and len(args) == 1 and isinstance(args[0], Proxy) \
            and set(kwargs) <= {"dtype"}:
        return _full_like(args[0], 0.0 if name == "zeros_like" else 1.0, kwargs.get("dtype"))
    if name == "full_like" and len(args) == 2 and isinstance(args[0], Proxy) and set(kwargs) <= {"dtype"}:
        return _full_like(args[0], args[1], kwargs.get("dtype"))
    if name == "__getitem__" and _is_tensor(args[0]) and isinstance(args[1], Proxy):
        table = args[0]
        if table.dim() != 1:
            raise TraceError("indexing a constant tensor of more than one dimension")
        return _gather(args[1], [table[i].item() for i in range(len(table))])
    if name in ("clone", "double") and isinstance(args[0], Proxy):
        return args[0].clone() if name == "clone" else args[0].double()
    if name == "logaddexp" and len(args) == 2 and not kwargs:
        return _float_op("logaddexp", list(args))
    if name == "softplus":
        beta = kwargs.get("beta", args[1] if len(args) > 1 else 1.0)
        threshold = kwargs.get("threshold", args[2] if len(args) > 2 else 20.0)
        if not (_is_number(beta) and _is_number(threshold)):
            raise TraceError("softplus with a traced beta or threshold")
        return _float_op("softplus", [args[0]], (float(beta), float(threshold)))
    if name == "nan_to_num":
        nan = kwargs.get("nan", args[1] if len(args) > 1 else 0.0)
        posinf = kwargs.get("posinf", args[2] if len(args) > 2 else None)
        neginf = kwargs.get("neginf", args[3] if len(args) > 3 else None)
        big = float(np.finfo(np.float64).max)
        return _float_op("nan_to_num", [args[0]], (float(0.0 if nan is None else nan),
                                                   big if posinf is None else float(posinf),
                                                   -big if neginf is None else float(neginf)))
    raise TraceError(f"torch op {name} is not traced")


# --------------------------------------------------------------------------------------------------- tracing
class Trace:
    """One traced function: the graph, its input nodes and its output node ids."""

    def __init__(self, graph: Graph, outputs: list[int], n_w: int):
        self.graph, self.outputs, self.n_w = graph, outputs, n_w


def _weights(graph: Graph, n_w: int) -> WeightVector:
    return WeightVector(graph, [graph.add("w", (), k, "f8", 1) for k in range(n_w)])


def _outputs(graph: Graph, result, what: str, state: bool) -> list[int]:
    if state:
        if not isinstance(result, (tuple, list)) or not result:
            raise TraceError(f"{what} must return a tuple of state tensors")
    else:
        result = [result]
    out = []
    for i, x in enumerate(result):
        p = _as_proxy(graph, x)
        if state and p.kind == "i":  # an integer state (a count): kept as a float64, exact below 2^53
            p = _cast(p, "f8")
        if p.kind != "f8":
            raise TraceError(f"{what} output {i} is {p.dtype}, not float64")
        out.append(p.id)
    return out


def _call(fn, what: str, *args):
    try:
        with _torch().no_grad():
            return fn(*args)
    except TraceError:
        raise
    except Exception as exc:  # a torch op that rejected a proxy, a shape access, ...
        raise TraceError(f"{what}: {type(exc).__name__}: {exc}") from exc


def trace_model(init, step, curve, n_w: int, clip=None, options=None) -> dict:
    """The traces of a contract model's functions: {"init", "step", "curve", ("clip")} and its N_STATE.
    `options`: (module, names): module-level constants the functions read ("NAME" in the module, or
    "package.module:NAME") that the compiled plug-in takes as run-time options instead (precompute's opts[i] for
    names[i]; e.g. the lower clamp of S, which upstream's --secs changes): while tracing, each is the module
    attribute bound to an "opt" node (constant per run, like a weight)."""
    standin = False
    try:
        with torch_standin.standing_in() as standin:  # torch not imported yet: the stand-in, no torch import
            return _trace_with_options(init, step, curve, n_w, clip, options)
    except TraceError:
        if not standin:
            raise
    import torch  # noqa: F401 (the functions need more of torch than the stand-in has: trace them with torch)

    return _trace_with_options(init, step, curve, n_w, clip, options)


def _trace_with_options(init, step, curve, n_w: int, clip, options) -> dict:
    import importlib

    g = Graph()
    module, names = options if options is not None else (None, ())
    # "NAME": the module's own constant; "package.module:NAME": one its functions read from another module
    owners = [(importlib.import_module(n.partition(":")[0]), n.partition(":")[2]) if ":" in n else (module, n)
              for n in names]
    saved = [getattr(owner, attr) for owner, attr in owners]
    try:
        for i, ((owner, attr), value) in enumerate(zip(owners, saved)):  # (index, the value: precompute's default
            setattr(owner, attr, g.add("opt", (), (i, float(value)), "f8", 1))  # when opts is shorter)
        return _trace_functions(g, init, step, curve, n_w, clip)
    finally:
        for (owner, attr), value in zip(owners, saved):
            setattr(owner, attr, value)


def _trace_functions(g: Graph, init, step, curve, n_w: int, clip) -> dict:
    first = _call(init, "init", _weights(g, n_w), g.add("in", (), "g", "i", 2), g.add("in", (), "t", "f8", 2))
    out_init = _outputs(g, first, "init", True)
    n_state = len(out_init)
    traces = {"init": Trace(g, out_init, n_w), "n_state": n_state}
    # step and curve record into the same graph: what depends on the weights only is shared (and hoisted once)
    prev = tuple(g.add("in", (), f"s{i}", "f8", 2) for i in range(n_state))
    new = _call(step, "step", _weights(g, n_w), prev, g.add("in", (), "t", "f8", 2), g.add("in", (), "g", "i", 2))
    traces["step"] = Trace(g, _outputs(g, new, "step", True), n_w)
    if len(traces["step"].outputs) != n_state:
        raise TraceError(f"step returns {len(traces['step'].outputs)} state components, init {n_state}")
    state = tuple(g.add("in", (), f"s{i}", "f8", 2) for i in range(n_state))
    p = _call(curve, "curve", _weights(g, n_w), state, g.add("in", (), "t", "f8", 2))
    traces["curve"] = Trace(g, _outputs(g, p, "curve", False), n_w)
    if clip is not None:
        g = Graph()
        out = _call(clip, "clip", _weights(g, n_w))
        if not isinstance(out, WeightVector) or len(out.elems) != n_w:
            raise TraceError("clip(w) must return the (cloned, edited) weight vector")
        traces["clip"] = Trace(g, [e.id for e in out.elems], n_w)
    return traces


# --------------------------------------------------------------------------------------------------- codegen
def _lit(value) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "math.nan"
        if math.isinf(value):
            return "math.inf" if value > 0 else "-math.inf"
    return repr(value)


def _pow_const(x: str, e: float) -> str:
    """x ** e as torch's pow(Tensor, Scalar) computes it (its fast paths for the common exponents)."""
    if e == 1.0:
        return f"({x})"
    if e == 2.0:
        return f"({x} * {x})"
    if e == 3.0:
        return f"({x} * {x} * {x})"
    if e == 0.5:
        return f"math.sqrt({x})"
    if e == -0.5:
        return f"(1.0 / math.sqrt({x}))"
    if e == -1.0:
        return f"(1.0 / {x})"
    if e == -2.0:
        return f"(1.0 / ({x} * {x}))"
    return f"({x} ** {_lit(e)})"


def _conj(conds) -> str:
    """The comparisons `conds` joined by & (not `and`: no branch per operand for numba to build and type)."""
    return " & ".join(f"({c})" for c in conds)


def _quotient_domain(v: str, x: str) -> tuple:
    """Where v/x is x^(y−1) exact enough, from the forward value v = x^y: x ≠ 0 and v a normal finite number."""
    return f"{x} != 0.0", f"abs({v}) >= 2.2250738585072014e-308", f"abs({v}) < math.inf"


def _pow_quotient(v: str, x: str, fallback: str) -> str:
    """x^(y−1) in pow's derivative as v/x from the forward value v = x^y (a division instead of a pow call, equal
    up to rounding), on _quotient_domain; else `fallback`, torch's own x^(y−1) (x = 0, overflow, underflow, NaN)."""
    return f"({v} / {x} if ({_conj(_quotient_domain(v, x))}) else {fallback})"


def _reach(nodes, roots, leaves=(), within: set | None = None, cut: tuple | None = None) -> set:
    """The nodes `roots` read, directly or through others (a leaf, a value read from wc, is read, not computed);
    `within`: only those nodes; `cut` = (node, i): not through that node's i-th argument."""
    seen: set = set()
    stack = [k for k in roots if within is None or k in within]
    while stack:
        k = stack.pop()
        if k in seen:
            continue
        seen.add(k)
        if k in leaves:
            continue
        stack.extend(j for i, j in enumerate(nodes[k][1])
                     if (within is None or j in within) and (cut is None or cut != (k, i)))
    return seen


def _needed(nodes, outputs, leaves=()) -> list[int]:
    """Ids of the nodes the outputs depend on, in topological (creation) order (`leaves` are read, not computed)."""
    return sorted(_reach(nodes, outputs, leaves))


def _hoisted(nodes, functions: list[list[int]]) -> list[int]:
    """The weight-only float64 values the per-card functions read (precompute's wc[N_W:]): nodes that depend on
    the weights and constants only, computed once per weight vector instead of once per review."""
    def weight_only(k):
        op, _, _, dtype, prio = nodes[k]
        return prio == 1 and dtype == "f8" and op not in ("const", "w", "in")

    frontier = set()
    for outputs in functions:
        for k in _needed(nodes, outputs):
            if weight_only(k):
                if k in outputs:
                    frontier.add(k)
                continue
            frontier.update(j for j in nodes[k][1] if weight_only(j))
    return sorted(frontier)


# ops whose forward and derivative share one exp (e<k>): logaddexp's e^{−|x−y|}, softplus' e^{βx}
_WITH_EXP = {"logaddexp", "softplus"}


def _exp_arg(op: str, a: list[str], attr) -> str:
    if op == "logaddexp":
        return f"math.exp(-abs({a[0]} - {a[1]}))"
    return f"math.exp({a[0]} * {_lit(attr[0])})"


def _computed_pow(nodes, k: int, leaves) -> bool:
    """Node k is a float64 x ** y the function computes (not read from wc): it is written exp(y·ln x) with ln x
    shared by every pow of the same base (l<x>), which the reverse pass reuses for d/dy = x^y·ln x."""
    return nodes[k][0] == "pow" and nodes[k][3] == "f8" and not (leaves and k in leaves)


# The lane dialect (engine/traced_lanes.py: the same code with several cards side by side): libm's functions as
# vec_math's vectorisable arithmetic, and every branch that would call libm's pow in the scalar code (pow off its
# exp(y·ln x) domain, x^(y−1) in its derivative) replaced by a flag, `bad`, that makes the batch fall back to the
# scalar code (the flagged value is never used).
_LANE_FN = {"exp": "exp1", "log": "log1", "log1p": "log1p1", "tanh": "tanh1", "sqrt": "math.sqrt"}


def _flag(*conds: str, unless: str | None = None) -> str:
    """The lane dialect's line that flags a review whose value takes the scalar code's libm-only branch: unless all
    the comparisons `conds` hold (or `unless` does), 1 added to a count in an integer (an integer sum vectorises
    without reordering float additions; a store into A inside the lane loop would make LLVM check A against every row
    of X it reads and writes, and give up past a few such checks). The comparisons are joined by & and |, not `and`
    and `or`: no branch per operand, for numba to build and type (a tenth of compiling a reverse lane pass)."""
    ok = _conj(conds)
    if unless is not None:
        ok = f"({ok}) | ({unless})"
    return f"    nbad += 1 - ({ok})"


def guard_ids(attr) -> tuple | None:
    """The operands a node fused across a where's sides (engine/traced_branches.py) no longer computes, from its
    attr ("guard", ids); None for any other node."""
    return attr[1] if isinstance(attr, tuple) and attr and attr[0] == "guard" else None


def _guard_conditions(nodes, k: int) -> list[str]:
    """The lane dialect's conditions on the operands that a node fused across a where's sides no longer computes,
    one tuple of comparisons per operand: each must hold (the untaken value finite, as the scalar code's gradient
    needs), else the review is flagged."""
    op, _, attr, _, _ = nodes[k]
    ids = guard_ids(attr)
    if ids is None:
        return []
    if op == "pow":
        return [(f"v{x} > 0.0", f"v{x} < math.inf", f"abs(v{y}) < math.inf") for x, y in zip(ids[::2], ids[1::2])]
    conds = {"exp": ("v{0} < 709.782712893384",), "log": ("v{0} > 0.0", "v{0} < math.inf"),
             "log1p": ("v{0} > -1.0", "v{0} < math.inf")}[op]
    return [tuple(c.format(x) for c in conds) for x in ids]


def _forward_lines(tr: Trace, order: list[int], inputs: dict, leaves: dict | None = None,
                   reads: dict | None = None, lanes: bool = False) -> list[str]:
    """v<k> = <value of node k> for every needed node (`leaves`: node -> the expression that reads it, a hoisted
    value in wc; `reads`: variable name -> the expression that reads it, in a VJP the transcendental values its
    forward function kept in the state; `lanes`: the lane dialect above)."""
    nodes, lines = tr.graph.nodes, []
    reads = reads or {}
    logged = set()
    fn = (lambda name: _LANE_FN[name]) if lanes else (lambda name: f"math.{name}")
    for k in order:
        op, args, attr, dtype, _ = nodes[k]
        a = [f"v{j}" for j in args]

        def pick(cond, x, y, dtype=dtype):  # x if cond else y: one select of two floats (engine/kernel_math.select)
            return f"select({cond}, {x}, {y})" if dtype == "f8" else f"{x} if ({cond}) else {y}"

        guards = _guard_conditions(nodes, k) if lanes and f"v{k}" not in reads else []
        lines += [_flag(*conds) for conds in guards]  # (a reverse pass reads the value: its forward checked them)
        if _computed_pow(nodes, k, leaves) and args[0] not in logged:
            logged.add(args[0])
            ln = fn("log")
            lines.append(f"    l{args[0]} = {reads.get(f'l{args[0]}', f'{ln}(v{args[0]})')}")
        if op in _WITH_EXP and not (leaves and k in leaves):  # the exp its forward and reverse share
            lines.append(f"    e{k} = {reads.get(f'e{k}', _exp_arg(op, a, attr).replace('math.exp', fn('exp')))}")
        if f"v{k}" in reads:
            expr = reads[f"v{k}"]
        elif leaves and k in leaves:
            expr = leaves[k]
        elif op == "const":
            expr = _lit(attr[1])
        elif op == "w":
            expr = f"w[{attr}]"
        elif op == "opt":  # a run-time option: read by precompute only (weight-like, always hoisted)
            expr = f"(opts[{attr[0]}] if len(opts) > {attr[0]} else {_lit(attr[1])})"
        elif op == "in":
            expr = inputs[attr]
        elif op in ("add", "sub", "mul", "div"):
            sym = {"add": "+", "sub": "-", "mul": "*", "div": "/"}[op]
            expr = f"{a[0]} {sym} {a[1]}"
            if op == "div" and dtype == "f8" and not _float_operand(nodes, args):
                expr = f"float({a[0]}) / {a[1]}"
        elif op in ("lt", "le", "gt", "ge", "eq", "ne"):
            sym = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}[op]
            expr = f"{a[0]} {sym} {a[1]}"
        elif op == "and":
            expr = f"{a[0]} and {a[1]}"
        elif op == "or":
            expr = f"{a[0]} or {a[1]}"
        elif op == "not":
            expr = f"not {a[0]}"
        elif op == "neg":
            expr = f"-{a[0]}"
        elif op == "abs":
            expr = f"abs({a[0]})"
        elif op in ("exp", "log", "log1p", "sqrt", "tanh"):
            expr = f"{fn(op)}({a[0]})"
        elif op == "sigmoid":
            expr = f"1.0 / (1.0 + {fn('exp')}(-{a[0]}))"
        elif op == "powc":
            expr = _pow_const(a[0], attr) if dtype == "f8" else f"{a[0]} ** {attr}"
            if lanes and dtype == "f8" and "**" in expr:  # x^e as exp(e·ln x) on x > 0 finite, else the flag
                lines.append(_flag(f"{a[0]} > 0.0", f"{a[0]} < math.inf"))
                expr = f"exp1({_lit(float(attr))} * log1({a[0]}))"
        elif op == "rpowc":
            expr = f"{_lit(attr)} ** {a[0]}" if dtype != "f8" else f"{_lit(float(attr))} ** float({a[0]})"
            if lanes and dtype == "f8" and attr > 0:  # c^x as exp(x·ln c) on x finite, else the flag
                lines.append(_flag(f"abs({a[0]}) < math.inf"))
                expr = f"exp1({a[0]} * {_lit(math.log(attr))})"
        elif op == "pow":  # pow as exp(y·ln x) where that is pow up to rounding: x > 0 finite, y finite
            x, y = a
            expr = f"float({x}) ** float({y})"
            domain = (f"{x} > 0.0", f"{x} < math.inf", f"abs({y}) < math.inf")
            if dtype == "f8" and lanes:
                if not guards:  # a fused pow's guard checks both sides' operands, its own among them
                    lines.append(_flag(*domain))
                expr = f"exp1({y} * l{args[0]})"
            elif dtype == "f8":
                expr = f"math.exp({y} * l{args[0]}) if ({_conj(domain)}) else {expr}"
        elif op == "clamp":
            has_lo, has_hi = attr
            x = a[0]
            if has_lo:  # the lower bound's result its own variable: one assignment each (see _backward_lines)
                lines.append(f"    {'m' if has_hi else 'v'}{k} = {pick(f'{x} < {a[1]}', a[1], x)}")
                x = f"m{k}" if has_hi else f"v{k}"
            if has_hi:
                hi = a[2] if has_lo else a[1]
                lines.append(f"    v{k} = {pick(f'{x} > {hi}', hi, x)}")
            if dtype == "f8" and not _float_operand(nodes, args):
                lines.append(f"    v{k} = float(v{k})")
            continue
        elif op == "minimum":
            expr = pick(f"({a[0]} < {a[1]}) | ({a[0]} != {a[0]})", a[0], a[1])
        elif op == "maximum":
            expr = pick(f"({a[0]} > {a[1]}) | ({a[0]} != {a[0]})", a[0], a[1])
        elif op == "where":
            expr = pick(a[0], a[1], a[2])
        elif op == "relu":  # NaN <= 0 is false: NaN stays NaN, as torch's
            expr = f"{a[0]} if not ({a[0]} <= 0) else {'0.0' if dtype == 'f8' or lanes else '0'}"
        elif op == "logaddexp":  # torch's CPU kernel: an infinity equal on both sides is returned as is
            x, y = a
            inf = f"abs({x}) == math.inf" if lanes else f"math.isinf({x})"
            expr = f"{x} if (({inf}) & ({x} == {y})) else (max({x}, {y}) + {fn('log1p')}(e{k}))"
        elif op == "softplus":
            beta, threshold = attr
            xb = f"({a[0]} * {_lit(beta)})"
            expr = f"{a[0]} if {xb} > {_lit(threshold)} else {fn('log1p')}(e{k}) / {_lit(beta)}"
        elif op == "nan_to_num":
            nan, posinf, neginf = attr
            x = a[0]
            expr = (f"{_lit(nan)} if {x} != {x} else ({_lit(posinf)} if {x} == math.inf else "
                    f"({_lit(neginf)} if {x} == -math.inf else {x}))")
        elif op == "cast":
            if nodes[args[0]][3] == "b":  # numba has no float(bool)
                expr = f"(1 if {a[0]} else 0)" if attr == "i" and not lanes else f"(1.0 if {a[0]} else 0.0)"
            elif lanes and attr == "i":  # integers are floats in the lanes (the grade is read as one)
                expr = f"float(int({a[0]}))"
            else:
                expr = {"i": f"int({a[0]})", "b": f"{a[0]} != 0", "f4": f"float({a[0]})",
                        "f8": f"float({a[0]})"}[attr]
        elif op == "gather":
            idx, elems = a[0], a[1:]
            n = len(elems)
            lines.append(f"    j{k} = {idx} + {n} if {idx} < 0 else {idx}")
            chain = elems[-1]
            for i in range(n - 2, -1, -1):
                chain = f"{elems[i]} if j{k} == {i} else ({chain})"
            expr = chain
        else:  # pragma: no cover - every op the tracer records is listed above
            raise TraceError(f"no code for op {op}")
        if dtype == "f8" and op in ("where", "minimum", "maximum", "gather", "add", "sub", "mul", "neg", "abs", "relu") \
                and not _float_operand(nodes, args[1:] if op in ("where", "gather") else args):
            expr = f"float({expr})"
        lines.append(f"    v{k} = {expr}")
    return lines


def _float_operand(nodes, args) -> bool:
    """Whether a float64 node is among `args`: then numba's arithmetic and its unification of a conditional's two
    sides make the result a float64 already, and a float() around it is one more call for numba to type (~120 in
    FSRS-6's lanes). Where every operand is an integer or a boolean, float() keeps the float64 that torch gives."""
    return any(nodes[j][3] == "f8" for j in args)


def _active(nodes, order, leaves=()) -> set[int]:
    """Float nodes that depend on the weights or the state inputs: the ones that carry an adjoint (a hoisted
    value read from wc counts as a weight)."""
    act = set()
    for k in order:
        op, args, attr, dtype, _ = nodes[k]
        if dtype not in ("f4", "f8"):
            continue
        if op == "w" or (op == "in" and attr != "t") or k in leaves:
            act.add(k)
        elif op not in ("const", "in") and any(j in act for j in args):
            act.add(k)
    return act


_ADJOINT = re.compile(r"a\d+")


def _backward_lines(tr: Trace, order: list[int], act: set[int], seeds: dict[int, list[str]],
                    sink: dict, lanes: bool = False) -> list[str]:
    """a<k> adjoints from the output seeds back to the inputs (torch's derivative formulas); `sink[(op, attr)]`
    gives the statement that stores an input's adjoint (e.g. gw[3] += a7); `lanes`: the lane dialect (see
    _forward_lines)."""
    nodes, lines = tr.graph.nodes, []

    def quotient(v, x, y, fallback):  # x^(y−1) from v = x^y (_pow_quotient); the lanes flag its libm branch
        if not lanes or "**" not in fallback:
            return _pow_quotient(v, x, fallback)
        # v/x alone: off its domain the review is flagged (unless y = 0, whose term is 0.0 whatever v/x is)
        lines.append(_flag(*_quotient_domain(v, x), unless=f"{y} == 0"))
        return f"({v} / {x})"

    def choose(cond, x, y):  # x if cond else y: in the lanes one select of two floats (engine/kernel_math.select);
        # the scalar code's y may call libm's pow, which only a conditional expression leaves uncomputed
        return f"select({cond}, {x}, {y})" if lanes else f"({x} if ({cond}) else {y})"

    def gate(g, cond, when=True):
        """g where `cond` is `when`, else 0.0, as one select (engine/kernel_math.select: no branch for numba to
        build; a third of compiling FSRS-6's reverse lane pass went to these)."""
        return f"select({cond}, {g}, 0.0)" if when else f"select({cond}, 0.0, {g})"

    # Each adjoint is assigned once, as the sum of its contributions when its node is reached (all of them come
    # from later nodes, reached before it): numba's SSA pass rebuilds every variable assigned more than once over
    # all of a function's blocks (one per side of each conditional), which had been ~30% of compiling FSRS-6's
    # reverse lane pass. An adjoint whose one contribution is another adjoint is that adjoint's name (a third of
    # FSRS-6's: an add, a clamp in range, a cast), not a copy of it. The scalar code sums (c1) + (c2) ..., not
    # 0.0 + (c1) + ... as a{k} = 0.0; a{k} += c1 computed: the two differ only in the sign of a zero adjoint, which
    # no result can see (every gradient is a sum that starts at +0.0; an adjoint is never a divisor or a condition).
    # The lanes keep the 0.0: under fastmath "contract" a bare product would be fused into the sum that reads it.
    pending: dict[int, list[str]] = {k: list(seeds.get(k, ())) for k in act}
    for k in reversed(order):
        if k not in act:
            continue
        op, args, attr, dtype, _ = nodes[k]
        a = [f"v{j}" for j in args]
        terms = pending.pop(k)
        if len(terms) == 1 and _ADJOINT.fullmatch(terms[0]):
            g = terms[0]
        else:
            g = f"a{k}"
            zero = ["0.0"] if lanes or not terms else []
            lines.append(f"    {g} = " + " + ".join(zero + [f"({e})" for e in terms]))

        def add(j, expr):
            if j in act:
                pending[j].append(expr)  # (a KeyError here: an adjoint added to after its node was reached)

        if ("node", k) in sink:  # a hoisted value read from wc: its adjoint goes to gwc
            lines.append("    " + sink[("node", k)].format(g))
        elif op in ("w", "in"):
            lines.append("    " + sink[(op, attr)].format(g))
        elif op == "add":
            add(args[0], g)
            add(args[1], g)
        elif op == "sub":
            add(args[0], g)
            add(args[1], f"-{g}")
        elif op == "mul":
            add(args[0], f"{g} * {a[1]}")
            add(args[1], f"{g} * {a[0]}")
        elif op == "div":
            add(args[0], f"{g} / {a[1]}")
            add(args[1], f"-{g} * (({a[0]} / {a[1]}) / {a[1]})")
        elif op == "neg":
            add(args[0], f"-{g}")
        elif op == "abs":  # grad · sgn(x), sgn(0) = 0
            add(args[0], f"{g} * (1.0 if {a[0]} > 0 else (-1.0 if {a[0]} < 0 else 0.0))")
        elif op == "exp":
            add(args[0], f"{g} * v{k}")
        elif op == "log":
            add(args[0], f"{g} / {a[0]}")
        elif op == "log1p":
            add(args[0], f"{g} / ({a[0]} + 1.0)")
        elif op == "sqrt":
            add(args[0], f"{g} / (2.0 * v{k})")
        elif op == "sigmoid":
            add(args[0], f"{g} * (1.0 - v{k}) * v{k}")
        elif op == "tanh":
            add(args[0], f"{g} * (1.0 - v{k} * v{k})")
        elif op == "powc":
            if attr != 0.0:
                e = float(attr)
                direct = _pow_const(a[0], e - 1.0)
                if lanes and "**" in direct:  # x^(e−1) as v/x (a libm pow would keep the lane loop scalar)
                    add(args[0], f"{g} * ({_lit(e)} * {quotient(f'v{k}', a[0], '1.0', direct)})")
                elif e in (1.0, 2.0, 3.0, 0.5, -0.5, -1.0, -2.0) or args[0] not in act:
                    add(args[0], f"{g} * ({_lit(e)} * {direct})")
                else:
                    add(args[0], f"{g} * ({_lit(e)} * {quotient(f'v{k}', a[0], '1.0', direct)})")
        elif op == "rpowc":
            ln = _lit(math.log(attr)) if attr > 0 else ("math.nan" if attr < 0 else "-math.inf")
            if attr == 0:
                add(args[0], f"{g} * (0.0 if {a[0]} >= 0 else v{k} * {ln})")
            else:
                add(args[0], f"{g} * (v{k} * {ln})")
        elif op == "pow":
            x, y = a
            if args[0] in act:
                xpow = quotient(f"v{k}", x, y, f"float({x}) ** ({y} - 1.0)")
                add(args[0], choose(f"{y} == 0", "0.0", f"{g} * ({y} * {xpow})"))
            if args[1] in act:
                add(args[1], f"{g} * {choose(f'({y} >= 0) & ({x} == 0)', '0.0', f'v{k} * l{args[0]}')}")
        elif op == "clamp":
            has_lo, has_hi = attr
            x = a[0]
            lo = a[1] if has_lo else None
            hi = (a[2] if has_lo else a[1]) if has_hi else None
            cond = " & ".join(c for c in ((f"({x} >= {lo})" if lo else None), (f"({x} <= {hi})" if hi else None)) if c)
            add(args[0], gate(g, cond))
            if has_lo and has_hi:  # torch's clamp_backward_min_max
                add(args[1], gate(g, f"({x} < {lo}) & ({lo} < {hi})"))
                add(args[2], gate(g, f"({x} > {hi}) | ({hi} < {lo})"))
            elif has_lo:
                add(args[1], gate(g, f"{x} < {lo}"))
            else:
                add(args[1], gate(g, f"{x} > {hi}"))
        elif op in ("minimum", "maximum"):
            x, y = a
            gt, lt = (">", "<") if op == "minimum" else ("<", ">")
            add(args[0], choose(f"{x} {gt} {y}", "0.0", choose(f"{x} == {y}", f"{g} / 2", g)))
            add(args[1], choose(f"{x} {lt} {y}", "0.0", choose(f"{x} == {y}", f"{g} / 2", g)))
        elif op == "relu":  # threshold_backward: the gradient where the result is positive
            add(args[0], gate(g, f"v{k} > 0"))
        elif op == "where":
            add(args[1], gate(g, a[0]))
            add(args[2], gate(g, a[0], when=False))
        elif op == "logaddexp":  # derivatives.yaml: grad / (1 + exp(other - self)) for each side, from the
            x, y = a            # forward's e = e^{−|x−y|}: 1/(1 + e) on the larger side, e/(1 + e) on the other
            add(args[0], f"({g} / (1.0 + e{k}) if {x} >= {y} else {g} * e{k} / (1.0 + e{k}))")
            add(args[1], f"({g} / (1.0 + e{k}) if {y} >= {x} else {g} * e{k} / (1.0 + e{k}))")
        elif op == "softplus":  # softplus_backward: z = exp(x·β); grad where x·β > threshold, else grad·z/(z + 1)
            beta, threshold = attr
            xb = f"({a[0]} * {_lit(beta)})"
            add(args[0], f"({g} if {xb} > {_lit(threshold)} else {g} * e{k} / (e{k} + 1.0))")
        elif op == "nan_to_num":  # grad · isfinite(x)
            finite = f"abs({a[0]}) < math.inf" if lanes else f"math.isfinite({a[0]})"
            add(args[0], gate(g, finite))
        elif op == "cast":
            add(args[0], g)
        elif op == "gather":
            for i, j in enumerate(args[1:]):
                add(j, gate(g, f"j{k} == {i}"))
        else:  # pragma: no cover
            raise TraceError(f"no derivative for op {op}")
    return lines


_HEADER = '''"""Generated by engine/traced.py from {source}: do not edit (regenerated from the model file)."""
# ruff: noqa
import math

import numpy as np
from numba import njit

from engine.kernel_math import BCE_GRAD_EPS, bce, select

N_STATE = {n_total}
N_ADJ = {n_state}
N_W = {n_w}
'''
_JIT = '@njit(cache=True, error_model="numpy")'


_DEFINITION = re.compile(r"^\s+([vmlej]\d+) = (.*)$")
_NAME = re.compile(r"[A-Za-z_]\w*")


def prune_dead(lines: list[str]) -> list[str]:
    """`lines` without the definitions of values nothing after them reads: a VJP recomputes its forward pass, and
    the values only the forward's outputs needed (a new state whose clamp the reverse pass reads through its input,
    a where's result whose branches are stashed) would otherwise be compiled again, conditionals and all. Every
    definition is a pure expression, so dropping an unread one changes nothing else."""
    used: set[str] = set()
    kept = []
    for line in reversed(lines):
        m = _DEFINITION.match(line)
        if m and m.group(1) not in used:
            continue
        used.update(_NAME.findall(m.group(2) if m else line))
        kept.append(line)
    return kept[::-1]


def _function(name: str, params: str, body: list[str]) -> str:
    return f"\n\n{_JIT}\ndef {name}({params}):\n" + "\n".join(prune_dead(body) or ["    pass"]) + "\n"


# ops whose value costs a libm call: init and step keep theirs in the state for their VJPs
_TRANSCENDENTAL = {"exp", "log", "log1p", "sqrt", "sigmoid", "tanh", "pow", "rpowc", "logaddexp", "softplus"}


def _libm(nodes, k: int) -> bool:
    """Node k's value costs a libm call (a power by a constant other than 1, 2, 3, -1, -2 included): what init and
    step keep for their VJPs, and what makes a where's side worth leaving uncomputed (_lazy_lines)."""
    op, _, attr, _, _ = nodes[k]
    return op in _TRANSCENDENTAL or (op == "powc" and float(attr) not in (1.0, 2.0, 3.0, -1.0, -2.0))


def _stashed(nodes, order: list[int], leaves: dict) -> list[str]:
    """The float64 transcendental values a forward function computes (hoisted ones excluded), by variable name:
    init and step write them into state[n_state:] and their VJPs read them back instead of calling libm again."""
    names = []
    for k in order:
        op, args, attr, dtype, _ = nodes[k]
        if k in leaves or dtype != "f8":
            continue
        if _computed_pow(nodes, k, leaves) and f"l{args[0]}" not in names:
            names.append(f"l{args[0]}")
        if op in _WITH_EXP:
            names.append(f"e{k}")
        if _libm(nodes, k):
            names.append(f"v{k}")
    return names


def hoisted_of(traces: dict) -> list[int]:
    """The traced model's hoisted weight-only nodes, in wc's order (wc[N_W:], the plug-in's precompute)."""
    return _hoisted(traces["init"].graph.nodes, [traces[name].outputs for name in ("init", "step", "curve")])


def _lazy_lines(tr: Trace, order: list[int], inputs: dict, leaves: dict) -> list[str]:
    """A forward function's lines computing only the side of a where its condition takes, where a side alone reads
    an exp, a log or a power (`if c:` ... `else:` ...): what predictions need, and no more. torch.where computes both
    sides, and so do step (its VJP reads the untaken side's values, whose adjoint is 0) and the lanes (branches as
    selects); a prediction needs the taken side only (FSRS-6: ~5 exp / log a review instead of 12). The same
    expressions as _forward_lines, so the values are the same to the bit."""
    nodes = tr.graph.nodes

    def block(roots: list[int], within: set) -> list[str]:
        need = _reach(nodes, roots, leaves, within)
        lazy, deferred = {}, set()
        for k in reversed([k for k in order if k in need]):  # the outermost where first
            op, args, _, dtype, _ = nodes[k]
            if k in deferred or op != "where" or dtype != "f8" or any(nodes[a][3] != "f8" for a in args[1:]):
                continue
            sides = [_reach(nodes, [a], leaves, need) - _reach(nodes, roots, leaves, need, (k, i))
                     for i, a in ((1, args[1]), (2, args[2]))]
            if any(_libm(nodes, j) and j not in leaves for side in sides for j in side):
                lazy[k] = sides
                deferred |= sides[0] | sides[1]
        lines, run = [], []
        for k in order:
            if k not in need or k in deferred:
                continue
            if k not in lazy:
                run.append(k)
                continue
            lines += _forward_lines(tr, run, inputs, leaves)
            run = []
            c, a1, a2 = nodes[k][1]
            for head, a, side in ((f"    if v{c}:", a1, lazy[k][0]), ("    else:", a2, lazy[k][1])):
                lines.append(head)
                lines += ["    " + line for line in block([a], side) + [f"    v{k} = v{a}"]]
        return lines + _forward_lines(tr, run, inputs, leaves)

    return block(list(tr.outputs), set(order))


def _plan(traces: dict, hoist: list[int] | None = None):
    """What every generated function shares: the hoisted weight-only nodes (wc[N_W:]; `hoist` when given, as the
    lanes' rewritten graph passes them), how a function reads them (leaves), each function's nodes in order (init,
    step, curve, the fused step_target) and the transcendental values init, step and step_target keep for their
    reverse passes (stash)."""
    nodes = traces["init"].graph.nodes
    n_w = traces["init"].n_w
    if hoist is None:
        hoist = hoisted_of(traces)
    leaves = {k: f"w[{n_w + i}]" for i, k in enumerate(hoist)}
    orders = {name: _needed(nodes, traces[name].outputs, leaves) for name in ("init", "step", "curve")}
    fused = traces["step"].outputs + traces["curve"].outputs  # a step and the target read from its input state
    orders["step_target"] = _needed(nodes, fused, leaves)
    stash = {name: _stashed(nodes, orders[name], leaves) for name in ("init", "step", "step_target")}
    return hoist, leaves, orders, stash


def generate(traces: dict, source: str = "a model file", lane_module: str | None = None,
             data_state: bool = False) -> str:
    """The plug-in's Python source (engine/seq_model_stub.py's contract); `lane_module`: the module of its lane
    kernels (engine/traced_lanes.py), named as the plug-in's LANE_KERNELS; `data_state`: with the card functions
    of a state that reads no weight (data_only_state, which it must be)."""
    n_state = traces["n_state"]
    n_w = traces["init"].n_w
    specs = {  # name: (params, vjp params, inputs, seeds of the vjp, state input sink, where the vjp finds the stash)
        "init": ("w, g, t, out", "w, g, t, state, gstate, gw", {"g": "g", "t": "t"}, "gstate", None, "state"),
        "step": ("w, prev, t, g, out", "w, prev, t, g, new, gnew, gprev, gw",
                 dict({"g": "g", "t": "t"}, **{f"s{i}": f"prev[{i}]" for i in range(n_state)}), "gnew", "gprev",
                 "new"),
        "curve": ("w, state, t", "w, state, t, gp, gstate, gw",
                  dict({"t": "t"}, **{f"s{i}": f"state[{i}]" for i in range(n_state)}), "gp", "gstate", None),
    }
    hoist, leaves, orders, stash = _plan(traces)
    n_total = n_state + max(len(v) for v in stash.values())
    parts = [_HEADER.format(source=source, n_state=n_state, n_total=n_total, n_w=n_w)]
    if lane_module:
        parts.append(f'LANE_KERNELS = "{lane_module}"  # the trainer\'s batches, cards side by side\n')
    if hoist:
        parts.append(_precompute(traces["init"], hoist, n_w))
    for name, (params, vjp_params, inputs, gname, gstate, kept) in specs.items():
        tr = traces[name]
        order = orders[name]
        fwd = _forward_lines(tr, order, inputs, leaves)
        if name == "curve":
            store = [f"    return v{tr.outputs[0]}"]
        else:
            store = [f"    out[{i}] = v{o}" for i, o in enumerate(tr.outputs)]
            store += [f"    out[{n_state + i}] = {v}" for i, v in enumerate(stash[name])]
        parts.append(_function(name, params, fwd + store))
        if name == "step":  # the predictions' step: the new state alone, each where's taken side alone
            parts.append(_function("step_value", params, _lazy_lines(tr, order, inputs, leaves)
                                   + [f"    out[{i}] = v{o}" for i, o in enumerate(tr.outputs)]))
        if kept:  # the VJP reads the forward's transcendental values back from the state it wrote
            fwd = _forward_lines(tr, order, inputs, leaves, {v: f"{kept}[{n_state + i}]"
                                                             for i, v in enumerate(stash[name])})
        act = _active(tr.graph.nodes, order, leaves)
        seeds: dict[int, list[str]] = {}
        for i, o in enumerate(tr.outputs):
            seeds.setdefault(o, []).append("gp" if name == "curve" else f"{gname}[{i}]")
        sink = {("w", k): f"gw[{k}] += {{}}" for k in range(n_w)}
        sink.update({("node", k): f"gw[{n_w + i}] += {{}}" for i, k in enumerate(hoist)})
        pre = []
        if name == "step":
            pre = [f"    gprev[{i}] = 0.0" for i in range(n_state)]
            sink.update({("in", f"s{i}"): f"gprev[{i}] += {{}}" for i in range(n_state)})
        elif name == "curve":
            sink.update({("in", f"s{i}"): f"gstate[{i}] += {{}}" for i in range(n_state)})
        back = _backward_lines(tr, order, act, seeds, sink)
        parts.append(_function(f"{name}_vjp", vjp_params, fwd + pre + back))
        if name == "curve":  # one target's weighted BCE: the curve's forward pass once, shared with its reverse
            p = f"v{tr.outputs[0]}"
            parts.append(_function("target_loss", "w, state, t, y, wt", fwd + [f"    return bce({p}, y, wt)[0]"]))
            seeds = {tr.outputs[0]: ["gp"]}
            back = _backward_lines(tr, order, act, seeds, sink)
            parts.append(_function("target_loss_vjp", "w, state, t, y, wt, gstate, gw",
                                   fwd + [f"    lo, gp = bce({p}, y, wt)"] + back + ["    return lo"]))
    parts.append(_step_target(traces, orders["step_target"], leaves, stash["step_target"], n_w))
    if data_state:
        if not data_only_state(traces):
            raise ValueError("data_state: init or step reads a weight or a run-time option")
        parts.append(_DATA_STATE.format(n_state=n_state, n_w=n_w))
    if "clip" in traces:
        tr = traces["clip"]
        order = _needed(tr.graph.nodes, tr.outputs)
        body = _forward_lines(tr, order, {})
        w_node = {tr.graph.nodes[k][2]: k for k in order if tr.graph.nodes[k][0] == "w"}
        body += [f"    w[{i}] = v{o}" for i, o in enumerate(tr.outputs) if w_node.get(i) != o]
        parts.append(_function("project", "w", body))
    return "".join(parts)


def data_only_state(traces: dict) -> bool:
    """Whether init and step read no weight and no run-time option (HLR: its state counts successes and failures):
    the state before every target is then the data's alone, computed once per fit or prediction (`target_inputs`),
    and a target costs its curve and its BCE, however long its history, instead of a replay of its card."""
    nodes = traces["init"].graph.nodes
    read = _reach(nodes, traces["init"].outputs + traces["step"].outputs)
    return not any(nodes[k][0] in ("w", "opt") for k in read)


# A data-only state's plug-in (data_only_state): the engine's card loops call these card functions
# (engine/seq_model_stub.py) with the rows of target_inputs in place of t_dt; no lanes (a target is one curve).
_DATA_STATE = '''

@njit(cache=True)
def target_inputs(seq_dt, seq_g, c_start, c_tb, c_te, t_pos, t_dt):
    """Row j: the state before target j (its card's reviews 0 .. t_pos[j] - 1; init and step read no weight), then
    its elapsed time. A card's targets come sorted by history length, so one pass over each card serves them all
    (restarted if a length ever goes down)."""
    out = np.empty((len(t_pos), {n_state} + 1))
    w = np.zeros({n_w})
    state = np.empty(N_STATE)
    new = np.empty(N_STATE)
    for c in range(len(c_start)):
        start = c_start[c]
        k = 0
        for j in range(c_tb[c], c_te[c]):
            if t_pos[j] < k:
                k = 0
            if k == 0:  # no review read yet: a target without one (none in the benchmark's data) reads NaN
                for i in range({n_state}):
                    state[i] = np.nan
            while k < t_pos[j]:
                if k == 0:
                    init(w, seq_g[start], seq_dt[start], state)
                else:
                    step_value(w, state, seq_dt[start + k], seq_g[start + k], new)
                    for i in range({n_state}):
                        state[i] = new[i]
                k += 1
            for i in range({n_state}):
                out[j, i] = state[i]
            out[j, {n_state}] = t_dt[j]
    return out


@njit(cache=True)
def card_loss_grad(w, seq_dt, seq_g, start, n, t_pos, t_in, t_y, t_wt, tb, te, buf, gw):
    """Σ weight·BCE of targets tb .. te - 1 from their rows of target_inputs, adding d/dw into gw."""
    gstate = buf[1][0]  # the state's adjoints: nothing reads them (no weight reaches the state)
    loss = 0.0
    for j in range(tb, te):
        loss += target_loss_vjp(w, t_in[j], t_in[j, {n_state}], t_y[j], t_wt[j], gstate, gw)
    return loss


@njit(cache=True)
def card_predict(w, seq_dt, seq_g, start, n, t_pos, t_in, tb, te, buf, out):
    """P(recall) of targets tb .. te - 1 from their rows of target_inputs."""
    for j in range(tb, te):
        out[j] = curve(w, t_in[j], t_in[j, {n_state}])
'''


def _step_target(traces: dict, order: list[int], leaves: dict, stash: list[str], n_w: int) -> str:
    """step_target / step_target_vjp: a step and the weighted BCE of a target that reads the step's input state at
    the step's own elapsed time, as one function of the shared graph. The curve's nodes are the step's nodes
    wherever the model computes the same value (FSRS-7's retention, SBD's recall), so the target costs its clamp
    and its BCE instead of a second evaluation of the curve, and its adjoint joins the step's reverse pass."""
    step, curve = traces["step"], traces["curve"]
    n_state = len(step.outputs)
    inputs = dict({"g": "g", "t": "t"}, **{f"s{i}": f"prev[{i}]" for i in range(n_state)})
    p = f"v{curve.outputs[0]}"
    fwd = _forward_lines(step, order, inputs, leaves)
    store = [f"    out[{i}] = v{o}" for i, o in enumerate(step.outputs)]
    store += [f"    out[{n_state + i}] = {v}" for i, v in enumerate(stash)]
    forward = _function("step_target", "w, prev, t, g, y, wt, out", fwd + store + [f"    return bce({p}, y, wt)[0]"])
    fwd = _forward_lines(step, order, inputs, leaves, {v: f"new[{n_state + i}]" for i, v in enumerate(stash)})
    act = _active(step.graph.nodes, order, leaves)
    seeds: dict[int, list[str]] = {}
    for i, o in enumerate(step.outputs):
        seeds.setdefault(o, []).append(f"gnew[{i}]")
    seeds.setdefault(curve.outputs[0], []).append("gp")
    sink = {("w", k): f"gw[{k}] += {{}}" for k in range(n_w)}
    sink.update({("node", k): f"gw[{n_w + i}] += {{}}" for i, k in enumerate(sorted(leaves))})
    sink.update({("in", f"s{i}"): f"gprev[{i}] += {{}}" for i in range(n_state)})
    pre = [f"    gp = wt * ({p} - y) / max({p} * (1.0 - {p}), BCE_GRAD_EPS)"]  # kernel_math.bce's d/dp
    pre += [f"    gprev[{i}] = 0.0" for i in range(n_state)]
    back = _backward_lines(step, order, act, seeds, sink)
    return forward + _function("step_target_vjp", "w, prev, t, g, y, wt, new, gnew, gprev, gw", fwd + pre + back)


def _precompute(tr: Trace, hoist: list[int], n_w: int) -> str:
    """precompute(w, opts) -> wc = [w, the hoisted values] and precompute_vjp (their adjoints folded into gw)."""
    order = _needed(tr.graph.nodes, hoist)
    fwd = _forward_lines(tr, order, {})
    body = fwd + [f"    wc = np.empty({n_w + len(hoist)})", f"    for j in range({n_w}):",  # (a slice assignment's
                  "        wc[j] = w[j]"]  # broadcasting machinery cost ~2 s of numba's compile, a loop nothing)
    body += [f"    wc[{n_w + i}] = v{k}" for i, k in enumerate(hoist)] + ["    return wc"]
    act = _active(tr.graph.nodes, order)
    seeds = {k: [f"gwc[{n_w + i}]"] for i, k in enumerate(hoist)}
    sink = {("w", k): f"gw[{k}] += {{}}" for k in range(n_w)}
    back = [f"    for j in range({n_w}):", "        gw[j] += gwc[j]"] + _backward_lines(tr, order, act, seeds, sink)
    return _function("precompute", "w, opts", body) + _function("precompute_vjp", "w, opts, wc, gwc, gw",
                                                               fwd + back)
