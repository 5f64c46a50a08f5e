"""Per-user metrics on the concatenated test predictions, as upstream's `utils.evaluate` computes them.

Pure functions of (y, p, test rows). Every reported value is rounded to 6 decimals like upstream's result files.
Upstream calls scikit-learn's metric functions; importing sklearn.metrics costs ~0.8 s per process and its
parameter validation milliseconds per call, more than a cheap model's whole fit. The same definitions are written
here in numpy (log_loss's clipping, roc_auc_score's ROC curve with tied scores, the sample-weighted RMSE), and
tests/test_split_metrics.py holds them to scikit-learn's own functions. smECE likewise (relplot's algorithm, `smece`;
tests/test_smece.py holds it to relplot).
"""

from __future__ import annotations

import functools
import importlib.machinery
import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd


def _exponent(x, base: float) -> np.ndarray:
    """floor(log_base x): the bin a value falls in (as a float; −inf for 0)."""
    return np.floor(np.log(np.asarray(x, dtype=np.float64)) / np.log(base))


# Each binning is (the exponent of a row, the bin's value from the exponent); rmse_bins groups by exponent and
# evaluates the value once per occupied bin, interval_bin & co. once per row.
def _interval_k(elapsed_days):
    return _exponent(np.maximum(np.asarray(elapsed_days, dtype=np.float64), 1e-6), 3.62)


def _interval_value(k):
    return np.round(2.48 * np.power(3.62, k), 2)


def _count_k(i):
    return _exponent(i, 1.89)


def _count_value(k):
    return np.round(1.99 * np.power(1.89, k))


def _lapse_k(lapses):
    """−1 for no lapse (L >= 1 has an exponent >= 0)."""
    lapses = np.asarray(lapses, dtype=np.float64)
    return np.where(lapses == 0, -1.0, _exponent(np.maximum(lapses, 1.0), 1.73))


def _lapse_value(k):
    return np.where(k == -1, 0.0, np.round(1.65 * np.power(1.73, np.maximum(k, 0.0))))


def interval_bin(elapsed_days: np.ndarray) -> np.ndarray:
    """2.48 * 3.62^floor(log_3.62 t), 2 decimals; 0 days falls in bin 0.0 (t is floored at 1e-6)."""
    return _interval_value(_interval_k(elapsed_days))


def review_count_bin(i: np.ndarray) -> np.ndarray:
    """1.99 * 1.89^floor(log_1.89 i), rounded: i = 1 → 2, 2-3 → 4, 4-6 → 7, ..."""
    return _count_value(_count_k(i))


def lapse_bin(lapses: np.ndarray) -> np.ndarray:
    """0 for no lapse, else 1.65 * 1.73^floor(log_1.73 L), rounded: 1 → 2, 2 → 3, 3-5 → 5, ..."""
    return _lapse_value(_lapse_k(lapses))


def _dense_codes(k: np.ndarray, value) -> tuple[np.ndarray, int]:
    """np.unique(value(k), return_inverse=True)'s codes and their count, found by ranking the values of the few
    distinct exponents instead of sorting the n rows' values (rmse_bins sorted the test rows 4 times, most of its
    time). Two exponents whose bins round to the same value share a code, as before. An infinite exponent (a
    review count of 0) falls back to the plain np.unique."""
    if len(k) == 0 or not np.isfinite(k).all():
        _, inverse = np.unique(value(k), return_inverse=True)
        return inverse.ravel(), int(inverse.max(initial=0)) + 1
    ki = k.astype(np.int64)
    lo = int(ki.min())
    span = np.arange(lo, int(ki.max()) + 1)
    present = np.bincount(ki - lo) > 0
    distinct, rank = np.unique(value(span[present].astype(np.float64)), return_inverse=True)
    table = np.zeros(len(span), dtype=np.int64)
    table[present] = rank.ravel()
    return table[ki - lo], len(distinct)


