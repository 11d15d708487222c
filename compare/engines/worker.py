"""One engine's process: `python -m compare.engines.worker`, started by the runner with KERAS_BACKEND in its
environment.

It says `ready` once its engine is imported, then reads one JSON request per line on stdin and answers with JSON
events on stdout: `progress` while it trains, then `done` (with what it wrote) or `error`. Arrays travel as files
in the request's folder, never on the pipe.
Anything a library prints is sent to stderr, so the protocol stays clean.
"""
from __future__ import annotations

import contextlib
import importlib
import json
import os
import sys
import time
import traceback
from pathlib import Path

import keras
import numpy as np

from compare.referee import zoo
from compare.engines import paths
from compare.io import named
from compare.speed import floors
from compare.parity import steps as parity_steps
from keras_side import cores, fit, models
from keras_side.arrays import keras_inputs, output_files
from keras_side.backend import keras_defaults
from keras_side.data import HarData, Scaling
from keras_side.determinism import seed_everything
from keras_side.initial import InitialWeights
from keras_side.losses import training_loss
from keras_side.precision import float64
from keras_side.results import compile_apart, loss_units, save_trained
from keras_side.spec import TrainConfig, resolve
from keras_side.zoo import ZOO

ENGINE = keras.config.backend()
WALK_FORWARD_REPEATS = 3  # timed runs of the compiled JAX walk-forward (a fraction of a second each); the median


def _builder(request: dict):
    """The request's model builder ("module:function"; the HAR unless it names another)."""
    return resolve(request.get("build", ZOO["har"].build))


def _model(request: dict, data: HarData) -> keras.Model:
    """A fresh model from the request's builder, built."""
    return models.ensure_built(_builder(request)(), data.x_train)


def _test_loss(model: keras.Model, data: HarData, cfg: TrainConfig) -> float:
    """The trained model's loss on the test split as `fit` computes its validation loss (the spec's loss plus the
    model's own losses, in inference mode), in the units of the result's curves."""
    pred = model(keras_inputs(data.x_test), training=False)
    loss = training_loss(cfg)(keras_inputs(data.y_test), pred)
    loss = loss + sum(model.losses) if model.losses else loss
    return float(keras.ops.convert_to_numpy(loss)) * loss_units(cfg, data)[0]


def initial(request: dict, send) -> dict:
    """Write this engine's seeded initial weights of the model: the start every engine's same-arithmetic run
    shares (for the HAR the referee draws it with NumPy instead)."""
    data = HarData.load(request["data"])
    seed_everything(request["seed"])
    np.savez(request["init"], **named("w", _model(request, data).get_weights()))
    return {}


def train_paths(request: dict, send) -> dict:
    """Train both paths of this engine: the run itself, its repeat (determinism), and the same-arithmetic run."""
    data, cfg, out = HarData.load(request["data"]), TrainConfig(**request["config"]), Path(request["out"])
    with np.load(request["init"]) as z:
        init = [z[f"w_{i}"] for i in range(len(z.files))]
    for path in paths.for_engine(ENGINE):

        def progress(stage):
            return lambda epoch, epochs: send(event="progress", engine=ENGINE, path=path.name, stage=stage,
                                              epoch=epoch, epochs=epochs)

        seed_everything(cfg.seed)
        model = _model(request, data)
        result = path.train(model, data, cfg, progress=progress("train"))
        result.test_loss = _test_loss(model, data, cfg)
        result.save(out)
        model.save_weights(str(out / f"{path.name}.weights.h5"))
        seed_everything(cfg.seed)
        again = path.train(_model(request, data), data, cfg, progress=progress("repeat"))
        model = _model(request, data)
        model.set_weights(init)
        same_cfg = cfg.replace(batch_order="numpy", validate=False, epochs=request["same_epochs"], patience=None)
        same = path.train(model, data, same_cfg, progress=progress("same"))
        np.savez(out / f"{path.name}.extra.npz", **named("again", again.weights), **named("same", same.weights))
    if request.get("many"):  # the model once per seed too (compare's seed_noise), in the same request
        seeds(request | request["many"], send)
    return {"paths": [p.name for p in paths.for_engine(ENGINE)]}


