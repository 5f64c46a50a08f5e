"""A contract model whose step uses torch.as_tensor, which engine/torch_standin.py does not have: traced with torch
itself (tests/test_torch_standin.py). Its functions import torch only when called, as the package models do."""

from __future__ import annotations


class Model:
    kernels = "standin_fallback"
    default_w = [1.0, 0.5]


def init(w, g, t):
    return (w[0] * (g.double() + 1),)


def step(w, state, t, g):
    import torch

    return (state[0] * torch.exp(-w[1] * t / state[0]) + torch.as_tensor(0.25, dtype=torch.float64),)


def curve(w, state, t):
    return 0.9 ** (t / state[0])
