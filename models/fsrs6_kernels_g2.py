"""FSRS-6 with the newer same-day rule (fsrs-rs ≥ 0.9, fsrs-optimizer after Dec 2025): the short-term growth is
floored at 1 from G ≥ 2 (Hard included). Used to compare with the peers; the benchmark's FSRS-6 floors from G ≥ 3."""

from __future__ import annotations

from numba import njit

from models import fsrs_v5 as core
from models.fsrs6_kernels import N_STATE, S_MIN, _curve_consts, curve, curve_vjp, init, init_vjp  # noqa: F401

FLOOR_GRADE = 2


@njit(cache=True)
def step(w, prev, t, g, out):
    f, d, _ = _curve_consts(w)
    core.core_step(w, prev, t, g, out, f, d, S_MIN, True, FLOOR_GRADE)


@njit(cache=True)
def step_vjp(w, prev, t, g, new, gnew, gprev, gw):
    f, d, df = _curve_consts(w)
    core.core_step_vjp(w, prev, t, g, gnew, gprev, gw, f, d, S_MIN, True, FLOOR_GRADE, df)
