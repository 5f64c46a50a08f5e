"""The project's imports form no cycle, function-level imports included (docs/architecture.md, "Imports").

What is read: every .py file of the project's code (the top-level modules, the `models` package, the
`bench/` and `examples/` scripts), each parsed with `ast` and never imported. tests/ is left out: nothing in the
project imports it (pytest loads it), so it cannot close a cycle.

What is an edge, from the module that holds it (anywhere in the file: module level, inside functions, methods,
`if` / `try` blocks and `if TYPE_CHECKING:` alike):
- `import a.b.c`: an edge to `a.b.c` (or to its longest prefix that is a project module);
- `from a.b import c` (and `from . import c`, `from .b import c`, resolved against the importing module's package):
  an edge to `a.b` (the package's `__init__` or the module that defines `c`: the name is read from it), and to
  `a.b.c` too when that is a project module (a submodule). So a submodule of `models` imports its siblings as
  `import models.x as x` or `from models.x import y`, never `from models import x`, which reads the registry;
- `importlib.import_module("a.b")` with a literal string: an edge to `a.b`.

Not edges: a module name held as data and imported elsewhere by `importlib.import_module(variable)` (the registry's
"module:Class" strings in models/__init__.py, a model's `kernels = "models.fsrs_v5"`, a kernel module's
`LANE_KERNELS`, neural_batched's BATCHED): the module that runs the import is the one that receives the name, and
what it imports is a plug-in it was handed, not a module it depends on (a name held only to hide an import from
this test would be a cycle all the same: that is for review to refuse). A module importing itself (bench/simulate.py
under `if __name__ == "__main__":`, so that numba's cache sees it as `bench.simulate`) is not a cycle either.

The implicit edge from `a.b` to the package `a` (Python runs `a/__init__.py` before `a.b`) is not counted: a
package's `__init__` importing its own submodules is how packages are written, and `models/__init__.py` does (the
registry imports `models.base`), so counted it would make every package a cycle. What that implicit import runs is
held apart instead (test_package_init_runs_only_leaves): the module-level imports of `models/__init__.py` import no
other project module at module level, so `import models.x` runs no model code before `models.x` itself. (Its
function-level import of `engine.own_model` in `model_class` runs only when a model is looked up, and is an edge
like any other.) A submodule that needs a name of `models/__init__.py` itself (`import models;
models.model_class(...)`, `from models import REGISTRY`) does count: that is an import of the registry.

The rule the graph must hold: no strongly connected component of more than one module. A failure names each cycle
as a chain `a -> b (a.py:12) -> ... -> a`.
"""

from __future__ import annotations

import ast
from collections import deque
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE_DIRS = ("models", "engine", "lane_kernels", "neural", "upstream", "bench", "examples")  # besides top-level modules


def project_files() -> dict[str, Path]:
    """Dotted module name -> file, for every project module (a package is its __init__.py)."""
    files = {path.stem: path for path in ROOT.glob("*.py")}
    for folder in SOURCE_DIRS:
        for path in (ROOT / folder).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            files[".".join(parts)] = path
    return files


def _resolve(name: str, modules: set[str]) -> str | None:
    """`name` or its longest prefix that is a project module (`models.fsrs6.FSRS6` -> `models.fsrs6`)."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        candidate = ".".join(parts[:n])
        if candidate in modules:
            return candidate
    return None


def _nodes(tree: ast.AST, module_level_only: bool):
    """Every node of `tree`; with module_level_only, none inside a function (what importing the module runs)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if not (module_level_only and isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))):
                stack.append(child)


def imports_of(module: str, path: Path, modules: set[str], module_level_only: bool = False) -> list[tuple[str, int]]:
    """(imported project module, line) for every import in `path` (module `module`); with module_level_only, only
    those that importing the module runs (none inside a function)."""
    is_package = path.name == "__init__.py"
    package = module.split(".") if is_package else module.split(".")[:-1]
    out: list[tuple[str, int]] = []

    def add(name: str | None, line: int) -> None:
        target = _resolve(name, modules) if name else None
        if target is not None:
            out.append((target, line))

    for node in _nodes(ast.parse(path.read_text(encoding="utf-8"), str(path)), module_level_only):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package[: len(package) - (node.level - 1)] if node.level > 1 else package
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                sub = f"{base}.{alias.name}" if base else alias.name
                if alias.name != "*" and sub in modules:
                    add(sub, node.lineno)
                if base:  # the names are read from `base` (its __init__), a submodule among them or not
                    add(base, node.lineno)
        elif isinstance(node, ast.Call):
            func = node.func
            called = (func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name)
                      else None)
            if called == "import_module" and node.args and isinstance(node.args[0], ast.Constant) \
                    and isinstance(node.args[0].value, str):
                add(node.args[0].value, node.lineno)
    return [(target, line) for target, line in out if target != module]


