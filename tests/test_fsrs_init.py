"""The fast S0 fit (models/fsrs_init.py: numpy groups, scipy's L-BFGS-B routine driven directly) against the reference
path (pandas groupby + `scipy.optimize.minimize`, upstream's call): the same S0, bit for bit, on every training fold
of the real collections in this repo, for the curves of FSRS-6, FSRS-4.5/5 and FSRS v4, and at the bounds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from data_loader import load_revlogs
from features import FeatureConfig, NotEnoughData, build_features
from models import fsrs_init
from models.base import InadequateData
from models.fsrs6 import DEFAULT_W, S_MIN
from split import time_series_folds
from tests.check_users import CHECK, check_features

ROOT = Path(__file__).resolve().parents[1]
EMBEDDED = ROOT / "data" / "embedded"
CURVES = {  # name: (factor, decay) of R = (1 + factor·t/S)^(−decay)
    "FSRS-6": (0.9 ** (-1.0 / DEFAULT_W[20]) - 1.0, DEFAULT_W[20]),
    "FSRS-5": (19.0 / 81.0, 0.5),
    "FSRSv4": (1.0 / 9.0, 1.0),
}


def _users():
    out = []
    for root in (CHECK, EMBEDDED):
        for d in sorted((root / "revlogs").iterdir()):
            out.append((root, int(d.name.split("=")[1])))
    return out


def _folds(root: Path, user: int):
    if root == CHECK:
        data = check_features(user, True)
    else:
        data = build_features(load_revlogs(root, user), FeatureConfig(short=True))
    return [data.subset(train).rows for train, _ in time_series_folds(len(data))]


def _curve(factor: float, decay: float):
    return lambda t, s: (1 + factor * t / s) ** (-decay)


def _both(rows: pd.DataFrame, factor: float, decay: float, secs: bool = False):
    """(fast, reference) S0, or None where both raise InadequateData."""
    curve = _curve(factor, decay)
    try:
        ref = fsrs_init.initialize_s0(rows, curve, DEFAULT_W[:4], S_MIN, secs=secs, reference=True)
    except InadequateData:
        with pytest.raises(InadequateData):
            fsrs_init.initialize_s0(rows, curve, DEFAULT_W[:4], S_MIN, secs=secs)
        return None
    return fsrs_init.initialize_s0(rows, curve, DEFAULT_W[:4], S_MIN, secs=secs), ref


@pytest.mark.parametrize("curve", sorted(CURVES))
def test_compiled_s0_equals_scipy_on_real_collections(curve):
    factor, decay = CURVES[curve]
    n = 0
    for root, user in _users():
        try:
            folds = _folds(root, user)
        except NotEnoughData:  # embedded user 4: no evaluation reviews
            continue
        for rows in folds:
            got = _both(rows, factor, decay)
            if got is None:
                continue
            assert got[0] == got[1]
            n += 1
    assert n >= 10  # the folds really ran


def test_compiled_s0_equals_scipy_without_smoothing():
    """--secs: no recall smoothing, no L1 pull."""
    factor, decay = CURVES["FSRS-6"]
    for rows in _folds(CHECK, sorted(int(d.name.split("=")[1]) for d in (CHECK / "revlogs").iterdir())[0]):
        got = _both(rows, factor, decay, secs=True)
        if got is not None:
            assert got[0] == got[1]


@pytest.mark.parametrize("recall, count", [(1.0, 40), (0.0, 40), (0.9, 1), (0.5, 3)])
def test_one_rating_equals_scipy_at_bounds_and_few_iterations(recall, count):
    """Optima at the upper bound 100 (always recalled after long intervals; from 100 the finite difference steps
    backwards), at S_MIN (always forgotten), and maxiter = Σ count of 4 and 12, where scipy may stop before
    converging: the same value all the same."""
    delta_t = np.array([1.0, 3.0, 30.0, 365.0])
    r = np.full(4, recall)
    c = np.full(4, float(count))
    curve = _curve(*CURVES["FSRS-6"])
    for s_default in (DEFAULT_W[0], DEFAULT_W[3], 100.0):
        for l1 in (True, False):
            ref = fsrs_init.fit_one_rating_scipy(delta_t, r, c, curve, s_default, S_MIN, l1)
            assert fsrs_init.fit_one_rating(delta_t, r, c, curve, s_default, S_MIN, l1) == ref


def test_batched_runs_are_independent_and_equal_single_runs():
    """StepLbfgsb.batch's runs keep their work arrays in rows of shared blocks and share the bounds: stepped
    together on different losses (fit_many), each must end where a run of its own ends, bit for bit, and at its
    own minimum: (S − c)² + S/100 is smallest at S = c − 1/200 (inside [S_MIN, 100]), and at the bound 100 for a
    centre beyond it."""
    centres = np.array([0.7, 3.0, 42.0, 250.0])
    expected = [0.695, 2.995, 41.995, 100.0]

    def loss(c, s):
        return (s - c) ** 2 + s / 100

    runs = fsrs_init.StepLbfgsb.batch(len(centres), 1.0, S_MIN, 1000)
    fsrs_init.fit_many(runs, lambda which, s: loss(centres[which][:, None], s))
    for run, c, want in zip(runs, centres, expected):
        single = fsrs_init.StepLbfgsb(1.0, S_MIN, 1000)
        while (s := single.points()) is not None:
            single.supply(*loss(c, s).tolist())
        assert run.result() == single.result()
        assert abs(run.result()[0] - want) < 1e-4
