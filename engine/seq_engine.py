"""The general one-pass-per-card engine: predictions, loss and gradients for any sequence model, and its trainer.

Why: every target of a card is a prefix of one review sequence (`ReviewData`), so a model's predictions for ALL of a
card's targets come from one forward pass over the card, and the gradient of their summed loss from one reverse
pass (carrying the state adjoint backwards). The upstream trainer instead re-runs each target's whole history,
padded per batch, through autograd: Σ_targets history_length steps per epoch instead of Σ_cards sequence_length.

A model plugs in with its step function and its vector-Jacobian products written once as numba functions (the
contract: engine/seq_model_stub.py); `instantiate` compiles the engine's kernels (engine/seq_engine_kernels.py) for
that model. What depends only on the weights is hoisted out of the per-review loop by the model's optional
`precompute` (once per mini-batch / call, with its own VJP folding the constants' adjoints back into the gradient);
a model may also keep a step's intermediates in its state for its own step_vjp (N_ADJ), fuse a target's curve
and BCE (target_loss / target_loss_vjp), and compute a target read at the next review's elapsed time with that
step (step_target / step_target_vjp); and it may name a module of lane kernels (LANE_KERNELS: its
lanes_loss_grad runs the trainer's batches with several cards side by side, vectorised; engine/traced_lanes.py
generates them, lane_kernels/fsrs_v5_lanes.py is FSRS-5's by hand).
Models that define none of these run exactly as before. The trainer
minimises upstream's objective
    L(w) = Σ_i weight_i · BCE(p_i(w), y_i) + Σ_j ((w_j − w_init_j) / σ_j)²     (no prior: σ = ∞)
with Adam (lr 4e-2), a per-step cosine schedule over mini-batches of whole cards (≈ batch_size targets, order
shuffled per epoch with a seeded numpy Generator), the model's clip box after every step, frozen parameters
(grad_mask), and upstream's best-checkpoint rule on the full objective. Training rows with a history longer than
max_seq_len are left out of the loss, as upstream's BatchDataset drops them.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
from functools import lru_cache, partial
from pathlib import Path

import numpy as np
from numba import typeof

from models.base import ReviewData, column, recency_weights
from engine.jit_cache import Unit
from engine.lanes import kernel_address
from upstream.torch_rng import SHUFFLE_SEED, TorchGenerator

SEED = 2023
LR = 4e-2
NUMPY126 = "numpy1.26"  # sort_kind of numpy 1.26's quicksort tie order (argsort)
_TEMPLATE = Path(__file__).with_name("seq_engine_kernels.py")
_STUB_IMPORT = "from engine.seq_model_stub import *"
_GENERIC_BEGIN = "# ---- GENERIC-CARD-BEGIN"
_GENERIC_END = "# ---- GENERIC-CARD-END"
_CUSTOM_BEGIN = "# ---- CUSTOM-CARD-BEGIN"
_CUSTOM_END = "# ---- CUSTOM-CARD-END"
_TARGET_BEGIN = "# ---- DEFAULT-TARGET-BEGIN"
_TARGET_END = "# ---- DEFAULT-TARGET-END"
_PLAIN_BEGIN = "# ---- PLAIN-LOSS-BEGIN"
_PLAIN_END = "# ---- PLAIN-LOSS-END"
_FUSED_BEGIN = "# ---- STEP-TARGET-BEGIN"
_FUSED_END = "# ---- STEP-TARGET-END"
_CARD_BATCH = ("# ---- CARD-BATCH-BEGIN", "# ---- CARD-BATCH-END")
_LANE_BATCH = ("# ---- LANE-BATCH-BEGIN", "# ---- LANE-BATCH-END")
_LANE_ONLY = ("# ---- LANE-ONLY-BEGIN", "# ---- LANE-ONLY-END")
_LANE_LOSS = ("# ---- LANE-LOSS-BEGIN", "# ---- LANE-LOSS-END")
_INSTANCES: dict[tuple[str, bool], object] = {}


def _engine_dir() -> Path:
    """Where instantiated kernels live: $SRS_BENCH_ENGINE_DIR, else numba's cache folder (models/__init__.py names
    it after the package's sources, so an edited model never meets stale compiled code), else the temp dir."""
    candidates = []
    if os.environ.get("SRS_BENCH_ENGINE_DIR"):
        candidates.append(Path(os.environ["SRS_BENCH_ENGINE_DIR"]))
    if os.environ.get("NUMBA_CACHE_DIR"):
        candidates.append(Path(os.environ["NUMBA_CACHE_DIR"]) / "engines")
    candidates.append(Path(tempfile.gettempdir()) / "srs-bench-engines")
    for path in candidates:
        try:
            path.mkdir(parents=True, exist_ok=True)
            if os.access(path, os.W_OK):
                return path
        except OSError:
            continue
    raise RuntimeError("no writable directory for compiled engine kernels (set SRS_BENCH_ENGINE_DIR)")


