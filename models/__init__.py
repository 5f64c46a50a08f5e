"""Model registry: a name in the tables maps to "module:Class", imported only when that model runs.

Adding a model is one file in this package plus one line here. The class is called with the run's `RunConfig`.
"""

from __future__ import annotations

import importlib

from models.base import InadequateData, Model, ReviewData

REGISTRY: dict[str, str] = {
    "FSRS-6": "models.fsrs6:FSRS6",
    "FSRS-5": "models.fsrs_v5:FSRS5",
    "FSRS-4.5": "models.fsrs_v45:FSRS45",
    "FSRSv4": "models.fsrs_v4:FSRSv4",
    "FSRSv3": "models.fsrs_v3:FSRSv3",
    "FSRSv2": "models.fsrs_v2:FSRSv2",
    "FSRSv1": "models.fsrs_v1:FSRSv1",
    "FSRS-rs": "models.fsrs_rs:FSRSRs",
    "AVG": "models.avg:AVG",
    "HLR": "models.hlr:HLR",
    "SM2-trainable": "models.sm2_trainable:SM2Trainable",
    "Anki": "models.anki:Anki",
    "SM2": "models.sm2:SM2",
    "Ebisu-v2": "models.ebisu_v2:EbisuV2",
    "RMSE-BINS-EXPLOIT": "models.baselines:RMSEBinsExploit",
    "MOVING-AVG": "models.baselines:MovingAvg",
}


def model_class(name: str) -> type:
    try:
        target = REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(sorted(REGISTRY))}") from None
    module, cls = target.split(":")
    return getattr(importlib.import_module(module), cls)


def create(cfg) -> Model:
    return model_class(cfg.algo)(cfg)


__all__ = ["REGISTRY", "create", "model_class", "InadequateData", "Model", "ReviewData"]
