"""One engine's process: `python -m compare.engines.worker`, started by the runner with KERAS_BACKEND in its
environment.

It says `ready` once its engine is imported, then reads one JSON request per line on stdin and answers with JSON
events on stdout: `progress` while it trains, then `done` (with what it wrote) or `error`. Arrays travel as files
in the request's folder, never on the pipe.
Anything a library prints is sent to stderr, so the protocol stays clean.
"""
from __future__ import annotations

import importlib
import json
import os
import sys
import time
import traceback
from pathlib import Path

import keras
import numpy as np

from compare.engines import faults, paths
from compare.engines.requests import builder, model_for
from compare.io import named
from keras_side import cores, fit, models
from keras_side.arrays import keras_inputs, output_files
from keras_side.backend import keras_defaults
from keras_side.data import HarData
from keras_side.determinism import seed_everything
from keras_side.initial import InitialWeights
from keras_side.losses import training_loss
from keras_side.precision import float64
from keras_side.results import loss_units, save_trained
from keras_side.spec import TrainConfig, resolve

ENGINE = keras.config.backend()


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
    np.savez(request["init"], **named("w", model_for(request, data).get_weights()))
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

        def given(cfg):  # what `path.train` takes after the model: with `compare --plant`'s fault, on its path
            if request.get("plant", {}).get("path") == path.name:
                cfg, planted = faults.plant(request["plant"]["fault"], cfg, data)
                return planted, cfg
            return data, cfg

        seed_everything(cfg.seed)
        model = model_for(request, data)
        result = path.train(model, *given(cfg), progress=progress("train"))
        result.test_loss = _test_loss(model, data, cfg)
        result.save(out)
        model.save_weights(str(out / f"{path.name}.weights.h5"))
        seed_everything(cfg.seed)
        again = path.train(model_for(request, data), *given(cfg), progress=progress("repeat"))
        model = model_for(request, data)
        model.set_weights(init)
        same_cfg = cfg.replace(batch_order="numpy", validate=False, epochs=request["same_epochs"], patience=None)
        same = path.train(model, *given(same_cfg), progress=progress("same"))
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
        model = model_for(request, data)
        model.load_weights(weights_file)
        preds |= output_files(name, fit.predict(model, data.x_test))
    np.savez(Path(request["out"]) / "cross_predictions.npz", **preds)
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
    model = model_for(request, data)
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


def seeds(request: dict, send) -> dict:
    """The model trained once per seed at once by this engine's many-model trainer (for each learning rate of the
    request when it gives several: rate-major), and with `fit` at the run's seed when asked: each model's
    validation and test loss, its trained trainable weights stacked."""
    data, cfg, out = HarData.load(request["data"]), TrainConfig(**request["config"]), Path(request["out"])
    name, found = request["name"], {}
    if request["seeds"]:
        send(event="progress", engine=ENGINE, path=f"{len(request['seeds'])} seeds", stage="seeds", epoch=0, epochs=1)
        many = importlib.import_module(paths.MANY_MODULES[ENGINE])
        rates = request.get("learning_rates") or [cfg.learning_rate]
        init = InitialWeights.of(builder(request), data.x_train)
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
        # done: else the bar's last frame says 0/1 after every check has passed
        send(event="progress", engine=ENGINE, path=f"{len(request['seeds'])} seeds", stage="seeds", epoch=1, epochs=1)
    if request.get("fit"):  # the engine's default run: fit, at the run's seed
        send(event="progress", engine=ENGINE, path=f"keras-{ENGINE}", stage="train", epoch=0, epochs=1)
        seed_everything(cfg.seed)
        model = model_for(request, data)
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


def started(request: dict, send) -> dict:
    """Nothing: answered once the engine is imported (`runner.Pool.started`)."""
    return {}


# The worker's own tasks: what `compare.engines.runner.run` and the many-seed and data-parallel runs ask. A feature's
# task is named "module:function" instead (`task`), so that this package imports no feature.
HANDLERS = {"started": started, "init": initial, "train": train_paths, "gradients": gradients,
            "cross_predict": cross_predict, "native_weights": native_weights, "seeds": seeds}


def task(cmd: str):
    """The handler of a request: one of `HANDLERS`, or a feature's `handler(request, send) -> dict` named
    "module:function" (`compare.speed.tasks:bench`), imported here, in the worker."""
    if cmd in HANDLERS:
        return HANDLERS[cmd]
    if ":" not in cmd:
        raise ValueError(f"unknown worker task {cmd!r}: one of {', '.join(HANDLERS)}, or a feature's module:function")
    return resolve(cmd)


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
            send(event="done", **task(request["cmd"])(request, send))
        except Exception as err:  # reported to the runner, which marks this engine's step as failed
            send(event="error", message=f"{type(err).__name__}: {err}", traceback=traceback.format_exc())
            traceback.print_exc()  # and in the worker's log (its stderr), which a run can keep


def main() -> None:
    protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # stray prints from any library land on stderr, not in the protocol
    serve(sys.stdin, protocol)
    sys.stderr.flush()
    os._exit(0)  # every file is written and closed; skip the engines' slow interpreter teardown


if __name__ == "__main__":
    main()
