"""The pieces of the reverse pass that FSRS-5's and FSRS-6's lane kernels share (lane_kernels/fsrs_v5_lanes.py,
fsrs6_lanes.py): the difficulty update's and the first review's adjoints, whose equations are the same in both
versions. Small helpers, so numba inlines their code into each kernel's lane loop, under that kernel's flags: the
same operations in the same order as when each kernel wrote them out (the result lines of every FSRS-5 and FSRS-6
row are unchanged).
"""

from __future__ import annotations

from engine.jit import inlined
from engine.lanes import grade_pick


@inlined(error_model="numpy")
def difficulty_adjoint(A, lane, gd, g, dd, w4, w6, w7, d04, e3):
    """The reverse of D' = clamp(w7·D0(4) + (1 − w7)·(D − w6(G − 3)(10 − D)/9), 1, 10) with the unclamped
    D0(4) = w4 − e^{3·w5} + 1 (e3 = e^{3·w5}): adds w4..w7's gradient into A's lane, returns the old D's adjoint."""
    ndp = dd - w6 * (g - 3.0) * (10.0 - dd) / 9.0
    nd = w7 * d04 + (1.0 - w7) * ndp
    gdm = gd if (nd >= 1.0 and nd <= 10.0) else 0.0
    gndp = gdm * (1.0 - w7)
    A[7, lane] += gdm * (d04 - ndp)
    A[4, lane] += gdm * w7
    A[5, lane] += gdm * w7 * (-3.0 * e3)
    A[6, lane] += gndp * (-(g - 3.0) * (10.0 - dd) / 9.0)
    return gndp * (1.0 + w6 * (g - 3.0) / 9.0)


@inlined(error_model="numpy")
def first_review_adjoint(A, lane, gs, gd, g, w0, w1, w2, w3, w4, s_min, s_max, e):
    """The reverse of the first review: S0 = clamp(w[G − 1], s_min, s_max), D0 = clamp(w4 − e + 1, 1, 10) with
    e = e^{w5(G − 1)}: adds w0..w5's gradient into A's lane."""
    s0 = grade_pick(g, w0, w1, w2, w3)
    gs0 = gs if (s0 >= s_min and s0 <= s_max) else 0.0
    A[0, lane] += gs0 if g < 1.5 else 0.0
    A[1, lane] += gs0 if (g > 1.5 and g < 2.5) else 0.0
    A[2, lane] += gs0 if (g > 2.5 and g < 3.5) else 0.0
    A[3, lane] += gs0 if g > 3.5 else 0.0
    d0 = w4 - e + 1.0
    gd0 = gd if (d0 >= 1.0 and d0 <= 10.0) else 0.0
    A[4, lane] += gd0
    A[5, lane] += gd0 * (-(g - 1.0) * e)
