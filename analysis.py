"""Pairwise comparisons of models on per-user Log Loss, and calibration plots.

- `superiority`: share of users for which the row model's Log Loss is ≤ the column model's (upstream's
  superiority.py), rounded to 0.1% so that every (A, B) + (B, A) pair adds up to exactly 100.0%.
- `significance`: Wilcoxon signed-rank r and paired t-test Cohen's d for every pair, coloured as upstream's
  significance_table.py (red: row model worse, green: better, grey: p > 0.01; shades by effect size).
- `calibration_plot`: predicted-R bins vs measured recall from `raw/<model>.jsonl`.

Everything renders with matplotlib's Agg backend; no display is needed.
"""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.colors import LinearSegmentedColormap, ListedColormap  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

P_THRESHOLD = 0.01
LARGE, MEDIUM = 0.5, 0.2  # effect size > 0.5 large, (0.2, 0.5] medium, ≤ 0.2 small

# ---------------------------------------------------------------------------------------------------------------
# Superiority


def win_counts(logloss: np.ndarray) -> np.ndarray:
    """wins[a, b] = number of users with LogLoss_a ≤ LogLoss_b (a tie is a win for the row model).

    logloss: (users, models). The diagonal counts every user.
    """
    x = np.asarray(logloss, dtype=np.float64)
    m = x.shape[1]
    wins = np.empty((m, m), dtype=np.int64)
    for a in range(m):
        wins[a] = np.count_nonzero(x[:, [a]] <= x, axis=0)
    return wins


def _round_pair(wins_ab: int, wins_ba: int, n: int) -> tuple[int, int]:
    """(A,B), (B,A) in tenths of a percent, adding up to exactly 1000, with the least total rounding error.

    Exact rational arithmetic. Without ties the raw shares add up to 100% and the answer is a floor/ceil choice for
    each; at an exact .x5 the candidate whose (A,B) is even in the last digit wins (round half to even). With ties
    (counted for both rows) the raw shares add up to more than 100%; every split in between has the same total
    error, and the one closest to sharing the excess equally is used.
    """
    xa = Fraction(1000 * wins_ab, n)
    xb = Fraction(1000 * wins_ba, n)
    best = None
    for a in {math.floor(xa), math.ceil(xa)}:
        b = 1000 - a
        if b in (math.floor(xb), math.ceil(xb)):
            err = abs(a - xa) + abs(b - xb)
            key = (err, a % 2)
            if best is None or key < best[0]:
                best = (key, a)
    if best is None:  # ties: no floor/ceil pair adds up to 1000
        a = round((xa + 1000 - xb) / 2)
        a = min(max(a, 0), 1000)
        return a, 1000 - a
    return best[1], 1000 - best[1]


