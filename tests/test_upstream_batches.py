"""DASH, DASH[MCM] and HLR's fast trainer against an independent re-statement of upstream's January-2025 training.

Upstream (other.py `Trainer` + fsrs-optimizer 5.x `BatchDataset`/`BatchLoader`): the training rows in time order,
sorted by len(feature tensor), which is the same for every row of these models (8 for DASH, 2 for HLR), with
pandas' quicksort, i.e. numpy 1.26's tie order (tests/test_legacy_sort.py); cut into batches of batch_size; every
epoch the batches in torch.randperm order (one generator seeded 2023); Adam(lr 4e-2) with CosineAnnealingLR over
batches·epochs; loss Σ BCE per batch; the whole training set's mean BCE before every epoch and after the last, the
lowest one's weights kept. The reference below is written from that description in torch (float64), with its own
feature code (upstream's reverse cumulative sums and counts) and numpy 1.26.4's permutation of 42 equal keys
written out; it shares nothing with the engine but the data."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from config import RunConfig
from models.base import ReviewData
from models.dash import DASH, DASHMCM
from models.hlr import HLR

N_CARDS, N_REVIEWS = 6, 8  # 6 cards × 7 targets = 42 training rows
NUMPY_1_26_4_EQUAL_42 = [0, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 22, 21, 20, 19, 1, 2,
                         3, 4, 5, 6, 7, 8, 40, 9, 11, 12, 13, 14, 15, 16, 17, 18, 10, 41]
TAU = np.array([0.2434, 1.9739, 16.0090, 129.8426])
WINDOWS = np.array([1.0, 7.0, 30.0, np.inf])


def interleaved_cards(seed: int):
    """ReviewData of N_CARDS cards whose targets (reviews 1..7 of each card) are interleaved in time, plus each
    target's (intervals t_0..t_p, ratings r_0..r_p) as upstream's t_item / r_item lists, in row (time) order."""
    rng = np.random.default_rng(seed)
    dt = rng.choice([0, 1, 2, 3, 5, 8, 13, 30, 60], size=(N_CARDS, N_REVIEWS)).astype(np.float64)
    dt[:, 0] = 0.0
    dt[:, 1:] = np.maximum(dt[:, 1:], 1.0)  # targets have delta_t > 0
    g = rng.choice([1, 2, 3, 3, 3, 4], size=(N_CARDS, N_REVIEWS)).astype(np.int8)
    # time order: a random interleaving that keeps each card's own reviews in order
    slots = np.repeat(np.arange(N_CARDS), N_REVIEWS - 1)
    rng.shuffle(slots)
    nxt = np.ones(N_CARDS, dtype=int)
    rows, items = [], []
    for c in slots:
        p = nxt[c]
        nxt[c] += 1
        rows.append({"card_id": c, "delta_t": dt[c, p], "y": int(g[c, p] > 1), "i": p + 1,
                     "seq_start": c * N_REVIEWS, "seq_pos": p})
        items.append((dt[c, :p + 1].tolist(), g[c, :p + 1].tolist()))
    data = ReviewData(pd.DataFrame(rows), dt.reshape(-1), g.reshape(-1))
    return data, items


def dash_features(t_item, r_item, decay: bool) -> np.ndarray:
    """upstream's dash_tw_features(r_item[:-1], t_item[1:]): window counts over the reverse cumulative sums."""
    r = np.array(r_item[:-1]) > 1
    cum = np.cumsum(np.array(t_item[1:])[::-1])[::-1]
    f = np.zeros(8)
    for j in range(4):
        d = np.exp(-cum / TAU[j]) if decay else np.ones_like(cum)
        inside = cum <= WINDOWS[j]
        f[2 * j] = d[inside].sum()
        f[2 * j + 1] = (r[inside] * d[inside]).sum()
    return f


def hlr_features(t_item, r_item) -> np.ndarray:
    r = r_item[:-1]
    return np.sqrt([sum(x > 1 for x in r), sum(x == 1 for x in r)])


