"""Compile a researcher's torch model file (the own-model contract, engine/own_model.py) into a plug-in of the
compiled engine (engine/seq_model_stub.py): trace, differentiate, generate numba source. No hand-written gradient.

Why: the autograd engine (engine/autograd_engine.py) runs such a file in eager torch and pays per op (it is no
faster than the upstream-style trainer), while the compiled engine is 20–200× faster but asks for numba step
functions and their vector-Jacobian products written by hand. A contract model is a per-card scalar recurrence
written with a handful of torch ops, so it can be read as an expression graph and its VJPs derived mechanically.

1. Tracing. `init(w, g, t)`, `step(w, state, t, g)`, `curve(w, state, t)` (and the optional `clip(w)` hook) are
   called with proxies instead of tensors. A proxy stands for ONE card's scalar (cards are independent columns in
   the contract), w for the weight vector; operators, the tensor methods models use and torch functions (through
   `__torch_function__`) record nodes. Python numbers and one-element tensors are constants. Anything else (a
   reduction, float() of a traced value, Python control flow on one, float32 arithmetic) raises TraceError naming
   the op; the caller then keeps the autograd engine. Identical nodes are shared (hash-consing): the same value.
   Types follow torch's promotion (a [B] tensor outranks a 0-dim one, which outranks a Python number); an
   operation torch would compute in float32 (an int tensor times a Python float, `.float()` mixed with a 0-dim
   weight) is refused rather than silently computed in float64, so a traced model computes what torch computes.
2. Differentiation. Reverse mode over the graph with torch's own derivative formulas (derivatives.yaml /
   FunctionsManual.cpp): clamp passes the gradient where min <= x <= max (bounds inclusive) and a tensor bound gets
   it where it is active; minimum/maximum split it in half on ties; where routes it by the condition; pow(x, y)
   d/dx = y·x^(y−1) (0 where y == 0), d/dy = x^y·ln x masked to 0 where x == 0 and y >= 0; integer and boolean
   nodes carry none; an integer-indexed weight read adds into gw at that index. Both sides of a where are computed
   and differentiated, as in torch, so a NaN or inf on the unused side reaches the gradient the same way.
3. Code generation. A module following engine/seq_model_stub.py: init/step/curve and init_vjp/step_vjp/
   curve_vjp as straight-line `@njit(cache=True, error_model="numpy")` scalar functions (x/0 = inf as in torch),
   `precompute` (the weight-only values, once per weight vector), target_loss / target_loss_vjp, plus `project(w)`
   (the clip hook, in place, after the box clip) when the file has one. Written once per content hash into the
   engine directory and registered in sys.modules, so `SeqEngine(name, LOWER, UPPER)` compiles its disk-cached
   kernels for it.
   Why it is shaped so: on FSRS-6's torch equations a training pass (step, step_vjp, the target's loss and
   gradient) cost ~690 ns a review against ~140 for the hand-written plug-in it then had, ~465 of it in step_vjp,
   which recomputed the forward step (every libm call twice) and whose derivative formulas add one more pow or
   log per pow node. So (now ~300 ns; FSRS-7 1450 → 520, SBD 640 → 400; numba loops over the functions):
   - init and step write every transcendental value they compute (exp, log, pow, ...) into state[n:]
     (N_STATE = n + that many, N_ADJ = n: only the model's state carries adjoints), and their VJPs read them
     back from the state they wrote: the reverse pass is arithmetic only;
   - a float64 pow x^y is exp(y·ln x) with ln x computed once per base (FSRS-7 raises S to four weights), where
     that is pow up to rounding (x > 0 finite, y finite; pow itself elsewhere, so 0^y, (−2)^3, inf keep pow's
     values); d/dy = x^y·ln x reuses that ln x and d/dx = y·x^(y−1) is y·(x^y / x) while x^y is a normal
     nonzero number (torch's x^(y−1) otherwise);
   - logaddexp and softplus keep the exp their forward computes (e^{−|x−y|}, e^{βx}) for their derivatives;
   - target_loss_vjp evaluates the curve once per target (the engine's default composes curve and curve_vjp,
     which evaluates it again);
   - step_target / step_target_vjp: a step and the BCE of the target that reads the step's input state at the
     step's own elapsed time, one function of the shared graph. A model's curve usually recomputes what its step
     already computes from the same state and time (FSRS-7's retention, SBD's recall), and hash-consing makes
     those the same nodes, so such a target costs its clamp and its log, and its adjoint joins the step's reverse
     pass. The engine's generic card loop takes them (seq_engine_kernels' STEP-TARGET section): a target whose
     delta_t is the next review's (every target but a card's last, in the usual layout) goes through
     step_target, any other through target_loss_vjp;
   - clamp(clamp(x, lo, hi), lo, hi) with constant bounds is recorded as the inner clamp (same value and
     gradient), so a helper that clamps again does not split a shared value (SBD's step clamps t, then _recall
     clamps it again; the curve clamps once).
   Measured on a 45k-review user (loss and gradient per training state, best of 40, machine shared): FSRS-7
   ~375 → ~280 ns, SBD ~380 → ~260 ns; FSRS-7's forward is now its 20 libm calls per review (9 log, 11 exp).
   Results change by rounding only (tests/test_traced.py's tolerances; FSRS-7's and SBD's result lines on the
   embedded data are unchanged). What remains of the gap to a hand-written kernel is torch.where's semantics:
   both sides of every where are computed and differentiated (so a NaN on the unused side reaches the gradient
   as in torch), where a hand-written step computes only the branch a review takes. numba's inline="always" on
   the generated functions was measured too: no gain beyond noise, twice the compile time, so it is not used;
   nor is fastmath (contract/arcp/reassoc: no clear gain, and it would reorder torch's arithmetic).
4. Lanes (issue #19). The plug-in also names a generated lane module as its LANE_KERNELS
   (engine/traced_lanes.py: the same graph, every op over a lane axis of 8 cards, exp / log / log1p / tanh as
   vec_math's vectorisable arithmetic, wheres as selects; `_forward_lines` / `_backward_lines(lanes=True)`, the
   lane dialect), so the engine's Adam batches and objective passes run 8 cards side by side. pow(x, y) keeps the
   scalar code's values off its exp(y·ln x) domain (x <= 0, inf, NaN) by refusing such a batch: the engine then
   runs it card by card. L-BFGS (SBD) runs over the prefix tree (the scalar functions), untouched by the lanes.
   Measured on FSRS-7 (/tmp/big45, the 45k-review user; CPU time, one process, old/new alternating, medians; the
   2-core machine shared and loaded, so the absolute times are ~2x the quiet machine's above): before, perf
   put libm (exp 5.5%, log 1.8% of the samples) at ~37% of the scalar loss and gradient (the generated code
   12.9%); loss and gradient of one epoch's batches (last fold, 34,002 states, 34 batches; lane slots 1.35x the
   states) 577 -> 268 ns a state (2.16x, five pairs 1.76-2.35); the 5-fold fit (Adam, 8 epochs, initial
   weights not timed) 352 -> 185 ms (2.05x, three pairs 1.90-2.24); fitted weights within 2e-14 (relative) of
   the scalar fit's. FSRS-7-recency: 2.10x and 1.99x (410 -> 226 ms), weights within 6e-15. Result lines (FSRS-7, FSRS-7-recency, SBD-recency on the embedded users and sim36 users
   1-6) identical to main's (sizes, metrics and parameters at their 6 decimals; the lanes accept every fold's
   batches there). Rows projected (bench_executors.py project, main's tree and this one back to back, twice):
   FSRS-7 1.86 / 1.96 -> 1.33 / 1.17 CPU-hours, FSRS-7-recency 1.82 / 2.11 -> 1.35 / 1.22; SBD-recency
   1.79 / 1.70 -> 1.81 / 1.66 (unchanged: L-BFGS over the tree). `compile_module(module, lanes=False)` gives the plug-in without them
   (bench/bench_traced_lanes.py pairs the two; that plug-in's source is main's byte for byte). The lane module
   compiles once per model graph, lazily (when Adam or its objective first runs), and is cached on disk like the
   plug-in: a fresh compile of lanes_loss_grad took 86 CPU-s for FSRS-7, 33 for SBD (machine loaded). The module
   lists its forward and reverse group passes as PARTS, so that a first run's warm-up compiles them on two workers
   side by side and then the kernel (seq_engine.lane_units): FSRS v4's cold run on 2 processes 6.2 -> 5.9 s.

5. Run-time options (RUN_OPTIONS, a tuple of the module's constant names, e.g. FSRS v2-v4's ("S_MIN",), the lower
   clamp of S that upstream's --secs changes, or "package.module:NAME" for one read from another module, as
   FSRS-4.5's "models.fsrs_v4:S_MIN"): while tracing, each such module constant is an "opt" node, a
   weight-like value that precompute(w, opts) reads from opts (the module's value when opts is shorter), so one
   plug-in serves every mode; the model class passes them as its engine_opts. A package's model is traced once per
   version of the sources: engine/trace_cache.py remembers its generated modules, so a later run imports them
   without tracing.
6. Tracing without torch: when torch is not imported yet, the functions are traced with engine/torch_standin.py as
   their `import torch` (the same __torch_function__ calls, so the same graph: tests/test_torch_standin.py holds the
   generated sources byte-identical), so a run of FSRS v1-v4.5, FSRS-7 or SBD never imports torch (~1.5 s); a
   function that needs more of torch than the stand-in has is traced again with torch itself.

`compile_module(module)` gives the plug-in's module name (or raises TraceError); `CompiledOwnEngine` runs a model
file's RECIPE on SeqEngine with the autograd engine's API (fit / predict / loss_and_grad / clip). The tracer and the
code generator (1–3, and the lane dialect of 4) are engine/traced_codegen.py, below this module and
engine/traced_lanes.py; their public names are re-exported here.
"""