def superiority(logloss: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Returns (raw, rounded): raw[a, b] = share of users with LogLoss_a ≤ LogLoss_b, in % (ties count for the row
    model); rounded[a, b] in % with one decimal, rounded[a, b] + rounded[b, a] = 100.0 exactly (diagonal NaN)."""
    x = np.asarray(logloss, dtype=np.float64)
    n, m = x.shape
    wins = win_counts(x)
    raw = 100.0 * wins / n
    tenths = np.zeros((m, m), dtype=np.int64)
    for a in range(m):
        for b in range(a + 1, m):
            tenths[a, b], tenths[b, a] = _round_pair(int(wins[a, b]), int(wins[b, a]), n)
    rounded = tenths / 10.0
    np.fill_diagonal(raw, np.nan)
    np.fill_diagonal(rounded, np.nan)
    return raw, rounded


def _matrix_figure(m: int):
    side = max(6.0, 0.42 * m + 3.0)
    fig, ax = plt.subplots(figsize=(side + 1.5, side), dpi=150 if m <= 20 else 130)
    return fig, ax


def _label_axes(ax, names, title, xlabel="Column model (B)", ylabel="Row model (A)"):
    m = len(names)
    fs = 11 if m <= 12 else (10 if m <= 24 else 9.5)
    ax.set_xticks(range(m))
    ax.set_yticks(range(m))
    ax.set_xticklabels(names, rotation=55, ha="right", rotation_mode="anchor", fontsize=fs)
    ax.set_yticklabels(names, fontsize=fs)
    ax.set_xlabel(xlabel, fontsize=fs + 2)
    ax.set_ylabel(ylabel, fontsize=fs + 2)
    ax.set_title(title, fontsize=fs + 5 if m <= 24 else 17, pad=12)
    ax.set_xticks(np.arange(-0.5, m, 1), minor=True)
    ax.set_yticks(np.arange(-0.5, m, 1), minor=True)
    ax.grid(which="minor", color="white", linewidth=0.8)
    ax.tick_params(which="minor", length=0)
    for spine in ax.spines.values():
        spine.set_visible(False)


def _cell_font(m: int) -> float:
    return 10 if m <= 10 else (8.5 if m <= 16 else (7.5 if m <= 24 else 6.6))


def superiority_plot(logloss: np.ndarray, names: list[str], out_dir: Path, n_users: int | None = None) -> Path:
    """Heat map of the rounded superiority matrix → out_dir/Superiority-<n>.png. Models in the given order."""
    x = np.asarray(logloss, dtype=np.float64)
    n, m = x.shape
    _, rounded = superiority(x)
    fig, ax = _matrix_figure(m)
    cmap = LinearSegmentedColormap.from_list("sup", ["#c62828", "#f4a582", "#f7f7f7", "#92c5de", "#1565c0"])
    cmap = cmap.with_extremes(bad="#e0e0e0")
    im = ax.imshow(np.ma.masked_invalid(rounded), cmap=cmap, vmin=0, vmax=100)
    fs = _cell_font(m)
    for a in range(m):
        for b in range(m):
            if a == b:
                continue
            val = rounded[a, b]
            color = "white" if (val < 12 or val > 88) else "black"
            ax.text(b, a, f"{val:.1f}", ha="center", va="center", fontsize=fs, color=color)
    _label_axes(ax, names, f"Superiority: % of {n_users or n:,} collections where A's Log Loss ≤ B's")
    cbar = fig.colorbar(im, ax=ax, fraction=0.04, pad=0.02)
    cbar.set_label("% of collections where the row model is at least as good", fontsize=10)
    fig.tight_layout()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"Superiority-{n_users or n}.png"
    fig.savefig(path)
    plt.close(fig)
    return path


# ---------------------------------------------------------------------------------------------------------------
# Significance


@dataclass
class PairTest:
    p: float
    effect: float  # Wilcoxon r or Cohen's d (non-negative)
    direction: float  # median of non-zero x − y (Wilcoxon) or mean x − mean y (t-test); > 0: row model worse

    @property
    def worse(self) -> bool:
        return self.direction > 0


def wilcoxon_pair(x: np.ndarray, y: np.ndarray) -> PairTest:
    """Wilcoxon signed-rank on paired Log Loss: r = |z|/√n over the n non-zero differences.

    z = (W − n(n+1)/4) / √(n(n+1)(2n+1)/24) with W scipy's statistic (zero_method="wilcox", no continuity
    correction, no tie correction in σ). Sign: median of the non-zero differences x − y > 0 means the row is worse.
    """
    d = np.asarray(x, dtype=np.float64) - np.asarray(y, dtype=np.float64)
    nz = d[d != 0]
    n = nz.size
    if n == 0:
        return PairTest(1.0, 0.0, 0.0)
    from scipy import stats  # here, not at the top: ~0.4 s to import, and the report page never calls it

    res = stats.wilcoxon(x, y, zero_method="wilcox", correction=False)
    mu = n * (n + 1) / 4
    sigma = math.sqrt(n * (n + 1) * (2 * n + 1) / 24)
    z = (float(res.statistic) - mu) / sigma
    return PairTest(float(res.pvalue), abs(z) / math.sqrt(n), float(np.median(nz)))


def ttest_pair(x: np.ndarray, y: np.ndarray) -> PairTest:
    """Paired t-test; Cohen's d = |mean x − mean y| / √((sd_x² + sd_y²)/2) with ddof = 1 SDs of each model."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    diff = x.mean() - y.mean()
    pooled = math.sqrt((x.std(ddof=1) ** 2 + y.std(ddof=1) ** 2) / 2)
    if np.all(x == y):
        return PairTest(1.0, 0.0, 0.0)
    from scipy import stats  # here, not at the top: see wilcoxon_pair

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        p = float(stats.ttest_rel(x, y).pvalue)
    d = abs(diff) / pooled if pooled > 0 else math.inf
    return PairTest(p if math.isfinite(p) else 1.0, d, float(diff))


