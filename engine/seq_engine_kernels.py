"""Compiled kernels of the general one-pass-per-card engine: a TEMPLATE, instantiated once per model.

`engine/seq_engine.py` copies this file with the import line below pointing at the model's module (the contract is
in engine/seq_model_stub.py), so numba compiles every kernel with the model's step functions inlined as globals and
caches the machine code on disk. (The per-review step functions stay bound this way, inlined into the loops; a
dispatcher passed as an argument is typed as that very dispatcher, which numba cannot cache. The plug-in's lane
kernel, called once per batch, is passed as the address of its machine code instead: engine/lanes.call_lane_kernel.)

Layout (see seq_engine.Cards): targets sorted by card then history length; card c spans targets tb[c]..te[c]-1 and
needs the states after its first n[c] reviews, which start at sequence index start[c]. Target j reads the state
after its t_pos[j]-th review (index t_pos[j]-1) and its own elapsed time t_dt[j].

Every entry point takes the raw weights w and the model's run-time options, calls the model's `precompute(w, opts)`
once (per call, or per mini-batch in adam_fit) and hands the result wc to the per-card functions; the gradient is
accumulated against wc and folded back into w's by `precompute_vjp` (the stub's defaults: wc is w, a plain copy).
Sections between the marker lines are cut by seq_engine.instantiate according to what the model defines: its own
card loops (CUSTOM-CARD instead of GENERIC-CARD), its own target loss (DEFAULT-TARGET out), a fused step and target
(STEP-TARGET instead of PLAIN-LOSS), the trainer's batches card by card (CARD-BATCH) or by the plug-in's lane kernel,
which the trainer receives as an address (seq_engine.lane_kernel): alone (LANE-ONLY, what a fit compiles
first) or with the card loops for the batches it refuses (LANE-BATCH, the fallback instance).
"""

# ruff: noqa: F405, F811  (the model's names come from the rebound star import; one of the two card_loss sections
# is cut out by seq_engine.instantiate)

import math

import numpy as np
from numba import njit

from engine.kernel_math import adam_step, bce, card_batch_bounds, cosine_lr, l2_prior  # noqa: F401
from engine.seq_model_stub import *  # noqa: F401,F403  MODEL-IMPORT (rebound per model by seq_engine.instantiate)


@njit(cache=True)
def scratch(max_n):
    """Per-card work space: states, state adjoints, one spare row."""
    return np.zeros((3, max_n + 1, max(N_STATE, 1)))


# ---- GENERIC-CARD-BEGIN (left out when the model defines card_loss_grad / card_predict itself)

# ---- DEFAULT-TARGET-BEGIN (left out when the model defines target_loss / target_loss_vjp itself)
@njit(cache=True)
def target_loss(w, state, t, y, wt):
    """weight·BCE of one target read from `state`."""
    return bce(curve(w, state, t), y, wt)[0]


@njit(cache=True)
def target_loss_vjp(w, state, t, y, wt, gstate, gw):
    """weight·BCE of one target read from `state`; adds its adjoint into gstate and gw."""
    p = curve(w, state, t)
    lo, gp = bce(p, y, wt)
    curve_vjp(w, state, t, gp, gstate, gw)
    return lo
# ---- DEFAULT-TARGET-END


@njit(cache=True)
def forward_card(w, seq_dt, seq_g, start, n, states):
    """states[k] = state after review k of the card (k = 0..n-1)."""
    init(w, seq_g[start], seq_dt[start], states[0])
    for k in range(1, n):
        step(w, states[k - 1], seq_dt[start + k], seq_g[start + k], states[k])