from __future__ import annotations

import math
import os
import sys

import numpy as np

from engine.traced_codegen import (Graph, Proxy, Trace, TraceError, WeightVector, _clamp,  # noqa: F401 (re-exported)
                                   data_only_state, generate, trace_model)


# --------------------------------------------------------------------------------------------------- plug-ins
def _fn(module, name: str):
    return getattr(module, f"torch_{name}", None) or getattr(module, name, None)


_TOLD: set = set()
_COMPILED: dict = {}


def compile_module(module, n_w: int | None = None, use_clip: bool = True, lanes: bool = True,
                   data_state: bool = True) -> str:
    """The name of the generated plug-in module for a contract module (imported and registered in sys.modules),
    or TraceError. Written once per content into the engine directory (seq_engine.import_generated). `lanes`: the
    plug-in names a generated lane module (engine/traced_lanes.py) as its LANE_KERNELS, which the trainer's
    batches run on. `data_state`: a state that reads no weight is computed once per fit, before the targets
    (traced_codegen.data_only_state; then no lanes); False replays each target's card as any other model's."""
    key = (id(module), n_w, use_clip, lanes, data_state)
    if key not in _COMPILED:
        try:
            _COMPILED[key] = (module, _compile_module(module, n_w, use_clip, lanes, data_state))  # the module kept
        except TraceError as exc:
            _COMPILED[key] = (module, exc)
    result = _COMPILED[key][1]
    if isinstance(result, TraceError):
        raise result
    return result