def effect_matrix(logloss: np.ndarray, test) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(p, effect, worse) matrices for every ordered pair; the diagonal is NaN / False."""
    x = np.asarray(logloss, dtype=np.float64)
    m = x.shape[1]
    p = np.full((m, m), np.nan)
    eff = np.full((m, m), np.nan)
    worse = np.zeros((m, m), dtype=bool)
    for a in range(m):
        for b in range(a + 1, m):
            r = test(x[:, a], x[:, b])
            p[a, b] = p[b, a] = r.p
            eff[a, b] = eff[b, a] = r.effect
            worse[a, b] = r.direction > 0  # the (b, a) test has the opposite direction
            worse[b, a] = r.direction < 0
    return p, eff, worse


# colour classes: 0 grey, 1..3 green small/medium/large, 4..6 red small/medium/large, 7 diagonal
CLASS_COLORS = ["#cfcfcf", "#c7e9c0", "#74c476", "#1b7837", "#fcbba1", "#ef6548", "#b2182b", "#ffffff"]
SHADE_NAMES = ["small", "medium", "large"]


def color_classes(p: np.ndarray, eff: np.ndarray, worse: np.ndarray) -> np.ndarray:
    shade = np.where(eff > LARGE, 2, np.where(eff > MEDIUM, 1, 0))
    cls = np.where(worse, 4 + shade, 1 + shade)
    cls = np.where(p > P_THRESHOLD, 0, cls)
    cls = np.where(np.isnan(p), 7, cls)
    return cls


def significance_plot(logloss: np.ndarray, names: list[str], out_dir: Path, kind: str,
                      n_users: int | None = None) -> Path:
    """kind "wilcoxon" → Wilcoxon-<n>-collections.png (r), "ttest" → T-test-<n>-collections.png (Cohen's d)."""
    x = np.asarray(logloss, dtype=np.float64)
    n, m = x.shape
    if kind == "wilcoxon":
        test, symbol, title, fname = wilcoxon_pair, "r", "Wilcoxon signed-rank test, effect size r", "Wilcoxon"
    elif kind == "ttest":
        test, symbol, title, fname = ttest_pair, "d", "Paired t-test, effect size Cohen's d", "T-test"
    else:
        raise ValueError(kind)
    p, eff, worse = effect_matrix(x, test)
    cls = color_classes(p, eff, worse)
    fig, ax = _matrix_figure(m)
    ax.imshow(cls, cmap=ListedColormap(CLASS_COLORS), vmin=-0.5, vmax=len(CLASS_COLORS) - 0.5)
    fs = _cell_font(m)
    for a in range(m):
        for b in range(m):
            if a == b:
                continue
            text_color = "white" if cls[a, b] in (3, 6) else "black"
            ax.text(b, a, f"{eff[a, b]:.2f}", ha="center", va="center", fontsize=fs, color=text_color)
    _label_axes(ax, names, f"{title} on Log Loss, {n_users or n:,} collections")
    handles = []
    for group, offset, label in (("red", 4, "row worse"), ("green", 1, "row better")):
        for i, shade in enumerate(reversed(SHADE_NAMES)):
            lvl = 2 - i
            rng = {2: f"{symbol} > {LARGE}", 1: f"{MEDIUM} < {symbol} ≤ {LARGE}", 0: f"{symbol} ≤ {MEDIUM}"}[lvl]
            handles.append(Patch(facecolor=CLASS_COLORS[offset + lvl], edgecolor="#777777",
                                 label=f"{label}, {shade} ({rng})"))
    handles.append(Patch(facecolor=CLASS_COLORS[0], edgecolor="#777777",
                         label=f"p > {P_THRESHOLD}: no conclusion"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=11 if m <= 12 else 13,
              title=f"Row vs column (cell = {symbol})", title_fontsize=12 if m <= 12 else 14, frameon=False)
    fig.tight_layout()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{fname}-{n_users or n}-collections.png"
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
    return path


def significance_plots(logloss: np.ndarray, names: list[str], out_dir: Path) -> list[Path]:
    return [significance_plot(logloss, names, out_dir, kind) for kind in ("wilcoxon", "ttest")]


# ---------------------------------------------------------------------------------------------------------------
# Calibration


def read_raw(path: Path, user: int | None = None) -> tuple[np.ndarray, np.ndarray, int]:
    """Pooled (p, y) from raw/<model>.jsonl (one user if given); returns (p, y, users read)."""
    ps, ys, users = [], [], 0
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                uid = int(obj["user"])
                p, y = obj["p"], obj["y"]
            except (ValueError, KeyError, TypeError):
                warnings.warn(f"{path}:{lineno}: unreadable line skipped", stacklevel=2)
                continue
            if user is not None and uid != user:
                continue
            if len(p) != len(y):
                warnings.warn(f"{path}:{lineno}: p and y differ in length; skipped", stacklevel=2)
                continue
            ps.append(np.asarray(p, dtype=np.float64))
            ys.append(np.asarray(y, dtype=np.float64))
            users += 1
    if not ps:
        raise ValueError(f"{path}: no predictions" + (f" for user {user}" if user is not None else ""))
    return np.concatenate(ps), np.concatenate(ys), users


def calibration_bins(p: np.ndarray, y: np.ndarray, bins: int = 20):
    """Equal-width predicted-R bins on [0, 1]: (mean p, mean y, count) of the non-empty bins, and
    count-weighted MAE and RMSE between the two means."""
    p = np.asarray(p, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    idx = np.clip((p * bins).astype(np.int64), 0, bins - 1)
    count = np.bincount(idx, minlength=bins)
    sum_p = np.bincount(idx, weights=p, minlength=bins)
    sum_y = np.bincount(idx, weights=y, minlength=bins)
    keep = count > 0
    mean_p = sum_p[keep] / count[keep]
    mean_y = sum_y[keep] / count[keep]
    cnt = count[keep]
    err = mean_y - mean_p
    mae = float(np.sum(cnt * np.abs(err)) / cnt.sum())
    rmse = float(np.sqrt(np.sum(cnt * err**2) / cnt.sum()))
    edges = np.linspace(0, 1, bins + 1)
    return {"mean_p": mean_p, "mean_y": mean_y, "count": cnt, "left": edges[:-1][keep], "width": 1 / bins,
            "mae": mae, "rmse": rmse}


def calibration_plot(raw_path: Path, out_dir: Path, *, user: int | None = None, bins: int = 20,
                     name: str | None = None) -> Path:
    raw_path = Path(raw_path)
    name = name or raw_path.stem
    p, y, users = read_raw(raw_path, user)
    cal = calibration_bins(p, y, bins)
    fig, ax = plt.subplots(figsize=(8, 7), dpi=130)
    ax2 = ax.twinx()
    ax2.bar(cal["left"], cal["count"], width=cal["width"], align="edge", color="#9ecae1", alpha=0.45,
            edgecolor="#6baed6", linewidth=0.6, label="reviews per bin (right axis)")
    ax2.set_yscale("log")
    ax2.set_ylabel("Reviews per bin (log scale)", fontsize=12, color="#3182bd")
    ax2.tick_params(axis="y", colors="#3182bd")
    ax.set_zorder(ax2.get_zorder() + 1)
    ax.patch.set_visible(False)
    ax.plot([0, 1], [0, 1], "--", color="#ff7f0e", linewidth=1.8, label="perfect calibration")
    ax.plot(cal["mean_p"], cal["mean_y"], "-o", color="#08519c", linewidth=2, markersize=5,
            label=f"{name}: measured recall per bin")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel("Predicted probability of recall (R)", fontsize=12)
    ax.set_ylabel("Measured recall (share of successful reviews)", fontsize=12)
    who = f"user {user}" if user is not None else f"{users:,} users pooled"
    ax.set_title(f"Calibration of {name} ({who}, {len(p):,} reviews)", fontsize=13)
    ax.grid(True, alpha=0.3)
    ax.text(0.03, 0.97, f"MAE = {cal['mae']:.2%}\nRMSE = {cal['rmse']:.2%}\n{bins} bins, weighted by reviews",
            transform=ax.transAxes, va="top", ha="left", fontsize=12,
            bbox=dict(boxstyle="round", facecolor="white", edgecolor="#999999", alpha=0.9))
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, loc="lower right", fontsize=10, framealpha=0.9)
    fig.tight_layout()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    suffix = f"-user-{user}" if user is not None else ""
    path = out_dir / f"calibration-{name}{suffix}.png"
    fig.savefig(path)
    plt.close(fig)
    return path


# ---------------------------------------------------------------------------------------------------------------
# One collection's page (report.py): calibration of every model, head to head, per-user spread


def calibration_grid(cals: dict[str, dict], path: Path, title: str) -> Path:
    """Small multiples, one calibration plot per model on the same axes: measured vs predicted recall per bin, the
    reviews per bin as bars along the bottom (tallest = the bin with most reviews, its count written), MAE and RMSE
    written on each. `cals`: name → calibration_bins. Shared axes and no per-plot layout pass keep 45 models fast."""
    names = list(cals)
    cols = min(4, len(names))
    rows = math.ceil(len(names) / cols)
    height = 2.7 * rows + 1.0  # inches: the plots and a margin for the title and the axis label
    fig, axes = plt.subplots(rows, cols, figsize=(2.9 * cols, height), dpi=100, squeeze=False, sharex=True,
                             sharey=True)
    for ax, name in zip(axes.ravel(), names):
        cal = cals[name]
        ax.bar(cal["left"], 0.3 * cal["count"] / cal["count"].max(), width=cal["width"], align="edge",
               color="#9ecae1", alpha=0.6)
        ax.plot([0, 1], [0, 1], "--", color="#ff7f0e", linewidth=1.2)
        ax.plot(cal["mean_p"], cal["mean_y"], "-o", color="#08519c", linewidth=1.6, markersize=3)
        ax.set_title(name, fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.text(0.04, 0.96, f"MAE {cal['mae']:.1%}\nRMSE {cal['rmse']:.1%}\nbar max {int(cal['count'].max()):,}",
                transform=ax.transAxes, va="top", fontsize=7.5,
                bbox=dict(boxstyle="round", facecolor="white", edgecolor="#bbbbbb", alpha=0.9))
    axes[0, 0].set_xlim(0, 1)
    axes[0, 0].set_ylim(0, 1)
    for ax in axes.ravel()[len(names):]:
        ax.axis("off")
    fig.supxlabel("Predicted probability of recall (bins of 5%); bars: reviews per bin", fontsize=10)
    fig.supylabel("Measured recall", fontsize=10)
    fig.suptitle(title, fontsize=12)
    fig.subplots_adjust(left=0.07, right=0.98, bottom=0.55 / height, top=1 - 0.6 / height, wspace=0.08, hspace=0.3)
    fig.savefig(path)
    plt.close(fig)
    return Path(path)


def calibration_overlay(cals: dict[str, dict], path: Path, title: str) -> Path:
    """Two (or more) models' calibration curves on one plot, with the perfect diagonal."""
    fig, ax = plt.subplots(figsize=(6.5, 5.5), dpi=110)
    ax.plot([0, 1], [0, 1], "--", color="#888888", linewidth=1.2, label="perfect calibration")
    for (name, cal), color in zip(cals.items(), ["#1565c0", "#c62828", "#2e7d32", "#6a1b9a"]):
        ax.plot(cal["mean_p"], cal["mean_y"], "-o", color=color, linewidth=2, markersize=4,
                label=f"{name} (off by {cal['mae']:.1%} on average)")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel("Predicted probability of recall")
    ax.set_ylabel("Measured recall")
    ax.set_title(title, fontsize=11)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return Path(path)


def head_to_head_plot(share: np.ndarray, names: list[str], path: Path, title: str) -> Path:
    """Heat map of `share[a, b]`: % of resamples in which row model a's Log Loss is lower than column model b's."""
    m = len(names)
    fig, ax = _matrix_figure(m)
    cmap = LinearSegmentedColormap.from_list("h2h", ["#c62828", "#f4a582", "#f7f7f7", "#92c5de", "#1565c0"])
    im = ax.imshow(np.ma.masked_invalid(share), cmap=cmap.with_extremes(bad="#e0e0e0"), vmin=0, vmax=100)
    for a in range(m if m <= 24 else 0):  # beyond 24 models the numbers would not be legible: colours only
        for b in range(m):
            if a != b:
                val = share[a, b]
                ax.text(b, a, f"{val:.0f}", ha="center", va="center", fontsize=_cell_font(m),
                        color="white" if (val < 12 or val > 88) else "black")
    _label_axes(ax, names, title)
    cbar = fig.colorbar(im, ax=ax, fraction=0.04, pad=0.02)
    cbar.set_label("% of card resamples where the row model's Log Loss is lower", fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return Path(path)


def distribution_plot(logloss: np.ndarray, names: list[str], path: Path) -> Path:
    """Per-user Log Loss of every model (users × models), one box per model, best median first."""
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(names) + 1.5), dpi=110)
    ax.boxplot([logloss[:, k] for k in range(len(names))], orientation="horizontal", showfliers=True)
    ax.set_yticks(range(1, len(names) + 1))
    ax.set_yticklabels(names, fontsize=9)
    ax.invert_yaxis()
    ax.set_xlabel("Log Loss per collection (lower is better)")
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return Path(path)