def rmse_bins(y: np.ndarray, p: np.ndarray, elapsed_days, i, lapses) -> float:
    """RMSE between mean recall and mean prediction per (interval, review count, lapse) bin, weighted by bin size
    (upstream: a pandas groupby, then sklearn's root_mean_squared_error with the bin sizes as sample_weight).
    Bins in the groupby's order (sorted by interval, then count, then lapses); a bin's sums in row order."""
    codes = np.zeros(len(y), dtype=np.int64)
    for k, value in ((_interval_k(elapsed_days), _interval_value), (_count_k(i), _count_value),
                     (_lapse_k(lapses), _lapse_value)):
        inverse, m = _dense_codes(k, value)
        codes = codes * m + inverse
    count = np.bincount(codes)
    occupied = count > 0
    bin_of = (np.cumsum(occupied) - 1)[codes]  # occupied codes numbered in order: np.unique(codes)'s inverse
    n = count[occupied].astype(np.float64)
    y_mean = np.bincount(bin_of, weights=np.asarray(y, dtype=np.float64)) / n
    p_mean = np.bincount(bin_of, weights=np.asarray(p, dtype=np.float64)) / n
    return float(np.sqrt(np.average((y_mean - p_mean) ** 2, weights=n)))


def log_loss(y: np.ndarray, p: np.ndarray) -> float:
    """sklearn's log_loss(y, p, labels=[0, 1]): the probability given to the observed class (p or 1 − p), clipped
    to [eps, 1 − eps] with float64's eps, averaged as −log."""
    eps = np.finfo(np.float64).eps
    p = np.asarray(p, dtype=np.float64)
    observed = np.where(np.asarray(y) == 1, p, 1 - p)
    return float(-np.mean(np.log(np.clip(observed, eps, 1 - eps))))


@functools.cache
def _compiled_lowess():
    """statsmodels' compiled lowess loop (statsmodels.nonparametric._smoothers_lowess, what its public `lowess`
    calls), loaded from its file. The ordinary import first runs statsmodels.nonparametric's and statsmodels.tools'
    __init__, which import scipy.linalg: ~0.4 s per process, a fifth of a cheap row's whole run; the extension
    itself needs numpy only. It is registered under its own name, so a later ordinary import reuses it (a Cython
    module cannot be initialised twice)."""
    name = "statsmodels.nonparametric._smoothers_lowess"
    if name not in sys.modules:
        import statsmodels  # its version only

        folder = Path(statsmodels.__file__).parent / "nonparametric"
        path = next(path for suffix in importlib.machinery.EXTENSION_SUFFIXES
                    if (path := folder / f"_smoothers_lowess{suffix}").exists())
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name].lowess


# The ICI's lowess runs in lowess.py's numba kernel (bit-identical, ~3.8× faster: 18 → 4.7 ms on 20.7k
# predictions) from LOWESS_KERNEL_MIN predictions on when its machine code is at hand (compiled in this process or in
# numba's disk cache; numba already imported by a compiled model), and from LOWESS_KERNEL_MIN_COLD on in any case:
# compiling it costs ~3 s, a tenth of a cold FSRS-6 run, and pays off within one user only that large. Smaller users
# of a first run take statsmodels' loop (the same values), so that run never waits for the kernel.
LOWESS_KERNEL_MIN = 2000
LOWESS_KERNEL_MIN_COLD = 50_000


def _use_kernel(n: int) -> bool:
    if n >= LOWESS_KERNEL_MIN_COLD:
        return True
    if n < LOWESS_KERNEL_MIN or "numba" not in sys.modules:
        return False
    from lowess import kernel_ready

    return kernel_ready()


def ici(y: np.ndarray, p: np.ndarray, order: np.ndarray | None = None) -> float:
    """Integrated calibration index: mean |lowess(y ~ p) − p| (statsmodels lowess, one pass, 1% delta), as
    statsmodels' lowess(y, p, it=0, delta, return_sorted=False) computes it: x sorted by np.argsort, the compiled
    loop (or its numba twin for large users, lowess.py), the fit put back in the input's order. `order`: np.argsort(p)
    when the caller has it (tied scores must stay in that order: the lowess sums run in it)."""
    y = np.asarray(y, dtype=np.float64)
    p = np.asarray(p, dtype=np.float64)
    if not np.isfinite(p).all() or not np.isfinite(y).all():
        return float("nan")  # statsmodels drops such rows and returns NaN for them: the mean is NaN
    if p.max() == p.min():
        return float("nan")  # lowess is undefined for a constant predictor
    order = np.argsort(p) if order is None else order
    x = np.ascontiguousarray(p[order])
    y_sorted = np.ascontiguousarray(y[order])
    delta = 0.01 * (p.max() - p.min())
    if _use_kernel(len(p)):
        from lowess import lowess_sorted

        fit = lowess_sorted(y_sorted, x, 2.0 / 3.0, delta)
    else:
        with np.errstate(invalid="ignore", divide="ignore"):  # a degenerate neighbourhood's 0/0 stays NaN, unannounced
            fit = _compiled_lowess()(y_sorted, x, x, np.ones_like(x), frac=2.0 / 3.0, it=0, delta=delta,
                                     given_xvals=False)[0][:, 1]
    smoothed = np.empty_like(p)
    smoothed[order] = fit
    return float(np.mean(np.abs(smoothed - p)))