def gradients(request: dict, send) -> dict:
    """The native loop's `grad_at` on the fixed batch at fixed weights; in float64 too when asked."""
    with np.load(request["batch"]) as z:
        x, y, weights = z["x"], z["y"], [z["kernel"], z["bias"]]
    loop = paths.loop(ENGINE)
    model = models.har()
    model.set_weights(weights)
    grads = named("f32", loop.grad_at(model, x, y))
    if request.get("float64"):
        with float64():
            model = models.har()
            model.set_weights([w.astype(np.float64) for w in weights])
            grads |= named("f64", loop.grad_at(model, x.astype(np.float64), y.astype(np.float64)))
    np.savez(Path(request["out"]) / "gradients.npz", **grads)
    return {}


def cross_predict(request: dict, send) -> dict:
    """Load other engines' `.weights.h5` files into a fresh model here and predict the test set."""
    data = HarData.load(request["data"])
    preds = {}
    for name, weights_file in request["weights"].items():
        model = _model(request, data)
        model.load_weights(weights_file)
        preds |= output_files(name, fit.predict(model, data.x_test))
    np.savez(Path(request["out"]) / "cross_predictions.npz", **preds)
    return {}


def parity(request: dict, send) -> dict:
    """Build the user's model here; describe its trainable weights, or, at given weights, take the gradient of its
    training objective (`grads`) or every layer's output (`forward`)."""
    build, loss = resolve(request["build"]), _loss(request.get("loss", "mse"))
    exact = bool(request.get("float64"))
    with np.load(request["inputs"]) as z:
        xs = [z[f"x{i}"] for i in range(int(z["n_inputs"]))]
        y = z["y"]
    if exact:
        xs = [a.astype(np.float64) if np.issubdtype(a.dtype, np.floating) else a for a in xs]
        y = y.astype(np.float64)
    x = xs[0] if len(xs) == 1 else tuple(xs)
    keras.backend.clear_session(free_memory=False)  # fresh layer names, so weights read the same; no gc (~0.2 s)
    with float64() if exact else contextlib.nullcontext():
        model = models.ensure_built(build(), x)
        variables = model.trainable_weights
        frozen = model.non_trainable_weights  # BatchNorm's statistics, a frozen layer's weights, seed states
        if "describe" in request:  # the trainable weights' names and shapes, and this engine's non-trainable values
            np.savez(request["describe"], names=np.array([v.path for v in variables]),
                     **{f"shape{i}": np.array(v.shape, dtype=np.int64) for i, v in enumerate(variables)},
                     **{f"frozen{i}": keras.ops.convert_to_numpy(v.value) for i, v in enumerate(frozen)})
            return {}
        with np.load(request["weights"]) as z:
            for i, v in enumerate(variables):
                v.assign(z[f"w{i}"].astype(v.dtype))
            for i, v in enumerate(frozen):  # the reference engine's, so that no engine keeps its own draw
                v.assign(z[f"frozen{i}"].astype(v.dtype))
        if "forward" in request:
            outputs = models.layer_outputs(model, x, training=request["training"])
            np.savez(request["forward"], names=np.array(list(outputs)), **named("o", outputs.values()))
            return {}
        grads = paths.loop(ENGINE).grad_at(model, x, y, loss=loss, training=request["training"])
    np.savez(request["grads"], **named("g", grads))
    return {}


def native_weights(request: dict, send) -> dict:
    """The native loop in this one process, on the request's spec, or with `fit`: plain `fit` on one device. The
    trained weights, the training seconds and the cores it ran on: the baselines of `native-loops distributed`.
    With `nudge`, from one ulp away (`nudge` below): how far rounding alone carries the run. With `cpus`, every
    thread of this process on those cores meanwhile (`cores.on_cpus`)."""
    with cores.on_cpus(request.get("cpus"), every_thread=True):
        return _native_weights(request, send)


