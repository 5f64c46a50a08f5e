"""What every lane kernel shares (lane_kernels/fsrs_v5_lanes.py and the generated ones): the work layout's
input rows, packing a group of cards into them, the work items of whole cards, and the grade select.

A lane kernel runs LANES cards side by side: a mini-batch's cards sorted by length, taken LANES at a time, every
per-review quantity an array X[position, field, lane] with the lane innermost, so that each position is one loop
over the lanes that LLVM vectorises. Rows I_DT..I_ANY of X are the packed inputs (this module); the rows after
them are the kernel's own (its states and what its reverse pass reads).

Layout of a group of at most N states: positions 0..N. Position 0 is the first review; position k ≥ 1 is the step
from state k−1 over elapsed time dt[k] with grade g[k], AND the target that reads state k−1 at time dt[k]. A card's
last target reads its last state n−1 at its own t_dt: position n carries that time (its step's output is never
read). This needs every other target's elapsed time to equal the next review's (the usual layout: a target's
delta_t is the review it predicts); pack_group reports a card that breaks this (−1), and the engine then runs the
batch card by card. A lane past its card's end runs padding reviews (t = 1, grade 3) whose states nothing reads,
so their adjoints are exactly zero and nothing is masked in the reverse pass.

What makes LLVM vectorise the lane loops (each found by its remarks, -pass-remarks-analysis=loop-vectorize, on
FSRS-6's hand kernel of 2026; any one of them left the loops scalar): the work arrays allocated inside the kernel's
lanes_loss_grad (constant inner strides, so the accesses of two positions provably do not overlap; arrays passed in
have run-time strides, "cannot identify array bounds"); the lane sums in a second array (in the same one, at a
run-time distance, every pair of accesses needed its own overlap check: "too many memory checks"); a run-time lane
count (for a constant 8 LLVM refuses a loop that needs any overlap check); the reverse loop over positions as a
forward range (range(n, 0, −1) kept the lane loop scalar); the weights read into locals before the loops. Kernels
are compiled with fastmath "contract": fused multiply-adds on every x86-64 CPU since 2013 (one without FMA runs the
same code unfused, so its results move in the last bits).

Why the kernels' lane loops (forward, reverse, loss) are not shared too: numba caches no function that takes
another function as an argument (it would recompile in every process), so each kernel keeps its own ~20-line
driver around its own group functions.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from engine.jit import inlined

LANES = 8  # cards side by side: two AVX2 vectors per field
I_DT = 0  # elapsed days of the review (or of the card's last target)
I_G = 1  # grade as a float
I_W = 2  # the target that reads state k−1 at dt[k]: +weight if recalled, −weight if forgotten, 0 if none
I_ANY = 3  # lane 0 only: 1 if any lane's review k is a lapse (G = 1, t ≥ the kernel's lapse_min_dt)
N_INPUTS = 4  # the kernel's own rows start here


@njit(cache=True)
def pack_group(seq_dt, seq_g, c_start, t_pos, t_dt, t_y, t_wt, items, sel, first, nl, X, lapse_min_dt):
    """Fill the inputs of positions 0..N for the cards items[sel[first + lane]], lane = 0..nl−1, and return the
    number of positions N + 1, or −1 when a target's elapsed time is not the next review's (module docstring).
    A review k ≥ 1 with grade 1 and dt ≥ lapse_min_dt flags its position in I_ANY (FSRS-5 and 6: 1, a same-day
    Again is no lapse; FSRS v4 and 4.5: 0, every Again is)."""
    n_max = 0
    for lane in range(nl):
        n_max = max(n_max, items[sel[first + lane], 3])
    n_pos = n_max + 1
    for k in range(n_pos):
        X[k, I_ANY, 0] = 0.0
    for lane in range(nl):
        it = sel[first + lane]
        start = c_start[items[it, 0]]
        n = items[it, 3]
        for k in range(n):
            dt = seq_dt[start + k]
            g = seq_g[start + k]
            X[k, I_DT, lane] = dt
            X[k, I_G, lane] = g
            X[k, I_W, lane] = 0.0
            if g == 1 and dt >= lapse_min_dt and k > 0:
                X[k, I_ANY, 0] = 1.0
        for k in range(n, n_pos):  # past the card's end: padding reviews nothing reads
            X[k, I_DT, lane] = 1.0
            X[k, I_G, lane] = 3.0
            X[k, I_W, lane] = 0.0
        for j in range(items[it, 1], items[it, 2]):
            k = t_pos[j]
            if k == n:
                X[k, I_DT, lane] = t_dt[j]
            elif t_dt[j] != X[k, I_DT, lane]:
                return -1
            X[k, I_W, lane] = t_wt[j] if t_y[j] > 0.5 else -t_wt[j]
    return n_pos


@inlined(error_model="numpy")
def grade_pick(g, a1, a2, a3, a4):
    """a_g for a grade g (a float 1..4) as selects (no gather)."""
    return a1 if g < 1.5 else (a2 if g < 2.5 else (a3 if g < 3.5 else a4))


@njit(cache=True)
def card_items(c_start, c_n, c_tb, c_te):
    """Work items (card, first target, end target, states) of whole cards, as the engine's fit makes them."""
    items = np.empty((len(c_start), 4), dtype=np.int64)
    for c in range(len(c_start)):
        items[c, 0] = c
        items[c, 1] = c_tb[c]
        items[c, 2] = c_te[c]
        items[c, 3] = c_n[c]
    return items