def auc(y: np.ndarray, p: np.ndarray, order: np.ndarray | None = None) -> float | None:
    """sklearn's roc_auc_score, or None when it is undefined (a test set with a single class). As roc_curve builds
    it: scores in decreasing order, one ROC point per distinct score (tied scores move together, so a tied
    (positive, negative) pair counts 1/2), collinear points dropped, trapezoid area. Only the ends of the runs of
    tied scores are read, so any ascending sort of p does: `order`, when given, is the ICI's np.argsort(p)."""
    y = np.asarray(y)
    p = np.asarray(p, dtype=np.float64)
    if len(np.unique(y)) != 2 or not np.isfinite(p).all():  # sklearn: a warning and NaN / a ValueError
        return None
    order = (np.argsort(p) if order is None else order)[::-1]
    p, positive = p[order], (y[order] == 1).astype(np.float64)
    last_of_tie = np.r_[np.nonzero(np.diff(p))[0], len(p) - 1]
    tps = np.cumsum(positive)[last_of_tie]
    fps = 1 + last_of_tie.astype(np.float64) - tps
    if len(fps) > 2:  # roc_curve(drop_intermediate=True)
        corner = np.r_[True, np.logical_or(np.diff(fps, 2), np.diff(tps, 2)), True]
        fps, tps = fps[corner], tps[corner]
    fpr = np.r_[0.0, fps] / fps[-1]
    tpr = np.r_[0.0, tps] / tps[-1]
    return float((np.diff(fpr) * (tpr[1:] + tpr[:-1]) / 2.0).sum())


SMECE_EPS = 0.001  # relplot.smECE's eps: the smallest bandwidth its search tries


