"""FSRS-4.5 (17 parameters, spec models.md §1.6): FSRS v4's step with the curve (1 + (19/81)·t/S)^(−0.5), the
post-lapse stability capped at S, and wider clip bounds: fsrs_v4.py's torch equations with these constants, which the
compiled engine runs as the plug-in engine/traced.py generates from them (`traced`)."""

from __future__ import annotations

import models.fsrs_v4 as v4

RUN_OPTIONS = ("models.fsrs_v4:S_MIN",)  # the run-time option of the generated plug-in: v4's S_MIN, which
# torch_core_step (and torch_init) read
FACTOR = 19.0 / 81.0
DECAY = 0.5


torch_init = v4.torch_init


def torch_step(w, state, t, g):
    return v4.torch_core_step(w, state, t, g, FACTOR, DECAY, True)


def torch_curve(w, state, t):
    return v4.torch_power_curve(t, state[0], FACTOR, DECAY)


class FSRS45(v4.FSRSv4Family):
    name = "FSRS-4.5"
    kernels = "models.fsrs_v45"
    traced = True  # the compiled engine runs the plug-in generated from torch_init / torch_step / torch_curve
    factor = FACTOR
    decay = DECAY
    default_w = [0.4872, 1.4003, 3.7145, 13.8206, 5.1618, 1.2298, 0.8975, 0.031, 1.6474, 0.1367, 1.0461, 2.1072,
                 0.0793, 0.3246, 1.587, 0.2272, 2.8755]
    # upstream's FSRS4dot5 with --secs starts from (and its S0 fit pulls towards) its own secs-mode defaults
    secs_default_w = [0.0012, 0.0826, 0.8382, 26.2146, 4.8622, 1.0311, 0.8295, 0.0379, 2.0884, 0.4704, 1.2009,
                      1.7196, 0.1874, 0.1593, 1.5636, 0.2358, 3.3175]
    lower = [v4.S_MIN] * 4 + [0, 0.01, 0.01, 0, 0, 0, 0.01, 0.2, 0.01, 0.01, 0.01, 0, 1]
    upper = [100] * 4 + [10, 5, 5, 0.8, 6, 0.8, 5, 6, 0.4, 0.9, 4, 1, 10]
