"""evaluate.py / analysis.py: table means and BCa intervals, formatting, superiority, significance, plots, CLI."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

import analysis
import evaluate


def write_results(folder: Path, name: str, rows):
    """rows: (user, size, logloss, rmse_bins, auc-or-None)."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"{name}.jsonl", "w") as fh:
        for user, size, ll, rb, auc in rows:
            fh.write(json.dumps({"metrics": {"RMSE": 0.1, "LogLoss": ll, "RMSE(bins)": rb, "AUC": auc, "ICI": 0.01,
                                             "MBE": 0.0}, "user": user, "size": size,
                                 "parameters": {"0": [0.1, 0.2, 0.3]}, "time_ms": 1.0}) + "\n")


# ---------------------------------------------------------------------------------------------------------------
# means and intervals


def test_weighted_and_unweighted_means_are_exact(tmp_path):
    write_results(tmp_path, "A", [(1, 1, 0.25, 0.125, 0.5), (2, 1, 0.5, 0.25, None), (3, 2, 0.75, 0.5, 0.75)])
    models, info = evaluate.common_users(evaluate.load_models(tmp_path))
    weighted = evaluate.compute_table_cells(models, weighted=True, n_resamples=199)
    unweighted = evaluate.compute_table_cells(models, weighted=False, n_resamples=199)
    assert weighted[("A", "LogLoss")].mean == (0.25 + 0.5 + 1.5) / 4 == 0.5625
    assert unweighted[("A", "LogLoss")].mean == 0.5
    assert weighted[("A", "RMSE(bins)")].mean == (0.125 + 0.25 + 1.0) / 4
    # the AUC-null user is dropped from the AUC column only
    assert weighted[("A", "AUC")].mean == (0.5 + 1.5) / 3
    assert unweighted[("A", "AUC")].mean == 0.625
    assert unweighted[("A", "AUC")].n == 2 and unweighted[("A", "LogLoss")].n == 3
    assert info["users"] == 3 and info["reviews"] == 4


@pytest.mark.parametrize("n, weighted, seed", [(30, True, 0), (57, False, 1), (80, True, 2)])
def test_fast_bca_matches_scipys_own_non_vectorised_call(n, weighted, seed):
    rng = np.random.default_rng(seed)
    values = np.round(rng.normal(0.35, 0.1, n), 6)
    weights = np.round(rng.lognormal(6, 1.5, n)) if weighted else np.ones(n)
    ids = np.arange(n)

    def weighted_mean(idx):  # one resample at a time: scipy's slow, reference path
        return np.average(values[idx], weights=weights[idx])

    ref = stats.bootstrap((ids,), weighted_mean, confidence_level=0.99, method="BCa", random_state=42,
                          vectorized=False)
    mean, low, high = evaluate.weighted_mean_cis(values, weights, batch=777)  # batches that do not divide 9999
    assert low == pytest.approx(ref.confidence_interval.low, abs=1e-12)
    assert high == pytest.approx(ref.confidence_interval.high, abs=1e-12)
    assert mean == pytest.approx(np.average(values, weights=weights), abs=1e-15)


def test_many_columns_at_once_equal_one_at_a_time():
    rng = np.random.default_rng(5)
    n = 200
    vals = rng.normal(0.4, 0.1, (n, 3))
    wts = np.column_stack([rng.lognormal(5, 1, n), np.ones(n), rng.lognormal(5, 1, n)])
    mean, low, high = evaluate.weighted_mean_cis(vals, wts, n_resamples=2000, batch=300)
    for k in range(3):
        lo, hi = evaluate.weighted_mean_ci_scipy(vals[:, k], wts[:, k], n_resamples=2000)
        assert (low[k], high[k]) == pytest.approx((lo, hi), abs=1e-12)


def test_degenerate_column_has_zero_width():
    mean, low, high = evaluate.weighted_mean_cis(np.full(20, 0.5), np.ones(20), n_resamples=99)
    assert mean == low == high == 0.5
    assert evaluate.sigdig(0.5, 0.0) == "0.5000"


@pytest.mark.parametrize("mean, ci, text", [
    (0.33321, 0.00412, "0.3332±0.0041"),
    (0.3771, 0.00999, "0.377±0.010"),  # 0.0100 would be 3 significant digits: one decimal fewer
    (0.3771, 0.00995, "0.377±0.010"),  # round-half bump too
    (0.3771, 0.00994, "0.3771±0.0099"),
    (0.0538, 0.00096, "0.05380±0.00096"),
    (4.6081, 0.0671, "4.608±0.067"),
    (4.5, 0.13, "4.50±0.13"),
    (0.312, 0.0078, "0.3120±0.0078"),
    (0.5, 0.0999, "0.50±0.10"),
    (12.34, 1.26, "12.3±1.3"),
    (123.4, 9.96, "123±10"),
    (123.4, 13.4, "123±13"),
    (1234.5, 134.0, "1230±130"),
])
def test_sigdig(mean, ci, text):
    assert evaluate.sigdig(mean, ci) == text


# ---------------------------------------------------------------------------------------------------------------
# tables, files, CLI