def bound_copy(source: str, placeholder: str, binding: str, name: str):
    """Import a copy of a numba module's `source` with its line `placeholder` replaced by `binding` (the import of
    one model's functions). Why a copy: numba caches compiled code per source file, and a function passed as an
    argument is never found in that cache (it recompiled in every process), so each model gets its own file
    (.cache/…/engines), written once per content and compiled once."""
    if placeholder not in source:
        raise RuntimeError(f"{name}: template line {placeholder!r} not found")
    return import_generated(source.replace(placeholder, binding), name, 10)


def import_generated(source: str, name: str, digits: int):
    """The module of generated `source`, written once per content into the engine directory as
    <name>_<hash>.py (numba's disk cache needs a real file) and imported under that name."""
    stem = f"{name}_{hashlib.sha1(source.encode()).hexdigest()[:digits]}"
    if stem in sys.modules:
        return sys.modules[stem]
    path = _engine_dir() / f"{stem}.py"
    if not path.exists() or path.read_text(encoding="utf-8") != source:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(source, encoding="utf-8")
        os.replace(tmp, path)
    return load_generated(stem)


def load_generated(stem: str):
    """The generated module `stem` already written into the engine directory (import_generated), imported and
    registered under its name; None if its file is gone."""
    if stem in sys.modules:
        return sys.modules[stem]
    path = _engine_dir() / f"{stem}.py"
    if not path.exists():
        return None
    spec = importlib.util.spec_from_file_location(stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[stem] = module
    spec.loader.exec_module(module)
    return module


def _cut(source: str, begin: str, end: str) -> str:
    """The template without its section from the line `begin` to the line `end`."""
    a, b = source.index(begin), source.index(end)
    return source[:a] + source[b:]


def _source_digest(module) -> str:
    """A digest of the plug-in's own source file, written into its engine copy. numba checks a cached kernel against
    the kernel's file only, and the cache folder (engine/jit_cache.py) follows the project's packages only: a plug-in
    outside them (a researcher's file, a test's) that changed would otherwise meet the engine compiled for its old
    functions. With the digest in the copy, a changed plug-in gets a new copy and compiles afresh."""
    path = getattr(module, "__file__", None)
    if not path:
        return "none"
    return hashlib.sha1(Path(path).read_bytes()).hexdigest()[:12]


def instantiate(model_module: str, fallback: bool = False):
    """The engine's kernels compiled for `model_module` (a module following engine/seq_model_stub.py). For a
    plug-in with lane kernels, the trainer's passes run on them alone (LANE-ONLY: a refused pass ends adam_fit,
    reporting it), or with `fallback` take a refused batch card by card (LANE-BATCH): the card loops are compiled
    only for the fits that need them."""
    if (model_module, fallback) in _INSTANCES:
        return _INSTANCES[model_module, fallback]
    model = importlib.import_module(model_module)
    source = _TEMPLATE.read_text(encoding="utf-8")
    names = ["N_STATE"]
    if hasattr(model, "card_loss_grad"):
        source = _cut(source, _GENERIC_BEGIN, _GENERIC_END)
        names += ["card_loss_grad", "card_predict"]
    else:
        source = _cut(source, _CUSTOM_BEGIN, _CUSTOM_END)
        names += ["init", "step", "curve", "init_vjp", "step_vjp", "curve_vjp"]
        if hasattr(model, "step_value"):  # a step for predictions: the new state alone (engine/traced_codegen.py)
            names.append("step_value")
        if hasattr(model, "target_loss_vjp"):
            source = _cut(source, _TARGET_BEGIN, _TARGET_END)
            names += ["target_loss", "target_loss_vjp"]
        if hasattr(model, "step_target_vjp"):
            source = _cut(source, _PLAIN_BEGIN, _PLAIN_END)
            names += ["step_target", "step_target_vjp"]
        else:
            source = _cut(source, _FUSED_BEGIN, _FUSED_END)
    lanes = getattr(model, "LANE_KERNELS", None)  # a module with the plug-in's lanes_loss_grad
    if not lanes:
        unused = [_LANE_BATCH, _LANE_ONLY, _LANE_LOSS]
    else:
        unused = [_CARD_BATCH, _LANE_ONLY if fallback else _LANE_BATCH]
    for section in unused:
        source = _cut(source, *section)
    if hasattr(model, "N_ADJ"):
        names.append("N_ADJ")
    if hasattr(model, "precompute"):
        names += ["precompute", "precompute_vjp"]
    binding = f"from {model_module} import {', '.join(names)}"
    if not hasattr(model, "N_ADJ"):
        binding += "\nN_ADJ = N_STATE"
    if not hasattr(model, "card_loss_grad") and not hasattr(model, "step_value"):
        binding += "\nstep_value = step"
    if not hasattr(model, "precompute"):  # the stub's no-op defaults: wc is w, gw += gwc
        binding += "\nfrom engine.seq_model_stub import precompute, precompute_vjp"
    binding += f"\nfrom {model_module if hasattr(model, 'project') else 'engine.seq_model_stub'} import project"
    if lanes:  # the lane kernel itself is passed to adam_fit at run time, as its address (lane_kernel)
        binding += "\nfrom engine.lanes import call_lane_kernel, card_items"
    binding += f"\n# plug-in source {_source_digest(model)}"
    module = bound_copy(source, _STUB_IMPORT, binding, f"engine_{model_module.replace('.', '_')}")
    _INSTANCES[model_module, fallback] = module
    return module


_LANE_KERNELS: dict[str, int] = {}


def lane_function(kernels: str):
    """The lane kernel a LANE_KERNELS value names: "module" (its lanes_loss_grad) or "module:function"."""
    module, _, function = kernels.partition(":")
    return getattr(importlib.import_module(module), function or "lanes_loss_grad")


def lane_kernel(model_module: str) -> int:
    """The address of the plug-in's lane kernel (its LANE_KERNELS: "module", whose lanes_loss_grad, or
    "module:function"), compiled (or loaded from the disk cache) on its own: the engine's loops call it through
    engine/lanes.call_lane_kernel, so compiling them neither waits for nor repeats the kernel's optimisation.
    0 for a plug-in without lanes."""
    if model_module not in _LANE_KERNELS:
        name = getattr(importlib.import_module(model_module), "LANE_KERNELS", None)
        address = 0
        if name:
            address = kernel_address(lane_function(name))
        _LANE_KERNELS[model_module] = address
    return _LANE_KERNELS[model_module]


def lane_units(kernels: str, model_module: str) -> list[Unit]:
    """The lane kernel `kernels` (a LANE_KERNELS value) as compile units: the kernel, after the large parts its
    module lists in PARTS ((helper, argument types) pairs: @inlined helpers it calls), each a unit of its own, so
    that a first run's workers compile them side by side and the kernel then loads them from the cache."""
    kernel = lane_function(kernels)
    module = kernels.partition(":")[0]
    mod = importlib.import_module(module)
    parts = [Unit(f"lane kernel part {module}.{helper.py_func.__name__}", 2.0,
                  partial(helper.compile_for, kernel, argtypes)) for helper, argtypes in getattr(mod, "PARTS", ())]
    return parts + [Unit(f"lane kernel {kernels}", 2.5 if parts else 4.0, partial(lane_kernel, model_module),
                         after=tuple(p.label for p in parts))]


def toy_data() -> ReviewData:
    """Two cards, five reviews, three targets: enough for every kernel of a fit and a prediction to be compiled with
    the argument types real data gives them (SeqEngine.compile_units)."""
    import pandas as pd

    rows = pd.DataFrame({"card_id": [0, 0, 1], "delta_t": [1.0, 3.0, 2.0], "y": [1, 0, 1],
                         "seq_start": [0, 0, 3], "seq_pos": [1, 2, 1]})
    return ReviewData(rows, np.array([0.0, 1.0, 3.0, 0.0, 2.0]), np.array([3, 3, 1, 1, 3], dtype=np.int8))


def card_order(sel: np.ndarray, start: np.ndarray, pos: np.ndarray, n_seq: int) -> np.ndarray:
    """The rows `sel` ordered by (seq_start, seq_pos), i.e. np.lexsort((pos[sel], start[sel])) applied to sel, in
    linear time. A row is the review at seq_start + seq_pos of the sequence arrays (models/base.py), and a card's
    reviews are one contiguous block there, so that index orders the rows exactly as (card, history length) does
    and, being unique, by one scatter over the n_seq sequence slots instead of a sort (the lexsort was half of
    the engine's set-up time per fit and prediction). Rows that break the invariant (two rows on one review)
    fall back to the lexsort."""
    key = start[sel] + pos[sel]
    if len(key) and 0 <= key.min() and key.max() < n_seq:
        slot = np.full(n_seq, -1, dtype=np.int64)
        slot[key] = sel
        order = slot[slot >= 0]
        if len(order) == len(sel):
            return order
    return sel[np.lexsort((pos[sel], start[sel]))]


class Cards:
    """Targets grouped by card (sorted by history length), with the sequence span each card needs."""

    __slots__ = ("seq_dt", "seq_g", "c_start", "c_n", "c_tb", "c_te", "t_pos", "t_dt", "t_y", "t_wt", "t_row",
                 "max_n")

    def __init__(self, data: ReviewData, weights: np.ndarray | None = None, keep: np.ndarray | None = None):
        rows = data.rows
        start = column(rows, "seq_start", np.int64)
        pos = column(rows, "seq_pos", np.int64)
        sel = np.arange(len(rows)) if keep is None else np.flatnonzero(keep)
        sel = sel[pos[sel] >= 1]  # a first review has no history and is never a target
        order = card_order(sel, start, pos, len(data.seq_delta_t))
        self.t_row = order
        self.t_pos = pos[order]
        self.t_dt = column(rows, "delta_t", np.float64)[order]
        self.t_y = column(rows, "y", np.float64)[order]
        w = np.ones(len(rows)) if weights is None else np.asarray(weights, dtype=np.float64)
        self.t_wt = w[order]
        st = start[order]
        first = np.ones(len(order), dtype=bool)
        first[1:] = st[1:] != st[:-1]
        self.c_tb = np.flatnonzero(first).astype(np.int64)
        self.c_te = np.append(self.c_tb[1:], len(order)).astype(np.int64)
        self.c_start = st[self.c_tb]
        self.c_n = self.t_pos[self.c_te - 1] if len(order) else np.zeros(0, dtype=np.int64)  # states 0..maxpos-1
        self.max_n = int(self.c_n.max()) if len(self.c_n) else 1
        self.seq_dt = np.ascontiguousarray(data.seq_delta_t, dtype=np.float64)
        self.seq_g = np.ascontiguousarray(data.seq_rating, dtype=np.int64)

    def args(self) -> tuple:
        return (self.seq_dt, self.seq_g, self.c_start, self.c_n, self.c_tb, self.c_te, self.t_pos, self.t_dt)

    def card_of(self) -> np.ndarray:
        """The card (index into c_start) of every target."""
        return np.repeat(np.arange(len(self.c_start)), self.c_te - self.c_tb)


def time_order(t_row: np.ndarray) -> np.ndarray:
    """np.argsort(t_row, kind="stable") for distinct non-negative row numbers (Cards.t_row), by one scatter over
    the row numbers instead of a sort: the positions of the targets in time (row) order."""
    if len(t_row) == 0:
        return np.zeros(0, dtype=np.int64)
    slot = np.full(int(t_row.max()) + 1, -1, dtype=np.int64)
    slot[t_row] = np.arange(len(t_row))
    order = slot[slot >= 0]
    if len(order) != len(t_row) or t_row.min() < 0:  # repeated rows: the sort itself
        return np.argsort(t_row, kind="stable")
    return order


def argsort(key: np.ndarray, sort_kind: str) -> np.ndarray:
    """np.argsort(key, kind=sort_kind), or with sort_kind "numpy1.26" numpy 1.26's quicksort order on this CPU (the
    tie order of upstream's January-2025 runs, upstream/legacy_sort.upstream_argsort), which numpy >= 2 no longer
    gives."""
    if sort_kind == NUMPY126:
        from upstream.legacy_sort import upstream_argsort

        return upstream_argsort(key)
    return np.argsort(key, kind=sort_kind)


@lru_cache(maxsize=256)
def batch_permutations(n_batches: int, n_epoch: int) -> tuple[np.ndarray, ...]:
    """The batch order of each epoch: torch.randperm(n_batches) drawn n_epoch times from one generator seeded 2023
    (upstream/training.py's order). It depends on the two numbers alone, so it is drawn once per process for each: seeding
    the generator cost ~0.5 ms per fit, a quarter of a small HLR fit. Read-only arrays (shared)."""
    generator = TorchGenerator(SHUFFLE_SEED)
    perms = tuple(generator.randperm(n_batches) for _ in range(n_epoch))
    for perm in perms:
        perm.flags.writeable = False
    return perms


def fit_prior(w0: np.ndarray, w_init, sigma, grad_mask) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(1/σ², centre, gradient mask) of a fit's L2 prior Σ((w − centre)/σ)²: none when sigma is None (1/σ² = 0,
    centre w0); the mask zeros the gradient of frozen parameters (all ones when grad_mask is None)."""
    if sigma is None:
        inv_var, centre = np.zeros(len(w0)), w0.copy()
    else:
        inv_var, centre = 1.0 / np.asarray(sigma, dtype=np.float64) ** 2, w_init
    mask = np.ones(len(w0)) if grad_mask is None else np.asarray(grad_mask, dtype=np.float64)
    return inv_var, centre, mask


def training_cards(train: ReviewData, weights, max_seq_len: int, keep: np.ndarray | None) -> "Cards":
    """The training targets grouped by card: rows with a history of at most max_seq_len (upstream's BatchDataset
    drops longer ones), restricted to `keep` when given, with their loss weights."""
    use = column(train.rows, "seq_pos") <= max_seq_len
    if keep is not None:
        use &= np.asarray(keep, dtype=bool)
    return Cards(train, weights, use)


def with_target_inputs(cards: Cards, model_module: str) -> Cards:
    """`cards` with t_dt replaced by the model's target_inputs (row j: target j's inputs) when it defines them;
    the engine's kernels only hand t_dt through to the model's card functions, which read it as they like."""
    fn = getattr(importlib.import_module(model_module), "target_inputs", None)
    if fn is not None:
        cards.t_dt = fn(cards.seq_dt, cards.seq_g, cards.c_start, cards.c_tb, cards.c_te, cards.t_pos, cards.t_dt)
    return cards


def share_card_prefixes(targets: np.ndarray, chunk: np.ndarray, cards: "Cards") -> tuple[np.ndarray, np.ndarray]:
    """Work items for upstream's length batches with each card's targets within one batch merged into one item
    (card, first target, end, states needed), so that a model which replays a target's whole history (ACT-R:
    O(history²) per target) replays the card once per batch, up to the longest of them. The weights are the same
    within a batch, so the loss and gradient are too, only summed per card instead of in upstream's target order
    (floating-point rounding). A card's targets within one batch are consecutive in `Cards` (one target per history
    length, sorted by length, and a batch is a range of lengths), so an item is a contiguous target range; a break
    in one would just start another item.

    targets: the targets in upstream's order; chunk: the batch of each (non-decreasing). Returns the items, batch
    by batch (targets ascending within each), and each batch's first item (len = batches + 1)."""
    t_s, b_s = _by_chunk_then_target(targets, chunk, len(cards.t_pos))
    card_of = cards.card_of()
    new = np.ones(len(t_s), dtype=bool)
    new[1:] = (b_s[1:] != b_s[:-1]) | (t_s[1:] != t_s[:-1] + 1) | (card_of[t_s[1:]] != card_of[t_s[:-1]])
    first = np.flatnonzero(new)
    last = np.append(first[1:], len(t_s)) - 1
    items = np.stack([card_of[t_s[first]], t_s[first], t_s[last] + 1, cards.t_pos[t_s[last]]], axis=1)
    n_chunks = int(chunk[-1]) + 1 if len(chunk) else 0
    return items.astype(np.int64), np.searchsorted(b_s[first], np.arange(n_chunks + 1)).astype(np.int64)


