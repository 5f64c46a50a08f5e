"""FSRS v4 (17 parameters) and the step functions it shares with FSRS-4.5 (spec models.md §1.6–1.7).

State (S, D). First review: S = w[G−1], D = clamp(w4 − w5·(G−3), 1, 10). Later review with R = R(t, S):
  D' = clamp(w7·w4 + (1−w7)·(D − w6·(G−3)), 1, 10)
  recall: S' = S·(1 + e^{w8}·(11−D)·S^{−w9}·(e^{w10(1−R)} − 1)·h·b)   (h = w15 for Hard, b = w16 for Easy)
  lapse:  S' = w11·D^{−w12}·((S+1)^{w13} − 1)·e^{w14(1−R)}           (FSRS-4.5: min(·, S))
  S' clamped to [0.01, 36500]; the stability formulas use the OLD D.
v4's curve is R = (1 + t/(9S))^{−1}; FSRS-4.5's is (1 + (19/81)·t/S)^{−0.5}: both are (1 + F·t/S)^{−d}.
Training (upstream): S0 fitted (§1.1) and then frozen, only rows with i > 2, no L2 prior.

The equations are written once, as torch_init / torch_core_step / torch_curve below (`traced`): the compiled engine
runs the plug-in engine/traced.py generates from them (scalar steps, VJPs, and the lane kernel of its trainer's
batches), S's lower clamp a run-time option (RUN_OPTIONS: 0.01, upstream's --secs 1e-4); fsrs_v45.py binds the same
step with its own constants; the upstream-style trainer steps them in torch. Until 29 Nov 2026 v4 and 4.5 had
hand-written numba steps, VJPs and lanes (shared with FSRS-5, whose plug-in keeps them: models/fsrs_v5.py); the
generated ones give the same result lines on data/embedded and upstream-check (day mode and --secs) and their lane
kernels run at the hand ones' speed (generated / hand 1.04x for both, bench/bench_generated_lanes.py).
"""

from __future__ import annotations

from models.fsrs_init import SECS_S_MIN, initialize_s0
from engine.kernel_math import LEGACY_S_MIN
from engine.seq_model import SeqModel

S_MIN = LEGACY_S_MIN  # 0.01; upstream's --secs: 1e-4 (the plug-in's run-time option)
RUN_OPTIONS = ("S_MIN",)  # the generated plug-in's run-time options (engine/traced.py): FSRSv4Family.engine_opts
S_MAX = 36500.0
# v4 constants: R = (1 + F·t/S)^(−DECAY), lapse not capped at S
F_V4 = 1.0 / 9.0
DECAY_V4 = 1.0


# ---------------------------------------------------------------------------------------- the equations (torch)

def torch_power_curve(t, s, factor: float, decay: float):
    return (1 + factor * t / s) ** (-decay)


def torch_init(w, g, t):
    s = w[:4][(g.long() - 1).clamp(0, 3)].clamp(S_MIN, S_MAX)
    d = (w[4] - w[5] * (g - 3)).clamp(1, 10)
    return s, d


def torch_core_step(w, state, t, g, factor: float, decay: float, cap_lapse: bool):
    import torch  # the upstream-style trainer only: a default run does not import torch

    s, d = state
    r = torch_power_curve(t, s, factor, decay)
    hb = torch.where(g == 2, w[15], 1.0) * torch.where(g == 4, w[16], 1.0)
    s_recall = s * (1 + torch.exp(w[8]) * (11 - d) * s.pow(-w[9]) * (torch.exp((1 - r) * w[10]) - 1) * hb)
    s_lapse = w[11] * d.pow(-w[12]) * ((s + 1).pow(w[13]) - 1) * torch.exp((1 - r) * w[14])
    if cap_lapse:
        s_lapse = torch.minimum(s_lapse, s)
    ns = torch.where(g > 1, s_recall, s_lapse).clamp(S_MIN, S_MAX)
    nd = (w[7] * w[4] + (1 - w[7]) * (d - w[6] * (g - 3))).clamp(1, 10)
    return ns, nd


def torch_step(w, state, t, g):
    return torch_core_step(w, state, t, g, F_V4, DECAY_V4, False)


def torch_curve(w, state, t):
    return torch_power_curve(t, state[0], F_V4, DECAY_V4)


# ---------------------------------------------------------------------------------------- the model

class FSRSv4Family(SeqModel):
    """v4 and 4.5: S0 fitted with the version's curve and frozen; trained on rows with i > 2.

    --secs (upstream's config.s_min with use_secs_intervals): s_min 1e-4 for S after every step, for the S0 fit's
    bounds and for w0..w3's clip; the S0 fit without recall smoothing or L1 pull; FSRS-4.5 with its secs-mode
    defaults (secs_default_w)."""

    factor: float = F_V4
    decay: float = DECAY_V4
    frozen = (0, 1, 2, 3)
    secs_default_w: list[float] | None = None  # the defaults of a --secs run, when the version has its own
    accepts_secs = True  # config.ACCEPTS_SECS

    def __init__(self, cfg=None):
        self.secs = bool(getattr(cfg, "secs_mode", False))
        self.s_min = SECS_S_MIN if self.secs else S_MIN
        if self.secs:  # instance values, read by SeqModel.__init__ (the engine's box, the starting weights)
            self.lower = [self.s_min] * 4 + list(type(self).lower[4:])
            if self.secs_default_w is not None:
                self.default_w = list(self.secs_default_w)
        super().__init__(cfg)

    def engine_opts(self) -> tuple:
        return (self.s_min,)

    def initial_weights(self, train):
        f, d = self.factor, self.decay
        s0 = initialize_s0(train.rows, lambda t, s: (1 + f * t / s) ** (-d), self.default_w[:4], self.s_min,
                           secs=self.secs)
        return list(s0) + list(self.default_w[4:])

    def training_rows(self, train):
        return train.rows["i"].to_numpy() > 2

    def fit(self, train):
        if self.cfg.S0 and not self.cfg.default:
            self.w = self.initial_weights(train)
            return self
        return super().fit(train)


class FSRSv4(FSRSv4Family):
    name = "FSRSv4"
    kernels = "models.fsrs_v4"
    traced = True  # the compiled engine runs the plug-in generated from torch_init / torch_step / torch_curve
    default_w = [0.4, 0.9, 2.3, 10.9, 4.93, 0.94, 0.86, 0.01, 1.49, 0.14, 0.94, 2.18, 0.05, 0.34, 1.26, 0.29, 2.61]
    lower = [S_MIN] * 4 + [1, 0.1, 0.1, 0, 0, 0.1, 0.01, 0.5, 0.01, 0.01, 0.01, 0, 1]
    upper = [100] * 4 + [10, 5, 5, 0.5, 3, 0.8, 2.5, 5, 0.2, 0.9, 2, 1, 4]

