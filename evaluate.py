"""README tables from per-user result files: means with 99% BCa bootstrap intervals, plus superiority,
significance and calibration plots (see `analysis.py`).

    python evaluate.py                                  # upstream's current "without same-day reviews" table
    python evaluate.py --secs                           # ... its "with same-day reviews" table
    python evaluate.py --all-tables                     # both, one after the other (what run_table.py writes)
    python evaluate.py --layout seeds                   # the seeds' layout: weighted + unweighted, every file
    python evaluate.py --models FSRS-6,AVG --readme README.md
    python evaluate.py --superiority --significance     # also plots/Superiority-<n>.png, Wilcoxon-/T-test-<n>-collections.png
    python evaluate.py --calibration FSRS-6 [--user 8]  # plots/calibration-FSRS-6[-user-8].png from raw/FSRS-6.jsonl

Aggregation follows upstream's evaluate.py (spec §7):
- only users present in every compared model's file are used; users with a null/NaN value are dropped from that
  metric's column only (AUC is null for single-class test sets);
- mean = Σ w·m / Σ w with w = `size` ("weighted by the number of reviews") or w = 1 ("unweighted");
- ± = half the width of the 99% BCa interval of that weighted mean, exactly what
  `scipy.stats.bootstrap((user_indices,), weighted_mean, confidence_level=0.99, method="BCa", random_state=42)`
  returns (default 9999 resamples). `weighted_mean_cis` computes the same numbers in a few seconds for all models
  at once: it draws the same resample indices (same generator, same order), turns each batch of resamples into
  per-user counts so that every (model, metric, weighting) column is one matrix product, and uses the closed-form
  leave-one-out weighted mean for the BCa acceleration instead of n separate jackknife evaluations;
- formatting is upstream's `sigdig`: the CI with 2 significant digits, the mean with as many decimals;
- rows are labelled as upstream's README labels them ("FSRS-6-dry-run" → "FSRS-6 default param.", "Anki" →
  "Anki-SM-2 trainable"; `--file-names` keeps the file names), and "Parameters" is the README's count for every
  name of either era of upstream's result files (`KNOWN_MODELS`), else the length of the stored weight list.

Two layouts (`--layout`):
- `current` (default): upstream's evaluate.py/README of today. Only UNWEIGHTED per-user means (the review-weighted
  table is gone upstream), columns Model | Parameters | Log Loss↓ | RMSE(bins)↓ | AUC↑ | Input features, rows sorted
  by Log Loss, in each metric column ONE best cell in bold (lowest Log Loss / RMSE(bins), highest AUC; on a tie the
  row listed first) and the name of every row that holds one. Two tables: "Without same-day reviews" (default) and
  "With same-day reviews" (`--secs`), each over its own result files and its own common users. A file belongs to the
  with-same-day table when its upstream name (`current_name`) has the `secs` flag and is not
  `equalize_test_with_non_secs` (upstream: the `-short-secs` files, e.g. `DASH-short-secs`, `FSRS-6-short-secs`);
  every other file belongs to the without-same-day table (the equalized secs rows such as FSRS-7, LSTM and Logistic
  Regression are tested on the day-level reviews, so upstream lists them there).
  THE NAME MAPPING lives here, in `current_name` (srs-bench result name → upstream's current file name: the flags a
  model always runs with are spelled out, e.g. `FSRS-6` → `FSRS-6-short`, `FSRS-6-S0` → `FSRS-6-S0-short`, `LSTM` →
  `LSTM-short-secs-duration-equalize_test_with_non_secs`, from config.ALWAYS_SHORT and config.BUILTIN_FLAGS) and
  `CURRENT_LABELS` (upstream's current file name → the row name its tables show, e.g. `FSRS-6-short` → `FSRS-6`,
  `DASH-short-secs` → `DASH`); names it does not list keep `display_name`'s label.
- `seeds`: the layout the seeds' published numbers use, unchanged: a review-weighted and an unweighted table
  (`--scale`) over every result file, every best cell in bold.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from scipy.special import ndtr, ndtri

from config import ALWAYS_SHORT, BUILTIN_FLAGS

REPO_ROOT = Path(__file__).resolve().parent

# Table columns: (key in "metrics", header, lower is better)
METRICS = [("LogLoss", "Log Loss", True), ("RMSE(bins)", "RMSE (bins)", True), ("AUC", "AUC", False)]

# Input-feature abbreviations of upstream's newer README.
FEATURE_LEGEND = {
    "IL": "interval lengths, in days",
    "FIL": "fractional (aka non-integer) interval lengths",
    "G": "grades (Again/Hard/Good/Easy)",
    "SR": "same-day (or short-term) reviews",
    "AT": "answer time (duration of the review), in milliseconds",
}

# Result name (file name without .jsonl) → (trainable parameters per user, input features): upstream's hand-kept
# list, under both naming eras of upstream's result files. Era A (script.py/other.py of the FSRS-5 and early FSRS-6
# tables) spells the untrained row "-dry-run" and the S0-only row "-pretrain"; Era B and srs-bench spell them
# "-default" and "-S0". "Anki" is the TRAINABLE Anki-SM-2 row in upstream's files (7 parameters); the untrained one
# is "Anki-dry-run" (Era A) / "Anki-default". The count is what the README's "Parameters" column shows, which is not
# always the length of a result line's `parameters` list (-S0 and -dry-run rows store all 21 weights but train 4 / 0;
# -binary stores 21 but w1, w3, w15, w16 are never used; neural rows store none), so for these names it wins.
_FSRS6_IN = _FSRS5_IN = "IL, G, SR"
KNOWN_MODELS: dict[str, tuple[int, str]] = {
    "FSRS-7": (35, "FIL, G, SR"),  # its built-in --secs: fractional intervals
    "FSRS-7-short-secs-equalize_test_with_non_secs": (35, "FIL, G, SR"),  # upstream's file name for "FSRS-7"
    "FSRS-7-short-secs-recency-equalize_test_with_non_secs": (35, "FIL, G, SR"),  # ... for "FSRS-7 recency"
    "FSRS-7-sched_penalties": (35, "FIL, G, SR"),  # --sched_penalties
    "FSRS-7-default": (0, "FIL, G, SR"),
    "FSRS-7-sched_penalties-short-secs-equalize_test_with_non_secs": (35, "FIL, G, SR"),  # upstream's name for it
    "FSRS-6": (21, _FSRS6_IN),
    "FSRS-6-default": (0, _FSRS6_IN),
    "FSRS-6-dry-run": (0, _FSRS6_IN),
    "FSRS-6-S0": (4, _FSRS6_IN),
    "FSRS-6-pretrain": (4, _FSRS6_IN),
    "FSRS-6-binary": (17, _FSRS6_IN),
    "FSRS-6-recency": (21, _FSRS6_IN),
    "FSRS-6-preset": (21, _FSRS6_IN),
    "FSRS-6-deck": (21, _FSRS6_IN),
    "FSRS-6-upstream-trainer": (21, _FSRS6_IN),  # srs-bench: same model, upstream-style torch trainer
    "FSRS-6-one-step": (21, _FSRS6_IN),
    "FSRS-rs": (21, _FSRS6_IN),  # FSRS-6 trained by fsrs-rs; Era A's FSRS-rs was FSRS-5 (19), see COUNT_FROM_RESULT
    "FSRS-5": (19, _FSRS5_IN),
    "FSRS-5-default": (0, _FSRS5_IN),
    "FSRS-5-dry-run": (0, _FSRS5_IN),
    "FSRS-5-S0": (4, _FSRS5_IN),
    "FSRS-5-pretrain": (4, _FSRS5_IN),
    "FSRS-5-binary": (15, _FSRS5_IN),
    "FSRS-5-disable_short_term": (17, "IL, G"),  # w17, w18 fixed at 0: no short-term term
    "FSRS-5-recency": (19, _FSRS5_IN),
    "FSRS-5-preset": (19, _FSRS5_IN),
    "FSRS-5-deck": (19, _FSRS5_IN),
    "FSRS-4.5": (17, "IL, G"),
    "FSRSv4": (17, "IL, G"),
    "FSRSv3": (13, "IL, G"),
    "FSRSv2": (14, "IL, G"),
    "FSRSv1": (7, "IL, G"),
    "LSTM": (8869, "FIL, G, SR, AT"),
    "LSTM-short-secs-equalize_test_with_non_secs": (8869, "FIL, G, SR, AT"),  # upstream's file name for "LSTM"
    "GRU": (39, "IL, G"),
    "GRU-short-secs-equalize_test_with_non_secs": (39, "FIL, G, SR"),  # upstream's current day-table GRU row
    "GRU-P": (297, "IL, G"),
    "GRU-P-short": (297, "IL, G, SR"),
    "Transformer": (127, "IL, G"),
    "NN-17": (39, "IL, G"),
    "DASH": (9, "IL, G"),
    "DASH-short": (9, "IL, G, SR"),
    "DASH[MCM]": (9, "IL, G"),
    "DASH[ACT-R]": (5, "IL, G"),
    "ACT-R": (5, "IL"),
    "HLR": (3, "IL, G"),
    "HLR-short": (3, "IL, G, SR"),
    "SM2": (0, "IL, G"),
    "SM2-short": (0, "IL, G, SR"),
    "SM2-trainable": (6, "IL, G"),
    "SBD": (7, "IL, G"),
    "SBD-recency": (7, "IL, G"),  # upstream's file name for the published (recency-weighted) SBD row
    "Anki": (7, "IL, G"),  # trainable Anki-SM-2
    "Anki-default": (0, "IL, G"),
    "Anki-dry-run": (0, "IL, G"),
    "Ebisu-v2": (0, "IL, G"),
    "AVG": (0, "---"),
    "MOVING-AVG": (0, "---"),
    "LogisticRegression": (34, "IL, FIL, G, SR"),
    # upstream's file name for "LogisticRegression" (its flags are the row's defaults here)
    "LogisticRegression-short-secs-recency-equalize_test_with_non_secs": (34, "IL, FIL, G, SR"),
    "RMSE-BINS-EXPLOIT": (0, "IL, G"),
    "90%": (0, "---"),
}

# Names whose every stored weight is trained and whose weight count changed between eras under the same name: the
# length of the result's `parameters` list is used when there is one (Era A "FSRS-rs" = FSRS-5 port, 19 weights).
COUNT_FROM_RESULT = {"FSRS-rs"}

# srs-bench suffixes that change neither the parameter count nor the inputs; "X-recency-deck" counts as "X".
NEUTRAL_SUFFIXES = ("-recency", "-preset", "-deck", "-upstream-trainer", "-autograd-trainer", "-causal")

# How upstream's README tables name the rows (the tables are hand-edited from the result-file names).
DISPLAY_NAMES: dict[str, str] = {
    "LSTM-short-secs-equalize_test_with_non_secs": "LSTM",
    "FSRS-7-short-secs-equalize_test_with_non_secs": "FSRS-7",
    "FSRS-7-short-secs-recency-equalize_test_with_non_secs": "FSRS-7 recency",
    "FSRS-7-sched_penalties-short-secs-equalize_test_with_non_secs": "FSRS-7 sched. penalties",
    "SBD-recency": "SBD",
    "FSRSv4": "FSRS v4",
    "FSRSv3": "FSRS v3",
    "FSRSv2": "FSRS v2",
    "FSRSv1": "FSRS v1",
    "SM2": "SM-2",
    "SM2-short": "SM-2-short",
    "SM2-trainable": "SM-2 trainable",
    "Anki": "Anki-SM-2 trainable",
    "Anki-default": "Anki-SM-2",
    "Anki-dry-run": "Anki-SM-2",
    "Ebisu-v2": "Ebisu v2",
    "LogisticRegression": "Logistic Regression",
    "LogisticRegression-short-secs-recency-equalize_test_with_non_secs": "Logistic Regression",
}
# Variant suffixes of the FSRS rows, as the README words them ("FSRS-6 default param.", "FSRS-6 pretrain", ...).
SUFFIX_WORDS: dict[str, str] = {
    "-default": "default param.",
    "-dry-run": "default param.",
    "-S0": "pretrain",
    "-pretrain": "pretrain",
    "-sched_penalties": "sched. penalties",
    "-binary": "binary",
    "-disable_short_term": "disable_short_term",
    "-recency": "recency",
    "-preset": "preset",
    "-deck": "deck",
    "-upstream-trainer": "upstream trainer",
    "-causal": "causal",
}


def known_base(name: str) -> str | None:
    """The KNOWN_MODELS key a result name counts as, or None: the name itself, else the name with srs-bench's
    count-neutral suffixes taken off the end ("FSRS-6-binary-recency" counts as "FSRS-6-binary")."""
    while name not in KNOWN_MODELS:
        for suffix in NEUTRAL_SUFFIXES:
            if name.endswith(suffix) and len(name) > len(suffix):
                name = name[: -len(suffix)]
                break
        else:
            return None
    return name


def known_model(name: str) -> tuple[int, str] | None:
    """(parameters, input features) of a result name, or None when unknown."""
    base = known_base(name)
    return None if base is None else KNOWN_MODELS[base]


def display_name(name: str) -> str:
    """README row name of a result name: "FSRS-6-dry-run" → "FSRS-6 default param.", "Anki" → "Anki-SM-2
    trainable", "FSRSv4" → "FSRS v4", "FSRS-6-binary-recency" → "FSRS-6 binary recency"; unknown names unchanged."""
    if name in DISPLAY_NAMES:
        return DISPLAY_NAMES[name]
    words: list[str] = []
    base = name
    while base not in DISPLAY_NAMES:
        for suffix, word in SUFFIX_WORDS.items():
            if base.endswith(suffix) and len(base) > len(suffix):
                base = base[: -len(suffix)]
                words.insert(0, word)
                break
        else:
            break
    if not words:
        return name
    return " ".join([DISPLAY_NAMES.get(base, base)] + words)