# The lane kernels' contract (engine/seq_model_stub.py): lanes_loss_grad(wc, seq_dt, seq_g, c_start, t_pos, t_dt, t_y,
# t_wt, items, batch, max_n, gwc, want_loss, want_grad) -> loss, every array C-contiguous.
_F8, _I8 = types.float64[::1], types.int64[::1]
LANE_SIG = types.float64(_F8, _F8, _I8, _I8, _I8, _F8, _F8, _F8, types.int64[:, ::1], _I8, types.int64, _F8,
                         types.boolean, types.boolean)


def kernel_address(dispatcher) -> int:
    """The address of `dispatcher`'s machine code for LANE_SIG, compiled (or loaded from the disk cache) now: what
    call_lane_kernel calls. The code lives as long as the dispatcher does (a module-level function: the process)."""
    cres = dispatcher.get_compile_result(LANE_SIG)
    return cres.library.get_pointer_to_function(cres.fndesc.llvm_func_name)


@intrinsic
def call_lane_kernel(typingctx, address, args):
    """lanes_loss_grad(*args) of the lane kernel at `address` (kernel_address): a call through numba's own calling
    convention (its errors propagate), so that the engine's loops and the kernel compile apart. A plain int64
    argument, where a first-class function argument would make numba initialise its whole typing context in every
    process that calls the loops (~90 ms: scipy.linalg among it)."""
    if not isinstance(args, types.BaseTuple) or len(args) != len(LANE_SIG.args):
        return None
    if not all(typingctx.can_convert(a, b) for a, b in zip(args, LANE_SIG.args)):
        return None

    def codegen(context, builder, signature, llargs):
        addr, packed = llargs
        values = [context.cast(builder, builder.extract_value(packed, i), args[i], want)
                  for i, want in enumerate(LANE_SIG.args)]
        fnty = context.call_conv.get_function_type(LANE_SIG.return_type, LANE_SIG.args)
        status, res = context.call_conv.call_function(builder, builder.inttoptr(addr, fnty.as_pointer()),
                                                      LANE_SIG.return_type, LANE_SIG.args, values)
        with cgutils.if_unlikely(builder, status.is_error):
            context.call_conv.return_status_propagate(builder, status)
        return res

    return LANE_SIG.return_type(types.int64, args), codegen