def _fft_size(n: int) -> int:
    """The smallest 2^a·3^b·5^c >= n: numpy's FFT is fastest at such sizes (3072 for smECE's usual 3001 points takes
    ~0.85 of the time 4096 does)."""
    best, p5 = 1 << (n - 1).bit_length(), 1
    while p5 < best:
        p35 = p5
        while p35 < best:
            best = min(best, p35 << (-(-n // p35) - 1).bit_length())
            p35 *= 3
        p5 *= 5
    return best


def smece(y: np.ndarray, p: np.ndarray) -> float:
    """SmoothECE (Błasiok & Nakkiran 2023), upstream's "smECE" (relplot.smECE(p, y)): the residuals p − y smoothed by
    a Gaussian kernel reflected at 0 and 1, their mean absolute value under the smoothed density of p; the bandwidth
    σ is where σ = smECE(σ), found by bisection. relplot 1.0.3's algorithm step by step (metrics.smECE,
    kernels.ReflectedGaussianKernel): residuals and counts shared linearly between the two nearest points of a grid
    of max(2000, round(20/σ))//2 + 1 points, convolved with the kernel sampled on that grid after mirroring the grid
    at both ends, interpolated at max(round(10/σ), 200) points of [0, 1], density + 1e-4, then
    Σ|residual/density|·density / Σ density; σ: 1 if it fits, else 10 bisection steps on [0, 1], any σ < 0.001
    taken as fitting unevaluated, the last σ that did not fit kept.

    Written here, not imported: `import relplot` imports matplotlib.pyplot, seaborn and scikit-learn (its plots),
    1.1-1.6 s per worker process, for these ~40 lines. It differs from relplot in rounding only: grid sums by
    np.bincount instead of np.add.at, the two convolutions (residuals, counts) by one real FFT instead of
    np.convolve's direct sums, the predictions gridded once per grid size, each σ evaluated once.
    tests/test_smece.py holds it to relplot.smECE itself (relative 1e-12; seen: <= 3e-15) and to a direct
    O(n·grid) sum. Cost: ~2-3 ms for 10,000 predictions, ~3.5 ms for 20,700 (relplot.smECE: 12-18 ms).
    NaN when p or y is not finite (as the ICI)."""
    f = np.asarray(p, dtype=np.float64)
    r = f - np.asarray(y, dtype=np.float64)
    if not (np.isfinite(f).all() and np.isfinite(r).all()):
        return float("nan")
    grids: dict[int, tuple] = {}  # grid size → (FFT length, rfft of the mirrored (residual, count) grid sums)
    found: dict[float, float] = {}  # σ → smooth ECE

    def spectrum(g: int):
        if g not in grids:
            bins = (f * (g - 1)).astype(int).clip(0, g - 2)  # relplot's smooth_round_to_grid
            frac = f * (g - 1) - bins
            values = np.stack([np.bincount(bins, (1 - frac) * r, g) + np.bincount(bins + 1, frac * r, g),
                               np.bincount(bins, 1 - frac, g) + np.bincount(bins + 1, frac, g)])
            mirrored = np.concatenate([values[:, :0:-1], values, values[:, -2::-1]], axis=1)
            n_fft = _fft_size(mirrored.shape[1])  # ≥ 3g − 2: the slice below never wraps around
            grids[g] = n_fft, np.fft.rfft(mirrored, n_fft)
        return grids[g]

    def smooth_ece(sigma: float) -> float:
        if sigma not in found:
            g = max(2000, round(20 / sigma)) // 2 + 1
            n_fft, values = spectrum(g)
            t = np.linspace(0, 1, g)
            kernel = np.exp(-(t - 0.5) * (t - 0.5) / (2 * sigma ** 2))
            kernel /= np.sqrt(2 * np.pi) * sigma
            full = np.fft.irfft(values * np.fft.rfft(kernel, n_fft), n_fft)
            start = g - 1 + g // 2  # np.convolve(mirrored, kernel, "valid")[g//2 : g//2 + g]
            smoothed = full[:, start:start + g]
            x = np.linspace(0, 1, max(round(10 / sigma), 200))  # relplot's interpolate
            inds = (x * (g - 1)).astype(int).clip(0, g - 2)
            bucket = 1 / (g - 1)
            residual = (x - inds * bucket) / bucket
            at = smoothed[:, inds] * (1 - residual) + smoothed[:, inds + 1] * residual
            density = at[1] + 0.0001
            found[sigma] = float(np.sum(np.abs(at[0] / density) * density) / np.sum(density))
        return found[sigma]

    def fits(sigma: float) -> bool:
        return sigma < SMECE_EPS or sigma < smooth_ece(sigma)

    sigma = 1  # relplot's search_param(start=1, refine=10)
    if not fits(sigma):
        end = 0
        for _ in range(10):
            mid = (sigma + end) / 2
            if fits(mid):
                end = mid
            else:
                sigma = mid
    return smooth_ece(sigma)


def _ratio(num: int, den: int) -> float:
    """precision_score / recall_score with zero_division=0."""
    return num / den if den else 0.0


ROW_COLUMNS = ("y", "elapsed_days", "i", "rmse_bins_lapse")  # what evaluate reads of the test rows


def evaluate(y: np.ndarray, p: np.ndarray, rows: pd.DataFrame | dict) -> dict:
    """All metrics of one user; `rows` (a frame, or a dict of arrays) supplies elapsed_days, i and rmse_bins_lapse
    of the test rows."""
    y = np.asarray(y, dtype=np.int64)
    p = np.asarray(p, dtype=np.float64)
    predicted = p >= 0.9
    hits = int((predicted & (y == 1)).sum())
    order = np.argsort(p)  # one sort for the AUC and the ICI
    out = {
        "RMSE": float(np.sqrt(np.mean((p - y) ** 2))),
        "LogLoss": log_loss(y, p),
        "RMSE(bins)": rmse_bins(y, p, np.asarray(rows["elapsed_days"]), np.asarray(rows["i"]),
                                np.asarray(rows["rmse_bins_lapse"])),
        "smECE": smece(y, p),
        "AUC": auc(y, p, order),
        "ICI": ici(y, p, order),
        "precision@90": _ratio(hits, int(predicted.sum())),
        "recall@90": _ratio(hits, int((y == 1).sum())),
        "MBE": float(np.mean(p - y)),
    }
    # NaN (e.g. ICI when every prediction is equal) is written as null: result files stay strict JSON
    return {k: (None if v is None or math.isnan(v) else round(v, 6)) for k, v in out.items()}
