"""Untrained upstream rows: SM2 (-short), Ebisu-v2, RMSE-BINS-EXPLOIT, MOVING-AVG.

Expected values come from hand computation, from the `ebisu` package (an independent implementation of Ebisu v2)
or from the straightforward single online pass upstream runs, never from the models' own outputs; the upstream-check
users must reproduce upstream's own per-user sizes and metrics to 1e-6.
"""

import math
from pathlib import Path

import ebisu
import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import roc_auc_score

import models
from config import RunConfig
from data_loader import load_revlogs
from features import FeatureConfig, build_features
from models.base import ReviewData
from models.baseline_kernels import _exploit
from models.baselines import MovingAvg, RMSEBinsExploit, first_test_candidates
from models.ebisu_v2 import EbisuV2, update_recall
from models.sm2 import SM2, upstream_card_join_mask
from runner import evaluate_user, read_results, run
from check_users import CHECK, UPSTREAM
from revlog_factory import make_revlog, write_user
from split import time_series_folds

REPO = Path(__file__).resolve().parents[1]


def one_card(ratings, deltas, target_ts):
    """ReviewData for one card with reviews (deltas[k], ratings[k]) and one target row per entry of target_ts:
    the target at position k reads the first k reviews (k = 1..len(ratings)) and waits target_ts[k-1] days."""
    seq_dt = np.asarray(deltas, dtype=np.float64)
    seq_r = np.asarray(ratings, dtype=np.int8)
    k = np.arange(1, len(target_ts) + 1)
    rows = pd.DataFrame({"seq_start": 0, "seq_pos": k, "delta_t": np.asarray(target_ts, dtype=np.float64),
                         "y": 1, "card_id": 0})
    # the target at position k is review k of the same card when it exists
    return ReviewData(rows, np.concatenate([seq_dt, [0.0]]), np.concatenate([seq_r, [3]]).astype(np.int8))


# ---------------------------------------------------------------------------------------------------------- SM-2

@pytest.mark.parametrize("ratings, intervals", [
    # Again: ivl 1, EF 2.5+0.1-0.42 = 2.18; Good: reps 0 -> 1; Easy: reps 1 -> 6, EF 2.28; Hard: 6*2.28 = 13.68 -> 14
    ([1, 3, 4, 2], [1, 1, 6, 14]),
    # Easy x4: EF 2.6, 2.7, 2.8, ...; 6*2.7 = 16.2 -> 16 (rounded); 16*2.8 = 44.8 -> 45 (unrounded 16.2*2.8 = 45.4)
    ([4, 4, 4, 4], [1, 6, 16, 45]),
    # four Agains floor EF at 1.3 (2.18, 1.86, 1.54, 1.22 -> 1.3); then 1, 6, 6*1.3 = 7.8 -> 8
    ([1, 1, 1, 1, 3, 3, 3], [1, 1, 1, 1, 1, 6, 8]),
])
def test_sm2_intervals_by_hand(ratings, intervals):
    t = [3.0] * len(ratings)
    p = SM2().predict(one_card(ratings, [0] + [5] * (len(ratings) - 1), t))
    assert p == pytest.approx([0.9 ** (3.0 / ivl) for ivl in intervals], rel=1e-12)


def test_sm2_ignores_intervals():
    a = SM2().predict(one_card([3, 3, 3], [0, 1, 1], [10, 10, 10]))
    b = SM2().predict(one_card([3, 3, 3], [0, 50, 400], [10, 10, 10]))
    assert np.array_equal(a, b)


def sm2_reference(ratings):
    """Upstream's sm2(r_history) in plain Python: the interval after the given ratings."""
    ivl, ef, reps = 0, 2.5, 0
    for g in ratings:
        q = g + 1
        if q > 2:
            ivl = 1 if reps == 0 else 6 if reps == 1 else ivl * ef
            reps += 1
        else:
            ivl, reps = 1, 0
        ef = max(1.3, ef + (0.1 - (5 - q) * (0.08 + (5 - q) * 0.02)))
        ivl = min(max(1, round(ivl + 0.01)), 36500)
    return ivl