def three_models(folder: Path):
    # B misses user 4; C has an AUC null for user 2
    write_results(folder, "A", [(1, 10, 0.30, 0.05, 0.7), (2, 20, 0.35, 0.06, 0.6), (3, 30, 0.40, 0.07, 0.65),
                                (4, 40, 0.45, 0.08, 0.7)])
    write_results(folder, "B", [(1, 10, 0.31, 0.04, 0.72), (2, 20, 0.30, 0.05, 0.61), (3, 30, 0.42, 0.06, 0.66)])
    write_results(folder, "FSRS-6", [(1, 10, 0.50, 0.09, 0.5), (2, 20, 0.55, 0.10, None), (3, 30, 0.60, 0.11, 0.55),
                                     (4, 40, 0.62, 0.12, 0.5)])


def test_missing_users_are_excluded_and_reported(tmp_path, capsys):
    three_models(tmp_path / "result")
    assert evaluate.main(["--results", str(tmp_path / "result"), "--n-resamples", "99"]) == 0
    out, err = capsys.readouterr()
    assert "3 users in common" in err and "1 users excluded" in err and "B: 1" in err
    assert "Total number of users: 3." in out
    assert "Total number of reviews for evaluation: 60." in out
    models, info = evaluate.common_users(evaluate.load_models(tmp_path / "result"))
    assert info["excluded"] == 1 and all(list(m.users) == [1, 2, 3] for m in models)


def test_table_rows_sorted_by_logloss_with_best_in_bold(tmp_path, capsys):
    three_models(tmp_path / "result")
    evaluate.main(["--results", str(tmp_path / "result"), "--n-resamples", "99", "--layout", "seeds",
                   "--scale", "users"])
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "---" not in line][1:]
    names = [r.split("|")[1].strip().strip("*") for r in rows]
    assert names == ["B", "A", "FSRS-6"]  # mean LogLoss 0.343 < 0.35 < 0.55
    b, a, fsrs = rows
    assert b.split("|")[3].strip().startswith("**") and b.split("|")[4].strip().startswith("**")  # LogLoss, RMSE(bins)
    assert b.split("|")[5].strip().startswith("**")  # best AUC (0.663 vs 0.65)
    assert "**" not in a
    assert fsrs.split("|")[2].strip() == "21" and fsrs.split("|")[6].strip() == "IL, G, SR"
    assert a.split("|")[2].strip() == "3"  # unknown name: length of the parameters list


def test_bad_lines_are_skipped_with_a_warning(tmp_path):
    write_results(tmp_path, "A", [(1, 10, 0.3, 0.05, 0.7), (2, 20, 0.35, 0.06, 0.6)])
    with open(tmp_path / "A.jsonl", "a") as fh:
        fh.write("\n{\"metrics\": {\"LogLoss\": 0.4")  # blank line, then a torn last line
    with pytest.warns(UserWarning) as record:
        res = evaluate.read_result_file(tmp_path / "A.jsonl")
    messages = [str(w.message) for w in record]
    assert any("A.jsonl:3" in m and "blank" in m for m in messages)
    assert any("A.jsonl:4" in m and "unreadable" in m for m in messages)
    assert list(res.users) == [1, 2]


def test_result_files_with_and_without_smece_give_the_same_tables(tmp_path, capsys):
    """Result lines written before smECE joined the metrics read as before (smECE NaN); the tables' columns and
    numbers do not depend on it."""
    three_models(tmp_path / "old")
    new = tmp_path / "new"
    new.mkdir()
    for path in (tmp_path / "old").glob("*.jsonl"):
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        for k, line in enumerate(lines):
            line["metrics"] = {**{key: v for key, v in line["metrics"].items() if key != "AUC"},
                               "smECE": 0.01 * (k + 1), "AUC": line["metrics"]["AUC"]}
        (new / path.name).write_text("".join(json.dumps(line) + "\n" for line in lines))
    old_models = {m.name: m for m in evaluate.load_models(tmp_path / "old")}
    new_models = {m.name: m for m in evaluate.load_models(new)}
    assert np.isnan(old_models["A"].metrics["smECE"]).all()
    assert list(new_models["A"].metrics["smECE"]) == [0.01, 0.02, 0.03, 0.04]
    out = {}
    for folder in ("old", "new"):
        assert evaluate.main(["--results", str(tmp_path / folder), "--n-resamples", "99"]) == 0
        out[folder] = capsys.readouterr().out
    assert out["old"] == out["new"] and "Total number of users: 3." in out["old"] and "smECE" not in out["old"]


def test_readme_rewrite_between_markers(tmp_path):
    three_models(tmp_path / "result")
    readme = tmp_path / "README.md"
    readme.write_text("# Title\n\nintro\n<!-- tables:start -->\nold table\n<!-- tables:end -->\n\nafter\n")
    assert evaluate.main(["--results", str(tmp_path / "result"), "--n-resamples", "99", "--layout", "seeds",
                          "--readme", str(readme)]) == 0
    text = readme.read_text()
    assert "old table" not in text
    assert text.startswith("# Title\n\nintro\n<!-- tables:start -->\nTotal number of users: 3.")
    assert text.endswith("<!-- tables:end -->\n\nafter\n")
    assert "### Weighted by the number of reviews" in text and "### Unweighted" in text
    again = text
    evaluate.main(["--results", str(tmp_path / "result"), "--n-resamples", "99", "--layout", "seeds",
                   "--readme", str(readme)])
    assert readme.read_text() == again  # idempotent


