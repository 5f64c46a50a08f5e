"""Per-user metrics on the concatenated test predictions, as upstream's `utils.evaluate` computes them.

Pure functions of (y, p, test rows). Every reported value is rounded to 6 decimals like upstream's result files.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
from sklearn.metrics import log_loss, precision_score, recall_score, roc_auc_score, root_mean_squared_error


def interval_bin(elapsed_days: np.ndarray) -> np.ndarray:
    """2.48 * 3.62^floor(log_3.62 t), 2 decimals; 0 days falls in bin 0.0 (t is floored at 1e-6)."""
    t = np.maximum(np.asarray(elapsed_days, dtype=np.float64), 1e-6)
    return np.round(2.48 * np.power(3.62, np.floor(np.log(t) / np.log(3.62))), 2)


def review_count_bin(i: np.ndarray) -> np.ndarray:
    """1.99 * 1.89^floor(log_1.89 i), rounded: i = 1 → 2, 2-3 → 4, 4-6 → 7, ..."""
    i = np.asarray(i, dtype=np.float64)
    return np.round(1.99 * np.power(1.89, np.floor(np.log(i) / np.log(1.89))))


def lapse_bin(lapses: np.ndarray) -> np.ndarray:
    """0 for no lapse, else 1.65 * 1.73^floor(log_1.73 L), rounded: 1 → 2, 2 → 3, 3-5 → 5, ..."""
    lapses = np.asarray(lapses, dtype=np.float64)
    safe = np.maximum(lapses, 1.0)
    binned = np.round(1.65 * np.power(1.73, np.floor(np.log(safe) / np.log(1.73))))
    return np.where(lapses == 0, 0.0, binned)


def rmse_bins(y: np.ndarray, p: np.ndarray, elapsed_days, i, lapses) -> float:
    """RMSE between mean recall and mean prediction per (interval, review count, lapse) bin, weighted by bin size."""
    frame = pd.DataFrame({
        "a": interval_bin(elapsed_days), "b": review_count_bin(i), "c": lapse_bin(lapses),
        "y": np.asarray(y, dtype=np.float64), "p": np.asarray(p, dtype=np.float64),
    })
    bins = frame.groupby(["a", "b", "c"], sort=False).agg(y=("y", "mean"), p=("p", "mean"), n=("y", "size"))
    return float(root_mean_squared_error(bins["y"], bins["p"], sample_weight=bins["n"]))


def ici(y: np.ndarray, p: np.ndarray) -> float:
    """Integrated calibration index: mean |lowess(y ~ p) − p| (statsmodels lowess, one pass, 1% delta)."""
    from statsmodels.nonparametric.smoothers_lowess import lowess

    p = np.asarray(p, dtype=np.float64)
    if p.max() == p.min():
        return float("nan")  # lowess is undefined for a constant predictor
    smoothed = lowess(np.asarray(y, dtype=np.float64), p, it=0, delta=0.01 * (p.max() - p.min()),
                      return_sorted=False)
    return float(np.mean(np.abs(smoothed - p)))


def auc(y: np.ndarray, p: np.ndarray) -> float | None:
    """ROC AUC, or None when it is undefined (a test set with a single class)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # sklearn warns (and returns NaN) for a single class
            value = float(roc_auc_score(y, p))
    except ValueError:
        return None
    return None if math.isnan(value) else value


def evaluate(y: np.ndarray, p: np.ndarray, rows: pd.DataFrame) -> dict:
    """All metrics of one user; `rows` supplies elapsed_days, i and rmse_bins_lapse of the test rows."""
    y = np.asarray(y, dtype=np.int64)
    p = np.asarray(p, dtype=np.float64)
    predicted = (p >= 0.9).astype(np.int64)
    out = {
        "RMSE": float(np.sqrt(np.mean((p - y) ** 2))),
        "LogLoss": float(log_loss(y, p, labels=[0, 1])),
        "RMSE(bins)": rmse_bins(y, p, rows["elapsed_days"], rows["i"], rows["rmse_bins_lapse"]),
        "AUC": auc(y, p),
        "ICI": ici(y, p),
        "precision@90": float(precision_score(y, predicted, zero_division=0)),
        "recall@90": float(recall_score(y, predicted, zero_division=0)),
        "MBE": float(np.mean(p - y)),
    }
    # NaN (e.g. ICI when every prediction is equal) is written as null: result files stay strict JSON
    return {k: (None if v is None or math.isnan(v) else round(v, 6)) for k, v in out.items()}
