"""Card resampling: intervals and head-to-head shares for ONE collection (report.py).

Across users, evaluate.py bootstraps users, which are independent. Within one collection the reviews are not: a
card's reviews share its difficulty and its history. So a resample draws the collection's cards with replacement
(as many cards as it has), and every evaluated review of a drawn card enters with the card's multiplicity. A
metric of a resample is the metric of that weighted set of reviews, with the same definitions as metrics.py:
Log Loss (mean BCE, p clipped to [eps, 1 − eps] as scikit-learn does), RMSE(bins) (bins of interval, review count
and lapses, each bin's mean prediction against its mean recall, weighted by its review count) and AUC (the
probability that a recalled review is ranked above a forgotten one, ties counting half).

Everything is a product of the multiplicity matrix (resamples × cards) with per-card sums, so 2,000 resamples of
a 10,000-review collection take milliseconds per model.
"""

from __future__ import annotations

import numpy as np
from scipy import sparse

import metrics

CONFIDENCE = 0.99
N_RESAMPLES = 2000
SEED = 42


def card_multiplicities(n_cards: int, n_resamples: int = N_RESAMPLES, seed: int = SEED, chunk: int = 250):
    """Blocks of the (n_resamples, n_cards) matrix of how often each card is drawn when n_cards cards are drawn with
    replacement, `chunk` resamples at a time (a large collection's whole matrix would not fit in memory); the
    blocks are the rows of one draw from one generator, so they do not depend on `chunk`."""
    rng = np.random.default_rng(seed)
    uniform = np.full(n_cards, 1.0 / n_cards)
    for lo in range(0, n_resamples, chunk):
        yield rng.multinomial(n_cards, uniform, size=min(chunk, n_resamples - lo)).astype(np.float64)


def _per_card(card: np.ndarray, values: np.ndarray, n_cards: int) -> np.ndarray:
    return np.bincount(card, weights=values, minlength=n_cards)


def card_losses(card: np.ndarray, y: np.ndarray, p: np.ndarray, n_cards: int) -> tuple[np.ndarray, np.ndarray]:
    """Per card: summed binary cross-entropy of its reviews and their number (sklearn's log_loss clipping)."""
    eps = np.finfo(np.float64).eps
    p = np.clip(np.asarray(p, np.float64), eps, 1 - eps)
    loss = -(y * np.log(p) + (1 - y) * np.log1p(-p))
    return _per_card(card, loss, n_cards), _per_card(card, np.ones(len(card)), n_cards)


def log_loss(W: np.ndarray, card: np.ndarray, y: np.ndarray, p: np.ndarray) -> np.ndarray:
    """Log Loss of every resample (rows of W)."""
    loss, count = card_losses(card, y, p, W.shape[1])
    return (W @ loss) / (W @ count)


def _resampled_sums(W: np.ndarray, card: np.ndarray, group: np.ndarray, columns: list[np.ndarray]) -> list:
    """For each array of per-review values: resamples × groups sums, i.e. W times the per-(card, group) sums (sparse:
    a card's reviews fall in few groups)."""
    shape = (W.shape[1], int(group.max()) + 1)
    stacked = sparse.hstack([sparse.csr_matrix((np.asarray(v, np.float64), (card, group)), shape=shape)
                             for v in columns]).tocsr()
    sums = np.asarray((stacked.T @ W.T).T)
    return np.split(sums, len(columns), axis=1)


def rmse_bins(W: np.ndarray, card: np.ndarray, y: np.ndarray, p: np.ndarray, elapsed_days, i, lapses) -> np.ndarray:
    """RMSE(bins) of every resample: per-bin sums weighted per resample, then metrics.rmse_bins' formula."""
    keys = np.stack([metrics.interval_bin(elapsed_days), metrics.review_count_bin(i), metrics.lapse_bin(lapses)])
    _, bin_id = np.unique(keys, axis=1, return_inverse=True)
    n, sum_y, sum_p = _resampled_sums(W, card, bin_id.ravel(), [np.ones(len(card)), y, p])
    with np.errstate(invalid="ignore", divide="ignore"):
        diff = np.where(n > 0, (sum_y - sum_p) / n, 0.0)
    return np.sqrt((n * diff**2).sum(axis=1) / n.sum(axis=1))


def auc(W: np.ndarray, card: np.ndarray, y: np.ndarray, p: np.ndarray) -> np.ndarray:
    """AUC of every resample (NaN where a resample holds a single class): each group of equal predictions, in
    ascending order, credits its recalled reviews with the forgotten weight below it plus half its own."""
    y = np.asarray(y, np.float64)
    _, group = np.unique(np.asarray(p), return_inverse=True)  # groups of equal predictions, ascending
    pos, neg = _resampled_sums(W, card, group.ravel(), [y, 1 - y])
    below = np.cumsum(neg, axis=1) - neg
    with np.errstate(invalid="ignore", divide="ignore"):
        return (pos * (below + 0.5 * neg)).sum(axis=1) / (pos.sum(axis=1) * neg.sum(axis=1))


def interval(values: np.ndarray, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Percentile interval of the resampled values (NaN resamples left out)."""
    values = values[np.isfinite(values)]
    if len(values) == 0:
        return float("nan"), float("nan")
    tail = (1 - confidence) / 2 * 100
    lo, hi = np.percentile(values, [tail, 100 - tail])
    return float(lo), float(hi)


def head_to_head(ll: np.ndarray) -> np.ndarray:
    """Share (%) of resamples in which the row model's Log Loss is lower than the column model's, ties counting
    half, so that share[a, b] + share[b, a] = 100. `ll`: resamples × models, every model's Log Loss on the reviews
    all compared models evaluated (each pair is judged on the same reviews)."""
    m = ll.shape[1]
    share = np.full((m, m), np.nan)
    for a in range(m):
        for b in range(m):
            if a != b:
                share[a, b] = 100 * (np.mean(ll[:, a] < ll[:, b]) + 0.5 * np.mean(ll[:, a] == ll[:, b]))
    return share
