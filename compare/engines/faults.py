"""Faults a run can plant in one path (`native-loops compare --plant FAULT`): a referee that cannot fail a wrong
loop proves nothing, so each fault must make `compare` exit 1 with a check of that path named, on any data
(tests/compare/test_verdict.py). A fault changes what the path is given, never the checks, in every run of the
path (its run, its repeat, its same-arithmetic run), as a bug in the loop would.

    cfg, data = plant("lr-times-10", cfg, data)
"""
from __future__ import annotations

import dataclasses

import numpy as np

from keras_side.data import HarData
from keras_side.spec import TrainConfig

FAULTS = {
    "lr-times-10": "the learning rate 10 times too large",
    "lr-over-10": "the learning rate 10 times too small",
    "ascent": "the update's sign flipped (gradient ascent)",
    "shuffled-target": "the training targets shuffled against their inputs",
}


def plant(fault: str, cfg: TrainConfig, data: HarData) -> tuple[TrainConfig, HarData]:
    """`cfg` and `data` with `fault` (one of `FAULTS`) planted."""
    if fault == "lr-times-10":
        return cfg.replace(learning_rate=cfg.learning_rate * 10), data
    if fault == "lr-over-10":
        return cfg.replace(learning_rate=cfg.learning_rate / 10), data
    if fault == "ascent":  # every step then climbs the loss it should descend
        return cfg.replace(loss=f"{__name__}:negated_mse"), data
    if fault == "shuffled-target":
        order = np.random.default_rng(cfg.seed).permutation(len(data.y_train))
        return cfg, dataclasses.replace(data, y_train=data.y_train[order])
    raise ValueError(f"unknown fault {fault!r}: one of {', '.join(FAULTS)}")


def negated_mse(y_true, y_pred):
    """−MSE: its gradient is MSE's with the sign flipped."""
    import keras  # the worker's engine, imported where the spec resolves the loss
    return -keras.ops.mean(keras.ops.square(y_pred - y_true), axis=-1)