START_MARKER = "<!-- tables:start -->"
END_MARKER = "<!-- tables:end -->"


# ---------------------------------------------------------------------------------------------------------------
# Reading result files


@dataclass
class ModelResults:
    """One result file: per-user metrics keyed by user id."""

    name: str
    users: np.ndarray  # sorted user ids
    size: np.ndarray  # evaluated reviews per user
    metrics: dict[str, np.ndarray]  # metric → values aligned with `users`, NaN where null/missing
    n_params: int | None = None  # from the first user's `parameters`, if any
    warnings: list[str] = field(default_factory=list)

    def select(self, users: np.ndarray) -> "ModelResults":
        pos = np.searchsorted(self.users, users)
        return ModelResults(self.name, users, self.size[pos], {k: v[pos] for k, v in self.metrics.items()},
                            self.n_params, self.warnings)


def _count_parameters(params) -> int | None:
    """Trainable parameters per user from a result line's `parameters` ({partition: [floats]} or a list)."""
    if isinstance(params, dict) and params:
        first = next(iter(params.values()))
        return len(first) if isinstance(first, list) else None
    if isinstance(params, list):
        return len(params)
    return None


def _as_float(value) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return math.nan
    return out


def read_result_file(path: Path, metric_keys=("LogLoss", "RMSE(bins)", "AUC", "RMSE", "ICI", "MBE", "smECE")
                     ) -> ModelResults:
    """Parse `result/<name>.jsonl`, tolerating blank, torn and malformed lines (each one is reported once). A metric
    a line lacks (smECE in result files written before it was added) reads as NaN."""
    path = Path(path)
    rows: dict[int, tuple[float, dict[str, float]]] = {}
    n_params = None
    notes: list[str] = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                notes.append(f"{path}:{lineno}: blank line skipped")
                continue
            try:
                obj = json.loads(line)
                user = int(obj["user"])
                size = float(obj["size"])
                metrics = obj["metrics"]
                if not isinstance(metrics, dict):
                    raise TypeError("metrics is not an object")
            except (ValueError, KeyError, TypeError) as exc:
                notes.append(f"{path}:{lineno}: unreadable line skipped ({type(exc).__name__}: {exc})")
                continue
            if user in rows:
                notes.append(f"{path}:{lineno}: user {user} appears again; the later line is used")
            rows[user] = (size, {k: _as_float(metrics.get(k)) for k in metric_keys})
            if n_params is None and "parameters" in obj:
                n_params = _count_parameters(obj["parameters"])
    for note in notes:
        warnings.warn(note, stacklevel=2)
    users = np.array(sorted(rows), dtype=np.int64)
    size = np.array([rows[u][0] for u in users], dtype=np.float64)
    metrics = {k: np.array([rows[u][1][k] for u in users], dtype=np.float64) for k in metric_keys}
    return ModelResults(path.stem, users, size, metrics, n_params, notes)


