"""FSRS-rs: FSRS-6 trained by the Rust `fsrs` crate (through fsrs-rs-python), predicted by our FSRS-6 (spec §1.4).

What upstream's row does, and what this module reproduces (srs-benchmark `model_processors.py:process_fsrs_rs` and
`models/fsrs_rs.py`; Era A: `script.py --rust`, both read at the commits cited in the report of issue "FSRS-rs"):

- Histories include same-day reviews (like FSRS-5/6): `config.ALWAYS_SHORT` holds "FSRS-rs", so the targets and
  therefore the per-user `size` are exactly FSRS-6's.
- Training: one `FSRSItem` per training target, in time order (`review_th`), holding the card's whole kept review
  list up to and including the target: delta_t as integer days (`max(0, int(t))`), the first review 0, same-day
  reviews 0. The list is `fsrs_rs_python.FSRS(parameters=[]).benchmark(items)`, which does its own S0
  initialisation (items with exactly one long-term review), its own recency weighting 0.25 + 0.75·x³ (so no
  `--recency` weighting is added here) and the training proper.
- Long histories: the feature pipeline keeps each card's first 2·max_seq_len = 128 reviews (as upstream's does);
  `benchmark()` then drops the items with more than max_seq_len = 64 reviews from the gradient steps (they still
  count in the S0 initialisation and in the recency positions). Up to fsrs-rs 6.4 `benchmark()` hard-coded that
  64; since fsrs-rs 6.6 (fsrs-rs-python 0.9.3) it reads `TrainingConfig.max_seq_len`, whose default is 256, so the
  64 is passed explicitly here (`cfg.max_seq_len`).
- The trained weights are rounded to 4 decimals (upstream: `round(x, 4)`).
- Prediction: upstream feeds the Rust weights to fsrs-optimizer's Python `Collection` (the same FSRS-6 code as its
  FSRS-6 row) and the power curve with decay w20; it does not use the Rust memory state. Here that is our FSRS-6's
  forward pass (`models.fsrs6.predict`), which reproduces that Collection. (The Rust memory state differs on histories with a same-day
  Hard review: fsrs-rs floors the same-day growth for G >= 2, the published Python model for G >= 3.)
- Inadequate training data (no item with exactly one long-term review, or any failure inside `benchmark()`, which
  panics rather than raising) → `InadequateData`, and the runner falls back to the default weights, as upstream
  falls back to `FSRS6.init_w`.

Where the time goes (45k-review simulated user, 5 folds, CPU): the library's `benchmark()` ≈ 0.4 s — its own
optimiser, untouched — and on our side building its items (0.2 s before, 0.08 s now: `training_items`), the
shared pipeline (features, split, metrics) and the FSRS-6 prediction. `benchmark()` runs on the calling thread
(no rayon pool was started in our measurements; workers cap RAYON_NUM_THREADS at 1 all the same:
local_pool.init_worker), so its CPU time is the process's and counted as such.
"""

from __future__ import annotations

import numpy as np

import models.fsrs6 as fsrs6
from models.base import InadequateData, Model, ReviewData
from models.fsrs6 import DEFAULT_W

ROUND_DECIMALS = 4  # upstream rounds the weights benchmark() returns


def _fsrs_rs():
    try:
        import fsrs_rs_python
    except ImportError as exc:  # pragma: no cover - it is in requirements.txt
        raise RuntimeError("FSRS-rs needs the fsrs-rs-python package (pip install fsrs-rs-python==0.9.3)") from exc
    return fsrs_rs_python


def item_reviews(data: ReviewData) -> list[list[tuple[int, int]]]:
    """(rating, delta_t) lists of the items, one per target row of `data` in time order: the card's reviews up to and
    including the target. Plain tuples (for tests and inspection); `training_items` builds the FSRSItems."""
    order, starts, ends = _item_bounds(data)
    dt, g = _review_arrays(data)
    return [list(zip(g[s:e].tolist(), dt[s:e].tolist())) for s, e in zip(starts[order], ends[order])]


def _item_bounds(data: ReviewData) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rows = data.rows
    starts = rows["seq_start"].to_numpy(np.int64)
    ends = starts + rows["seq_pos"].to_numpy(np.int64) + 1  # the target review is the item's last element
    order = np.argsort(rows["review_th"].to_numpy(np.int64), kind="stable")  # upstream sorts items by review_th
    return order, starts, ends


def _review_arrays(data: ReviewData) -> tuple[np.ndarray, np.ndarray]:
    """Integer delta_t (upstream: max(0, int(t))) and ratings of every sequence position."""
    dt = np.maximum(0, np.trunc(data.seq_delta_t)).astype(np.int64)
    return dt, data.seq_rating.astype(np.int64)


