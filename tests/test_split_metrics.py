"""The TimeSeriesSplit sizes and every metric against values computed by hand."""

import math

import numpy as np
import pandas as pd
import pytest

import metrics
from split import evaluated_size, time_series_folds


def test_split_sizes_12744():
    folds = time_series_folds(12744, 5)
    assert evaluated_size(12744) == 10620
    assert sum(len(test) for _, test in folds) == 10620
    assert folds[0][1][0] == 12744 - 5 * 2124
    for train, test in folds:
        assert len(test) == 2124
        assert train.max() + 1 == test.min() and train.min() == 0  # expanding window, strictly in the past
    tests = np.concatenate([t for _, t in folds])
    assert np.array_equal(tests, np.arange(12744 - 10620, 12744))


def test_split_equals_sklearn_time_series_split():
    from sklearn.model_selection import TimeSeriesSplit

    for n_splits in (2, 5, 7):
        for n_rows in range(n_splits + 1, 60):
            ours = time_series_folds(n_rows, n_splits)
            theirs = list(TimeSeriesSplit(n_splits=n_splits).split(np.arange(n_rows)))
            assert len(ours) == len(theirs)
            for (tr, te), (tr_ref, te_ref) in zip(ours, theirs):
                assert np.array_equal(tr, tr_ref) and np.array_equal(te, te_ref)
        for n_rows in range(0, n_splits + 1):  # too few rows: the same error as TimeSeriesSplit
            with pytest.raises(ValueError) as ours:
                time_series_folds(n_rows, n_splits)
            with pytest.raises(ValueError) as theirs:
                list(TimeSeriesSplit(n_splits=n_splits).split(np.arange(n_rows)))
            assert str(ours.value) == str(theirs.value)


def test_logloss_rmse_mbe_by_hand():
    y = np.array([1, 0, 1, 1])
    p = np.array([0.9, 0.2, 0.6, 0.99])
    rows = pd.DataFrame({"elapsed_days": [1, 1, 1, 1], "i": [2, 2, 2, 2], "rmse_bins_lapse": [0, 0, 0, 0]})
    m = metrics.evaluate(y, p, rows)
    ll = -(math.log(0.9) + math.log(0.8) + math.log(0.6) + math.log(0.99)) / 4
    assert m["LogLoss"] == round(ll, 6)
    assert m["RMSE"] == round(math.sqrt((0.01 + 0.04 + 0.16 + 0.0001) / 4), 6)
    assert m["MBE"] == round((-0.1 + 0.2 - 0.4 - 0.01) / 4, 6)
    # one bin: |mean y − mean p| = |0.75 − 0.6725|
    assert m["RMSE(bins)"] == round(abs(0.75 - 0.6725), 6)
    # AUC: positives {0.9, 0.6, 0.99} vs negative {0.2}: every pair ranked right
    assert m["AUC"] == 1.0
    # p >= 0.9 predicts recall: predicted {0.9, 0.99} both recalled → precision 1, recall 2/3
    assert m["precision@90"] == 1.0 and m["recall@90"] == round(2 / 3, 6)


def test_rmse_bins_weights_bins_by_size():
    # bin A (interval 1-3 days): 3 rows, y mean 2/3, p mean 0.9; bin B (interval 4-13): 1 row, y 0, p 0.5
    y = np.array([1, 1, 0, 0])
    p = np.array([0.9, 0.9, 0.9, 0.5])
    rows = pd.DataFrame({"elapsed_days": [1, 2, 3, 5], "i": [2, 2, 3, 2], "rmse_bins_lapse": [0, 0, 0, 0]})
    expected = math.sqrt((3 * (2 / 3 - 0.9) ** 2 + 1 * 0.5 ** 2) / 4)
    assert metrics.rmse_bins(y, p, rows.elapsed_days, rows.i, rows.rmse_bins_lapse) == pytest.approx(expected, 1e-12)
    # a lapse moves row 3 into its own bin
    rows.loc[2, "rmse_bins_lapse"] = 1
    expected = math.sqrt((2 * (1 - 0.9) ** 2 + 1 * 0.9 ** 2 + 1 * 0.5 ** 2) / 4)
    assert metrics.rmse_bins(y, p, rows.elapsed_days, rows.i, rows.rmse_bins_lapse) == pytest.approx(expected, 1e-12)


def test_bin_edges():
    assert list(metrics.interval_bin([0, 1, 3, 4, 13, 14, 47, 48, 171, 172, 621, 622])) == \
        [0.0, 2.48, 2.48, 8.98, 8.98, 32.5, 32.5, 117.65, 117.65, 425.88, 425.88, 1541.68]
    assert list(metrics.review_count_bin([1, 2, 3, 4, 6, 7, 12, 13, 24, 25, 45, 46, 86, 87])) == \
        [2, 4, 4, 7, 7, 13, 13, 25, 25, 48, 48, 91, 91, 171]
    assert list(metrics.lapse_bin([0, 1, 2, 3, 5, 6, 8, 9, 15, 16, 26, 27, 46])) == \
        [0, 2, 3, 5, 5, 9, 9, 15, 15, 26, 26, 44, 44]