def load_models(result_dir: Path, names: list[str] | None = None) -> list[ModelResults]:
    result_dir = Path(result_dir)
    if names:
        paths = [result_dir / f"{name}.jsonl" for name in names]
        missing = [str(p) for p in paths if not p.exists()]
        if missing:
            raise SystemExit(f"error: no result file for: {', '.join(missing)}")
    else:
        paths = sorted(result_dir.glob("*.jsonl"))
        if not paths:
            raise SystemExit(f"error: no result files (*.jsonl) in {result_dir}")
    return [read_result_file(p) for p in paths]


def common_users(models: list[ModelResults]) -> tuple[list[ModelResults], dict]:
    """Restrict every model to the users present in all files; report how many were dropped."""
    all_users = set().union(*(set(m.users.tolist()) for m in models))
    common = np.array(sorted(set.intersection(*(set(m.users.tolist()) for m in models))), dtype=np.int64)
    info = {"users": len(common), "excluded": len(all_users) - len(common),
            "missing_per_model": {m.name: len(all_users) - len(m.users) for m in models}}
    restricted = [m.select(common) for m in models]
    if restricted:
        sizes = np.stack([m.size for m in restricted])
        info["reviews"] = int(sizes[0].sum())
        info["sizes_differ"] = bool((sizes != sizes[0]).any())
    else:
        info["reviews"] = 0
        info["sizes_differ"] = False
    return restricted, info


# ---------------------------------------------------------------------------------------------------------------
# Bootstrap


def _weighted_mean_stat(values: np.ndarray, weights: np.ndarray):
    """Upstream's statistic: weighted mean of the users picked by an index array (vectorised along the last axis)."""

    def statistic(idx, axis=-1):
        return np.average(values[idx], weights=weights[idx], axis=axis)

    return statistic


