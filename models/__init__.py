"""Model registry: a name in the tables maps to "module:Class", imported only when that model runs.

Adding a model is one file in this package plus one line here. The class is called with the run's `RunConfig`.
A line without ":Class" ("SBD": "models.sbd") names a module written to the own-model contract (one torch file:
DEFAULT_W, init/step/curve, ...; engine/own_model.py), which the card-major autograd engine trains.
"""

from __future__ import annotations

import importlib

from models.base import InadequateData, Model, ReviewData
from engine.jit_cache import use_cache_folder

use_cache_folder()  # numba's disk cache of compiled kernels: this version's folder (engine/jit_cache.py)

REGISTRY: dict[str, str] = {
    "FSRS-7": "models.fsrs7:FSRS7",
    "FSRS-6": "models.fsrs6:FSRS6",
    "FSRS-rs": "models.fsrs_rs:FSRSRs",
    "FSRS-6-one-step": "models.fsrs_one_step:FSRS6OneStep",
    "FSRS-5": "models.fsrs_v5:FSRS5",
    "FSRS-4.5": "models.fsrs_v45:FSRS45",
    "FSRSv4": "models.fsrs_v4:FSRSv4",
    "FSRSv3": "models.fsrs_v3:FSRSv3",
    "FSRSv2": "models.fsrs_v2:FSRSv2",
    "FSRSv1": "models.fsrs_v1:FSRSv1",
    "GRU-P": "models.gru_p:GRUP",
    "GRU": "models.gru_p:GRU",
    "Transformer": "models.transformer:Transformer",
    "NN-17": "models.nn17:NN17",
    "LSTM": "models.lstm:LSTM",
    "DASH": "models.dash:DASH",
    "DASH[MCM]": "models.dash:DASHMCM",
    "DASH[ACT-R]": "models.dash:DASHACTR",
    "ACT-R": "models.act_r:ACTR",
    "HLR": "models.hlr:HLR",
    "SBD": "models.sbd",  # a one-file torch model (engine/own_model.py's contract)
    "SM2-trainable": "models.sm2_trainable:SM2Trainable",
    "Anki": "models.anki:Anki",
    "SM2": "models.sm2:SM2",
    "Ebisu-v2": "models.ebisu_v2:EbisuV2",
    "AVG": "models.avg:AVG",
    "MOVING-AVG": "models.baselines:MovingAvg",
    "RMSE-BINS-EXPLOIT": "models.baselines:RMSEBinsExploit",
    "90%": "models.baselines:Constant90",
    "LogisticRegression": "models.logistic_regression:LogisticRegression",
}


_OWN_CLASSES: dict[str, type] = {}


def model_class(name: str) -> type:
    """The class of a registered model, or of a model file (a path ending in .py, engine/own_model.py). A registry
    entry without ":Class" names a module written to the own-model contract."""
    from engine import own_model

    if own_model.is_model_path(name):
        if name not in _OWN_CLASSES:
            _OWN_CLASSES[name] = own_model.model_class(name)
        return _OWN_CLASSES[name]
    try:
        target = REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(sorted(REGISTRY))}") from None
    if ":" not in target:
        if target not in _OWN_CLASSES:
            _OWN_CLASSES[target] = own_model.model_class(importlib.import_module(target), name)
        return _OWN_CLASSES[target]
    module, cls = target.split(":")
    return getattr(importlib.import_module(module), cls)


def create(cfg) -> Model:
    return model_class(cfg.algo)(cfg)


__all__ = ["REGISTRY", "create", "model_class", "InadequateData", "Model", "ReviewData"]
