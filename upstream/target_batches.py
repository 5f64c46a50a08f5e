"""Upstream's per-target padded batches (fsrs-optimizer's BatchDataset) as numpy arrays, without torch.

Why here: upstream/training.py (the torch minibatch trainer) wraps these batches as tensors, and the Transformer's compiled
trainer (models/transformer.py) runs on them directly; keeping the one definition torch-free lets that trainer run
in a process that never imports torch (~2.5 s per process). The rules (spec models.md §0.4): rows whose history is
longer than max_seq_len are dropped (none left: InadequateData); the rest are sorted by history length (`sort_kind`,
see upstream/training.py) and cut into consecutive batches of batch_size, each zero-padded to its own longest history,
time-major ([L, B]) like upstream.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from models.base import InadequateData, ReviewData


class TargetBatch(NamedTuple):
    t: np.ndarray  # [L, B] float64: interval before each history review (0 for the first and for padding)
    g: np.ndarray  # [L, B] float64: rating of each history review (0 for padding)
    lengths: np.ndarray  # [B] int64: real history length (>= 1)
    delta_t: np.ndarray  # [B] float64: the target's elapsed time
    y: np.ndarray  # [B] float64 0/1
    weight: np.ndarray  # [B] float64
    rows: np.ndarray  # [B] positions of these targets in the ReviewData


def pad_histories(seq_delta_t: np.ndarray, seq_rating: np.ndarray, starts: np.ndarray, lengths: np.ndarray,
                  width: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """[n, width] arrays of the histories seq[start : start+length], zero-padded at the end (vectorised gather)."""
    starts = np.asarray(starts, dtype=np.int64)
    lengths = np.asarray(lengths, dtype=np.int64)
    if width is None:
        width = int(lengths.max()) if len(lengths) else 0
    cols = np.arange(width, dtype=np.int64)
    mask = cols[None, :] < lengths[:, None]
    idx = np.where(mask, starts[:, None] + cols[None, :], 0)
    if len(seq_delta_t) == 0:
        return np.zeros((len(starts), width)), np.zeros((len(starts), width))
    t = np.where(mask, seq_delta_t[idx], 0.0)
    g = np.where(mask, seq_rating[idx].astype(np.float64), 0.0)
    return t, g


def target_batches(data: ReviewData, weights: np.ndarray, batch_size: int, max_seq_len: int,
                   sort_kind: str = "stable") -> list[TargetBatch]:
    """Upstream's BatchDataset: drop rows with history > max_seq_len, sort by length, cut, pad per batch."""
    rows = data.rows
    lengths = rows["seq_pos"].to_numpy(np.int64)
    keep = np.flatnonzero(lengths <= max_seq_len)
    if len(keep) == 0:
        raise InadequateData("every training row's history is longer than max_seq_len")
    from engine.seq_engine import argsort

    order = keep[argsort(lengths[keep], sort_kind)]
    starts = rows["seq_start"].to_numpy(np.int64)
    delta_t = rows["delta_t"].to_numpy(np.float64)
    y = rows["y"].to_numpy(np.float64)
    weights = np.asarray(weights, dtype=np.float64)
    batch_size = max(1, int(batch_size))
    batches = []
    for lo in range(0, len(order), batch_size):
        sel = order[lo:lo + batch_size]
        t, g = pad_histories(data.seq_delta_t, data.seq_rating, starts[sel], lengths[sel])
        batches.append(TargetBatch(np.ascontiguousarray(t.T), np.ascontiguousarray(g.T), lengths[sel],
                                   delta_t[sel], y[sel], weights[sel], sel))
    return batches


def check_diverged(states: list, evaluate) -> float:
    """The "training diverged" rule of a run that keeps its final weights: InadequateData when evaluate(state) is
    NaN (not < inf) for every state (the checkpoints training.train would have evaluated, in any order). States
    are evaluated in the order given until one is finite, whose loss is returned: pass the final weights first,
    the one finite in all but broken runs."""
    for state in states:
        loss = evaluate(state)
        if loss < np.inf:
            return loss
    raise InadequateData("training diverged (no finite evaluation loss)")