def test_readme_without_markers_fails_clearly(tmp_path, capsys):
    three_models(tmp_path / "result")
    readme = tmp_path / "README.md"
    readme.write_text("# no markers here\n")
    assert evaluate.main(["--results", str(tmp_path / "result"), "--n-resamples", "99",
                          "--readme", str(readme)]) == 2
    assert "tables:start" in capsys.readouterr().err
    assert readme.read_text() == "# no markers here\n"


# ---------------------------------------------------------------------------------------------------------------
# superiority


def test_superiority_pairs_add_to_exactly_100():
    rng = np.random.default_rng(0)
    for trial in range(40):
        n = int(rng.integers(1, 400))
        m = int(rng.integers(2, 7))
        if trial % 2:
            x = rng.integers(0, 4, (n, m)) / 4.0  # many ties
        else:
            x = rng.random((n, m))
        raw, rounded = analysis.superiority(x)
        tenths = np.rint(rounded * 10)
        for a in range(m):
            for b in range(a + 1, m):
                assert tenths[a, b] + tenths[b, a] == 1000
                assert rounded[a, b] + rounded[b, a] == 100.0
                assert rounded[a, b] * 10 == tenths[a, b]  # one decimal
                if raw[a, b] + raw[b, a] == 100.0:  # no ties: each cell is a floor or ceil of the raw share
                    assert abs(rounded[a, b] - raw[a, b]) < 0.1


def test_superiority_ties_count_for_the_row_model():
    x = np.array([[0.1, 0.1], [0.2, 0.3], [0.5, 0.4]])  # user 0 ties
    wins = analysis.win_counts(x)
    assert wins[0, 1] == 2 and wins[1, 0] == 2  # the tie is a win for whichever model is the row
    same = np.column_stack([np.arange(10.0), np.arange(10.0)])
    raw, rounded = analysis.superiority(same)
    assert raw[0, 1] == raw[1, 0] == 100.0
    assert rounded[0, 1] + rounded[1, 0] == 100.0


def test_superiority_least_error_rounding():
    # 1 of 8 users: 12.5% / 87.5% are exact in tenths
    assert analysis._round_pair(1, 7, 8) == (125, 875)
    # 1 of 3: 33.333…% / 66.666…% → 33.3 / 66.7
    assert analysis._round_pair(1, 2, 3) == (333, 667)
    # 1 of 16 = 6.25% / 93.75%: equal error either way; the even last digit wins → 6.2 / 93.8
    assert analysis._round_pair(1, 15, 16) == (62, 938)


# ---------------------------------------------------------------------------------------------------------------
# significance


def test_wilcoxon_r_by_hand():
    d = np.array([1, -2, 3, 4, -0.5, 6, 0, 7]) / 8
    y = np.ones(8)
    x = y + d
    res = analysis.wilcoxon_pair(x, y)
    # non-zero |d| ranks: 0.5→1, 1→2, 2→3, 3→4, 4→5, 6→6, 7→7; R− = 1 + 3 = 4 = W, n = 7
    n = 7
    z = (4 - n * (n + 1) / 4) / math.sqrt(n * (n + 1) * (2 * n + 1) / 24)
    assert res.effect == pytest.approx(abs(z) / math.sqrt(n), abs=1e-12)
    assert res.effect == pytest.approx(10 / math.sqrt(245), abs=1e-12)
    assert res.worse  # median non-zero difference 3/8 > 0
    assert res.p == pytest.approx(stats.wilcoxon(x, y, zero_method="wilcox", correction=False).pvalue)
    assert not analysis.wilcoxon_pair(y, x).worse


def test_cohens_d_by_hand():
    x = np.array([1.0, 2, 3, 4])
    y = np.array([2.0, 2, 5, 3])
    res = analysis.ttest_pair(x, y)
    assert res.effect == pytest.approx(0.5 / math.sqrt((5 / 3 + 2) / 2), abs=1e-12)
    assert not res.worse  # mean x < mean y: row model better
    assert res.p == pytest.approx(stats.ttest_rel(x, y).pvalue)


def test_colour_classes():
    p = np.array([[np.nan, 0.001, 0.5], [0.001, np.nan, 0.001], [0.5, 0.001, np.nan]])
    eff = np.array([[np.nan, 0.6, 0.9], [0.6, np.nan, 0.2], [0.9, 0.2, np.nan]])
    worse = np.array([[False, False, True], [True, False, True], [False, False, False]])
    cls = analysis.color_classes(p, eff, worse)
    assert cls[0, 1] == 3 and cls[1, 0] == 6  # large green / large red
    assert cls[0, 2] == 0 and cls[2, 0] == 0  # p > 0.01: grey whatever the effect
    assert cls[1, 2] == 4 and cls[2, 1] == 1  # r = 0.2 is small
    assert (np.diag(cls) == 7).all()


# ---------------------------------------------------------------------------------------------------------------
# plots