# ---- PLAIN-LOSS-BEGIN (left out when the model defines step_target / step_target_vjp)
@njit(cache=True)
def card_loss_grad(w, seq_dt, seq_g, start, n, t_pos, t_dt, t_y, t_wt, tb, te, buf, gw):
    """Σ weight·BCE over the card's targets; adds d/dw into gw. One forward and one reverse pass over the card."""
    states = buf[0]
    gstates = buf[1]
    gprev = buf[2][0]
    forward_card(w, seq_dt, seq_g, start, n, states)
    for k in range(n):
        for i in range(N_ADJ):
            gstates[k, i] = 0.0
    loss = 0.0
    for j in range(tb, te):
        k = t_pos[j] - 1
        loss += target_loss_vjp(w, states[k], t_dt[j], t_y[j], t_wt[j], gstates[k], gw)
    for k in range(n - 1, 0, -1):
        step_vjp(w, states[k - 1], seq_dt[start + k], seq_g[start + k], states[k], gstates[k], gprev, gw)
        for i in range(N_ADJ):
            gstates[k - 1, i] += gprev[i]
    init_vjp(w, seq_g[start], seq_dt[start], states[0], gstates[0], gw)
    return loss
# ---- PLAIN-LOSS-END

# ---- STEP-TARGET-BEGIN (only when the model defines step_target / step_target_vjp)
@njit(cache=True)
def same_time(a, b):
    """a and b the same float, a signed zero included: a target at elapsed time a may share the step taken at b."""
    return a == b and (a != 0.0 or math.copysign(1.0, a) == math.copysign(1.0, b))


@njit(cache=True)
def card_loss_grad(w, seq_dt, seq_g, start, n, t_pos, t_dt, t_y, t_wt, tb, te, buf, gw):
    """Σ weight·BCE over the card's targets; adds d/dw into gw. One forward and one reverse pass over the card.
    Step k also computes the first target that reads the state before review k (t_pos == k; targets are sorted by
    t_pos) when that target's elapsed time is the review's own (step_target: the step computes its curve anyway),
    and its adjoint joins the step's reverse pass (step_target_vjp); that is every target but a card's last in the
    usual layout (a target's delta_t is the next review's). Any other target goes through target_loss_vjp. The
    result is the plain loop's up to rounding (sums in another order).
    buf[2][k][0] records which target step k took (−1: none) for the two later loops (row 0 is gprev): deciding
    it again there from t_pos / t_dt made FSRS-7's loss and gradient ~10% slower (interleaved runs)."""
    states = buf[0]
    gstates = buf[1]
    took = buf[2]
    gprev = buf[2][0]
    init(w, seq_g[start], seq_dt[start], states[0])
    loss = 0.0
    j = tb
    for k in range(1, n):  # step k reads states[k - 1], as do the targets with t_pos == k
        while j < te and t_pos[j] < k:
            j += 1
        if j < te and t_pos[j] == k and same_time(t_dt[j], seq_dt[start + k]):
            took[k, 0] = j
            loss += step_target(w, states[k - 1], seq_dt[start + k], seq_g[start + k], t_y[j], t_wt[j], states[k])
        else:
            took[k, 0] = -1.0
            step(w, states[k - 1], seq_dt[start + k], seq_g[start + k], states[k])
    for k in range(n):
        for i in range(N_ADJ):
            gstates[k, i] = 0.0
    for j in range(tb, te):
        k = t_pos[j]
        if k >= n or took[k, 0] != j:
            loss += target_loss_vjp(w, states[k - 1], t_dt[j], t_y[j], t_wt[j], gstates[k - 1], gw)
    for k in range(n - 1, 0, -1):
        jf = int(took[k, 0])
        if jf >= 0:
            step_target_vjp(w, states[k - 1], seq_dt[start + k], seq_g[start + k], t_y[jf], t_wt[jf], states[k],
                            gstates[k], gprev, gw)
        else:
            step_vjp(w, states[k - 1], seq_dt[start + k], seq_g[start + k], states[k], gstates[k], gprev, gw)
        for i in range(N_ADJ):
            gstates[k - 1, i] += gprev[i]
    init_vjp(w, seq_g[start], seq_dt[start], states[0], gstates[0], gw)
    return loss


