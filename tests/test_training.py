"""upstream/training.py: the upstream-style minibatch trainer (batching, shuffling, loss, clipping, best epoch, recency)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import upstream.training as training
from config import RunConfig
from models.base import InadequateData
from models.fsrs6 import CLIP_HI, CLIP_LO, FSRS6
from models import fsrs6
from upstream.fsrs6_torch import FSRS6Net
from test_fsrs6 import W, W_OTHER, make_data, simulate


@pytest.fixture(scope="module")
def sim_data():
    cards, times = simulate(200, seed=21, w_true=W_OTHER, same_day_hard=True)
    return make_data(cards, times)


class Constant(training.TrainableModule):
    """p = σ(a) for every row: the simplest trainable model, with a recorder of the batches it sees."""

    def __init__(self, a: float, lo=-20.0, hi=20.0, pen: float = 0.0):
        super().__init__()
        self.a = nn.Parameter(torch.tensor([a]))
        self.lo, self.hi, self.pen = lo, hi, pen
        self.seen: list[np.ndarray] = []

    def forward_batch(self, batch):
        if self.training:
            self.seen.append(batch.rows.copy())
        return torch.sigmoid(self.a).expand(len(batch))

    def penalty(self):
        return self.pen * torch.sum(self.a ** 2) if self.pen else None

    def clip_(self):
        self.a.data.clamp_(self.lo, self.hi)


def _cfg(**kw):
    kw.setdefault("trainer", "upstream")  # these tests are about the upstream-style torch trainer
    return RunConfig(**kw)


# ------------------------------------------------------------------------------------------------ batching
def test_batches_drop_long_sort_stably_and_pad_per_batch():
    # Card histories of lengths 1..6; max_seq_len 4 drops the rows with history 5 and 6.
    cards = [[(0, 3)] + [(k + 1, 3) for k in range(6)], [(0, 1), (2, 3), (0, 3), (1, 1)]]
    data = make_data(cards)
    lengths = data.rows["seq_pos"].to_numpy()
    batches = training.make_batches(data, np.ones(len(data)), batch_size=4, max_seq_len=4)
    rows = np.concatenate([b.rows for b in batches])
    kept = np.flatnonzero(lengths <= 4)
    assert sorted(rows) == list(kept)
    assert list(rows) == list(kept[np.argsort(lengths[kept], kind="stable")])  # stable by length
    assert [len(b) for b in batches] == [4, 2]
    for b in batches:
        assert b.t.shape == (int(b.lengths.max()), len(b))  # trimmed to the batch's longest history
        for j, r in enumerate(b.rows):
            th, gh = data.history(r)
            n = len(th)
            assert b.t[:n, j].tolist() == list(th) and b.g[:n, j].tolist() == list(gh)
            assert not b.t[n:, j].any() and not b.g[n:, j].any()  # zero padding at the end


def test_inadequate_data():
    data = make_data([[(0, 3)] + [(1, 3)] * 5])
    with pytest.raises(InadequateData):
        training.train(Constant(0.0), data.subset(np.zeros(len(data), dtype=bool)), _cfg())
    long_only = data.subset((data.rows["seq_pos"] > 2).to_numpy())
    with pytest.raises(InadequateData):
        training.train(Constant(0.0), long_only, _cfg(max_seq_len=2))
    with pytest.raises(InadequateData):  # FSRS6 passes it on (the runner then falls back to defaults)
        FSRS6(_cfg(max_seq_len=2)).fit(long_only)


def test_recency_weights():
    np.testing.assert_allclose(training.recency_weights(5), 0.25 + 0.75 * np.array([0, 1, 8, 27, 64]) / 64)
    assert training.recency_weights(1).tolist() == [0.25]
    # In training, a row's weight follows its time position among ALL training rows.
    data = make_data([[(0, 3), (1, 3), (2, 1), (3, 3)], [(0, 3), (4, 3)]])
    seen = {}

    class Rec(Constant):
        def forward_batch(self, batch):
            for r, wt in zip(batch.rows, batch.weight.tolist()):
                seen[int(r)] = wt
            return super().forward_batch(batch)

    training.train(Rec(0.0), data, _cfg(recency=True, n_epoch=1))
    np.testing.assert_allclose([seen[k] for k in range(len(data))], training.recency_weights(len(data)), rtol=1e-6)


# ------------------------------------------------------------------------------------------------ the loop
def test_batch_order_is_randperm_2023(sim_data):
    m = Constant(0.0)
    cfg = _cfg(batch_size=64, n_epoch=3)
    training.train(m, sim_data, cfg)
    batches = training.make_batches(sim_data, np.ones(len(sim_data)), 64, 64)
    first_rows = {int(b.rows[0]): k for k, b in enumerate(batches)}
    order = [first_rows[int(r[0])] for r in m.seen]
    gen = torch.Generator().manual_seed(2023)
    expected = sum((torch.randperm(len(batches), generator=gen).tolist() for _ in range(3)), [])
    assert order == expected


def test_loss_schedule_and_eval_by_hand():
    """Two epochs of one batch each on a constant model, replayed by hand with torch's own Adam + cosine."""
    data = make_data([[(0, 3), (1, 3), (2, 1), (3, 3), (1, 3)]])
    y = torch.tensor(data.rows["y"].to_numpy(), dtype=torch.float32)
    m = Constant(0.3, pen=0.5)
    res = training.train(m, data, _cfg(n_epoch=2, recency=True))
    n = len(data)
    wt = torch.tensor(training.recency_weights(n), dtype=torch.float32)

    a = nn.Parameter(torch.tensor([0.3]))
    opt = torch.optim.Adam([a], lr=4e-2, betas=(0.9, 0.999))
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=2)

    def eval_loss():
        with torch.no_grad():
            p = torch.sigmoid(a).expand(n)
            return float((F.binary_cross_entropy(p, y, reduction="none") * wt).mean() + 0.5 * a[0] ** 2 / n)

    losses = []
    for _ in range(2):
        losses.append(eval_loss())
        opt.zero_grad()
        p = torch.sigmoid(a).expand(n)
        loss = (F.binary_cross_entropy(p, y, reduction="none") * wt).sum() + 0.5 * torch.sum(a ** 2) * n / n
        loss.backward()
        opt.step()
        sched.step()
    losses.append(eval_loss())
    np.testing.assert_allclose(res.eval_losses, losses, rtol=1e-6)
    assert res.best_epoch == int(np.argmin(losses))


