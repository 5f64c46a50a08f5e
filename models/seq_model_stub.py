"""The contract between a model and the general one-pass-per-card engine (models/seq_engine.py).

A model module that plugs into the engine defines the names below as numba `@njit` functions (and the constant
N_STATE). The engine's kernels (models/seq_engine_kernels.py) are compiled once per model with these names bound as
globals, so each model gets its own fully specialised, disk-cached machine code.

Recurrent models (FSRS, HLR, SM-2 trainable, Anki, ...) define the six step functions; the engine runs each card's
sequence once forward (storing the state after every review) and once backward (carrying the state adjoint), and
adds every target's loss gradient where that target reads the state. Models whose prediction depends on the whole
history in a way no fixed-size state captures (DASH windows, ACT-R activations) define `card_loss_grad` and
`card_predict` instead (same signatures as the engine's generic ones) and N_STATE = the scratch width they need.

Arguments: w — float64 parameter vector; g — integer grade 1..4 of the review; t — float64 elapsed days before
the review (0 for a first review) or, in `curve`, before the target; state/prev/new — float64 arrays of length
N_STATE. Every *_vjp receives the adjoint of its output and ADDS the parameter adjoint into gw.
"""

N_STATE = 1


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