def test_auc_single_class_is_null_and_ties_count_half():
    assert metrics.auc(np.array([1, 1, 1]), np.array([0.2, 0.5, 0.9])) is None
    # pairs (pos, neg): (0.5, 0.5) tie → 0.5, (0.8, 0.5) → 1 : AUC = 0.75
    assert metrics.auc(np.array([1, 1, 0]), np.array([0.5, 0.8, 0.5])) == 0.75


def test_ici_is_zero_when_calibrated_and_the_offset_otherwise():
    p = np.linspace(0.1, 0.9, 200)
    assert metrics.ici(p, p) == pytest.approx(0.0, abs=1e-12)  # lowess reproduces a straight line exactly
    assert metrics.ici(p + 0.05, p) == pytest.approx(0.05, abs=1e-12)


def test_logloss_clips_certain_wrong_predictions():
    y = np.array([0, 1])
    p = np.array([1.0, 1.0])
    rows = pd.DataFrame({"elapsed_days": [1, 1], "i": [2, 2], "rmse_bins_lapse": [0, 0]})
    eps = np.finfo(np.float64).eps
    assert metrics.evaluate(y, p, rows)["LogLoss"] == round(-math.log(eps) / 2, 6)


# ------------------------------------------------------------------- the numpy metrics against scikit-learn's own

def _sklearn_metrics(y, p, rows):
    """The metrics as upstream computes them: scikit-learn's functions and a pandas groupby for the bins."""
    import warnings

    from sklearn.metrics import log_loss, precision_score, recall_score, roc_auc_score, root_mean_squared_error

    frame = pd.DataFrame({"a": metrics.interval_bin(rows["elapsed_days"]), "b": metrics.review_count_bin(rows["i"]),
                          "c": metrics.lapse_bin(rows["rmse_bins_lapse"]), "y": y.astype(float), "p": p})
    bins = frame.groupby(["a", "b", "c"], sort=False).agg(y=("y", "mean"), p=("p", "mean"), n=("y", "size"))
    predicted = (p >= 0.9).astype(int)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        auc = roc_auc_score(y, p) if len(np.unique(y)) == 2 else None
    return {"LogLoss": log_loss(y, p, labels=[0, 1]),
            "RMSE(bins)": root_mean_squared_error(bins["y"], bins["p"], sample_weight=bins["n"]),
            "AUC": auc,
            "precision@90": precision_score(y, predicted, zero_division=0),
            "recall@90": recall_score(y, predicted, zero_division=0)}


def _random_case(rng, n, ties):
    """y, p and test rows; `ties`: p on a coarse grid (many tied scores, as constant-ish models give), with 0 and 1."""
    p = rng.choice([0.0, 0.25, 0.5, 0.9, 0.95, 1.0], n) if ties else rng.uniform(0, 1, n)
    y = (rng.uniform(0, 1, n) < np.clip(p, 0.05, 0.95)).astype(np.int64)
    rows = pd.DataFrame({"elapsed_days": rng.integers(0, 800, n), "i": rng.integers(1, 60, n),
                         "rmse_bins_lapse": rng.integers(0, 12, n)})
    return y, p, rows


def _assert_same(ours: dict, theirs: dict, tol: float) -> None:
    for key, value in theirs.items():
        if value is None:
            assert ours[key] is None, key
        else:
            assert ours[key] == pytest.approx(value, rel=tol, abs=tol), key


@pytest.mark.parametrize("ties", [False, True])
def test_metrics_equal_sklearn_on_random_inputs(ties):
    rng = np.random.default_rng(19 + ties)
    for n in (2, 3, 10, 57, 1000, 5000):
        for _ in range(5):
            y, p, rows = _random_case(rng, n, ties)
            ours = {"LogLoss": metrics.log_loss(y, p),
                    "RMSE(bins)": metrics.rmse_bins(y, p, rows.elapsed_days, rows.i, rows.rmse_bins_lapse),
                    "AUC": metrics.auc(y, p)}
            theirs = _sklearn_metrics(y, p, rows)
            assert ours["LogLoss"] == theirs["LogLoss"]  # the same float operations
            assert ours["AUC"] == theirs["AUC"]  # the same ROC curve and trapezoids
            assert ours["RMSE(bins)"] == pytest.approx(theirs["RMSE(bins)"], rel=1e-12, abs=1e-15)
            m = metrics.evaluate(y, p, rows)
            for key in ("precision@90", "recall@90"):
                assert m[key] == round(theirs[key], 6), key


def test_auc_single_class_and_all_tied_like_sklearn():
    from sklearn.metrics import roc_auc_score

    assert metrics.auc(np.array([0, 0]), np.array([0.1, 0.7])) is None
    y = np.array([0, 1, 1, 0, 1])
    assert metrics.auc(y, np.full(5, 0.9)) == roc_auc_score(y, np.full(5, 0.9)) == 0.5