def _native_weights(request: dict, send) -> dict:
    data, cfg = HarData.load(request["data"]), TrainConfig(**request["config"])
    seed_everything(cfg.seed)
    path = "fit" if request.get("fit") else "native"

    def progress(epoch, epochs):
        send(event="progress", engine=ENGINE, path=f"{ENGINE}-{path}", stage="train", epoch=epoch, epochs=epochs)

    start = time.perf_counter()  # fit's seconds as its launchers count them: the model's build and fit
    model = _model(request, data)
    if request.get("nudge"):
        nudge(model)
    if request.get("fit"):
        fit.train(model, data, cfg, progress=progress)
        weights, seconds = model.get_weights(), time.perf_counter() - start
    else:
        result = paths.loop(ENGINE).train(model, data, cfg, progress=progress)
        weights, seconds = result.weights, result.train_seconds + (result.compile_seconds or 0.0)  # compiles too
    save_trained(request["weights"], weights, seconds, [cores.cores_in_use()], seed=cfg.seed)
    return {}


def nudge(model: keras.Model) -> None:
    """Move the first element of the model's first floating-point weight to the next float: one ulp, the smallest
    difference rounding can make."""
    weights = model.get_weights()
    w = next(w for w in weights if np.issubdtype(w.dtype, np.floating))
    w.flat[0] = np.nextafter(w.flat[0], w.dtype.type(np.inf))
    model.set_weights(weights)


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
                model = _model(request, data)
                seconds, compile_seconds = floors.FLOORS[name][1](data, cfg, model.get_weights(),
                                                                  request.get("model", "har"),
                                                                  seeds=floors.seed_states(model))
            else:
                result = paths.get(name).train(_model(request, data), data, cfg)
                seconds, compile_seconds, first_run = result.train_seconds, result.compile_seconds, \
                    result.first_run_seconds
            send(event="timing", path=name, seconds=seconds, compile_seconds=compile_seconds,
                 first_run_seconds=first_run)
    if request.get("stages") and ENGINE == "torch":  # where the eager step's time goes
        seed_everything(cfg.seed)
        send(event="stages", stages=floors.torch_stages(_model(request, data), data, cfg))
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
        scaling = Scaling(np.zeros(3), np.ones(3), 0.0, 1.0)  # timing only: the inputs are standardized already
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
            pred, seconds, compile_seconds = jax_many.forecasts(models.har, w, cfg, jax.devices()[:count],
                                                                repeats=repeats or WALK_FORWARD_REPEATS)
            found[f"jax-vmap-{count}dev"] = (pred, seconds, compile_seconds, count, cores.cores_in_use())
    return found


def _walk_torch(w: dict, cfg: TrainConfig) -> dict:
    from native.torch import many as torch_many

    seed_everything(cfg.seed)  # one thread, as every worker's training: the compiled step's kernels are tiny
    init = InitialWeights.of(models.har, w["x"][0])
    params = init.draw_grid(w["rows"].shape, cfg.seed)[0]  # each model's start, from the HAR's own initializers
    epochs = []
    params = torch_many.train_many(init.model, w["x"], w["y"], w["rows"], params, cfg, compile=True,
                                   epoch_seconds=epochs)
    seconds, compile_seconds = compile_apart(epochs)
    return {"torch-vmap": (torch_many.predict_many(init.model, params, w["x_next"])[..., 0], seconds,
                           compile_seconds, 1, cores.cores_in_use())}


# The engines with a many-model trainer (`native.<engine>.many.train_seeds`: vmap over stacked models).
MANY = {"jax": "native.jax.many", "torch": "native.torch.many"}  # compare.engines.runner.MANY_ENGINES