def _by_chunk_then_target(targets: np.ndarray, chunk: np.ndarray, n_targets: int) -> tuple[np.ndarray, np.ndarray]:
    """(targets, chunk) reordered by chunk, then target: np.argsort(chunk·n + targets, kind="stable") applied to both.
    When `targets` is every target once (upstream's batches always are), the same order in linear time: each
    target's chunk scattered to its slot, then a stable sort of those chunk numbers, which numpy does by radix
    sort for 16-bit keys (0.2 instead of 0.85 ms for 25k targets; HLR's fit spent a tenth of its time here)."""
    n_chunks = int(chunk[-1]) + 1 if len(chunk) else 0
    if len(targets) == n_targets and n_chunks <= 1 << 16:
        chunk_of = np.full(n_targets, -1, dtype=np.int64)
        chunk_of[targets] = chunk
        if n_targets == 0 or chunk_of.min() >= 0:  # n writes filled n slots: a permutation
            t_s = np.argsort(chunk_of.astype(np.uint16), kind="stable")
            return t_s, chunk_of[t_s]
    order = np.argsort(chunk * n_targets + targets, kind="stable")
    return targets[order], chunk[order]


class SeqEngine:
    """Prediction, loss/gradient and training of one model on `ReviewData`, through its compiled kernels."""

    def __init__(self, model_module: str, lower, upper, opts=()):
        """opts: the model's run-time options, passed to its `precompute` (e.g. FSRS-6's same-day floor grade)."""
        self.model_module = model_module
        self.lower = np.asarray(lower, dtype=np.float64)
        self.upper = np.asarray(upper, dtype=np.float64)
        self.opts = np.asarray(opts, dtype=np.float64).reshape(-1)

    @property
    def k(self):
        """The compiled kernels (a lane plug-in's trainer passes on its lane kernel alone: `instantiate`)."""
        return instantiate(self.model_module)

    @property
    def lanes(self) -> int:
        """The address of the plug-in's lane kernel for the trainer (`lane_kernel`), or 0."""
        return lane_kernel(self.model_module)

    @property
    def k_fallback(self):
        """The kernels whose trainer passes take a batch the lane kernel refuses card by card."""
        return instantiate(self.model_module, fallback=True)

    def _w(self, w) -> np.ndarray:
        w = np.ascontiguousarray(w, dtype=np.float64)
        if w.shape != self.lower.shape:
            raise ValueError(f"{self.model_module}: expected {len(self.lower)} parameters, got shape {w.shape}")
        return w

    def clip(self, w) -> np.ndarray:
        """The LOWER/UPPER box, then the model's own `project` (bounds on other parameters) when it has one."""
        w = np.minimum(np.maximum(np.asarray(w, dtype=np.float64), self.lower), self.upper)
        project = getattr(importlib.import_module(self.model_module), "project", None)
        if project is not None:
            project(w)
        return w

    def cards(self, data: ReviewData, weights=None, keep: np.ndarray | None = None) -> Cards:
        """Cards of `data`, with the model's per-target inputs in place of t_dt when it defines `target_inputs`
        (engine/seq_model_stub.py: data-only features computed once here, not in every pass)."""
        return with_target_inputs(Cards(data, weights, keep), self.model_module)

    def predict(self, w, data: ReviewData) -> np.ndarray:
        """P(recall) for every row of `data`, in row order (NaN for a row without history)."""
        cards = self.cards(data)
        out = np.full(len(data), np.nan)
        p = np.empty(len(cards.t_row))
        self.k.predict_cards(self._w(w), self.opts, *cards.args(), cards.max_n, p)
        out[cards.t_row] = p
        return out

    def loss_and_grad(self, w, data: ReviewData, weights=None, w_init=None, sigma=None,
                      max_seq_len: int | None = None) -> tuple[float, np.ndarray]:
        """Σ weight·BCE (+ the L2 prior when sigma is given) and its gradient, over the rows of `data` (only those
        with history length ≤ max_seq_len when given)."""
        w = self._w(w)
        keep = None if max_seq_len is None else column(data.rows, "seq_pos") <= max_seq_len
        cards = self.cards(data, weights, keep)
        grad = np.zeros(len(w))
        loss = self.k.loss_grad_cards(w, self.opts, *cards.args(), cards.t_y, cards.t_wt, cards.max_n, grad)
        if sigma is not None:
            inv_var = 1.0 / np.asarray(sigma, dtype=np.float64) ** 2
            diff = w - self._w(w_init)
            loss += float(np.sum(diff ** 2 * inv_var))
            grad += 2.0 * diff * inv_var
        return float(loss), grad

    def fit(self, w0, train: ReviewData, cfg=None, *, w_init=None, sigma=None, grad_mask=None,
            keep: np.ndarray | None = None, lr: float = LR, betas=(0.9, 0.999), seed: int = SEED,
            check_every_epoch: bool = False, batching: str = "cards", sort_kind: str = "stable",
            keep_last: bool = False, weights: np.ndarray | None = None, prior_scale: float = 1.0,
            equal_lengths: bool = False) -> np.ndarray:
        """Trained weights from w0 (clipped). cfg supplies n_epoch, batch_size, max_seq_len and recency; `keep`
        restricts the training rows (e.g. FSRS v4's i > 2); `w_init`/`sigma` define the L2 prior (none if sigma is
        None); grad_mask zeros the gradient of frozen parameters. Deterministic for a given seed.

        batching "cards" (default): mini-batches of whole cards, one forward and one reverse pass per card.
        batching "length": upstream's length-sorted target batches and batch order (sort_kind as upstream/training.py);
        for models whose 5 epochs are far from convergence, so that where training stops depends on the batches.
        batching "length-shared": the same batches, each card's targets within one batch as one work item (one
        replay of the card up to its longest target there; see share_card_prefixes).
        keep_last: the weights training ends with (no best-checkpoint rule). weights: explicit row weights over
        `train` (instead of cfg.recency's). prior_scale multiplies the prior's 1/σ² (a model's PRIOR_WEIGHT).
        equal_lengths: with the "length" batchings, every row has the same sort key (upstream's len(tensor) of a
        fixed-size feature vector: DASH, HLR), so the batches are the time-ordered rows in `sort_kind`'s tie order
        (NUMPY126: numpy 1.26's, upstream's)."""
        w0 = self.clip(self._w(w0))
        args = self._adam_args(w0, train, cfg, w_init, sigma, grad_mask, keep, lr, betas, seed, check_every_epoch,
                               batching, sort_kind, keep_last, weights, prior_scale, equal_lengths)
        if args is None:  # no training rows, or no epochs
            return w0
        best_w, _, done = self.k.adam_fit(*args, self.lanes)
        if not done:  # the lane kernel refused a pass: the whole fit again, such batches card by card
            best_w, _, _ = self.k_fallback.adam_fit(*args, self.lanes)
        return self.clip(best_w)

    def _adam_args(self, w0, train, cfg, w_init, sigma, grad_mask, keep, lr, betas, seed, check_every_epoch,
                   batching, sort_kind, keep_last, weights, prior_scale, equal_lengths) -> tuple | None:
        """adam_fit's arguments but its last (the lane kernel) for `fit`'s (w0 clipped), or None when there is
        nothing to train."""
        n_epoch = int(getattr(cfg, "n_epoch", 5))
        batch_size = int(getattr(cfg, "batch_size", 512))
        max_seq_len = int(getattr(cfg, "max_seq_len", 64))
        inv_var, w_init, mask = fit_prior(w0, None if sigma is None else self._w(w_init), sigma, grad_mask)
        if prior_scale != 1.0:
            inv_var = inv_var * prior_scale
        # upstream sets recency weights on the whole training frame, before any row is dropped
        if weights is None:
            weights = recency_weights(len(train)) if getattr(cfg, "recency", False) else None
        cards = with_target_inputs(training_cards(train, weights, max_seq_len, keep), self.model_module)
        n_cards = len(cards.c_start)
        if n_cards == 0 or n_epoch <= 0:
            return None
        if batching == "cards":
            items, orders, bounds, n_batches = self._card_batches(cards, n_epoch, batch_size, seed)
        elif batching in ("length", "length-shared"):
            items, orders, bounds, n_batches = self._length_batches(cards, n_epoch, batch_size, sort_kind,
                                                                    share=batching == "length-shared",
                                                                    equal_lengths=equal_lengths)
        else:
            raise ValueError(f"unknown batching {batching!r}")
        return (w0, self.opts, w_init, inv_var, mask, self.lower, self.upper, *cards.args(), cards.t_y, cards.t_wt,
                cards.max_n, items, orders, bounds, n_batches, float(lr), np.asarray(betas, dtype=np.float64),
                bool(check_every_epoch), bool(keep_last))

    def compile_units(self, train: bool = True) -> list[Unit]:
        """The engine's compiled code as units (engine/jit_cache.Unit), which a first run compiles side by side
        (warmup.py): the plug-in's lane kernel (and its parts: lane_units), and the trainer's and the predictions' loops. The loops'
        argument types are those of a toy card set, and the lane kernel is passed as an address (lane_kernel), so that
        the loops compile without it. `train`: False for a model that only predicts (its default weights)."""
        name = self.model_module
        units = []
        if train and self.lane_kernels:
            units += lane_units(self.lane_kernels, name)
        units.append(Unit(f"engine predictions of {name}", 1.5, self._compile_predictions))
        if train:
            units.append(Unit(f"engine trainer of {name}", 2.5, self._compile_trainer))
        return units

    def _compile_predictions(self) -> None:
        """Compile (or load) the predictions' kernels for the types a run passes them, on a toy set."""
        self.predict(self.clip(np.zeros(len(self.lower))), toy_data())

    def _compile_trainer(self) -> None:
        """Compile (or load) adam_fit for the types a fit passes it, on a toy set: a unit apart from the
        predictions', so that a first run's two workers compile them side by side."""
        data = toy_data()
        w0 = self.clip(np.zeros(len(self.lower)))
        args = self._adam_args(w0, data, None, w0, None, None, None, LR, (0.9, 0.999), SEED, False, "cards", "stable",
                               False, None, 1.0, False)
        self.k.adam_fit.compile(tuple(typeof(a) for a in args + (0,)))  # the lane kernel: an address (lane_kernel)

    @property
    def lane_kernels(self) -> str | None:
        """The plug-in's LANE_KERNELS ("module" or "module:function"), or None."""
        return getattr(importlib.import_module(self.model_module), "LANE_KERNELS", None)

    def _card_batches(self, cards: Cards, n_epoch: int, batch_size: int, seed: int):
        """Whole cards, in a new random order every epoch (numpy Generator), cut at >= batch_size targets."""
        n_cards = len(cards.c_start)
        items = np.stack([np.arange(n_cards), cards.c_tb, cards.c_te, cards.c_n], axis=1).astype(np.int64)
        rng = np.random.default_rng(seed)
        orders = np.stack([rng.permutation(n_cards) for _ in range(n_epoch)]).astype(np.int64)
        sizes = cards.c_te - cards.c_tb
        cuts = [self.k.card_batch_bounds(sizes[order], batch_size) for order in orders]
        bounds = np.zeros((n_epoch, max(len(c) for c in cuts)), dtype=np.int64)
        for e, c in enumerate(cuts):
            bounds[e, :len(c)] = c
        return items, orders, bounds, np.array([len(c) - 1 for c in cuts], dtype=np.int64)

    def _length_batches(self, cards: Cards, n_epoch: int, batch_size: int, sort_kind: str, share: bool = False,
                        equal_lengths: bool = False):
        """Upstream's batches: targets (in time order) sorted by history length (by nothing with equal_lengths:
        only the sort's tie order moves them), cut every batch_size, the batch
        order drawn by torch.randperm on one generator seeded 2023 (upstream/training.py's order; upstream/torch_rng.py draws it
        without torch). Each target is replayed
        from its card's first review: upstream's cost (Σ history lengths per epoch), still compiled.
        share: one item per card within each batch instead of one per target (share_card_prefixes)."""
        by_time = time_order(cards.t_row)  # Cards is grouped by card; upstream sees time order
        key = np.zeros(len(by_time), dtype=np.int64) if equal_lengths else cards.t_pos[by_time]
        targets = by_time[argsort(key, sort_kind)]
        n_b = (len(targets) + batch_size - 1) // batch_size
        if share:
            items, first = share_card_prefixes(targets, np.arange(len(targets)) // batch_size, cards)
        else:
            card_of = cards.card_of()
            items = np.stack([card_of[targets], targets, targets + 1, cards.t_pos[targets]], axis=1).astype(np.int64)
            first = np.minimum(np.arange(n_b + 1) * batch_size, len(targets))
        orders = np.empty((n_epoch, len(items)), dtype=np.int64)
        bounds = np.zeros((n_epoch, n_b + 1), dtype=np.int64)
        sizes = np.diff(first)
        for e, perm in enumerate(batch_permutations(n_b, n_epoch)):
            # the batches' item ranges first[k]..first[k+1]−1 one after another in the order perm draws them
            bounds[e, 1:] = np.cumsum(sizes[perm])
            orders[e] = np.arange(len(items)) + np.repeat(first[perm] - bounds[e, :-1], sizes[perm])
        return items, orders, bounds, np.full(n_epoch, n_b, dtype=np.int64)
