"""FSRS v1 (7 parameters, spec models.md §1.10) on the shared engine.

State (S, D, L), L the number of lapses. Curve R = 0.9^{t/S}. First review (grade G):
  S = w0·0.25·2^{G−1}   (Again w0/4, Hard w0/2, Good w0, Easy 2·w0)
  D = w1 − G + 3        (not clamped)
  L = max(0, 2 − G)     (1 after Again, else 0)
Later review (elapsed t, R = 0.9^{t/S}); the NEW difficulty is computed first and used by the stability update:
  D' = max(0, D + R − 0.25·2^{G−1} + 0.1)
  recall (G > 1): S' = S·(1 + e^{w2}·(D' + 0.1)^{w3}·S^{w4}·(e^{w5(1−R)} − 1))
  lapse  (G = 1): S' = w0·e^{w6·L}       (L before this review)
  L' = L + max(0, 2 − G)
S (at the first review too) is clamped to [0.01, 36500]; D has no clamp besides the max(0, ·).
Training as v3 (fsrs_v3.py): defaults as the start, every row, Adam 4e-2, 5 epochs, no prior, weights rounded to
4 decimals before prediction.

DEVIATION from the upstream run this benchmark reproduces: in srs-benchmark's January-2025 code (the monolithic
other.py, which also defined FSRS1 with exactly the equations above) FSRS v1 never produces a result. Its base
class `FSRS.iter` unpacks the final state as `stabilities, difficulties = outputs[seq_lens - 1, arange].
transpose(0, 1)`, which assumes a 2-component state; v1's state has 3 components (S, D, L), so every call raises
"ValueError: too many values to unpack (expected 2)". Training catches it (not an "inadequate data" error: it is
printed and the default weights are used), but prediction calls the same `iter` and the user fails, so no
FSRSv1 line is ever written (hence no FSRSv1 entry in data/upstream-check). Later upstream code (models/fsrs.py
@00c9de57: `stabilities, difficulties, *_ = ...`) reads S and D from the first two components, which is what this
implementation does: the model runs and is trained as upstream later intended.

The equations are written once, as the torch functions below (`FSRSv1.traced`): the compiled engine runs the plug-in
engine/traced.py generates from them (scalar steps, VJPs and lanes; S's lower clamp the run-time option RUN_OPTIONS),
the upstream-style trainer steps them in torch. Until 29 Nov 2026 v1 had a hand-written numba plug-in and lane kernel
(lane_kernels/fsrs_legacy_lanes.py, later fsrs_v1_lanes.py); the generated ones give the same result lines (day mode and --secs), and the
generated lane kernel ran 0.80x the hand one's time (bench/bench_generated_lanes.py). For the tracer the lapse count
is an integer state kept as a float64, and 0.25·2^{G−1} a table (torch computes 0.25 * pow(2, G − 1) in float32;
the values are exact either way).
"""

from __future__ import annotations

from models.fsrs_v3 import S_MAX, S_MIN, FSRSLegacy, torch_exp_curve
from models.fsrs_v3 import torch_curve  # noqa: F401 (v3's curve)

RUN_OPTIONS = ("S_MIN",)  # the generated plug-in's run-time options (engine/traced.py): FSRSLegacy.engine_opts


# ---------------------------------------------------------------------------------------- the equations (torch)

def torch_init(w, g, t):
    import torch  # the upstream-style trainer only: a default run does not import torch

    s = (w[0] * 0.25 * torch.pow(2, g - 1)).clamp(S_MIN, S_MAX)
    d = w[1] - g + 3
    lapses = torch.relu(2 - g)
    return s, d, lapses


def torch_step(w, state, t, g):
    import torch  # the upstream-style trainer only: a default run does not import torch

    s, d, lapses = state
    r = torch_exp_curve(t, s)
    quarter_powers = torch.tensor([0.25, 0.5, 1.0, 2.0], dtype=d.dtype)  # 0.25·2^{G−1}, exact in float32 too
    nd = torch.relu(d + r - quarter_powers[(g.long() - 1).clamp(0, 3)] + 0.1)
    s_recall = s * (1 + torch.exp(w[2]) * (nd + 0.1).pow(w[3]) * s.pow(w[4]) * (torch.exp((1 - r) * w[5]) - 1))
    s_lapse = w[0] * torch.exp(w[6] * lapses)
    ns = torch.where(g > 1, s_recall, s_lapse).clamp(S_MIN, S_MAX)
    return ns, nd, lapses + torch.relu(2 - g)


class FSRSv1(FSRSLegacy):
    name = "FSRSv1"
    kernels = "models.fsrs_v1"
    traced = True  # the compiled engine runs the plug-in generated from torch_init / torch_step / torch_curve
    default_w = [2, 5, 3, -0.7, -0.2, 1, -0.3]
    lower = [0.1, 1, 0.01, -1, -1, 0.01, -1]
    upper = [10, 10, 10, -0.01, -0.01, 10, -0.01]