def test_plots_are_written(tmp_path):
    rng = np.random.default_rng(3)
    names = ["FSRS-6", "AVG", "SM2", "HLR"]
    x = np.clip(rng.normal(0.35, 0.1, (300, 1)) + np.array([0, 0.02, 0.1, 0.05]) +
                0.03 * rng.standard_normal((300, 4)), 0.01, None)
    out = [analysis.superiority_plot(x, names, tmp_path)] + analysis.significance_plots(x, names, tmp_path)
    assert [p.name for p in out] == ["Superiority-300.png", "Wilcoxon-300-collections.png",
                                     "T-test-300-collections.png"]
    raw = tmp_path / "raw"
    raw.mkdir()
    with open(raw / "FSRS-6.jsonl", "w") as fh:
        for user in (1, 2):
            p = rng.uniform(0.3, 1, 500)
            fh.write(json.dumps({"user": user, "p": np.round(p, 4).tolist(),
                                 "y": (rng.random(500) < p).astype(int).tolist()}) + "\n")
    assert evaluate.main(["--calibration", "FSRS-6", "--raw", str(raw), "--plots", str(tmp_path)]) == 0
    assert evaluate.main(["--calibration", "FSRS-6", "--user", "2", "--raw", str(raw),
                          "--plots", str(tmp_path)]) == 0
    out += [tmp_path / "calibration-FSRS-6.png", tmp_path / "calibration-FSRS-6-user-2.png"]
    for path in out:
        assert path.exists() and path.stat().st_size > 10_000
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_writes_superiority_and_significance(tmp_path):
    three_models(tmp_path / "result")
    assert evaluate.main(["--results", str(tmp_path / "result"), "--n-resamples", "99", "--scale", "users",
                          "--superiority", "--significance", "--plots", str(tmp_path / "plots")]) == 0
    names = sorted(p.name for p in (tmp_path / "plots").iterdir())
    assert names == ["Superiority-3.png", "T-test-3-collections.png", "Wilcoxon-3-collections.png"]


def test_calibration_bins_by_hand():
    p = np.array([0.05, 0.07, 0.55, 0.95, 0.97])
    y = np.array([0, 0, 1, 1, 0])
    cal = analysis.calibration_bins(p, y, bins=10)
    assert list(cal["count"]) == [2, 1, 2]
    # bin errors: 0 − 0.06, 1 − 0.55, 0.5 − 0.96
    errs = np.array([-0.06, 0.45, -0.46])
    assert cal["mae"] == pytest.approx((2 * 0.06 + 0.45 + 2 * 0.46) / 5)
    assert cal["rmse"] == pytest.approx(math.sqrt(np.sum(np.array([2, 1, 2]) * errs**2) / 5))


# ---------------------------------------------------------------------------------------------------------------
# every row of upstream's tables: names under both eras, README row names, the Parameters column

# README row → trainable parameters: spec §11 (README@00c9de57, weighted table), plus the rows of the older
# (FSRS-5 era) and newer READMEs that §11 lists separately, and FSRS-5 disable_short_term (spec §1.3).
PUBLISHED_PARAMETERS = {
    "LSTM": 8869, "GRU-P-short": 297, "FSRS-6 recency": 21, "FSRS-rs": 21, "FSRS-6": 21, "FSRS-6 preset": 21,
    "GRU-P": 297, "FSRS-6 binary": 17, "FSRS-5": 19, "FSRS-6 deck": 21, "FSRS-4.5": 17, "FSRS-6 pretrain": 4,
    "FSRS v4": 17, "FSRS-6 default param.": 0, "DASH-short": 9, "DASH": 9, "DASH[MCM]": 9, "DASH[ACT-R]": 5,
    "GRU": 39, "ACT-R": 5, "AVG": 0, "FSRS v3": 13, "FSRS v2": 14, "FSRS v1": 7, "Anki-SM-2 trainable": 7, "HLR": 3,
    "HLR-short": 3, "SM-2 trainable": 6, "Ebisu v2": 0, "Anki-SM-2": 0, "SM-2-short": 0, "SM-2": 0,
    "RMSE-BINS-EXPLOIT": 0,
    # older README (FSRS-5 era)
    "NN-17": 39, "Transformer": 127, "FSRS-5 binary": 15, "FSRS-5 default param.": 0, "FSRS-5 pretrain": 4,
    "FSRS-5 recency": 19, "FSRS-5 preset": 19, "FSRS-5 deck": 19, "FSRS-5 disable_short_term": 17,
    # newer README
    "MOVING-AVG": 0,
}
SAME_NAME = ["GRU-P-short", "FSRS-rs", "FSRS-6", "GRU-P", "FSRS-5", "FSRS-4.5", "DASH-short", "DASH", "DASH[MCM]",
             "DASH[ACT-R]", "GRU", "ACT-R", "AVG", "HLR", "HLR-short", "RMSE-BINS-EXPLOIT", "NN-17", "Transformer",
             "MOVING-AVG"]