def test_metrics_equal_sklearn_on_the_upstream_check_users():
    """Real collections: every row of each user scored by two stand-in predictors with real ranking signal and many
    tied scores (from the review count; from the interval), our metrics against scikit-learn's to the printed
    digit."""
    from check_users import CHECK, check_features
    from data_loader import list_user_ids

    for user in list_user_ids(CHECK):
        rows = check_features(user, False).rows
        y = rows["y"].to_numpy()
        i, days = rows["i"].to_numpy(), rows["elapsed_days"].to_numpy()
        for p in (i / (i + 1.0), 0.9 ** (days / 30.0)):
            ours = metrics.evaluate(y, p, rows)
            theirs = _sklearn_metrics(y, p, rows)
            _assert_same(ours, {k: None if v is None else round(float(v), 6) for k, v in theirs.items()}, 0)


def test_ici_equals_statsmodels_lowess():
    """The compiled loop called as statsmodels' own lowess calls it: bit-equal, ties in p included."""
    import warnings

    from statsmodels.nonparametric.smoothers_lowess import lowess

    rng = np.random.default_rng(7)
    for ties in (False, True):
        for n in (3, 10, 200, 3000):
            y, p, _ = _random_case(rng, n, ties)
            if p.max() == p.min():
                continue
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # a window of tied x: 0/0 weights, in both
                smoothed = lowess(y.astype(float), p, it=0, delta=0.01 * (p.max() - p.min()), return_sorted=False)
                assert metrics.ici(y, p) == float(np.mean(np.abs(smoothed - p)))


def test_lowess_kernel_equals_statsmodels_lowess_bit_for_bit():
    """lowess.py's numba loop (the ICI's lowess from metrics.LOWESS_KERNEL_MIN predictions on) against statsmodels'
    public lowess: the same fitted values to the last bit, on continuous scores, scores rounded to 2 decimals (few
    distinct values, delta skipping and ties), a coarse grid with windows of tied x (0/0 weights), and tiny sets."""
    import warnings

    from statsmodels.nonparametric.smoothers_lowess import lowess

    from lowess import lowess_sorted

    rng = np.random.default_rng(11)
    for n, kind in ((6000, "uniform"), (9000, "beta"), (7000, "rounded"), (6000, "grid"), (3, "uniform"),
                    (40, "beta")):
        p = {"uniform": lambda: rng.uniform(0, 1, n), "beta": lambda: rng.beta(8, 2, n),
             "rounded": lambda: np.round(rng.beta(8, 2, n), 2),
             "grid": lambda: rng.choice([0.0, 0.25, 0.5, 0.9, 0.95, 1.0], n)}[kind]()
        y = (rng.uniform(0, 1, n) < np.clip(p, 0.05, 0.95)).astype(np.float64)
        delta = 0.01 * (p.max() - p.min())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # tied windows: 0/0 weights, in both
            theirs = lowess(y, p, it=0, delta=delta, return_sorted=True)[:, 1]
            order = np.argsort(p)
            ours = lowess_sorted(np.ascontiguousarray(y[order]), np.ascontiguousarray(p[order]), 2.0 / 3.0, delta)
        assert np.array_equal(ours, theirs, equal_nan=True), (n, kind)
    y, p, _ = _random_case(rng, metrics.LOWESS_KERNEL_MIN + 100, False)  # metrics.ici on the kernel's side
    smoothed = lowess(y.astype(float), p, it=0, delta=0.01 * (p.max() - p.min()), return_sorted=False)
    assert metrics.ici(y, p) == float(np.mean(np.abs(smoothed - p)))


def test_pairwise_sum_is_numpys():
    """The weights' sum in lowess.py is numpy's pairwise summation (np.sum), bit for bit, at every size class:
    under 8, one 8-accumulator block (<= 128), and split blocks, from any offset."""
    from lowess import _pairwise_sum

    rng = np.random.default_rng(3)
    for n in (*range(0, 140), 255, 256, 1000, 1037, 9001, 40000):
        a = rng.uniform(0, 1, n + 5) ** 3 * 1e4
        assert _pairwise_sum(a, 5, n) == np.sum(a[5:5 + n]), n


def test_a_run_imports_no_sklearn_scipy_or_torch():
    """Start-up: the metrics, the split and the runner need numpy and pandas only (sklearn.metrics alone was ~0.8 s
    per process, statsmodels' package chain ~0.4 s through scipy.linalg)."""
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys, numpy as np, pandas as pd, runner, metrics\n"
            "y = np.array([1, 0, 1, 1]); p = np.array([0.9, 0.2, 0.6, 0.99])\n"
            "rows = pd.DataFrame({'elapsed_days': [1, 3, 9, 30], 'i': [2, 3, 4, 5], 'rmse_bins_lapse': [0, 0, 1, 0]})\n"
            "metrics.evaluate(y, p, rows)\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'sklearn', 'scipy', 'torch', 'numba', 'dask', "
            "'matplotlib', 'statsmodels'}), 'statsmodels.tools' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parent.parent)
    # statsmodels: its top package (for its version) and the lowess extension, not statsmodels.tools
    assert out.stdout.split("\n")[0] == "['statsmodels'] False"