def test_reproducible_and_lowers_objective(sim_data):
    m1, m2 = FSRS6(_cfg()).fit(sim_data), FSRS6(_cfg()).fit(sim_data)
    assert m1.w == m2.w
    res = m1.train_result
    assert len(res.eval_losses) == 6
    assert res.best_loss < res.eval_losses[0] - 1e-3  # better than the post-S0 weights
    assert res.best_loss == min(res.eval_losses) and res.best_epoch == int(np.argmin(res.eval_losses))
    # The final weights are the checkpoint's: re-evaluating them gives the best loss.
    net = FSRS6Net(fsrs6, m1.w, m1.w_init)
    batches = training.make_batches(sim_data, np.ones(len(sim_data)), 512, 64)
    assert training._eval_loss(net, batches, res.n_rows) == pytest.approx(res.best_loss, rel=1e-5)


def test_clipping_holds_after_every_step(sim_data):
    class Checked(FSRS6Net):
        def forward_batch(self, batch):
            w = self.w.detach().numpy()
            assert np.all(w >= np.array(CLIP_LO, np.float32)) and np.all(w <= np.array(CLIP_HI, np.float32))
            return super().forward_batch(batch)

    net = Checked(fsrs6, W)
    net.make_optimizer = lambda lr: torch.optim.Adam(net.parameters(), lr=0.5)  # big steps hit the bounds
    training.train(net, sim_data, _cfg(batch_size=128, n_epoch=2))
    w = net.w.detach().numpy()
    assert np.all(w >= np.array(CLIP_LO, np.float32)) and np.all(w <= np.array(CLIP_HI, np.float32))
    # clip_ itself projects into the box.
    net.w.data[:] = 1e6
    net.clip_()
    assert net.w.tolist() == pytest.approx(CLIP_HI)
    net.w.data[:] = -1e6
    net.clip_()
    assert net.w.tolist() == pytest.approx(CLIP_LO)


def test_initial_weights_win_when_training_only_hurts():
    # Start at the optimum with a huge learning rate: every epoch is worse, so the initial weights come back.
    data = make_data([[(0, 3)] + [(1, 3)] * 6 + [(1, 1)] * 2])
    ybar = data.rows["y"].mean()
    m = Constant(float(np.log(ybar / (1 - ybar))))
    a0 = m.a.detach().clone()
    m.make_optimizer = lambda lr: torch.optim.Adam(m.parameters(), lr=5.0)
    res = training.train(m, data, _cfg(n_epoch=3))
    assert res.best_epoch == 0 and min(res.eval_losses[1:]) > res.eval_losses[0]
    assert torch.equal(m.a.detach(), a0)