def _compile_module(module, n_w, use_clip, lanes, data_state) -> str:
    from engine.seq_engine import import_generated
    from engine.traced_lanes import generate_lanes

    n_w = len(module.DEFAULT_W) if n_w is None else n_w
    clip = getattr(module, "clip", None) if use_clip else None
    traces = trace_model(_fn(module, "init"), _fn(module, "step"), _fn(module, "curve"), n_w, clip,
                         options=(module, tuple(getattr(module, "RUN_OPTIONS", ()))))
    origin = os.path.basename(str(getattr(module, "__file__", None) or getattr(module, "__name__", "a model")))
    data_state = data_state and data_only_state(traces)
    lanes = lanes and not data_state  # a data-only state's target is one curve: nothing to lay side by side
    lane_module = import_generated(generate_lanes(traces, origin), "traced_lanes", 12).__name__ if lanes else None
    return import_generated(generate(traces, origin, lane_module, data_state), "traced", 12).__name__


def recipe_runs_compiled(recipe) -> str | None:
    """Why a RECIPE cannot run on the compiled engine (None when it can): the compiled trainer is Adam with a
    cosine schedule (a fixed prior weight), or torch's L-BFGS driven by the compiled loss and gradient; AdamW's
    decay stays on the autograd engine."""
    if getattr(recipe, "penalty", None) is not None:  # a per-step Python term: adam_fit is one compiled loop
        return "penalty"
    if recipe.optimizer == "lbfgs":
        return None
    if recipe.optimizer != "adam":
        return f"optimizer {recipe.optimizer}"
    if recipe.weight_decay:
        return "weight_decay"
    if callable(recipe.prior_weight):
        return "callable prior_weight"
    return None