def weighted_mean_ci_scipy(values, weights, *, confidence_level=0.99, n_resamples=9999, random_state=42,
                           vectorized=True, batch=None):
    """The reference: scipy's own BCa bootstrap over user indices, as upstream calls it. Returns (low, high)."""
    values = np.asarray(values, dtype=np.float64)
    weights = np.asarray(weights, dtype=np.float64)
    statistic = _weighted_mean_stat(values, weights)
    if not vectorized:
        vector_stat = statistic

        def statistic(idx):  # noqa: F811 - one resample at a time, like a naive statistic
            return vector_stat(idx, axis=-1)

    from scipy import stats  # here and in the BCa below, not at the top: ~0.35 s to import, which the report page,
    # importing this module for its table helpers, does not need

    res = stats.bootstrap((np.arange(len(values)),), statistic, confidence_level=confidence_level,
                          n_resamples=n_resamples, method="BCa", random_state=random_state,
                          vectorized=vectorized, batch=batch)
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def weighted_mean_cis(values, weights, *, confidence_level=0.99, n_resamples=9999, random_state=42,
                      batch=500):
    """BCa intervals of Σw·v/Σw for many columns that share the same users, all at once.

    values, weights: arrays of shape (n,) or (n, K) (K columns: models × metrics × weightings with the same user
    set). Returns (mean, low, high), each of shape (K,) (or scalars for 1-D input).

    Reproduces `weighted_mean_ci_scipy` (same generator `RandomState(random_state)`, same draws in the same order,
    same percentile-of-score, acceleration and quantile rules) up to floating-point summation order (~1e-15).
    Memory is O(batch × n + K × n_resamples), independent of how many columns are done together.
    """
    v = np.asarray(values, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    scalar = v.ndim == 1
    if scalar:
        v, w = v[:, None], w[:, None]
    n, K = v.shape
    if w.shape != v.shape:
        raise ValueError("values and weights must have the same shape")
    if n < 2:
        nan = np.full(K, np.nan)
        mean = (w * v).sum(0) / w.sum(0)
        return (mean[0], nan[0], nan[0]) if scalar else (mean, nan, nan)

    wv = w * v
    both = np.ascontiguousarray(np.concatenate([wv, w], axis=1))  # (n, 2K)
    # scipy: check_random_state(int) is a legacy RandomState; rng_integers → randint(0, n, (B, n)) as int64.
    # Bounded 32-bit draws are not buffered per call, so drawing batch by batch gives the same stream.
    rs = random_state if isinstance(random_state, np.random.RandomState) else np.random.RandomState(random_state)
    sums = np.empty((n_resamples, 2 * K))
    offsets = None
    for start in range(0, n_resamples, batch):
        b = min(batch, n_resamples - start)
        idx = rs.randint(0, n, (b, n), dtype=np.int64)
        if offsets is None or len(offsets) != b:
            offsets = (np.arange(b, dtype=np.int64) * n)[:, None]
        counts = np.bincount((idx + offsets).ravel(), minlength=b * n).reshape(b, n).astype(np.float64)
        sums[start:start + b] = counts @ both
    theta_b = (sums[:, :K] / sums[:, K:]).T  # (K, B)

    # statistic on the original sample, one column at a time (1-D sums, like scipy's own call)
    theta_hat = np.array([np.average(v[:, k], weights=w[:, k]) for k in range(K)])

    # z0: percentile of theta_hat in the bootstrap distribution ('mean' kind)
    th = theta_hat[:, None]
    pct = (np.count_nonzero(theta_b < th, axis=-1) + np.count_nonzero(theta_b <= th, axis=-1)) / (2 * n_resamples)
    z0 = ndtri(pct)

    # acceleration from the closed-form jackknife: mean without user i = (Σwv − w_i v_i) / (Σw − w_i)
    with np.errstate(divide="ignore", invalid="ignore"):
        theta_i = (wv.sum(0) - wv) / (w.sum(0) - w)  # (n, K)
        U = (n - 1) * (theta_i.mean(0) - theta_i)
        num = (U**3).sum(0) / n**3
        den = (U**2).sum(0) / n**2
        a_hat = 1 / 6 * num / den ** (3 / 2)

        alpha = (1 - confidence_level) / 2
        z_alpha = float(ndtri(alpha))
        num1 = z0 + z_alpha
        alpha_1 = ndtr(z0 + num1 / (1 - a_hat * num1))
        num2 = z0 - z_alpha
        alpha_2 = ndtr(z0 + num2 / (1 - a_hat * num2))
    low = np.full(K, np.nan)
    high = np.full(K, np.nan)
    ok = np.isfinite(alpha_1) & np.isfinite(alpha_2)
    if ok.any():
        from scipy import stats

        ci = stats.quantile(theta_b[ok], np.stack([alpha_1[ok], alpha_2[ok]], axis=-1), axis=-1)
        low[ok], high[ok] = ci[:, 0], ci[:, 1]
    # A degenerate column (every user has the same value) has no spread: the interval is the point itself.
    flat = ~ok & (np.ptp(theta_b, axis=-1) == 0)
    low[flat] = high[flat] = theta_hat[flat]
    if scalar:
        return theta_hat[0], low[0], high[0]
    return theta_hat, low, high


# ---------------------------------------------------------------------------------------------------------------
# Formatting


def sigdig(mean: float, ci: float) -> str:
    """Upstream's format: ± with 2 significant digits, the mean with the same number of decimals.

    If rounding carries the interval to the next power of ten (0.00999 → 0.0100), one decimal fewer is used
    for both (0.010). Intervals of 10 or more round to tens, hundreds, … and print as integers.
    """
    if not (math.isfinite(mean)):
        return "nan"
    if not math.isfinite(ci) or ci <= 0:
        return f"{mean:.4f}" if math.isfinite(mean) else "nan"
    exponent = math.floor(math.log10(ci))
    decimals = 1 - exponent  # 2 significant digits
    rounded = round(ci, decimals)
    if rounded >= 10.0 ** (exponent + 1):  # the carry made it 3 digits long
        decimals -= 1
        rounded = round(ci, decimals)
    shown_mean = round(mean, decimals)
    if decimals > 0:
        return f"{shown_mean:.{decimals}f}±{rounded:.{decimals}f}"
    return f"{shown_mean:.0f}±{rounded:.0f}"


def format_int(n: int) -> str:
    return f"{n:,}"


# ---------------------------------------------------------------------------------------------------------------
# Tables


@dataclass
class Cell:
    mean: float
    ci: float  # half width
    n: int  # users with a value

    @property
    def text(self) -> str:
        return sigdig(self.mean, self.ci)


def compute_table_cells(models: list[ModelResults], *, weighted: bool, n_resamples=9999, random_state=42,
                        batch=500) -> dict[tuple[str, str], Cell]:
    """Mean and CI for every (model, metric). Columns with the same valid-user set share one bootstrap pass."""
    columns = []  # (model, metric, mask)
    for m in models:
        for key, _, _ in METRICS:
            vals = m.metrics[key]
            columns.append((m, key, np.isfinite(vals)))
    groups: dict[bytes, list] = {}
    for col in columns:
        groups.setdefault(np.packbits(col[2]).tobytes() + bytes([len(col[2]) % 8]), []).append(col)
    cells = {}
    for cols in groups.values():
        mask = cols[0][2]
        if not mask.any():
            for m, key, _ in cols:
                cells[(m.name, key)] = Cell(math.nan, math.nan, 0)
            continue
        vals = np.stack([m.metrics[key][mask] for m, key, _ in cols], axis=1)
        wts = np.stack([m.size[mask] if weighted else np.ones(mask.sum()) for m, _, _ in cols], axis=1)
        mean, low, high = weighted_mean_cis(vals, wts, n_resamples=n_resamples, random_state=random_state,
                                            batch=batch)
        for j, (m, key, _) in enumerate(cols):
            cells[(m.name, key)] = Cell(float(mean[j]), float((high[j] - low[j]) / 2), int(mask.sum()))
    return cells


def parameter_label(m: ModelResults) -> str:
    """Known names: the README's count (KNOWN_MODELS), whatever the result's `parameters` list holds, except the
    COUNT_FROM_RESULT names, whose list length is the count. Unknown names: the list length, or "?"."""
    base = known_base(m.name)
    if base is None and (day := _same_day_base(m.name)) is not None:  # a -short-secs row counts as its model
        base = known_base(day)
    if base is None or (base in COUNT_FROM_RESULT and m.n_params):
        return str(m.n_params) if m.n_params is not None else "?"
    return str(KNOWN_MODELS[base][0])


def row_labels(models: list[ModelResults], display: bool = True) -> dict[str, str]:
    """Table/plot label of each result name: upstream's README name (`display_name`), or the file name when
    `display` is off or when two files would get the same README name (e.g. "FSRS-6-dry-run" and "FSRS-6-default")."""
    labels = {m.name: display_name(m.name) if display else m.name for m in models}
    counts: dict[str, int] = {}
    for label in labels.values():
        counts[label] = counts.get(label, 0) + 1
    return {name: (label if counts[label] == 1 else name) for name, label in labels.items()}


def render_table(models: list[ModelResults], cells: dict[tuple[str, str], Cell],
                 labels: dict[str, str] | None = None) -> str:
    labels = labels or {}
    show_features = any(known_model(m.name) for m in models)
    header = ["Model", "Parameters"] + [h for _, h, _ in METRICS] + (["Input features"] if show_features else [])
    best = {}
    for key, _, lower in METRICS:
        vals = [cells[(m.name, key)].mean for m in models if math.isfinite(cells[(m.name, key)].mean)]
        best[key] = (min(vals) if lower else max(vals)) if vals else None

    def sort_key(m):
        mean = cells[(m.name, "LogLoss")].mean
        return (not math.isfinite(mean), mean if math.isfinite(mean) else 0.0, m.name)

    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    for m in sorted(models, key=sort_key):
        texts, any_best = [], False
        for key, _, _ in METRICS:
            cell = cells[(m.name, key)]
            text = cell.text
            if best[key] is not None and cell.mean == best[key]:
                text, any_best = f"**{text}**", True
            texts.append(text)
        label = labels.get(m.name, m.name)
        row = [f"**{label}**" if any_best else label, parameter_label(m)] + texts
        if show_features:
            row.append((known_model(m.name) or (None, ""))[1])
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def build_tables(models: list[ModelResults], info: dict, *, n_resamples=9999, random_state=42,
                 scales=("reviews", "users"), display: bool = True) -> str:
    labels = row_labels(models, display)
    parts = [f"Total number of users: {format_int(info['users'])}.", "",
             f"Total number of reviews for evaluation: {format_int(info['reviews'])}.", "",
             "The tables show means and 99% confidence intervals (BCa bootstrap). The best result is in **bold**. "
             "\"Parameters\" is the number of trainable parameters per user.", ""]
    titles = {"reviews": "### Weighted by the number of reviews", "users": "### Unweighted"}
    for scale in scales:
        cells = compute_table_cells(models, weighted=(scale == "reviews"), n_resamples=n_resamples,
                                    random_state=random_state)
        parts += [titles[scale], "", render_table(models, cells, labels), ""]
    if any(known_model(m.name) for m in models):
        parts.append("Input features: " + "; ".join(f"{k} = {v}" for k, v in FEATURE_LEGEND.items()) + ".")
    return "\n".join(parts).rstrip() + "\n"


def replace_between_markers(text: str, content: str, path: str = "README") -> str:
    start = text.find(START_MARKER)
    end = text.find(END_MARKER)
    if start < 0 or end < 0 or end < start:
        raise ValueError(f"{path}: needs the markers {START_MARKER} and {END_MARKER} (in this order) "
                         "around the place where the tables go")
    if text.count(START_MARKER) > 1 or text.count(END_MARKER) > 1:
        raise ValueError(f"{path}: the table markers must appear once each")
    return text[:start + len(START_MARKER)] + "\n" + content.rstrip("\n") + "\n" + text[end:]


def rewrite_readme(path: Path, content: str) -> None:
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    path.write_text(replace_between_markers(text, content, str(path)), encoding="utf-8")


# ---------------------------------------------------------------------------------------------------------------
# Upstream's current layout: two unweighted tables, without / with same-day reviews

# The flags of upstream's result-file names, in the order upstream's names spell them.
_FLAG_ORDER = ("short", "secs", "duration", "recency", "equalize_test_with_non_secs")
# Modes that come right after the algorithm, before the flags ("FSRS-6-S0-short", "FSRS-7-default-short-secs...").
_MODES = ("default", "dry-run", "S0", "pretrain", "sched_penalties", "binary")


def current_name(name: str) -> str:
    """Upstream's current result-file name of an srs-bench result name: the flags a model always runs with
    (config.ALWAYS_SHORT: short; config.BUILTIN_FLAGS: e.g. the LSTM's secs, duration, equalize_test_with_non_secs)
    are spelled out in upstream's order. "FSRS-6" → "FSRS-6-short", "FSRS-6-binary" → "FSRS-6-binary-short",
    "FSRS-6-recency" → "FSRS-6-short-recency", "FSRS-7-preset" →
    "FSRS-7-short-secs-equalize_test_with_non_secs-preset", "LSTM" →
    "LSTM-short-secs-duration-equalize_test_with_non_secs". Other names, and names already spelled upstream's way,
    are returned unchanged."""
    algos = sorted(set(ALWAYS_SHORT) | set(BUILTIN_FLAGS), key=len, reverse=True)  # "FSRS-6-one-step" first
    algo = next((a for a in algos if name == a or name.startswith(a + "-")), None)
    if algo is None:
        return name
    rest = name[len(algo) + 1:]
    modes = []
    while True:
        mode = next((m for m in _MODES if rest == m or rest.startswith(m + "-")), None)
        if mode is None:
            break
        modes.append(mode)
        rest = rest[len(mode) + 1:]
    tokens = [t for t in rest.split("-") if t] if rest else []
    if "secs" in tokens:  # a secs row spells its flags as upstream does (config.RunConfig.name)
        return name
    flags = set(BUILTIN_FLAGS.get(algo, ())) | ({"short"} if algo in ALWAYS_SHORT else set())
    flags |= {t for t in tokens if t in _FLAG_ORDER}
    others = [t for t in tokens if t not in _FLAG_ORDER]
    return "-".join([algo, *modes, *(f for f in _FLAG_ORDER if f in flags), *others])


def with_same_day(name: str) -> bool:
    """Whether a result file belongs to upstream's "With same-day reviews" table (`--secs`): its upstream name has
    the secs flag and is not equalized to the day-level test set (upstream's `-short-secs` files)."""
    tokens = current_name(name).split("-")
    return "secs" in tokens and "equalize_test_with_non_secs" not in tokens


# Upstream's current file name → the row name its current tables show. Names not listed: `display_name`'s label.
# In the same-day table the -short-secs baselines carry their bare names ("DASH-short-secs" → "DASH"); in the
# other table "DASH-short" stays "DASH-short".
CURRENT_LABELS: dict[str, str] = {
    "LSTM-short-secs-duration-equalize_test_with_non_secs": "LSTM",
    "LSTM-short-secs-duration": "LSTM",
    "GRU-short-secs-equalize_test_with_non_secs": "GRU",
    "GRU-short-secs": "GRU",
    "LogisticRegression-short-secs-recency-equalize_test_with_non_secs": "Logistic Regression",
    "LogisticRegression-short-secs-recency": "Logistic Regression",
    "FSRS-7-short-secs-equalize_test_with_non_secs": "FSRS-7",
    "FSRS-7-short-secs": "FSRS-7",
    "FSRS-7-short-secs-recency-equalize_test_with_non_secs": "FSRS-7 recency",
    "FSRS-7-short-secs-recency": "FSRS-7 recency",
    "FSRS-7-short-secs-equalize_test_with_non_secs-preset": "FSRS-7 preset",
    "FSRS-7-short-secs-preset": "FSRS-7 preset",
    "FSRS-7-short-secs-equalize_test_with_non_secs-deck": "FSRS-7 deck",
    "FSRS-7-short-secs-deck": "FSRS-7 deck",
    "FSRS-7-default-short-secs-equalize_test_with_non_secs": "FSRS-7 default param.",
    "FSRS-7-default-short-secs": "FSRS-7 default param.",
    "FSRS-7-sched_penalties-short-secs-equalize_test_with_non_secs": "FSRS-7 sched. penalties",
    "FSRS-7-sched_penalties-short-secs": "FSRS-7 sched. penalties",
    "FSRS-7-sched_penalties-short-secs-recency-equalize_test_with_non_secs": "FSRS-7 recency + sched. penalties",
    "FSRS-7-sched_penalties-short-secs-recency": "FSRS-7 recency + sched. penalties",
    "FSRS-6-short": "FSRS-6",
    "FSRS-6-short-secs": "FSRS-6",
    "FSRS-6-short-recency": "FSRS-6 recency",
    "FSRS-6-short-secs-recency": "FSRS-6 recency",
    "FSRS-6-short-preset": "FSRS-6 preset",
    "FSRS-6-short-secs-preset": "FSRS-6 preset",
    "FSRS-6-short-deck": "FSRS-6 deck",
    "FSRS-6-short-secs-deck": "FSRS-6 deck",
    "FSRS-6-binary-short": "FSRS-6 binary",
    "FSRS-6-binary-short-secs": "FSRS-6 binary",
    "FSRS-6-S0-short": "FSRS-6 S0",
    "FSRS-6-S0-short-secs": "FSRS-6 S0",
    "FSRS-6-default-short": "FSRS-6 default param.",
    "FSRS-6-default-short-secs": "FSRS-6 default param.",
    "FSRS-rs-short": "FSRS-rs",
    "FSRS-5-short": "FSRS-5",
    "FSRS-5-short-secs": "FSRS-5",
    "FSRS-5-short-recency": "FSRS-5 recency",
    "FSRS-5-short-preset": "FSRS-5 preset",
    "FSRS-5-short-deck": "FSRS-5 deck",
    "FSRS-5-binary-short": "FSRS-5 binary",
    "FSRS-5-S0-short": "FSRS-5 S0",
    "FSRS-5-default-short": "FSRS-5 default param.",
    "FSRS-4.5-short-secs": "FSRS-4.5",
    "FSRSv4-short-secs": "FSRS v4",
    "FSRSv3-short-secs": "FSRS v3",
    "FSRSv2-short-secs": "FSRS v2",
    "FSRSv1-short-secs": "FSRS v1",
    "Ebisu-v2-short-secs": "Ebisu v2",
    "MOVING-AVG-short-secs": "MOVING-AVG",
    "AVG-short-secs": "AVG",
    "DASH-short-secs": "DASH",
    "DASH[MCM]-short-secs": "DASH[MCM]",
    "DASH[ACT-R]-short-secs": "DASH[ACT-R]",
    "ACT-R-short-secs": "ACT-R",
    "HLR-short-secs": "HLR",
    "RMSE-BINS-EXPLOIT-short-secs": "RMSE-BINS-EXPLOIT",
    "Anki-short-secs": "Anki",
    "Anki": "Anki",
    "Anki-default": "Anki default param.",
    "SM2": "SM2",
    "SM2-short": "SM2-short",
    "SM2-trainable": "SM2-trainable",
    "SM2-trainable-short-secs": "SM2-trainable",
}

CURRENT_METRIC_HEADERS = {"LogLoss": "Log Loss↓", "RMSE(bins)": "RMSE(bins)↓", "AUC": "AUC↑"}
TABLE_TITLES = {False: "Without same-day reviews", True: "With same-day reviews"}


def current_label(name: str) -> str:
    """Row name of a result file in upstream's current tables (CURRENT_LABELS over `current_name`). A same-day
    row not listed there is named as its day-level row ("FSRS-7-short-secs-recency-deck" as "FSRS-7-recency-deck"),
    since the table's title already says it is the same-day run."""
    upstream = current_name(name)
    if upstream in CURRENT_LABELS:
        return CURRENT_LABELS[upstream]
    if with_same_day(name):
        return current_label(upstream.replace("-short-secs", "", 1).replace("-duration", "", 1))
    return display_name(name)


def current_row_labels(models: list[ModelResults], display: bool = True) -> dict[str, str]:
    """`row_labels` for the current layout: the file name when `display` is off or when two files of one table
    would show the same row name."""
    labels = {m.name: current_label(m.name) if display else m.name for m in models}
    counts: dict[str, int] = {}
    for label in labels.values():
        counts[label] = counts.get(label, 0) + 1
    return {name: (label if counts[label] == 1 else name) for name, label in labels.items()}


def _same_day_base(name: str) -> str | None:
    """The day-level name of a -short-secs file ("DASH-short-secs" → "DASH"), for its parameter count."""
    if "-short-secs" not in name:
        return None
    return name.replace("-short-secs", "").replace("-duration", "")


def current_parameters_and_features(m: ModelResults) -> tuple[str, str]:
    """Parameters and input features of a row of the current layout. A -short-secs file unknown under its own name
    counts as its day-level model, with fractional intervals and same-day reviews (upstream: "IL, G" → "FIL, G,
    SR")."""
    known = known_model(m.name)
    if known is not None:
        return parameter_label(m), known[1]
    base = _same_day_base(m.name)
    if base is not None and known_model(base) is not None:
        count, features = known_model(base)
        if features != "---":
            parts = list(dict.fromkeys("FIL" if f == "IL" else f for f in features.split(", ")))
            features = ", ".join(parts + (["SR"] if "SR" not in parts else []))
        return str(count), features
    return parameter_label(m), ""


def render_current_table(models: list[ModelResults], cells: dict[tuple[str, str], Cell],
                         labels: dict[str, str]) -> str:
    """Upstream's current table: rows by Log Loss; per metric column ONE best cell in bold (the first row in table
    order on a tie) and the name of each row holding one."""

    def sort_key(m):
        mean = cells[(m.name, "LogLoss")].mean
        return (not math.isfinite(mean), mean if math.isfinite(mean) else 0.0, m.name)

    ordered = sorted(models, key=sort_key)
    best_row: dict[str, str] = {}
    for key, _, lower in METRICS:
        candidates = [(cells[(m.name, key)].mean, i) for i, m in enumerate(ordered)
                      if math.isfinite(cells[(m.name, key)].mean)]
        if candidates:
            value = min(v for v, _ in candidates) if lower else max(v for v, _ in candidates)
            best_row[key] = ordered[min(i for v, i in candidates if v == value)].name
    header = ["Model", "Parameters"] + [CURRENT_METRIC_HEADERS[k] for k, _, _ in METRICS] + ["Input features"]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    for m in ordered:
        texts = []
        for key, _, _ in METRICS:
            cell = cells[(m.name, key)]
            text = cell.text if cell.n else "N/A"
            texts.append(f"**{text}**" if best_row.get(key) == m.name else text)
        label = labels.get(m.name, m.name)
        params, features = current_parameters_and_features(m)
        row = [f"**{label}**" if m.name in best_row.values() else label, params] + texts + [features]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def split_by_table(models: list[ModelResults]) -> dict[bool, list[ModelResults]]:
    """{False: the without-same-day table's files, True: the with-same-day table's} (`with_same_day`)."""
    out: dict[bool, list[ModelResults]] = {False: [], True: []}
    for m in models:
        out[with_same_day(m.name)].append(m)
    return out


def build_current_table(models: list[ModelResults], secs: bool, *, n_resamples=9999, random_state=42,
                        display: bool = True) -> tuple[str, list[ModelResults], dict]:
    """One table of the current layout over the files that belong to it, restricted to their common users.
    Returns (markdown, the table's models restricted to the common users, info)."""
    title = f"### {TABLE_TITLES[secs]}"
    chosen = split_by_table(models)[secs]
    if not chosen:
        return (f"{title}\n\nNo result file belongs to this table (" + ("upstream's -short-secs files, e.g. DASH-short-secs" if secs else "every file but the -short-secs ones") + ").\n"), [], {"users": 0, "reviews": 0}
    chosen, info = common_users(chosen)
    if info["users"] == 0:
        return f"{title}\n\nNo user is present in every result file of this table.\n", chosen, info
    cells = compute_table_cells(chosen, weighted=False, n_resamples=n_resamples, random_state=random_state)
    parts = [title, "", f"Total number of users: {format_int(info['users'])}.", "",
             f"Total number of reviews for evaluation: {format_int(info['reviews'])}.", "",
             "Unweighted means over users (every user counts once) with 99% confidence intervals (BCa bootstrap). "
             "The best value of each column is in **bold**, and so is the name of its row. \"Parameters\" is the "
             "number of trainable parameters per user.", "",
             render_current_table(chosen, cells, current_row_labels(chosen, display)), ""]
    return "\n".join(parts), chosen, info


def build_current_tables(models: list[ModelResults], tables=(False,), *, n_resamples=9999, random_state=42,
                         display: bool = True) -> tuple[str, list[ModelResults], list[dict]]:
    """The current layout's tables (False: without, True: with same-day reviews), then the input-feature legend."""
    parts, shown, infos = [], [], []
    for secs in tables:
        text, chosen, info = build_current_table(models, secs, n_resamples=n_resamples, random_state=random_state,
                                                 display=display)
        parts.append(text)
        if info["users"]:
            shown.append(chosen)
            infos.append(info)
    if shown:
        parts.append("Input features: " + "; ".join(f"{k} = {v}" for k, v in FEATURE_LEGEND.items()) + ".")
    return "\n".join(parts).rstrip() + "\n", [m for ms in shown[:1] for m in ms], infos


# ---------------------------------------------------------------------------------------------------------------
# Command line


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="README tables (means, 99% BCa CIs), superiority, significance and "
                                            "calibration plots from per-user result files.")
    p.add_argument("--results", type=Path, default=REPO_ROOT / "result", help="folder of <model>.jsonl result files")
    p.add_argument("--models", type=lambda s: [x.strip() for x in s.split(",") if x.strip()], default=None,
                   help="comma-separated row names (file names without .jsonl); default: every file in --results")
    p.add_argument("--readme", type=Path, default=None,
                   help=f"rewrite the text between {START_MARKER} and {END_MARKER} in this file with the tables")
    p.add_argument("--plots", type=Path, default=REPO_ROOT / "plots", help="folder for the PNG plots (superiority, significance, calibration)")
    p.add_argument("--layout", choices=["current", "seeds"], default="current",
                   help="current: upstream's current tables, unweighted per-user means only, one table per run "
                        "(without same-day reviews; --secs: with them; --all-tables: both), only the best cell "
                        "of each column and its row name in bold; seeds: the layout of the seeds' published "
                        "numbers, byte for byte as before: a review-weighted and an unweighted table (--scale) over "
                        "every result file, every best cell in bold")
    p.add_argument("--secs", action="store_true",
                   help="current layout: the \"With same-day reviews\" table, over the result files whose upstream "
                        "name has the secs flag and is not equalize_test_with_non_secs (upstream's -short-secs "
                        "files); without it, the \"Without same-day reviews\" table over all the other files")
    p.add_argument("--all-tables", dest="all_tables", action="store_true",
                   help="current layout: both tables, without then with same-day reviews (run_table.py uses this "
                        "for the README); a table no result file belongs to says so")
    p.add_argument("--scale", choices=["both", "reviews", "users"], default=None,
                   help="seeds layout: which tables, weighted by reviews, unweighted (per user), or both (default: "
                        "both). The current layout is unweighted only (--scale users is accepted there)")
    p.add_argument("--superiority", action="store_true", help="also write plots/Superiority-<n>.png")
    p.add_argument("--significance", action="store_true",
                   help="also write plots/Wilcoxon-<n>-collections.png and plots/T-test-<n>-collections.png")
    p.add_argument("--calibration", metavar="MODEL", default=None,
                   help="calibration plot of raw/<MODEL>.jsonl (predicted-R bins vs measured recall); "
                        "with this flag alone, no tables are computed")
    p.add_argument("--user", type=int, default=None, help="with --calibration: one user instead of all pooled")
    p.add_argument("--raw", type=Path, default=REPO_ROOT / "raw", help="folder of raw prediction files")
    p.add_argument("--bins", type=int, default=20, help="with --calibration: number of equal-width bins")
    p.add_argument("--n-resamples", type=int, default=9999, help="bootstrap resamples (upstream: 9999)")
    p.add_argument("--seed", type=int, default=42, help="bootstrap random_state (upstream: 42)")
    p.add_argument("--file-names", dest="file_names", action="store_true",
                   help="label table rows and plots with the result-file names (e.g. FSRS-6-dry-run, Anki) instead "
                        "of upstream's README names (FSRS-6 default param., Anki-SM-2 trainable)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.calibration:
        import analysis

        out = analysis.calibration_plot(args.raw / f"{args.calibration}.jsonl", args.plots, user=args.user,
                                        bins=args.bins, name=args.calibration)
        print(f"wrote {out}")
        if not (args.superiority or args.significance or args.readme or args.models):
            return 0

    if args.layout == "seeds" and (args.secs or args.all_tables):
        print("error: --secs and --all-tables are for --layout current (the seeds' layout has no same-day split)",
              file=sys.stderr)
        return 2
    if args.layout == "current" and args.scale not in (None, "users"):
        print(f"error: --scale {args.scale} is for --layout seeds: upstream's current tables are unweighted only",
              file=sys.stderr)
        return 2
    models = load_models(args.results, args.models)
    if args.layout == "current":
        return current_main(args, models)
    models, info = common_users(models)
    if info["users"] == 0:
        print("error: no user is present in every compared result file", file=sys.stderr)
        return 1
    print(users_note(models, info), file=sys.stderr)

    scales = ("reviews", "users") if args.scale in (None, "both") else (args.scale,)
    tables = build_tables(models, info, n_resamples=args.n_resamples, random_state=args.seed, scales=scales,
                          display=not args.file_names)
    return finish(args, tables, models, row_labels(models, display=not args.file_names))


def users_note(models: list[ModelResults], info: dict) -> str:
    """The stderr line on the users a table uses and the users it leaves out."""
    note = f"{len(models)} models, {format_int(info['users'])} users in common, " \
           f"{format_int(info['reviews'])} reviews"
    if info["excluded"]:
        worst = ", ".join(f"{k}: {v}" for k, v in info["missing_per_model"].items() if v)
        note += f"; {format_int(info['excluded'])} users excluded (missing from: {worst})"
    if info["sizes_differ"]:
        note += "; note: per-user sizes differ between models (each model is weighted by its own sizes)"
    return note


def current_main(args: argparse.Namespace, models: list[ModelResults]) -> int:
    """`main` for the current layout: one table (or both with --all-tables), each over its own files and users."""
    tables = (False, True) if args.all_tables else ((True,) if args.secs else (False,))
    text, plotted, infos = build_current_tables(models, tables, n_resamples=args.n_resamples, random_state=args.seed,
                                                display=not args.file_names)
    for secs in tables:
        chosen = split_by_table(models)[secs]
        line = f"{TABLE_TITLES[secs]}: {len(chosen)} result file(s)"
        if chosen:
            restricted, info = common_users(chosen)
            line += f"; {users_note(restricted, info)}"
        print(line, file=sys.stderr)
    if not infos:
        print(text)
        print("error: no table to show: no result file belongs to it, or no user is in all of its files",
              file=sys.stderr)
        return 1
    return finish(args, text, plotted, current_row_labels(plotted, display=not args.file_names))


def finish(args: argparse.Namespace, tables: str, models: list[ModelResults], labels: dict[str, str]) -> int:
    """Print the tables, rewrite the README block, draw the superiority/significance plots over `models`."""
    print(tables)
    if args.readme:
        try:
            rewrite_readme(args.readme, tables)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(f"rewrote the tables in {args.readme}", file=sys.stderr)

    if (args.superiority or args.significance) and models:
        import analysis

        names = [m.name for m in sorted(models, key=lambda m: np.mean(m.metrics["LogLoss"]))]
        by_name = {m.name: m for m in models}
        logloss = np.stack([by_name[n].metrics["LogLoss"] for n in names], axis=1)
        keep = np.isfinite(logloss).all(axis=1)
        logloss = logloss[keep]
        names = [labels[n] for n in names]
        if args.superiority:
            out = analysis.superiority_plot(logloss, names, args.plots)
            print(f"wrote {out}", file=sys.stderr)
        if args.significance:
            for out in analysis.significance_plots(logloss, names, args.plots):
                print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
