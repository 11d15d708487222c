"""`native-loops zoo`: every zoo model × optimizer setting, trained by `fit` and by each native loop from the same
weights and the same batches, and how far apart they end.

    cells = zoo.run(panel, models=["bn_mlp"], engines=["jax"], optimizers=["adam"], folder=tmp)

A cell is (model, engine, path, optimizer): the largest absolute gap between the weights `fit` ends at and the
weights the path ends at (every weight, BatchNorm's moving statistics included), after `epochs` epochs of the shared
NumPy batch order. Paths, the three levels of unpacking: "train-step" (`fit` running our own `train_step`,
`native/<engine>/train_step.py`), "native" (the engine's loop with the Keras-exact optimizer), both judged against
`ZOO_ATOL`, with the loss and metrics they report per epoch within `HISTORY_ATOL` of `fit`'s History; and
"native-engine" (the same loop with the engine's stock optimizer: measured, not judged, since it differs by
convention; TensorFlow has no optimizers but Keras's). With `fast=True` (the CLI's default), each engine's fast
paths too, judged as "native" is: "native-fast" (torch: Keras's call wrapper bypassed; JAX: a 1-D convolution as a
matmul), "native-compile" (torch's loop under `torch.compile`) and "native-scan" (JAX's fused `lax.scan` driver).
`train_cells` runs inside an engine's worker; the rest runs in the referee.
"""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np
import pandas as pd

from compare.data.panel import DEFAULT_ASSET, DEFAULT_SPLIT, DEFAULT_VALIDATION, prepare_kind
from compare.engines import runner
from compare.referee.tolerances import HISTORY_ATOL, ZOO_ATOL
from keras_side.arrays import take
from keras_side.data import HarData
from keras_side.results import versions
from keras_side.zoo import OPTIMIZERS, ZOO

MODELS = tuple(ZOO)
PATHS = {"train-step": "keras", "native": "exact", "native-engine": "engine", "native-fast": "exact",
         "native-compile": "exact", "native-scan": "exact"}  # path -> optimizer flavour
# Each engine's fast paths, registered as f"{engine}-{path}" in `compare.engines.paths`.
FAST_PATHS = {"torch": ("native-fast", "native-compile"), "jax": ("native-fast", "native-scan")}
ZOO_EPOCHS = 3


def paths_on(engine: str, fast: bool = False) -> list[str]:
    """The zoo's paths on an engine: TensorFlow has no stock optimizer flavour (its optimizers are Keras's) and no
    fast path; with `fast`, the engine's fast paths too."""
    every_fast = {p for ps in FAST_PATHS.values() for p in ps}
    own = [p for p in PATHS if p not in every_fast and not (engine == "tensorflow" and PATHS[p] == "engine")]
    return own + (list(FAST_PATHS.get(engine, ())) if fast else [])


def _first_rows(data: HarData, rows: int | None) -> HarData:
    if rows is None or rows >= data.n_train:
        return data
    keep = slice(0, rows)
    weights = None if data.w_train is None else data.w_train[keep]
    return dataclasses.replace(data, x_train=take(data.x_train, keep), y_train=take(data.y_train, keep),
                               w_train=weights)


def run(panel: pd.DataFrame, *, models: list[str], engines: list[str], optimizers: list[str], folder: Path,
        epochs: int = ZOO_EPOCHS, rows: int | None = None, seed: int = 0, asset: str = DEFAULT_ASSET,
        split: str = DEFAULT_SPLIT, end: str | None = None, validation: str = DEFAULT_VALIDATION,
        fast: bool = False, on_cell=lambda cell: None) -> dict:
    """Every cell on every engine; `rows` trains on the first rows only (the fast subset); `fast` adds each
    engine's fast path (`FAST_PATHS`). Returns zoo.json."""
    kinds = sorted({ZOO[m].data for m in models})
    files = {}
    for kind in kinds:
        files[kind] = str(folder / f"zoo-{kind}.npz")
        prepared = prepare_kind(panel, kind, asset=asset, split=split, end=end, validation=validation)
        _first_rows(prepared, rows).save(files[kind])
    cells = []

    def on_event(engine: str, event: dict) -> None:
        if event.get("event") == "cell":
            cell = {k: v for k, v in event.items() if k != "event"}
            cells.append(cell)
            on_cell(cell)

    request = {"models": models, "optimizers": optimizers, "data": files, "epochs": epochs, "seed": seed,
               "fast": fast}
    start = time.perf_counter()
    with runner.Pool(engines, folder, jobs=1, compile_cache=True) as pool:
        pool.each("compare.referee.zoo:train_cells", lambda e: request, on_event)
    return {"tolerance": ZOO_ATOL, "history_tolerance": HISTORY_ATOL, "epochs": epochs, "rows": rows, "seed": seed,
            "versions": versions(), "seconds": time.perf_counter() - start, "cells": cells,
            "incomplete": dict(pool.failed)}


