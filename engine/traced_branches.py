"""One transcendental value for the two sides of a where, in the lane kernels the tracer generates (issue #39).

Why: torch.where computes both of its sides, and so do the generated lanes (engine/traced_lanes.py): FSRS v4's step
pays ln S, S^−w9 and e^{w10(1−R)} for a recall AND ln D, D^−w12, ln(S+1), (S+1)^w13 and e^{w14(1−R)} for a lapse at
every review, where a review takes one of the two. The hand-written lane kernels (lane_kernels/) select the lane's
own operands first and call exp or log once: exp(c ? a : b) instead of (c ? exp(a) : exp(b)). This pass does the
same on the traced graph, for every model: a value computed only for the one side of a where ("exclusive": every
path from it to an output goes through that side) is paired with a value of the same kind (exp, log, log1p, pow)
exclusive to the other side, and both become one node of the selected operands. Nested wheres are taken inner
first, so FSRS-5's same-day exp joins its recall/lapse pair. The generated code is then differentiated as before:
where's derivative routes the adjoint to the side the lane took.

Same values on the side a lane takes (the same operation on the same operands). On the side it does not take, the
lanes now hold the other side's value, whose adjoint is 0 (where's derivative), so the gradient is unchanged as
long as everything stays finite. Where the scalar code's untaken value is not finite, its gradient is NaN (0·inf,
torch's where), and the lanes must refuse the batch as they did before (engine/traced_lanes.py: the engine then
runs it card by card): each fused node keeps a guard of the operands it no longer computes, and the lane dialect
(traced_codegen._guard_conditions) flags a review whose operands leave the functions' finite domain: exp(x) for
x < ln(max double), log(x) for 0 < x < inf, log1p(x) for −1 < x < inf, x^y for 0 < x < inf and y finite (tests/test_traced_lanes.py has a model
whose untaken exp overflows). Left unchecked: an untaken x^y that overflows with such operands, and untaken
arithmetic that overflows downstream of a fused value (the hand kernels check neither), where the lanes give the
taken side's gradient and the scalar code NaN.

Measured (bench/bench_generated_lanes.py, kernel alone, 20,000 random cards, loss and gradient, paired medians,
29 Nov 2026): FSRS v4's lane loop computes 2 logs and 3 exps a review instead of 3 and 4, FSRS-5's 2 and 3 instead
of 3 and 6 (its same-day exp joins the pair); with the two other changes of that day (traced_lanes.py: the refusal
count an integer, the items sorted by counting) the generated / hand-written ratio went from 2.33x to 1.04x for FSRS
v4, 1.75x to 1.04x FSRS-4.5, 1.71x to 1.01x FSRS-5, 1.34x to 0.97x v2, 2.22x to 0.99x v3. FSRS-7's graph has no such
pair (its branches are blends); SBD's saves one exp and one log. Result lines of every FSRS-7 row and SBD-recency
on data/embedded and upstream-check are unchanged.

Only the lanes use the rewritten graph: the scalar plug-in (engine/traced_codegen.generate) is unchanged, and so is
the hoisted weight-only part (wc), whose order the scalar plug-in's precompute fixes.
"""

from __future__ import annotations

from engine.traced_codegen import Graph, Trace, _needed, guard_ids

FUSIBLE = ("exp", "log", "log1p", "pow")


def fuse_branches(traces: dict, hoist: list[int]) -> tuple[dict, list[int]]:
    """(the traces over a rewritten graph in which each where's two sides share their exp / log / log1p / pow
    values, the hoisted nodes' ids in that graph, in the same order)."""
    graph = traces["init"].graph
    outputs = {name: list(traces[name].outputs) for name in ("init", "step", "curve")}
    while True:
        pair = _next_pair(graph.nodes, [k for v in outputs.values() for k in v], set(hoist))
        if pair is None:
            break
        graph, ids = _rebuild(graph.nodes, [k for v in outputs.values() for k in v] + hoist, pair)
        outputs = {name: [ids[k] for k in v] for name, v in outputs.items()}
        hoist = [ids[k] for k in hoist]
    fused = dict(traces)
    n_w = traces["init"].n_w
    for name, out in outputs.items():
        fused[name] = Trace(graph, out, n_w)
    return fused, hoist


def _guard(nodes, k: int) -> tuple:
    """The operands node k stands for: its guard if it is already fused, else its own arguments."""
    _, args, attr, _, _ = nodes[k]
    ids = guard_ids(attr)
    return tuple(args) if ids is None else ids


def _next_pair(nodes, roots: list[int], leaves: set[int]):
    """The first pair (where, x, y) to fuse: x exclusive to the where's true side, y to its false side, the same
    fusible op; wheres inner (earlier) first, candidates in creation order. None when there is none."""
    order = _needed(nodes, roots, leaves)
    uses: dict[int, list[tuple[int, int]]] = {k: [] for k in order}
    for k in order:
        if k not in leaves:
            for pos, j in enumerate(nodes[k][1]):
                uses[j].append((k, pos))
    rootset = set(roots)
    for w in order:
        op, _, _, dtype, _ = nodes[w]
        if op != "where" or dtype != "f8" or w in leaves:
            continue
        sides = []
        for pos in (1, 2):
            excl: set[int] = set()
            for k in reversed(order):
                if k >= w or k in rootset or k in leaves or nodes[k][0] in ("const", "w", "in"):
                    continue
                if all((u == w and p == pos) or u in excl for u, p in uses[k]):
                    excl.add(k)
            sides.append(excl)
        for kind in FUSIBLE:
            cand = [sorted(k for k in s if nodes[k][0] == kind and nodes[k][3] == "f8") for s in sides]
            if cand[0] and cand[1]:
                return w, cand[0][0], cand[1][0]
    return None


def _rebuild(nodes, roots: list[int], pair) -> tuple[Graph, dict[int, int]]:
    """A new graph of the nodes the roots need, in which the pair's two nodes are one: op(where(c, x's operand,
    y's operand), ...) carrying the guard of both; and the map old id -> new id."""
    w, x, y = pair
    cond = nodes[w][1][0]
    g = Graph()
    ids: dict[int, int] = {}

    def emit(k: int) -> int:
        if k in ids:
            return ids[k]
        if k in (x, y):
            c = emit(cond)
            operands = []
            for a, b in zip(nodes[x][1], nodes[y][1]):
                if a == b:
                    operands.append(emit(a))
                else:
                    prio = max(nodes[cond][4], nodes[a][4], nodes[b][4])
                    operands.append(g.add("where", (c, emit(a), emit(b)), None, "f8", prio).id)
            guard = tuple(emit(j) for j in _guard(nodes, x) + _guard(nodes, y))
            new = g.add(nodes[x][0], tuple(operands), ("guard", guard), "f8", 2).id
            ids[x] = ids[y] = new
            return new
        op, args, attr, dtype, prio = nodes[k]
        new_args = tuple(emit(j) for j in args)
        if guard_ids(attr) is not None:
            attr = ("guard", tuple(emit(j) for j in guard_ids(attr)))
        ids[k] = g.add(op, new_args, attr, dtype, prio).id
        return ids[k]

    for r in roots:
        emit(r)
    return g, ids
