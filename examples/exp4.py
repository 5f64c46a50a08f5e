"""EXP-4: a 4-parameter toy memory model, the worked example of docs/own-model.md.

State: stability S (days), the time at which recall has dropped to 90 %.
    first review, grade g:  S = w0 · e^(w1·(g − 3))
    later review after t days, R = 0.9^(t/S) the recall predicted for it:
        pass (g ≥ 2):  S' = S · (1 + e^(w2) · (1 − R))      (a harder recall grows S more)
        fail (g = 1):  S' = w3 · S
    S is kept in [0.01, 36500];  P(recall after t days) = 0.9^(t/S).
"""

import math

import torch

NAME = "EXP-4"
DEFAULT_W = [1.0, 0.7, 3.0, 0.3]
LOWER = [0.01, 0.0, -5.0, 0.01]
UPPER = [100.0, 3.0, 10.0, 1.0]
S_MIN, S_MAX = 0.01, 36500.0
LN09 = math.log(0.9)


def init(w, g, t):
    return (torch.clamp(w[0] * torch.exp(w[1] * (g - 3)), S_MIN, S_MAX),)


def step(w, state, t, g):
    (s,) = state
    r = curve(w, state, t)
    s_pass = s * (1 + torch.exp(w[2]) * (1 - r))
    s_fail = w[3] * s
    return (torch.clamp(torch.where(g > 1, s_pass, s_fail), S_MIN, S_MAX),)


def curve(w, state, t):
    return torch.exp(LN09 * t / state[0])