@njit(cache=True)
def tree_loss_grad(w, opts, parent, node_t, node_g, fused_y, fused_wt, grp_node, grp_t, grp_y, grp_wt, gw):
    """loss_grad_cards over a prefix tree of the cards (engine/prefix_tree.py): node i is the state after a review
    sequence shared by one or more cards, computed once from its parent's (init for a root, parent −1); nodes are
    in topological order. A node with fused_y[i] >= 0 (−1: none) also computes a target group, the summed weight
    fused_wt[i] of every target that reads its parent's state at the node's own elapsed time with label fused_y[i]
    (step_target, as the card loop fuses one); the other target groups (grp_*) go through target_loss_vjp. Adds
    the gradient into gw. The card loop's loss and gradient up to rounding (weights summed first, sums in another
    order)."""
    n_nodes = len(parent)
    wc = precompute(w, opts)
    gwc = np.zeros(len(wc))
    states = np.empty((n_nodes, max(N_STATE, 1)))
    gstates = np.zeros((n_nodes, max(N_ADJ, 1)))
    gprev = np.zeros(max(N_STATE, 1))
    loss = 0.0
    for i in range(n_nodes):
        p = parent[i]
        if p < 0:
            init(wc, node_g[i], node_t[i], states[i])
        elif fused_y[i] >= 0.0:
            loss += step_target(wc, states[p], node_t[i], node_g[i], fused_y[i], fused_wt[i], states[i])
        else:
            step(wc, states[p], node_t[i], node_g[i], states[i])
    for j in range(len(grp_node)):
        k = grp_node[j]
        loss += target_loss_vjp(wc, states[k], grp_t[j], grp_y[j], grp_wt[j], gstates[k], gwc)
    for i in range(n_nodes - 1, -1, -1):
        p = parent[i]
        if p < 0:
            init_vjp(wc, node_g[i], node_t[i], states[i], gstates[i], gwc)
            continue
        if fused_y[i] >= 0.0:
            step_target_vjp(wc, states[p], node_t[i], node_g[i], fused_y[i], fused_wt[i], states[i], gstates[i],
                            gprev, gwc)
        else:
            step_vjp(wc, states[p], node_t[i], node_g[i], states[i], gstates[i], gprev, gwc)
        for a in range(N_ADJ):
            gstates[p, a] += gprev[a]
    precompute_vjp(w, opts, wc, gwc, gw)
    return loss
# ---- STEP-TARGET-END


@njit(cache=True)
def forward_values(w, seq_dt, seq_g, start, n, states):
    """states[k][:N_ADJ] = state after review k of the card, by step_value: the plug-in's step for what reads the
    states alone (predictions, a loss without gradient) when it has one, which writes nothing for step_vjp and
    computes only the side of each where its condition takes; else its step."""
    init(w, seq_g[start], seq_dt[start], states[0])
    for k in range(1, n):
        step_value(w, states[k - 1], seq_dt[start + k], seq_g[start + k], states[k])


@njit(cache=True)
def card_predict(w, seq_dt, seq_g, start, n, t_pos, t_dt, tb, te, buf, out):
    """out[j] = P(recall) of each target of the card (one forward pass)."""
    states = buf[0]
    forward_values(w, seq_dt, seq_g, start, n, states)
    for j in range(tb, te):
        out[j] = curve(w, states[t_pos[j] - 1], t_dt[j])


@njit(cache=True)
def card_loss(w, seq_dt, seq_g, start, n, t_pos, t_dt, t_y, t_wt, tb, te, buf, p):
    """Σ weight·BCE over the card's targets (one forward pass; p is unused scratch)."""
    states = buf[0]
    forward_values(w, seq_dt, seq_g, start, n, states)
    loss = 0.0
    for j in range(tb, te):
        loss += target_loss(w, states[t_pos[j] - 1], t_dt[j], t_y[j], t_wt[j])
    return loss

# ---- GENERIC-CARD-END

# ---- CUSTOM-CARD-BEGIN (left out for a step-function model, which has the card_loss above)