SAME_IN_BOTH_ERAS = {name: name for name in SAME_NAME} | {
    "FSRS-6 recency": "FSRS-6-recency", "FSRS-6 preset": "FSRS-6-preset", "FSRS-6 binary": "FSRS-6-binary",
    "FSRS-6 deck": "FSRS-6-deck", "FSRS v4": "FSRSv4", "FSRS v3": "FSRSv3", "FSRS v2": "FSRSv2", "FSRS v1": "FSRSv1",
    "Anki-SM-2 trainable": "Anki", "SM-2 trainable": "SM2-trainable", "Ebisu v2": "Ebisu-v2", "SM-2-short": "SM2-short",
    "SM-2": "SM2", "FSRS-5 binary": "FSRS-5-binary", "FSRS-5 recency": "FSRS-5-recency",
    "FSRS-5 preset": "FSRS-5-preset", "FSRS-5 deck": "FSRS-5-deck",
    "FSRS-5 disable_short_term": "FSRS-5-disable_short_term",
}
# README row → result-file name in upstream's Era A (script.py --dry / --pretrain) and in srs-bench / Era B
ERA_A = SAME_IN_BOTH_ERAS | {
    "LSTM": "LSTM-short-secs-equalize_test_with_non_secs", "FSRS-6 pretrain": "FSRS-6-pretrain",
    "FSRS-6 default param.": "FSRS-6-dry-run", "Anki-SM-2": "Anki-dry-run", "FSRS-5 default param.": "FSRS-5-dry-run",
    "FSRS-5 pretrain": "FSRS-5-pretrain",
}
ERA_B = SAME_IN_BOTH_ERAS | {
    "LSTM": "LSTM", "FSRS-6 pretrain": "FSRS-6-S0", "FSRS-6 default param.": "FSRS-6-default",
    "Anki-SM-2": "Anki-default", "FSRS-5 default param.": "FSRS-5-default", "FSRS-5 pretrain": "FSRS-5-S0",
}


def stored_weights(name: str) -> int | None:
    """How many floats a result line's `parameters` holds for this file, as upstream writes them: every FSRS row
    stores its whole weight vector (also -dry-run, -pretrain and -binary), neural and untrained rows none."""
    for prefix, n in (("FSRS-6", 21), ("FSRS-rs", 21), ("FSRS-5", 19), ("FSRS-4.5", 17), ("FSRSv4", 17),
                      ("FSRSv3", 13), ("FSRSv2", 14), ("FSRSv1", 7), ("Anki", 7), ("SM2-trainable", 6),
                      ("HLR", 3), ("DASH[ACT-R]", 5), ("DASH", 9), ("ACT-R", 5)):
        if name.startswith(prefix):
            return n
    return None


def write_named_results(folder: Path, names, weights=stored_weights):
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for name in names:
        n = weights(name)
        with open(folder / f"{name}.jsonl", "w") as fh:
            for user, size in ((1, 100), (2, 250), (3, 40)):
                line = {"metrics": {"LogLoss": float(rng.uniform(0.2, 0.6)), "RMSE(bins)": 0.05, "AUC": 0.7},
                        "user": user, "size": size}
                if n is not None:
                    line["parameters"] = {"0": [0.5] * n}
                fh.write(json.dumps(line) + "\n")


def table_rows(out: str) -> dict[str, list[str]]:
    """First table of evaluate's output: row label (bold removed) → cells."""
    lines = [line for line in out.split("### Unweighted")[0].splitlines() if line.startswith("| ")]
    rows = {}
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0].strip("*")] = cells[1:]
    return rows


@pytest.mark.parametrize("era", [ERA_A, ERA_B], ids=["era-A", "era-B"])
def test_parameters_column_equals_the_published_tables(tmp_path, capsys, era):
    assert set(era) == set(PUBLISHED_PARAMETERS)
    write_named_results(tmp_path, era.values())
    assert evaluate.main(["--results", str(tmp_path), "--n-resamples", "99", "--layout", "seeds", "--scale", "reviews"]) == 0
    rows = table_rows(capsys.readouterr().out)
    assert set(rows) == set(PUBLISHED_PARAMETERS)  # README row names, one row per file
    assert {label: int(cells[0]) for label, cells in rows.items()} == PUBLISHED_PARAMETERS
    assert all(cells[-1] for cells in rows.values())  # every row has its input features


def test_both_eras_map_to_the_same_counts_and_features():
    for label in PUBLISHED_PARAMETERS:
        assert evaluate.known_model(ERA_A[label]) == evaluate.known_model(ERA_B[label]) is not None, label
        assert evaluate.display_name(ERA_A[label]) == evaluate.display_name(ERA_B[label]) == label


def test_anki_is_the_trainable_row():
    assert evaluate.known_model("Anki")[0] == 7
    assert evaluate.known_model("Anki-dry-run")[0] == evaluate.known_model("Anki-default")[0] == 0
    assert evaluate.display_name("Anki") == "Anki-SM-2 trainable"
    assert evaluate.display_name("Anki-dry-run") == evaluate.display_name("Anki-default") == "Anki-SM-2"


def test_known_names_win_over_the_stored_list_length(tmp_path, capsys):
    # -S0 and -default store 21 weights, -binary 21: the README counts 4, 0, 17. Era A's FSRS-rs (the FSRS-5 port)
    # stored 19 weights, all trained: for that name the list length is the count.
    write_named_results(tmp_path, ["FSRS-6-S0", "FSRS-6-default", "FSRS-6-binary", "FSRS-rs"],
                        weights=lambda name: 19 if name == "FSRS-rs" else 21)
    evaluate.main(["--results", str(tmp_path), "--n-resamples", "99", "--layout", "seeds", "--scale", "reviews"])
    rows = table_rows(capsys.readouterr().out)
    assert {k: v[0] for k, v in rows.items()} == {"FSRS-6 pretrain": "4", "FSRS-6 default param.": "0",
                                                  "FSRS-6 binary": "17", "FSRS-rs": "19"}