class CompiledOwnEngine:
    """A contract model's generated plug-in on SeqEngine, with the autograd engine's API (fit with a Recipe)."""

    path = "compiled (traced)"

    def __init__(self, module, lower=None, upper=None):
        from engine.seq_engine import SeqEngine

        self.module = module
        self.plugin = compile_module(module)
        self.has_project = hasattr(sys.modules[self.plugin], "project")
        lower = getattr(module, "LOWER", None) if lower is None else lower
        upper = getattr(module, "UPPER", None) if upper is None else upper
        n = len(module.DEFAULT_W)
        self.seq = SeqEngine(self.plugin, lower if lower is not None else [-math.inf] * n,
                             upper if upper is not None else [math.inf] * n)
        self.lower, self.upper = self.seq.lower, self.seq.upper

    def clip(self, w) -> np.ndarray:
        return self.seq.clip(w)

    def compile_units(self, train: bool = True) -> list:
        """The generated plug-in's engine units (SeqEngine.compile_units)."""
        return self.seq.compile_units(train)

    def predict(self, w, data):
        return self.seq.predict(w, data)

    def loss_and_grad(self, w, data, weights=None, w_init=None, sigma=None, max_seq_len=None):
        return self.seq.loss_and_grad(w, data, weights=weights, w_init=w_init, sigma=sigma, max_seq_len=max_seq_len)

    def fit(self, w0, train, cfg=None, recipe=None, *, w_init=None, sigma=None, grad_mask=None, keep=None):
        """AutogradEngine.fit's meaning (recipe keys over cfg) on the compiled trainer."""
        from types import SimpleNamespace

        from engine.recipe import Recipe

        recipe = recipe if isinstance(recipe, Recipe) else Recipe.from_dict(recipe)
        why = recipe_runs_compiled(recipe)
        if why:
            raise TraceError(f"recipe {why} does not run on the compiled engine")
        n_epoch, batch_size = recipe.epochs_and_batch(cfg)
        run = SimpleNamespace(n_epoch=n_epoch, batch_size=batch_size, max_seq_len=int(getattr(cfg, "max_seq_len", 64)),
                              recency=False)
        weights = recipe.row_weights(cfg, len(train))
        if recipe.optimizer == "lbfgs":
            return self._lbfgs(w0, train, run, recipe, weights, w_init, sigma, grad_mask, keep)
        pw = recipe.prior_weight
        return self.seq.fit(w0, train, run, w_init=w_init, sigma=sigma, grad_mask=grad_mask, keep=keep,
                            lr=recipe.lr, betas=tuple(recipe.betas), seed=recipe.seed,
                            check_every_epoch=recipe.keep == "every_epoch", keep_last=recipe.keep == "last",
                            weights=weights, prior_scale=float(pw))

    def _lbfgs(self, w0, train, run, recipe, weights, w_init, sigma, grad_mask, keep) -> np.ndarray:
        """The autograd engine's full-batch L-BFGS (autograd_engine.lbfgs_fit: torch's algorithm, here followed in
        numpy by engine/lbfgs.fit_box, without torch; the same objective, line search and revert rule), its Σ weight·BCE and gradient
        from one compiled pass over the cards (over their prefix tree when the plug-in fuses a step and its
        target, as traced plug-ins do: engine/prefix_tree.py)."""
        from engine.lbfgs import fit_box
        from engine.seq_engine import fit_prior, training_cards, with_target_inputs

        w0 = self.clip(np.asarray(w0, dtype=np.float64))
        inv_var, centre, mask = fit_prior(w0, None if sigma is None else np.asarray(w_init, dtype=np.float64), sigma,
                                          grad_mask)
        seq = self.seq
        cards = with_target_inputs(training_cards(train, weights, run.max_seq_len, keep), seq.model_module)
        if len(cards.c_start) == 0:
            return w0
        if hasattr(seq.k, "tree_loss_grad"):  # a model with step_target: every distinct state once (prefix_tree.py)
            from engine.prefix_tree import PrefixTree

            tree = PrefixTree(cards).args()

            def loss_grad(w):  # Σ weight·BCE and its gradient, one compiled pass over the cards' prefix tree
                grad = np.zeros(len(w))
                return seq.k.tree_loss_grad(w, seq.opts, *tree, grad), grad
        else:
            def loss_grad(w):  # Σ weight·BCE and its gradient, one compiled pass per card
                grad = np.zeros(len(w))
                return (seq.k.loss_grad_cards(w, seq.opts, *cards.args(), cards.t_y, cards.t_wt, cards.max_n, grad),
                        grad)

        return fit_box(w0, loss_grad, float(cards.t_wt.sum()), recipe.prior_weight_for(len(cards.t_pos)), centre,
                       inv_var, mask, self.lower, self.upper, recipe)


def engine_for(module, lower=None, upper=None, recipe=None, trainer: str = "fast", device=None, label=None):
    """The engine a contract model trains on: the generated plug-in on SeqEngine when the model traces and its
    recipe runs there, else the autograd engine (one stderr line saying why when it did not trace).
    `trainer="autograd"` forces the autograd engine, as does a device other than the CPU."""
    if trainer != "autograd" and (device in (None, "cpu")):
        why = recipe_runs_compiled(recipe) if recipe is not None else None
        if why is None:  # a recipe the compiled trainer lacks (AdamW, ...) is a choice: no message for it
            try:
                return CompiledOwnEngine(module, lower, upper)
            except TraceError as exc:
                name = label or getattr(module, "NAME", None) or getattr(module, "__name__", "model")
                if (name, str(exc)) not in _TOLD:  # once per process
                    _TOLD.add((name, str(exc)))
                    print(f"{name}: trained on the autograd engine ({exc})", file=sys.stderr)
    from engine.autograd_engine import AutogradEngine  # torch: only when the compiled engine is not taken

    return AutogradEngine(module, lower, upper, device=device if device not in (None, "cpu") else None)


__all__ = ["TraceError", "trace_model", "generate", "compile_module", "CompiledOwnEngine", "engine_for",
           "recipe_runs_compiled"]