def upstream_fit(w0, x, t, y, predict, batch_size, n_epoch=5, lr=4e-2):
    """Upstream's Trainer.train on rows already in BatchDataset order (x: features, t: delta_t, y: labels)."""
    w = torch.tensor(w0, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.Adam([w], lr=lr)
    n = len(y)
    batches = [slice(s, min(s + batch_size, n)) for s in range(0, n, batch_size)]
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=len(batches) * n_epoch)
    gen = torch.Generator()
    gen.manual_seed(2023)
    bce = torch.nn.BCELoss(reduction="none")

    def mean_loss():
        with torch.no_grad():
            return float(bce(predict(w, x, t), y).mean())

    best, best_w = np.inf, None
    for _ in range(n_epoch):
        loss = mean_loss()
        if loss < best:
            best, best_w = loss, w.detach().clone()
        for b in torch.randperm(len(batches), generator=gen).tolist():
            opt.zero_grad()
            s = batches[b]
            bce(predict(w, x[s], t[s]), y[s]).sum().backward()
            opt.step()
            sched.step()
    if mean_loss() < best:
        best_w = w.detach().clone()
    return best_w.numpy()


def dash_predict(w, x, t):
    return torch.sigmoid(torch.log1p(x) @ w[:8] + w[8])


def hlr_predict(w, x, t):
    return 0.5 ** (t / 2 ** (x @ w[:2] + w[2]))


@pytest.mark.parametrize("cls,short", [(DASH, False), (DASH, True), (DASHMCM, False), (HLR, False)])
@pytest.mark.parametrize("seed", [1, 2])
def test_fast_trainer_is_upstreams_training(cls, short, seed, monkeypatch):
    from upstream.legacy_sort import TIE_ORDER_ENV

    monkeypatch.setenv(TIE_ORDER_ENV, "generic")  # an order that permutes 42 equal keys (the default keeps them)
    data, items = interleaved_cards(seed)
    assert len(items) == 42
    if cls is HLR:
        feats, predict = [hlr_features(*it) for it in items], hlr_predict
    else:
        feats, predict = [dash_features(*it, cls is DASHMCM) for it in items], dash_predict
    order = NUMPY_1_26_4_EQUAL_42  # the rows, time-ordered, as upstream's quicksort left them
    x = torch.tensor(np.array(feats)[order], dtype=torch.float64)
    t = torch.tensor(data.rows["delta_t"].to_numpy()[order], dtype=torch.float64)
    y = torch.tensor(data.rows["y"].to_numpy()[order], dtype=torch.float64)
    cfg = RunConfig(algo=cls.name, short=short, batch_size=8)
    model = cls(cfg)
    expected = upstream_fit(model.default_w, x, t, y, predict, batch_size=8)
    model.fit(data)
    np.testing.assert_allclose(model.w, expected, rtol=0, atol=1e-9)
    assert not np.allclose(model.w, model.default_w)  # it trained


# Upstream's own January-2025 code (other.py --model M) on the two upstream-check users in two environments: the
# published results (numpy 2.2 on an AVX-512 CPU: the "published" tie order, the default) and a run with numpy 1.26
# on a CPU without AVX-512 (check_users.UPSTREAM_NO_AVX512: the "generic" order, upstream/legacy_sort.py). In each
# order the fast trainer equals that environment's numbers.
@pytest.mark.parametrize("order", ["published", "generic"])
@pytest.mark.parametrize("algo", ["DASH", "DASH[MCM]", "HLR"])
def test_upstream_check_users_equal_upstreams_code(algo, order, tmp_path, monkeypatch):
    from check_users import CHECK, UPSTREAM, UPSTREAM_NO_AVX512
    from upstream.legacy_sort import TIE_ORDER_ENV
    from runner import read_results, run

    monkeypatch.setenv(TIE_ORDER_ENV, order)
    reference = UPSTREAM if order == "published" else UPSTREAM_NO_AVX512

    cfg = RunConfig(algo=algo, data=CHECK, processes=1, result_dir=tmp_path, quiet=True)
    assert run(cfg).exit_code == 0
    lines, _ = read_results(tmp_path / f"{cfg.name}.jsonl")
    assert {line["user"] for line in lines} == {8, 12}
    for line in lines:
        assert line["size"] == UPSTREAM[algo][str(line["user"])]["size"]
        assert line["metrics"]["LogLoss"] == pytest.approx(reference[algo][str(line["user"])]["metrics"]["LogLoss"],
                                                           abs=2e-6), (algo, order, line["user"])
