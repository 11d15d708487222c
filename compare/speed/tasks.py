"""Inside an engine's worker: the timed runs of `native-loops bench` and the walk-forward (asked as
"compare.speed.tasks:bench" and "compare.speed.tasks:walk_forward"). This module imports Keras: only a worker imports
it."""
from __future__ import annotations

from pathlib import Path

import keras
import numpy as np

from compare.engines import paths
from compare.engines.requests import model_for
from compare.speed import floors
from keras_side import cores, fit, models
from keras_side.data import HarData, Scaling
from keras_side.determinism import seed_everything
from keras_side.spec import TrainConfig

ENGINE = keras.config.backend()
WALK_FORWARD_REPEATS = 3  # timed runs of the compiled JAX walk-forward (a fraction of a second each); the median


def bench(request: dict, send) -> dict:
    """Train each requested path `repeats` times, alternating paths, and report each wall time; with `cpus`, every
    thread of this process on those cores meanwhile (`cores.on_cpus`)."""
    with cores.on_cpus(request.get("cpus"), every_thread=True):
        return _bench(request, send)


def _bench(request: dict, send) -> dict:
    data, cfg = HarData.load(request["data"]), TrainConfig(**request["config"])
    for _ in range(request["repeats"]):
        for name in request["paths"]:
            seed_everything(cfg.seed)
            first_run = None  # JAX's fused scan: its program's first run, in its compile time
            if name in floors.FLOORS:  # the same step without Keras, from the Keras model's own first weights
                model = model_for(request, data)
                seconds, compile_seconds = floors.FLOORS[name][1](data, cfg, model.get_weights(),
                                                                  request.get("model", "har"),
                                                                  seeds=floors.seed_states(model))
            else:
                result = paths.get(name).train(model_for(request, data), data, cfg)
                seconds, compile_seconds, first_run = result.train_seconds, result.compile_seconds, \
                    result.first_run_seconds
            send(event="timing", path=name, seconds=seconds, compile_seconds=compile_seconds,
                 first_run_seconds=first_run)
    if request.get("stages") and ENGINE == "torch":  # where the eager step's time goes
        seed_everything(cfg.seed)
        send(event="stages", stages=floors.torch_stages(model_for(request, data), data, cfg))
    return {"cpus": cores.cores_in_use()}


def walk_forward(request: dict, send) -> dict:
    """Train every walk-forward model at once on this engine, then time a few refits with `fit`. With `cpus` (the
    cores the run may use), every thread of this process on the last of them meanwhile, and JAX's sharded run on a
    core a device (`cores.on_cpus`)."""
    cpus = request.get("cpus")
    with cores.on_cpus(cpus[-1:] if cpus else None, every_thread=True):
        return _walk_forward(request, cpus)


def _walk_forward(request: dict, cpus: list[int] | None) -> dict:
    cfg, out = TrainConfig(**request["config"]), Path(request["out"])
    with np.load(request["windows"]) as z:
        w = dict(z)
    trained = _walk_jax(w, cfg, request["devices"], cpus, request.get("repeats")) if ENGINE == "jax" else \
        _walk_torch(w, cfg)  # one device, timed by its epochs
    timings = {}
    for name, (pred, seconds, compile_seconds, devices, used) in trained.items():
        np.save(out / f"walk-forward-{name}.npy", pred)
        timings[name] = {"seconds": seconds, "compile_seconds": compile_seconds, "devices": devices, "cpus": used}
    fit_seconds = []
    for a, r in request["fit_models"]:
        rows = int(w["rows"][a, r])
        scaling = Scaling.identity(3)  # timing only: the inputs are standardized already
        x_next, y_next = w["x_next"][a, r], w["x_next"][a, r, :, :1]  # timing only: no validation, no report
        one = HarData(x_train=w["x"][a, :rows], y_train=w["y"][a, :rows], x_val=x_next, y_val=y_next, x_test=x_next,
                      y_test=y_next, scaling=scaling, features=(), asset="", source="")
        seed_everything(cfg.seed)
        refit = fit.train(models.har(), one, cfg.replace(validate=False))
        fit_seconds.append(refit.train_seconds + (refit.compile_seconds or 0.0))  # a new model: each refit compiles
    return {"timings": timings, "fit_seconds": fit_seconds}


def _walk_jax(w: dict, cfg: TrainConfig, device_counts: list[int], cpus: list[int] | None = None,
              repeats: int | None = None) -> dict:
    """jax.vmap of the fused trainer, on 1 device and sharded over more: {name: (forecasts, s, compile s, devices,
    the cores its threads ran on)}. Timed as the median of `repeats` runs of the compiled trainer (default
    WALK_FORWARD_REPEATS). With `cpus` (the cores the run may use), each run computes on as many of the last of them
    as it has devices."""
    import jax

    from native.jax import many as jax_many

    found = {}
    for count in (c for c in device_counts if c <= len(jax.devices())):
        with cores.on_cpus(cpus[-count:] if cpus else None, every_thread=True):  # a core a device
            pred, seconds, compile_seconds = jax_many.forecasts(models.har, w, cfg, devices=jax.devices()[:count],
                                                                repeats=repeats or WALK_FORWARD_REPEATS)
            found[f"jax-vmap-{count}dev"] = (pred, seconds, compile_seconds, count, cores.cores_in_use())
    return found


def _walk_torch(w: dict, cfg: TrainConfig) -> dict:
    from native.torch import many as torch_many

    seed_everything(cfg.seed)  # one thread, as every worker's training: the compiled step's kernels are tiny
    pred, seconds, compile_seconds = torch_many.forecasts(models.har, w, cfg)
    return {"torch-vmap": (pred, seconds, compile_seconds, 1, cores.cores_in_use())}