def seeds(request: dict, send) -> dict:
    """The model trained once per seed at once by this engine's many-model trainer (for each learning rate of the
    request when it gives several: rate-major), and with `fit` at the run's seed when asked: each model's
    validation and test loss, its trained trainable weights stacked."""
    data, cfg, out = HarData.load(request["data"]), TrainConfig(**request["config"]), Path(request["out"])
    name, found = request["name"], {}
    if request["seeds"]:
        send(event="progress", engine=ENGINE, path=f"{len(request['seeds'])} seeds", stage="seeds", epoch=0, epochs=1)
        many = importlib.import_module(MANY[ENGINE])
        rates = request.get("learning_rates") or [cfg.learning_rate]
        init = InitialWeights.of(_builder(request), data.x_train)
        one_rate = init.draw(request["seeds"])  # every rate trains the same seeds: the rates are what differs
        start = [[np.concatenate([w] * len(rates)) for w in ws] for ws in one_rate]
        orders = many.seed_orders(cfg, request["seeds"], data.n_train)
        orders = np.concatenate([np.asarray(orders)] * len(rates))
        lrs = None if request.get("learning_rates") is None else np.repeat(rates, len(request["seeds"]))
        trained = many.train_seeds(init.model, data, cfg, start, orders, lrs)
        pred = many.predict_seeds(init.model, trained["trainable"], trained["non_trainable"], data.x_test)
        units = loss_units(cfg, data)[0]
        per_model = zip(*pred) if isinstance(pred, tuple) else pred  # several outputs: model k's of each
        np.savez(out / f"{name}.npz", val_loss=trained["val_loss"] * units,
                 test_loss=np.array([_spec_test_loss(cfg, data, p) for p in per_model]),
                 **named("w", trained["trainable"]))
        found |= {"seconds": trained["seconds"], "compile_seconds": trained["compile_seconds"]}
        # done: the bar's last frame said 0/1 after every check had passed
        send(event="progress", engine=ENGINE, path=f"{len(request['seeds'])} seeds", stage="seeds", epoch=1, epochs=1)
    if request.get("fit"):  # the engine's default run: fit, at the run's seed
        send(event="progress", engine=ENGINE, path=f"keras-{ENGINE}", stage="train", epoch=0, epochs=1)
        seed_everything(cfg.seed)
        model = _model(request, data)
        result = fit.train(model, data, cfg)
        np.savez(out / f"{name}-fit.npz", val_loss=np.array([result.val_loss[-1]]),
                 test_loss=np.array([_spec_test_loss(cfg, data, result.test_pred)]),
                 **named("w", [w[None] for w in result.weights[: len(model.trainable_weights)]]))
        found |= {"fit_seconds": result.train_seconds, "fit_compile_seconds": result.compile_seconds}
        send(event="progress", engine=ENGINE, path=f"keras-{ENGINE}", stage="train", epoch=1, epochs=1)
    return found


def _spec_test_loss(cfg: TrainConfig, data: HarData, pred) -> float:
    """The spec's loss on the test split, in the units of `loss_units` (for the HAR: the test MSE in log RV²),
    without the model's own losses (a regularizer's penalty is no error on the test data)."""
    pred = tuple(pred) if cfg.outputs > 1 else pred
    value = training_loss(cfg)(keras_inputs(data.y_test), keras_inputs(pred))
    return float(keras.ops.convert_to_numpy(value)) * loss_units(cfg, data)[0]


def _loss(spec: str):
    return resolve(spec) if ":" in spec else keras.losses.get(spec)


def started(request: dict, send) -> dict:
    """Nothing: answered once the engine is imported (`runner.Pool.started`)."""
    return {}


HANDLERS = {"started": started, "init": initial, "train": train_paths, "gradients": gradients,
            "cross_predict": cross_predict, "parity": parity, "trajectory": parity_steps.trajectory,
            "probe": parity_steps.probe, "bench": bench, "native_weights": native_weights, "seeds": seeds,
            "walk_forward": walk_forward, "zoo": zoo.train_cells}


def serve(requests, protocol) -> None:
    def send(**event):
        protocol.write(json.dumps(event) + "\n")
        protocol.flush()

    send(event="ready")  # the engine is imported: from here on, a silence means a hang, not a slow start
    for line in requests:
        request = json.loads(line)
        if request["cmd"] == "exit":
            return
        try:  # from Keras's defaults, whatever a user's keras.json or an earlier request's builder set
            keras_defaults()
            send(event="done", **HANDLERS[request["cmd"]](request, send))
        except Exception as err:  # reported to the runner, which marks this engine's step as failed
            send(event="error", message=f"{type(err).__name__}: {err}", traceback=traceback.format_exc())
            traceback.print_exc()  # and in the worker's log (its stderr), which a run can keep


def main() -> None:
    protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # stray prints from any library land on stderr, not in the protocol
    serve(sys.stdin, protocol)
    sys.stderr.flush()
    os._exit(0)  # every file is written and closed; skip the engines' slow interpreter teardown (~1 s each)


if __name__ == "__main__":
    main()