@njit(cache=True)
def card_loss(w, seq_dt, seq_g, start, n, t_pos, t_dt, t_y, t_wt, tb, te, buf, p):
    """Σ weight·BCE over the card's targets from the model's own card_predict (p: per-target scratch)."""
    card_predict(w, seq_dt, seq_g, start, n, t_pos, t_dt, tb, te, buf, p)
    loss = 0.0
    for j in range(tb, te):
        loss += bce(p[j], t_y[j], t_wt[j])[0]
    return loss

# ---- CUSTOM-CARD-END


# ---- CARD-BATCH-BEGIN (left out when the plug-in names lane kernels: LANE_KERNELS)
LANES_ONLY = False


@njit(cache=True, inline="always")
def batch_loss_grad(wc, seq_dt, seq_g, c_start, t_pos, t_dt, t_y, t_wt, items, batch, max_n, buf, gwc, lanes):
    """Adds the gradient of Σ weight·BCE over the work items `batch` (rows of items) into gwc, card by card.
    Returns True (the batch was taken; see LANE-ONLY). `lanes`: 0 here."""
    for it in batch:
        card_loss_grad(wc, seq_dt, seq_g, c_start[items[it, 0]], items[it, 3], t_pos, t_dt, t_y, t_wt, items[it, 1],
                       items[it, 2], buf, gwc)
    return True


@njit(cache=True, inline="always")
def fit_loss(w, opts, seq_dt, seq_g, c_start, c_n, c_tb, c_te, t_pos, t_dt, t_y, t_wt, max_n, lanes):
    """Σ weight·BCE over every card: the fit's objective without its prior."""
    return loss_cards(w, opts, seq_dt, seq_g, c_start, c_n, c_tb, c_te, t_pos, t_dt, t_y, t_wt, max_n)
# ---- CARD-BATCH-END

# ---- LANE-BATCH-BEGIN (only when the plug-in names lane kernels, LANE_KERNELS). `lanes` is the address of its
# lanes_loss_grad (seq_engine.lane_kernel), called through it (engine/lanes.call_lane_kernel), not compiled into these
# loops, so that the kernel and the engine compile apart: in parallel, and the kernel's code optimised once.
LANES_ONLY = False


@njit(cache=True, inline="always")
def batch_loss_grad(wc, seq_dt, seq_g, c_start, t_pos, t_dt, t_y, t_wt, items, batch, max_n, buf, gwc, lanes):
    """Adds the gradient of Σ weight·BCE over the work items `batch` into gwc by the plug-in's lane kernel (cards
    side by side); a batch it cannot lay out (NaN, nothing added) runs card by card. Returns True."""
    if math.isnan(call_lane_kernel(lanes, (wc, seq_dt, seq_g, c_start, t_pos, t_dt, t_y, t_wt, items, batch, max_n,
                                           gwc, False, True))):
        for it in batch:
            card_loss_grad(wc, seq_dt, seq_g, c_start[items[it, 0]], items[it, 3], t_pos, t_dt, t_y, t_wt,
                           items[it, 1], items[it, 2], buf, gwc)
    return True


@njit(cache=True, inline="always")
def fit_loss(w, opts, seq_dt, seq_g, c_start, c_n, c_tb, c_te, t_pos, t_dt, t_y, t_wt, max_n, lanes):
    """Σ weight·BCE over every card by the lane kernel's forward pass (card by card if it cannot lay them out)."""
    loss = lane_loss(w, opts, seq_dt, seq_g, c_start, c_n, c_tb, c_te, t_pos, t_dt, t_y, t_wt, max_n, lanes)
    if math.isnan(loss):
        return loss_cards(w, opts, seq_dt, seq_g, c_start, c_n, c_tb, c_te, t_pos, t_dt, t_y, t_wt, max_n)
    return loss
# ---- LANE-BATCH-END

