"""The contract between a model and the general one-pass-per-card engine (engine/seq_engine.py).

A model module that plugs into the engine defines the names below as numba `@njit` functions (and the constant
N_STATE). The engine's kernels (engine/seq_engine_kernels.py) are compiled once per model with these names bound as
globals, so each model gets its own fully specialised, disk-cached machine code.

Recurrent models (FSRS, HLR, SM-2 trainable, Anki, ...) define the six step functions; the engine runs each card's
sequence once forward (storing the state after every review) and once backward (carrying the state adjoint), and
adds every target's loss gradient where that target reads the state. Models whose prediction depends on the whole
history in a way no fixed-size state captures (DASH windows, ACT-R activations) define `card_loss_grad` and
`card_predict` instead (same signatures as the engine's generic ones) and N_STATE = the scratch width they need.
Such a model may also define `target_inputs(seq_dt, seq_g, c_start, c_tb, c_te, t_pos, t_dt) -> array` (one row
per target): what its targets need that depends on the data alone (DASH's window counts). SeqEngine computes it
once per Cards (a fit, a prediction, a loss call) and hands it to the card functions in place of t_dt, so no pass
rebuilds it. It may also be a tuple of arrays (ragged data with its own offsets, e.g. ACT-R's and DASH[ACT-R]'s
ln Δ of every pair): the engine's kernels only pass it through.

Per-weight precomputation (optional): a model may define `precompute(w, opts) -> wc` and
`precompute_vjp(w, opts, wc, gwc, gw)`. The engine calls precompute once per weight vector (per mini-batch, per
prediction or loss call) and passes wc, not w, to every function below (so `w` there means wc), and their *_vjp
add into gwc (same length as wc); precompute_vjp then folds gwc into gw once per batch. This is where a model
hoists what depends only on the weights (exp(w8), the curve factor of a trainable decay, ...) out of the per-review
loop; the convention is wc[:len(w)] = w followed by the model's constants. `opts` is a float64 array of run-time
options given to SeqEngine (empty by default; FSRS-6 passes its same-day floor grade). A model that does not define
them gets the defaults below: wc is w itself and gw += gwc, so its arithmetic is unchanged bit for bit.

Lane kernels (optional): a plug-in may set LANE_KERNELS to the name of a module defining
`lanes_loss_grad(wc, seq_dt, seq_g, c_start, t_pos, t_dt, t_y, t_wt, items, batch, max_n, gwc, want_loss,
want_grad) -> loss` (the work items `batch`, several cards side by side; NaN, having added nothing, for a batch it
cannot lay out), over work items made by engine/lanes.py's card_items. The engine's trainer then runs its mini-batches and its
objective passes through them (card by card where they return NaN); predictions and loss_and_grad stay card by card.
"module:function" names another function of that signature in place of lanes_loss_grad (one lane module serving
several plug-ins: lane_kernels/fsrs_v5_lanes.py). Why: a scalar step is bound by one libm
call at a time; side by side, exp and log vectorise (engine/traced_lanes.py, lane_kernels/fsrs_v5_lanes.py).

A step for predictions (optional): `step_value(w, prev, t, g, out)`, the same new state as `step` in
out[:N_ADJ], and nothing it keeps for step_vjp; predictions step with it (the generated plug-ins' computes only
the side of each where its condition takes). Without it, predictions use `step`.

Arguments: w — float64 parameter vector; g — integer grade 1..4 of the review; t — float64 elapsed days before
the review (0 for a first review) or, in `curve`, before the target; state/prev/new — float64 arrays of length
N_STATE. Every *_vjp receives the adjoint of its output and ADDS the parameter adjoint into gw.
"""

from numba import njit

N_STATE = 1
# Optional: only state[:N_ADJ] carry adjoints (default N_STATE). A model may keep values its step computed in
# state[N_ADJ:] for its own step_vjp (which receives `new`), as long as no later step or curve reads them; the
# engine then neither clears nor propagates their (zero) adjoints.
N_ADJ = N_STATE


@njit(cache=True)
def precompute(w, opts):
    """Default: no per-weight constants; the step functions see w itself."""
    return w


@njit(cache=True)
def precompute_vjp(w, opts, wc, gwc, gw):
    """Default: gw += gwc (wc is w)."""
    for j in range(len(gw)):
        gw[j] += gwc[j]


@njit(cache=True)
def project(w):
    """Optional: bounds that depend on other parameters, applied in place after the LOWER/UPPER box at every
    optimizer step (FSRS-7's ordered S0; engine/traced.py generates it from a model file's clip hook). Default:
    none."""
    return None


def init(w, g, t, out):
    """State after a card's first review (grade g, t = 0 unless a model uses it), written into out."""
    raise NotImplementedError


def step(w, prev, t, g, out):
    """State after a later review (elapsed t, grade g) from the previous state, written into out."""
    raise NotImplementedError


def curve(w, state, t):
    """P(recall) after elapsed time t from the state after the history."""
    raise NotImplementedError


def init_vjp(w, g, t, state, gstate, gw):
    """gw += gstate · ∂init/∂w."""
    raise NotImplementedError


def step_vjp(w, prev, t, g, new, gnew, gprev, gw):
    """gprev[:] = gnew · ∂step/∂prev (overwrite); gw += gnew · ∂step/∂w. `new` is step's output (for clamps)."""
    raise NotImplementedError


def curve_vjp(w, state, t, gp, gstate, gw):
    """gstate += gp · ∂curve/∂state; gw += gp · ∂curve/∂w."""
    raise NotImplementedError


def target_loss(w, state, t, y, wt):
    """Optional, with target_loss_vjp: weight·BCE(curve(w, state, t), y) of one target (default: kernel_math.bce
    of curve)."""
    raise NotImplementedError


def target_loss_vjp(w, state, t, y, wt, gstate, gw):
    """Optional, with target_loss: weight·BCE(curve(w, state, t), y) of one target, adding its adjoint into gstate and gw. The
    engine's default composes curve, kernel_math.bce and curve_vjp; a model defines it to share work between the
    three (FSRS-6 works on ln R, one log1p per target). It must keep torch's BCE (logs floored at −100) wherever
    the model's curve can reach those values."""
    raise NotImplementedError


def step_target(w, prev, t, g, y, wt, out):
    """Optional, with step_target_vjp: step(w, prev, t, g, out) and, returned, weight·BCE(curve(w, prev, t), y) of
    the target that reads `prev` at the step's own elapsed time t. Why: a model's curve often recomputes what its
    step computes from the same state and time (FSRS-7's retention, SBD's recall); fused, that target costs its
    BCE only. The engine's generic card loop (seq_engine_kernels' STEP-TARGET section) sends the first target
    with t_pos == k through step k's step_target when its delta_t equals that review's (every target but a
    card's last, in the usual layout); any other target through target_loss_vjp. engine/traced.py generates
    both for a model file."""
    raise NotImplementedError


def step_target_vjp(w, prev, t, g, y, wt, new, gnew, gprev, gw):
    """Optional, with step_target: gprev[:] = (gnew · ∂step/∂prev + ∂BCE/∂prev) (overwrite); gw += the same
    products for w. `new` is step_target's output (its stash, as step_vjp's)."""
    raise NotImplementedError