def passed(report: dict) -> bool:
    """Every judged cell within tolerance, and every engine complete."""
    judged = [c for c in report["cells"] if c["judged"]]
    return bool(judged) and all(c["passed"] for c in judged) and not report["incomplete"]


# ---- inside an engine's worker -------------------------------------------------------------------------------


def train_cells(request: dict, send) -> dict:
    """Train every (model, optimizer) with `fit` and each native path from the same weights; send each cell."""
    import keras

    from compare.engines import paths
    from keras_side import fit
    from keras_side.determinism import seed_everything
    from keras_side.models import ensure_built
    from keras_side.spec import TrainConfig

    engine = keras.config.backend()
    native = paths.loop(engine).train
    trainers = {"train-step": paths.get(f"keras-{engine}-train-step").load().train, "native": native,
                "native-engine": native}
    trainers |= {path: paths.get(f"{engine}-{path}").train for path in FAST_PATHS.get(engine, ())}
    own = paths_on(engine, request["fast"])
    for name in request["models"]:
        entry = ZOO[name]
        data = HarData.load(request["data"][entry.data])
        for optimizer in request["optimizers"]:
            cfg = TrainConfig(epochs=request["epochs"], seed=request["seed"], batch_order="numpy", validate=False,
                              **entry.spec, **OPTIMIZERS[optimizer])

            def trained(train, cfg=cfg):
                keras.backend.clear_session(free_memory=False)  # the same layer names; no gc (slow here)
                seed_everything(cfg.seed)
                model = ensure_built(entry.builder()(), data.x_train)
                result = train(model, data, cfg)
                return [v.path for v in model.weights], model.get_weights(), result

            names, want, reported = trained(fit.train)
            for path in own:
                cell = {"model": name, "engine": engine, "path": path, "optimizer": optimizer, "flavour": PATHS[path],
                        "tolerance": ZOO_ATOL, "judged": PATHS[path] != "engine", "seed": cfg.seed}
                flavour = "engine" if PATHS[path] == "engine" else "exact"
                try:
                    _, got, result = trained(lambda m, d, c: trainers[path](m, d, c.replace(flavour=flavour)))
                    cell |= _gap(names, got, want) | {"history_gap": _history_gap(result, reported)}
                except Exception as err:  # a spec this path cannot honour: the cell says so and fails
                    cell |= {"gap": float("nan"), "worst": "", "history_gap": float("nan"),
                             "error": f"{type(err).__name__}: {err}"}
                cell["passed"] = bool(cell["gap"] <= ZOO_ATOL and cell["history_gap"] <= HISTORY_ATOL)
                send(event="cell", **cell)
    return {}


def _history_gap(result, reported) -> float:
    """The largest gap between the loss and metrics a path reported per epoch and `fit`'s History."""
    curves = [(result.train_loss, reported.train_loss)] + [(result.metrics.get(k, []), v)
                                                           for k, v in reported.metrics.items()]
    if any(len(a) != len(b) for a, b in curves):
        return float("inf")  # a metric fit reports that the path did not
    return max(float(np.max(np.abs(np.subtract(a, b)), initial=0.0)) for a, b in curves)


def _gap(names: list[str], got: list[np.ndarray], want: list[np.ndarray]) -> dict:
    """The largest |got − want| over every weight, and the weight where it is."""
    gaps = [float(np.max(np.abs(np.asarray(g, np.float64) - np.asarray(w, np.float64)), initial=0.0))
            for g, w in zip(got, want, strict=True)]
    worst = int(np.argmax(gaps))
    return {"gap": gaps[worst], "worst": names[worst]}