def test_srs_bench_suffix_combinations():
    assert evaluate.known_model("FSRS-6-binary-recency") == evaluate.known_model("FSRS-6-binary")
    assert evaluate.known_model("FSRS-6-default-preset")[0] == 0
    assert evaluate.known_model("FSRS-6-recency-upstream-trainer-deck")[0] == 21
    assert evaluate.known_model("FSRS-rs-recency")[0] == 21
    assert evaluate.known_model("Mystery-recency") is None
    assert evaluate.display_name("FSRS-6-binary-recency") == "FSRS-6 binary recency"
    assert evaluate.display_name("FSRS-6-upstream-trainer") == "FSRS-6 upstream trainer"
    assert evaluate.display_name("FSRS-6-default-deck") == "FSRS-6 default param. deck"
    assert evaluate.display_name("Mystery") == "Mystery"


def test_file_names_flag_and_colliding_labels(tmp_path, capsys):
    write_named_results(tmp_path, ["FSRS-6-dry-run", "FSRS-6-default", "FSRSv4"])
    evaluate.main(["--results", str(tmp_path), "--n-resamples", "99", "--layout", "seeds", "--scale", "reviews"])
    rows = table_rows(capsys.readouterr().out)
    # two files would both read "FSRS-6 default param.": they keep their file names
    assert set(rows) == {"FSRS-6-dry-run", "FSRS-6-default", "FSRS v4"}
    evaluate.main(["--results", str(tmp_path), "--n-resamples", "99", "--layout", "seeds", "--scale", "reviews", "--file-names"])
    assert set(table_rows(capsys.readouterr().out)) == {"FSRS-6-dry-run", "FSRS-6-default", "FSRSv4"}


# ---------------------------------------------------------------------------------------------------------------
# layouts: upstream's current two unweighted tables (default) and the seeds' layout (--layout seeds)


def seeds_fixture(folder: Path):
    """Three hand-made files where review-weighted and unweighted means differ a lot (user 3 has 1,000 reviews)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, rows in {
        "FSRS-6": [(1, 10, 0.30, 0.05, 0.70), (2, 100, 0.40, 0.06, 0.60), (3, 1000, 0.50, 0.07, None),
                   (4, 50, 0.35, 0.04, 0.65)],
        "AVG": [(1, 10, 0.33, 0.08, 0.50), (2, 100, 0.45, 0.09, 0.50), (3, 1000, 0.44, 0.10, 0.52),
                (4, 50, 0.36, 0.07, 0.49)],
        "FSRS-6-S0": [(1, 10, 0.31, 0.06, 0.66), (2, 100, 0.42, 0.05, 0.61), (3, 1000, 0.52, 0.08, 0.58),
                      (4, 50, 0.37, 0.05, 0.60)],
    }.items():
        with open(folder / f"{name}.jsonl", "w") as fh:
            for user, size, ll, rb, auc in rows:
                fh.write(json.dumps({"metrics": {"RMSE": 0.1, "LogLoss": ll, "RMSE(bins)": rb, "AUC": auc,
                                                 "ICI": 0.01, "MBE": 0.0}, "user": user, "size": size,
                                     "parameters": {"0": [0.1] * 21}}) + "\n")


# `python evaluate.py --n-resamples 199` on seeds_fixture, written by evaluate.py as it was before the current layout
# became the default (commit 32e1679): `--layout seeds` must print exactly this.
SEEDS_GOLDEN = """Total number of users: 4.

Total number of reviews for evaluation: 1,160.

The tables show means and 99% confidence intervals (BCa bootstrap). The best result is in **bold**. "Parameters" is the number of trainable parameters per user.

### Weighted by the number of reviews

| Model | Parameters | Log Loss | RMSE (bins) | AUC | Input features |
| --- | --- | --- | --- | --- | --- |
| **AVG** | 0 | **0.436±0.047** | 0.098±0.015 | 0.517±0.015 | --- |
| **FSRS-6** | 21 | 0.483±0.079 | **0.068±0.015** | **0.622±0.050** | IL, G, SR |
| FSRS-6 pretrain | 4 | 0.503±0.080 | 0.076±0.015 | 0.584±0.017 | IL, G, SR |

### Unweighted

| Model | Parameters | Log Loss | RMSE (bins) | AUC | Input features |
| --- | --- | --- | --- | --- | --- |
| **FSRS-6** | 21 | **0.387±0.075** | **0.055±0.013** | **0.650±0.050** | IL, G, SR |
| AVG | 0 | 0.395±0.056 | 0.085±0.012 | 0.502±0.011 | --- |
| FSRS-6 pretrain | 4 | 0.405±0.078 | 0.060±0.012 | 0.613±0.031 | IL, G, SR |

Input features: IL = interval lengths, in days; FIL = fractional (aka non-integer) interval lengths; G = grades (Again/Hard/Good/Easy); SR = same-day (or short-term) reviews; AT = answer time (duration of the review), in milliseconds.