def test_sm2_many_cards_of_different_lengths():
    """Cards stepped side by side (numpy, longest first) give each card's own one-card answer, in row order."""
    rng = np.random.default_rng(3)
    lengths = rng.integers(1, 40, size=60)
    seq_r, rows, expected = [], [], []
    for length in lengths:
        ratings = rng.choice([1, 2, 3, 4], size=length, p=[0.15, 0.1, 0.65, 0.1])
        start = len(seq_r)
        seq_r.extend(ratings)
        for k in rng.choice(np.arange(1, length + 1), size=min(length, 3), replace=False):
            rows.append((start, k, float(rng.integers(1, 60))))
            expected.append(0.9 ** (rows[-1][2] / sm2_reference(ratings[:k])))
    order = rng.permutation(len(rows))
    frame = pd.DataFrame([rows[i] for i in order], columns=["seq_start", "seq_pos", "delta_t"]).assign(y=1, card_id=0)
    data = ReviewData(frame, np.zeros(len(seq_r) + 1), np.asarray(seq_r + [3], dtype=np.int8))
    assert SM2().predict(data) == pytest.approx(np.asarray(expected)[order], rel=1e-12)


def test_sm2_needs_no_numba():
    """The SM2 rows need no compiled code, so their processes never import numba (~1 s of CPU per process)."""
    import subprocess
    import sys

    code = "import sys, models.sm2; sys.exit('numba' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO).returncode == 0


# ------------------------------------------------------------------------------------------------------- Ebisu v2

def ebisu_reference(ratings, deltas, tnow):
    """Upstream's ebisu_v2 + predictRecall(exact=True), with the package."""
    model = ebisu.defaultModel(512, 0.2, 0.2)
    for t, g in zip(deltas, ratings):
        model = ebisu.updateRecall(model, successes=1 if g > 1 else 0, total=1, tnow=max(t, 0.001))
    return model, ebisu.predictRecall(model, tnow, exact=True)


@pytest.mark.parametrize("ratings, deltas", [
    ([3, 3, 3, 3], [0, 1, 4, 12]),
    ([1, 3, 1, 4], [0, 2, 7, 3]),  # first-review failure (the t = 0 quiz at 0.001 days), lapses
    ([4, 2, 3], [0, 30, 200]),
    ([3, 1, 1, 1], [5, 1, 1, 1]),  # a card whose first kept review has an interval
])
def test_ebisu_matches_package(ratings, deltas):
    targets = [1.0, 6.0, 20.0, 90.0][:len(ratings)]
    p = EbisuV2().predict(one_card(ratings, deltas, targets))
    for k in range(1, len(ratings) + 1):
        _, ref = ebisu_reference(ratings[:k], deltas[:k], targets[k - 1])
        assert p[k - 1] == pytest.approx(ref, rel=1e-9, abs=1e-12)


def test_ebisu_update_kernel_against_package():
    rng = np.random.default_rng(7)
    for _ in range(60):
        ours = ref = ebisu.defaultModel(512, 0.2, 0.2)
        for k in range(int(rng.integers(1, 25))):
            t = 0 if k == 0 else float(rng.choice([0.5, 1, 2, 3, 7, 15, 40, 120, 500]))
            s = int(rng.random() < (0.6 if k == 0 else 0.85))
            ref = ebisu.updateRecall(ref, s, 1, max(t, 0.001))
            a, b, tb, ok = update_recall(*ours, s == 1, max(t, 0.001))
            assert ok
            ours = (a, b, tb)
            assert ours == pytest.approx(ref, rel=1e-9)
    # the package's log-domain branch (alpha > 400 and beta > 400)
    for s in (0, 1):
        ref = ebisu.updateRecall((500.0, 450.0, 10.0), s, 1, 3.0)
        a, b, tb, ok = update_recall(500.0, 450.0, 10.0, s == 1, 3.0)
        assert ok and (a, b, tb) == pytest.approx(ref, rel=1e-9)


