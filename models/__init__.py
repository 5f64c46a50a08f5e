"""Model registry: a name in the tables maps to a factory taking the run's `RunConfig`.

Adding a model is one file in this package plus one line here.
"""

from __future__ import annotations

from typing import Callable

from models.base import InadequateData, Model, ReviewData


def _fsrs6(cfg):
    from models.fsrs6 import FSRS6

    return FSRS6(cfg)


def _avg(cfg):
    from models.avg import AVG

    return AVG(cfg)


REGISTRY: dict[str, Callable] = {
    "FSRS-6": _fsrs6,
    "AVG": _avg,
}


def create(cfg) -> Model:
    try:
        factory = REGISTRY[cfg.algo]
    except KeyError:
        raise ValueError(f"unknown model {cfg.algo!r}; known: {', '.join(sorted(REGISTRY))}") from None
    return factory(cfg)


__all__ = ["REGISTRY", "create", "InadequateData", "Model", "ReviewData"]