"""


def test_seeds_layout_is_byte_identical_to_the_old_default(tmp_path, capsys):
    seeds_fixture(tmp_path)
    assert evaluate.main(["--results", str(tmp_path), "--n-resamples", "199", "--layout", "seeds"]) == 0
    assert capsys.readouterr().out == SEEDS_GOLDEN


def current_rows(text: str) -> list[list[str]]:
    """Table rows of one current-layout table: cells, bold kept."""
    return [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()
            if line.startswith("| ") and not line.startswith("| Model") and not line.startswith("| ---")]


def test_current_layout_is_one_unweighted_table(tmp_path, capsys):
    seeds_fixture(tmp_path)
    assert evaluate.main(["--results", str(tmp_path), "--n-resamples", "199"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("### Without same-day reviews\n\nTotal number of users: 4.\n")
    assert "Weighted" not in out and out.count("| Model | Parameters | Log Loss↓ | RMSE(bins)↓ | AUC↑ | Input "
                                               "features |") == 1
    rows = current_rows(out)
    # unweighted means by hand; the review-weighted ones (0.483, 0.436, 0.503) would print otherwise
    hand = {"FSRS-6": ((0.30 + 0.40 + 0.50 + 0.35) / 4, (0.05 + 0.06 + 0.07 + 0.04) / 4, (0.70 + 0.60 + 0.65) / 3),
            "AVG": ((0.33 + 0.45 + 0.44 + 0.36) / 4, (0.08 + 0.09 + 0.10 + 0.07) / 4, (0.50 + 0.50 + 0.52 + 0.49) / 4),
            "FSRS-6 S0": ((0.31 + 0.42 + 0.52 + 0.37) / 4, (0.06 + 0.05 + 0.08 + 0.05) / 4,
                          (0.66 + 0.61 + 0.58 + 0.60) / 4)}
    assert [r[0].strip("*") for r in rows] == ["FSRS-6", "AVG", "FSRS-6 S0"]  # by Log Loss: 0.3875 < 0.395 < 0.405
    for row in rows:
        for cell, mean in zip(row[2:5], hand[row[0].strip("*")]):
            shown = cell.strip("*").split("±")[0]
            assert float(shown) == round(mean, len(shown.split(".")[1])), (row, cell, mean)
    assert [r[1] for r in rows] == ["21", "0", "4"] and rows[0][5] == "IL, G, SR" and rows[1][5] == "---"


def test_current_layout_bolds_one_best_cell_per_column_and_its_row_name(tmp_path, capsys):
    # A: best Log Loss; B: best RMSE(bins); C: best AUC, tied with D (listed after C: D stays plain); E: nothing
    rows = {"A": (0.30, 0.09, 0.60), "B": (0.35, 0.02, 0.61), "C": (0.40, 0.08, 0.80), "D": (0.45, 0.08, 0.80),
            "E": (0.50, 0.10, 0.50)}
    for name, (ll, rb, auc) in rows.items():
        write_results(tmp_path, name, [(u, 10 * u, ll + 0.01 * u, rb + 0.001 * u, auc) for u in (1, 2, 3)])
    assert evaluate.main(["--results", str(tmp_path), "--n-resamples", "199"]) == 0
    table = current_rows(capsys.readouterr().out)
    assert [r[0] for r in table] == ["**A**", "**B**", "**C**", "D", "E"]
    bold = {r[0].strip("*"): [k for k, c in zip(("LogLoss", "RMSE(bins)", "AUC"), r[2:5]) if c.startswith("**")]
            for r in table}
    assert bold == {"A": ["LogLoss"], "B": ["RMSE(bins)"], "C": ["AUC"], "D": [], "E": []}


def test_current_names_spell_out_the_built_in_flags():
    expected = {
        "FSRS-6": "FSRS-6-short", "FSRS-6-recency": "FSRS-6-short-recency", "FSRS-6-S0": "FSRS-6-S0-short",
        "FSRS-6-default": "FSRS-6-default-short", "FSRS-6-binary": "FSRS-6-binary-short",
        "FSRS-6-preset": "FSRS-6-short-preset", "FSRS-5": "FSRS-5-short", "FSRS-rs": "FSRS-rs-short",
        "LSTM": "LSTM-short-secs-duration-equalize_test_with_non_secs",
        "FSRS-7": "FSRS-7-short-secs-equalize_test_with_non_secs",
        "FSRS-7-recency": "FSRS-7-short-secs-recency-equalize_test_with_non_secs",
        "FSRS-7-default": "FSRS-7-default-short-secs-equalize_test_with_non_secs",
        "FSRS-7-deck": "FSRS-7-short-secs-equalize_test_with_non_secs-deck",
        "LogisticRegression": "LogisticRegression-short-secs-recency-equalize_test_with_non_secs",
        "FSRS-6-one-step": "FSRS-6-one-step-short",
        "AVG": "AVG", "DASH-short": "DASH-short", "DASH-short-secs": "DASH-short-secs", "GRU-P": "GRU-P",
    }
    for ours, upstream in expected.items():
        assert evaluate.current_name(ours) == upstream, ours
        assert evaluate.current_name(upstream) == upstream, upstream  # upstream's own names stay as they are
    labels = {"FSRS-6": "FSRS-6", "FSRS-6-short": "FSRS-6", "FSRS-6-S0": "FSRS-6 S0", "FSRS-rs": "FSRS-rs",
              "FSRS-6-default": "FSRS-6 default param.", "LSTM": "LSTM", "FSRS-7-recency": "FSRS-7 recency",
              "LogisticRegression": "Logistic Regression", "DASH-short": "DASH-short", "DASH-short-secs": "DASH",
              "FSRS-6-short-secs": "FSRS-6", "FSRSv4": "FSRS v4", "FSRSv4-short-secs": "FSRS v4",
              "Anki-default": "Anki default param.", "FSRS-6-upstream-trainer": "FSRS-6 upstream trainer"}
    for name, label in labels.items():
        assert evaluate.current_label(name) == label, name


def test_same_day_rows_keep_their_names_and_take_their_day_rows_labels():
    """--with_same_day names (config.RunConfig.name) are upstream's already; they belong to the same-day table and
    are labelled as the day table labels the same model and variant."""
    labels = {"FSRS-7-short-secs": "FSRS-7", "FSRS-7-short-secs-recency": "FSRS-7 recency",
              "FSRS-7-sched_penalties-short-secs": "FSRS-7 sched. penalties",
              "FSRS-7-sched_penalties-short-secs-recency": "FSRS-7 recency + sched. penalties",
              "FSRS-7-short-secs-deck": "FSRS-7 deck", "FSRS-7-default-short-secs": "FSRS-7 default param.",
              "LSTM-short-secs-duration": "LSTM", "LogisticRegression-short-secs-recency": "Logistic Regression",
              "FSRS-6-binary-short-secs": "FSRS-6 binary", "GRU-P-short-secs": "GRU-P"}
    for name, label in labels.items():
        assert evaluate.current_name(name) == name
        assert evaluate.with_same_day(name), name
        assert evaluate.current_label(name) == label, name
    # the day table's FSRS-7 variants (its published, equalized mode)
    assert evaluate.current_name("FSRS-7-sched_penalties-recency") == \
        "FSRS-7-sched_penalties-short-secs-recency-equalize_test_with_non_secs"
    assert evaluate.current_label("FSRS-7-sched_penalties-recency") == "FSRS-7 recency + sched. penalties"
    assert not evaluate.with_same_day("FSRS-7-sched_penalties")


def test_without_and_with_same_day_tables_take_their_own_files_and_users(tmp_path, capsys):
    day = [(1, 10, 0.3, 0.05, 0.7), (2, 20, 0.4, 0.06, 0.6), (3, 30, 0.5, 0.07, 0.65)]
    secs = day + [(4, 40, 0.45, 0.08, 0.6)]  # the same-day files have a fourth user
    for name in ("FSRS-6", "DASH", "DASH-short", "FSRS-7", "LSTM"):
        write_results(tmp_path, name, day)
    for name in ("DASH-short-secs", "FSRS-6-short-secs", "AVG-short-secs"):
        write_results(tmp_path, name, secs)
    assert [evaluate.with_same_day(n) for n in ("FSRS-7", "LSTM", "DASH-short", "DASH-short-secs")] == \
        [False, False, False, True]

    assert evaluate.main(["--results", str(tmp_path), "--n-resamples", "99"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("### Without same-day reviews\n\nTotal number of users: 3.") and "With same-day" not in out
    assert sorted(r[0].strip("*") for r in current_rows(out)) == ["DASH", "DASH-short", "FSRS-6", "FSRS-7", "LSTM"]

    assert evaluate.main(["--results", str(tmp_path), "--n-resamples", "99", "--secs"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("### With same-day reviews\n\nTotal number of users: 4.") and "Without" not in out
    rows = {r[0].strip("*"): r for r in current_rows(out)}
    assert set(rows) == {"DASH", "FSRS-6", "AVG"}  # upstream's bare names for its -short-secs files
    assert rows["DASH"][1] == "9" and rows["DASH"][5] == "FIL, G, SR" and rows["AVG"][5] == "---"

    assert evaluate.main(["--results", str(tmp_path), "--n-resamples", "99", "--all-tables"]) == 0
    out = capsys.readouterr().out
    assert out.index("### Without same-day reviews") < out.index("### With same-day reviews")
    assert len(current_rows(out)) == 8


def test_layout_flags_that_do_not_combine(tmp_path, capsys):
    seeds_fixture(tmp_path)
    assert evaluate.main(["--results", str(tmp_path), "--scale", "reviews"]) == 2
    assert "--layout seeds" in capsys.readouterr().err
    assert evaluate.main(["--results", str(tmp_path), "--layout", "seeds", "--secs"]) == 2
    assert evaluate.main(["--results", str(tmp_path), "--secs", "--n-resamples", "99"]) == 1  # no -short-secs file
    assert "No result file belongs to this table" in capsys.readouterr().out


def test_help_explains_every_flag():
    parser = evaluate.build_parser()
    for action in parser._actions:
        if action.option_strings and action.dest != "help":
            assert action.help and len(action.help) > 20, action.option_strings
    text = parser.format_help()
    for flag in ("--layout", "--secs", "--all-tables", "--scale", "seeds", "current"):
        assert flag in text