# ---- LANE-ONLY-BEGIN (the lane kernel alone: what a fit compiles first. Any NaN from the lane kernel ends
# adam_fit at once, reporting it, and the caller runs the fit again on the LANE-BATCH instance, which takes such
# batches card by card: the same weights, and the card loops compiled only for the fits that need them.)
LANES_ONLY = True


@njit(cache=True, inline="always")
def batch_loss_grad(wc, seq_dt, seq_g, c_start, t_pos, t_dt, t_y, t_wt, items, batch, max_n, buf, gwc, lanes):
    """Adds the gradient of Σ weight·BCE over the work items `batch` into gwc by the plug-in's lane kernel;
    False (nothing added) for a batch it cannot lay out."""
    return not math.isnan(call_lane_kernel(lanes, (wc, seq_dt, seq_g, c_start, t_pos, t_dt, t_y, t_wt, items, batch,
                                                   max_n, gwc, False, True)))


@njit(cache=True, inline="always")
def fit_loss(w, opts, seq_dt, seq_g, c_start, c_n, c_tb, c_te, t_pos, t_dt, t_y, t_wt, max_n, lanes):
    """Σ weight·BCE over every card by the lane kernel's forward pass; NaN when it cannot lay them out."""
    return lane_loss(w, opts, seq_dt, seq_g, c_start, c_n, c_tb, c_te, t_pos, t_dt, t_y, t_wt, max_n, lanes)
# ---- LANE-ONLY-END

# ---- LANE-LOSS-BEGIN (with either lane section)
@njit(cache=True, inline="always")
def lane_loss(w, opts, seq_dt, seq_g, c_start, c_n, c_tb, c_te, t_pos, t_dt, t_y, t_wt, max_n, lanes):
    """Σ weight·BCE over every card by the lane kernel's forward pass (NaN if it cannot lay them out)."""
    items = card_items(c_start, c_n, c_tb, c_te)
    return call_lane_kernel(lanes, (precompute(w, opts), seq_dt, seq_g, c_start, t_pos, t_dt, t_y, t_wt, items,
                                    np.arange(len(c_start)), max_n, np.zeros(0), True, False))
# ---- LANE-LOSS-END


@njit(cache=True)
def predict_cards(w, opts, seq_dt, seq_g, c_start, c_n, c_tb, c_te, t_pos, t_dt, max_n, out):
    buf = scratch(max_n)
    wc = precompute(w, opts)
    for c in range(len(c_start)):
        card_predict(wc, seq_dt, seq_g, c_start[c], c_n[c], t_pos, t_dt, c_tb[c], c_te[c], buf, out)


@njit(cache=True)
def loss_cards(w, opts, seq_dt, seq_g, c_start, c_n, c_tb, c_te, t_pos, t_dt, t_y, t_wt, max_n):
    """Σ weight·BCE over every card (forward only)."""
    buf = scratch(max_n)
    wc = precompute(w, opts)
    p = np.empty(len(t_pos))
    loss = 0.0
    for c in range(len(c_start)):
        loss += card_loss(wc, seq_dt, seq_g, c_start[c], c_n[c], t_pos, t_dt, t_y, t_wt, c_tb[c], c_te[c], buf, p)
    return loss


@njit(cache=True)
def loss_grad_cards(w, opts, seq_dt, seq_g, c_start, c_n, c_tb, c_te, t_pos, t_dt, t_y, t_wt, max_n, gw):
    """Σ weight·BCE over every card; adds its gradient into gw."""
    buf = scratch(max_n)
    wc = precompute(w, opts)
    gwc = np.zeros(len(wc))
    loss = 0.0
    for c in range(len(c_start)):
        loss += card_loss_grad(wc, seq_dt, seq_g, c_start[c], c_n[c], t_pos, t_dt, t_y, t_wt, c_tb[c], c_te[c],
                               buf, gwc)
    precompute_vjp(w, opts, wc, gwc, gw)
    return loss