def training_items(data: ReviewData) -> list:
    """The `FSRSItem`s upstream passes to `benchmark()` for these training rows, in time order.

    Why it is built this way: one Python call per item is the floor (the library takes a list of FSRSItems, each
    made from a list of FSRSReviews), so everything else stays in numpy. An FSRSReview is a plain (rating,
    delta_t) value that FSRSItem copies, so one object per distinct pair serves every review with that pair
    (a few thousand objects instead of one per review); each item's list is a slice of the object array of the
    sequence positions, taken in C (`tolist`). 3-4× faster than one FSRSReview per card review (big simulated
    user, 45k reviews: 0.33 → 0.09 s over its 5 folds)."""
    rs = _fsrs_rs()
    order, starts, ends = _item_bounds(data)
    if len(order) == 0:
        return []
    dt, g = _review_arrays(data)
    g_min, base = int(g.min()), int(g.max() - g.min()) + 1
    keys, inverse = np.unique(dt * base + (g - g_min), return_inverse=True)
    FSRSReview, FSRSItem = rs.FSRSReview, rs.FSRSItem
    distinct = np.empty(len(keys), dtype=object)
    distinct[:] = [FSRSReview(k % base + g_min, k // base) for k in keys.tolist()]
    reviews = distinct[inverse.reshape(-1)].tolist()
    return [FSRSItem(reviews[s:e]) for s, e in zip(starts[order].tolist(), ends[order].tolist())]


def _has_first_long_term_item(data: ReviewData) -> bool:
    """benchmark() needs an item with exactly one review with delta_t > 0 (the S0 data); otherwise it panics."""
    rows = data.rows
    if len(rows) == 0:
        return False
    dt, _ = _review_arrays(data)
    long_term = np.concatenate([[0], np.cumsum(dt > 0)])  # prefix counts of long-term reviews
    starts = rows["seq_start"].to_numpy(np.int64)
    ends = starts + rows["seq_pos"].to_numpy(np.int64) + 1
    return bool(np.any(long_term[ends] - long_term[starts] == 1))


class FSRSRs(Model):
    name = "FSRS-rs"

    def __init__(self, cfg=None):
        if cfg is None:
            from config import RunConfig

            cfg = RunConfig(algo="FSRS-rs")
        if cfg.S0:
            raise ValueError("FSRS-rs has no --pretrain/--S0 mode (upstream's --rust trains all 21 weights)")
        self.cfg = cfg
        self.n_params = 0 if cfg.default else 21
        self.w = list(DEFAULT_W)

    def fit(self, train: ReviewData) -> "FSRSRs":
        if self.cfg.default:
            return self
        if not _has_first_long_term_item(train):
            raise InadequateData("FSRS-rs: no training item with exactly one long-term review (S0 data)")
        rs = _fsrs_rs()
        items = training_items(train)
        config = rs.TrainingConfig(max_seq_len=int(self.cfg.max_seq_len))
        try:
            w = rs.FSRS(parameters=[]).benchmark(items, training_config=config)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # pyo3's PanicException derives from BaseException
            raise InadequateData(f"FSRS-rs: benchmark() failed: {type(exc).__name__}: {exc}") from exc
        w = [float(x) for x in w]
        if len(w) != len(DEFAULT_W) or not np.all(np.isfinite(w)):
            raise InadequateData(f"FSRS-rs: benchmark() returned {len(w)} weights, not {len(DEFAULT_W)} finite ones")
        self.w = [round(x, ROUND_DECIMALS) for x in w]
        return self

    def predict(self, test: ReviewData) -> np.ndarray:
        return fsrs6.predict(self.w, test)

    def rust_stabilities(self, data: ReviewData) -> np.ndarray:
        """S after each target's history from the Rust model (`memory_state_batch`), for cross-checks only."""
        rs = _fsrs_rs()
        rows = data.rows
        if len(rows) == 0:
            return np.empty(0)
        dt, g = _review_arrays(data)
        starts = rows["seq_start"].to_numpy(np.int64)
        ends = starts + rows["seq_pos"].to_numpy(np.int64)  # history only
        items = [rs.FSRSItem([rs.FSRSReview(r, t) for r, t in zip(g[s:e].tolist(), dt[s:e].tolist())])
                 for s, e in zip(starts.tolist(), ends.tolist())]
        states = rs.FSRS(parameters=list(self.w)).memory_state_batch(items)
        return np.array([st.stability for st in states], dtype=np.float64)

    def parameters(self) -> list[float]:
        return [round(float(x), 6) for x in self.w]