def test_ebisu_states_shared_across_calls():
    """Predicting a card's targets in pieces (later folds continuing earlier ones) gives the one-call answer."""
    ratings, deltas = [3, 1, 3, 4, 3, 2], [0, 3, 1, 5, 14, 30]
    data = one_card(ratings, deltas, [2.0, 3.0, 4.0, 5.0, 6.0, 7.0])
    whole = EbisuV2().predict(data)
    parts = [EbisuV2().predict(data.subset(np.array(ix))) for ix in ([3, 4], [0], [5, 1, 2])]
    assert np.allclose(np.concatenate(parts), whole[[3, 4, 0, 5, 1, 2]], rtol=0, atol=0)


# ------------------------------------------------------------------------------------------------ online baselines

def test_exploit_by_hand():
    # one bin, y = 1, 0, 1, 1: 0.5 (nothing seen); clip(1+1-0)=1; clip(1+0.5-1)=0.5; clip(2+2/3-1.5)=1
    p = _exploit(np.zeros(4, np.int64), np.array([1.0, 0.0, 1.0, 1.0]), 1, 0)
    assert p.tolist() == [0.5, 1.0, 0.5, 1.0]
    # two bins: the second bin's first row gets clip(0 + mean - 0)
    p = _exploit(np.array([0, 0, 1]), np.array([1.0, 0.0, 1.0]), 2, 1)
    assert p.tolist() == [1.0, 0.5]


def test_moving_avg_by_hand():
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    x, expect = 1.2, []
    for y in (1, 0, 1, 1):
        expect.append(sig(x))
        x = x + 0.3 * (1 - sig(x)) if y else x - 0.3 * sig(x)
    rows = pd.DataFrame({"y": [1, 0, 1, 1]})
    data = ReviewData(rows, np.zeros(0), np.zeros(0, np.int8))
    m = MovingAvg().fit(data.subset(np.array([0, 1])))
    assert m.predict(data.subset(np.array([2, 3]))) == pytest.approx(expect[2:], rel=1e-12)
    assert MovingAvg().fit(data.subset(np.array([], dtype=int))).predict(data) == pytest.approx(expect, rel=1e-12)


def upstream_online(rows: pd.DataFrame, first: int, model: str) -> list[float]:
    """Upstream's single pass over all rows (dict of bins keyed like utils.get_bin), predictions from `first`."""
    out = []
    if model == "MOVING-AVG":
        x = 1.2
        for k, y in enumerate(rows["y"]):
            if k >= first:
                out.append(1 / (1 + math.exp(-x)))
            x = x + 0.3 / (math.exp(x) + 1) if y == 1 else x - 0.3 * math.exp(x) / (math.exp(x) + 1)
        return out
    state, succ, seen = {}, 0, 0
    for k in range(first, len(rows)):
        lapse, dt, i, y = (rows[c].iat[k] for c in ("rmse_bins_lapse", "delta_t", "i", "y"))
        key = (0 if lapse == 0 else round(1.65 * 1.73 ** math.floor(math.log(lapse) / math.log(1.73))),
               round(2.48 * 3.62 ** math.floor(math.log(dt) / math.log(3.62)), 2),
               round(1.99 * 1.89 ** math.floor(math.log(i) / math.log(1.89))))
        if seen == 0:
            p = 0.5
        else:
            ps, ts = state.get(key, (0.0, 0))
            p = min(max(ts + succ / seen - ps, 0.0), 1.0)
            state[key] = (ps + p, ts)
        ps, ts = state.get(key, (0.0, 0))
        state[key] = (ps, ts + y)
        succ, seen = succ + y, seen + 1
        out.append(p)
    return out


@pytest.fixture(scope="module")
def embedded_user1():
    return build_features(load_revlogs(REPO / "data" / "embedded", 1), FeatureConfig())