def import_graph() -> tuple[dict[str, dict[str, int]], dict[str, Path]]:
    """module -> {imported module: first line}, over the project's modules; and module -> file."""
    files = project_files()
    modules = set(files)
    graph: dict[str, dict[str, int]] = {m: {} for m in files}
    for module, path in files.items():
        for target, line in imports_of(module, path, modules):
            graph[module].setdefault(target, line)
    return graph, files


def strongly_connected(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Tarjan's strongly connected components (iterative), each sorted; only those that are cycles."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph[node]:
                    out.append(sorted(component))
    return sorted(out)


def _shortest_cycle(graph, start: str, members: set[str]) -> list[str]:
    """The shortest path start -> ... -> start inside the component."""
    previous: dict[str, str] = {}
    queue = deque([start])
    seen = {start}
    while queue:
        node = queue.popleft()
        for child in sorted(graph[node]):
            if child not in members:
                continue
            if child == start:
                path = [node]
                while path[-1] != start:
                    path.append(previous[path[-1]])
                return [start] + path[::-1][1:] + [start] if node != start else [start, start]
            if child not in seen:
                seen.add(child)
                previous[child] = node
                queue.append(child)
    return [start]


def describe(graph, files, component: list[str]) -> str:
    """A component as readable chains: one shortest cycle through each member not yet on a printed chain."""
    members = set(component)
    lines = [f"{len(component)} modules: {', '.join(component)}"]
    covered: set[str] = set()
    for member in component:
        if member in covered:
            continue
        chain = _shortest_cycle(graph, member, members)
        covered.update(chain)
        text = chain[0]
        for a, b in zip(chain, chain[1:]):  # noqa: RUF007
            text += f" -> {b} ({files[a].relative_to(ROOT)}:{graph[a][b]})"
        lines.append("  " + text)
    return "\n".join(lines)


def test_graph_sees_the_project():
    """The parser finds the imports it should (a guard against a test that passes because it reads nothing)."""
    graph, files = import_graph()
    assert {"config", "runner", "models", "models.fsrs6", "engine.seq_engine"} <= set(files)
    assert "models.base" in graph["models"]  # from models.base import ...
    assert "pipeline" in graph["runner"]
    assert "engine.seq_engine" in graph["engine.seq_model"]


def test_no_import_cycles():
    graph, files = import_graph()
    cycles = strongly_connected(graph)
    assert not cycles, "import cycles:\n" + "\n".join(describe(graph, files, c) for c in cycles)


def test_package_init_runs_only_leaves():
    """`import models.x` runs models/__init__.py first: what it imports then must import no project module itself,
    so the implicit edge to the package (not in the graph above) can close no cycle at import time."""
    files = project_files()
    modules = set(files)
    for package in sorted(m for m, path in files.items() if path.name == "__init__.py"):
        for target, line in imports_of(package, files[package], modules, module_level_only=True):
            deeper = imports_of(target, files[target], modules, module_level_only=True)
            assert not deeper, (f"{files[package].relative_to(ROOT)}:{line} imports {target}, which imports "
                                f"{', '.join(sorted({t for t, _ in deeper}))} at module level")


def test_config_tables_match_the_model_classes():
    """config.py imports no model, so what the result name needs of one is a table there (BUILTIN_FLAGS,
    ACCEPTS_SECS) that the model classes read: a class that declared its own would go unseen by config."""
    import models
    from config import ACCEPTS_SECS, BUILTIN_FLAGS

    assert set(BUILTIN_FLAGS) | ACCEPTS_SECS <= set(models.REGISTRY)
    for name in models.REGISTRY:
        try:
            cls = models.model_class(name)
        except ImportError:  # an optional dependency (FSRS-rs: fsrs-rs-python) that is not installed
            continue
        assert tuple(getattr(cls, "builtin_flags", ())) == BUILTIN_FLAGS.get(name, ()), name
        assert bool(getattr(cls, "accepts_secs", False)) == (name in ACCEPTS_SECS), name