@njit(cache=True)
def adam_fit(w0, opts, w_init, inv_var, grad_mask, lower, upper, seq_dt, seq_g, c_start, c_n, c_tb, c_te, t_pos, t_dt,
             t_y, t_wt, max_n, items, orders, bounds, n_batches, lr, betas, check_every_epoch, keep_last, lanes):
    """Adam with a per-step cosine schedule, penalty·B/N per batch, frozen parameters (grad_mask 0), clipping after
    every step (the box, then the model's `project`, a no-op unless it defines one), and the best full objective
    among the initial weights and the end of every epoch (check_every_epoch) or of the last one only; keep_last
    returns the weights training ends with instead, and NaN for the objective (no full loss pass at all: two
    forward passes over the data saved, ~15% of FSRS-7's training).

    opts: the model's run-time options (engine/seq_model_stub.py: precompute); lanes: the address of the plug-in's
    lane kernel (seq_engine.lane_kernel), or 0.
    Work items are (card, first target, end target, states needed): a whole card, or one target with its history.
    Epoch e visits items orders[e, :] in batches bounds[e, b] .. bounds[e, b + 1] for b < n_batches[e].
    Returns (weights, objective, True), or (the current weights, NaN, False) at once when the LANE-ONLY instance's
    lane kernel refuses a pass (the caller then runs the fit on the LANE-BATCH instance)."""
    n_epoch = orders.shape[0]
    n_targets = len(t_pos)
    n_w = len(w0)
    buf = scratch(max_n)
    grad = np.zeros(n_w)
    n_batches_total = 0
    for e in range(n_epoch):
        n_batches_total += n_batches[e]
    w = w0.copy()
    m = np.zeros(n_w)
    v = np.zeros(n_w)
    b1 = betas[0]
    b2 = betas[1]
    eps = 1e-8
    best_w = w.copy()
    best = math.nan  # keep_last: no objective is needed (the start's and the end's loss passes are skipped)
    if not keep_last:
        loss = fit_loss(w, opts, seq_dt, seq_g, c_start, c_n, c_tb, c_te, t_pos, t_dt, t_y, t_wt, max_n, lanes)
        if LANES_ONLY and math.isnan(loss):
            return w, loss, False
        best = loss + l2_prior(w, w_init, inv_var)
    step_no = 0
    for e in range(n_epoch):
        for b in range(n_batches[e]):
            wc = precompute(w, opts)  # the model's per-weight constants, once per batch
            gwc = np.zeros(len(wc))
            grad[:] = 0.0
            batch = orders[e, bounds[e, b]:bounds[e, b + 1]]
            nt = 0
            for it in batch:
                nt += items[it, 2] - items[it, 1]
            if not batch_loss_grad(wc, seq_dt, seq_g, c_start, t_pos, t_dt, t_y, t_wt, items, batch, max_n, buf, gwc,
                                   lanes):
                return w, math.nan, False
            precompute_vjp(w, opts, wc, gwc, grad)
            scale = nt / n_targets
            for j in range(n_w):
                gj = (grad[j] + 2.0 * scale * (w[j] - w_init[j]) * inv_var[j]) * grad_mask[j]
                grad[j] = gj if math.isfinite(gj) else 0.0
            lr_t = cosine_lr(lr, step_no, n_batches_total)
            step_no += 1
            adam_step(w, grad, m, v, step_no, lr_t, b1, b2, eps, 0.0)
            for j in range(n_w):
                w[j] = min(max(w[j], lower[j]), upper[j])
            project(w)
        if keep_last:
            continue
        if check_every_epoch or e == n_epoch - 1:
            loss = fit_loss(w, opts, seq_dt, seq_g, c_start, c_n, c_tb, c_te, t_pos, t_dt, t_y, t_wt, max_n, lanes)
            if LANES_ONLY and math.isnan(loss):
                return w, loss, False
            cur = loss + l2_prior(w, w_init, inv_var)
            if cur < best:
                best = cur
                for j in range(n_w):  # (a slice assignment compiles numba's shape-mismatch message: ~1 s)
                    best_w[j] = w[j]
    if keep_last:
        return w, best, True
    return best_w, best, True