@pytest.mark.parametrize("model", ["RMSE-BINS-EXPLOIT", "MOVING-AVG"])
@pytest.mark.parametrize("n", [None, 7, 20, 35, 36, 41])
def test_online_models_equal_one_upstream_pass(embedded_user1, model, n):
    data = embedded_user1 if n is None else embedded_user1.subset(np.arange(n))
    folds = time_series_folds(len(data))
    cls = RMSEBinsExploit if model == "RMSE-BINS-EXPLOIT" else MovingAvg
    p = []
    for train_idx, test_idx in folds:
        p.extend(cls(RunConfig(algo=model)).fit(data.subset(train_idx)).predict(data.subset(test_idx)))
    first = len(folds[0][0])
    assert p == pytest.approx(upstream_online(data.rows, first, model), abs=1e-12)


def test_first_test_index_arithmetic():
    for n in range(6, 200):
        folds = time_series_folds(n)
        first = len(folds[0][0])
        for train_idx, test_idx in folds:
            cands = first_test_candidates(len(train_idx), len(test_idx), 5)
            assert first in cands
            if n >= 36:
                assert cands == [first]


def test_online_models_refuse_partitions():
    with pytest.raises(ValueError, match="partitions"):
        RMSEBinsExploit(RunConfig(algo="RMSE-BINS-EXPLOIT", partitions="deck"))


# --------------------------------------------------------------------------------------- upstream's card-join quirk

def test_card_join_mask():
    cards = pd.DataFrame({"card_id": [0, 1, 2, 3], "note_id": [0, 1, 2, 3], "deck_id": [10, 10, 11, 12]})
    decks = pd.DataFrame({"deck_id": [10, 11, 12], "parent_id": [-1, -1, np.nan], "preset_id": [0, np.nan, 0]})
    # card 4: not in cards; card 3: its deck's parent_id is NaN; card 2: NaN preset_id is filled with -1 upstream
    keep = upstream_card_join_mask(np.array([0, 1, 2, 3, 4, 0]), cards, decks)
    assert keep.tolist() == [True, True, True, False, False, True]
    decks = decks.iloc[:2]  # deck 12 missing altogether
    assert upstream_card_join_mask(np.array([3]), cards, decks).tolist() == [False]


def test_runner_restricts_sm2_targets(tmp_path):
    rng = np.random.default_rng(3)
    cards_reviews = []
    for _ in range(30):
        day, revs = int(rng.integers(0, 10)), []
        for k in range(5):
            revs.append((day, int(rng.choice([1, 3], p=[0.2, 0.8]))))
            day += 2 ** k
        cards_reviews.append(revs)
    revlog = make_revlog(cards_reviews)
    cards = pd.DataFrame({"card_id": np.arange(25), "note_id": np.arange(25), "deck_id": 0})  # cards 25-29 missing
    write_user(tmp_path, 1, revlog, cards, pd.DataFrame({"deck_id": [0], "parent_id": [-1], "preset_id": [0]}))
    sizes = {}
    for algo in ("AVG", "SM2", "Ebisu-v2"):
        out = evaluate_user(1, RunConfig(algo=algo, processes=1), tmp_path)
        assert out.error is None, out.error
        sizes[algo] = out.record["size"]
    data = build_features(revlog, FeatureConfig())
    kept = int(data.rows["card_id"].lt(25).sum())
    assert sizes["AVG"] == 5 * (len(data) // 6)
    assert sizes["SM2"] == sizes["Ebisu-v2"] == 5 * (kept // 6) < sizes["AVG"]


# ---------------------------------------------------------------------------------------------- upstream-check

def merge_near_ties(p: np.ndarray, rel: float = 1e-12) -> np.ndarray:
    """p with every run of sorted values closer than `rel` (relative, a few ulps) replaced by the run's first value."""
    order = np.argsort(p, kind="stable")
    ps = p[order]
    starts = np.concatenate([[True], np.diff(ps) > rel * np.abs(ps[1:])])
    out = np.empty_like(p)
    out[order] = ps[np.flatnonzero(starts)[np.cumsum(starts) - 1]]
    return out


def test_merge_near_ties_by_hand():
    p = np.array([0.5, 0.9, 0.5 * (1 + 1e-15), 0.1, 0.5 * (1 + 1e-9)])
    assert merge_near_ties(p).tolist() == [0.5, 0.9, 0.5, 0.1, 0.5 * (1 + 1e-9)]
    y = np.array([0, 1, 1, 0, 0])
    # positives {0.9, 0.5+} vs negatives {0.5, 0.1, 0.5(1+1e-9)}: 6 pairs; 0.9 wins 3, 0.5+ wins 2 (loses to the last)
    assert roc_auc_score(y, p) == 5 / 6
    # merged, 0.5+ ties 0.5: half a win instead of one
    assert roc_auc_score(y, merge_near_ties(p)) == 4.5 / 6


@pytest.mark.parametrize("algo", ["SM2", "Ebisu-v2", "RMSE-BINS-EXPLOIT"])
def test_upstream_check_exact(algo):
    """Sizes and Log Loss, RMSE, RMSE(bins), ICI to 1e-6. AUC: up to the order of predictions a few ulps apart.
    Some predictions that are equal in exact arithmetic (SM-2: p = 0.9^(t/ivl) at equal ratios t/ivl, e.g. 2/4 and
    3/6) come out one ulp apart or exactly equal depending on the exp routine, which numpy picks by CPU (SIMD); such
    near-ties decide their AUC ranking (SM2 user 12: 0.586830 on a CPU without AVX-512, upstream 0.586802). Upstream's
    AUC must lie between ours and ours with every near-tie merged into an exact tie."""
    for user, ref in UPSTREAM[algo].items():
        out = evaluate_user(int(user), RunConfig(algo=algo, processes=1, file=True), CHECK)
        assert out.error is None and out.record is not None, out.error
        assert out.record["size"] == ref["size"], (user, out.record["size"], ref["size"])
        for m in ("RMSE", "LogLoss", "RMSE(bins)", "ICI"):
            assert out.record["metrics"][m] == pytest.approx(ref["metrics"][m], abs=1.01e-6), (user, m)
        y, p = out.table["y"].to_numpy(), out.table["p"].to_numpy()
        lo, hi = sorted([roc_auc_score(y, p), roc_auc_score(y, merge_near_ties(p))])
        assert hi - lo < 1e-4
        assert lo - 1.01e-6 <= ref["metrics"]["AUC"] <= hi + 1.01e-6, (user, lo, hi, ref["metrics"]["AUC"])


# ------------------------------------------------------------------------------------------------ end to end

@pytest.mark.parametrize("algo, short", [("MOVING-AVG", False), ("SM2", True)])
def test_end_to_end_embedded(tmp_path, algo, short):
    cfg = RunConfig(algo=algo, short=short, data=None, processes=1, result_dir=tmp_path / "result",
                    raw_dir=tmp_path / "raw", evaluation_dir=tmp_path / "evaluation", quiet=True)
    assert algo in models.REGISTRY
    summary = run(cfg)
    assert summary.exit_code == 0 and summary.done >= 3
    lines, bad = read_results(tmp_path / "result" / f"{cfg.name}.jsonl")
    assert bad == 0 and len(lines) == summary.done
    assert cfg.name == (f"{algo}-short" if short else algo)
    for line in lines:
        assert line["size"] > 0 and math.isfinite(line["metrics"]["LogLoss"])


def test_constant_90_row_log_loss_by_hand(tmp_path):
    """`--model 90%`: p = 0.9 everywhere, so Log Loss = −(k·ln 0.9 + (n − k)·ln 0.1)/n over the evaluated reviews."""
    cfg = RunConfig(algo="90%", processes=1, users=[1], result_dir=tmp_path, quiet=True, raw=True,
                    raw_dir=tmp_path / "raw")
    assert run(cfg).done == 1
    line = read_results(tmp_path / "90%.jsonl")[0][0]
    y = np.array(read_results(tmp_path / "raw" / "90%.jsonl")[0][0]["y"])
    k, n = int(y.sum()), len(y)
    assert n == line["size"]
    assert line["metrics"]["LogLoss"] == pytest.approx(-(k * math.log(0.9) + (n - k) * math.log(0.1)) / n, abs=1e-6)
