"""Training through `model.fit`, on whatever engine this process runs: the path the native loops unpack.

    seed_everything(cfg.seed); model = models.har(); result = fit.train(model, data, cfg)
"""
from __future__ import annotations

import dataclasses
import time

import keras

from keras_side.arrays import keras_inputs, output_arrays, take
from keras_side.checks import check_data
from keras_side.data import HarData, batch_slices, numpy_orders
from keras_side.losses import keras_loss, training_loss
from keras_side.metrics import keras_metrics
from keras_side.models import ensure_built
from keras_side.optimizers import keras_optimizer
from keras_side.results import Result, compile_apart
from keras_side.spec import SpecError, TrainConfig

VALIDATION_BATCH = 8192


class _EpochTimes(keras.callbacks.Callback):
    """Each epoch's seconds, its validation included: the first one also traces and compiles `fit`'s step on JAX
    and TensorFlow (`compile_apart`)."""

    def __init__(self):
        super().__init__()
        self.seconds = []

    def on_epoch_begin(self, epoch, logs=None):
        self.start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.seconds.append(time.perf_counter() - self.start)


class _EpochReport(keras.callbacks.Callback):
    def __init__(self, progress, epochs):
        super().__init__()
        self.progress, self.epochs = progress, epochs

    def on_epoch_end(self, epoch, logs=None):
        self.progress(epoch + 1, self.epochs)


class NumpyOrder(keras.utils.PyDataset):
    """The training rows in batches of `cfg.batch_size`, in a new NumPy permutation every epoch (`numpy_orders`, the
    order every path of a same-arithmetic run takes), the short batch last, as one endless stream that `fit` reads
    `steps` batches an epoch from: batch `k` is batch `k % steps` of epoch `k // steps`, whoever asks and whenever
    (tf.data fetches ahead, across the epoch's end). One `fit` call traces its step once: forty calls, one an
    epoch, would each set up its data and its step afresh, a large share of TensorFlow's `fit` time (measured in
    docs/dev-notes.md, "`make compare`: where a run's time went")."""

    def __init__(self, data: HarData, cfg: TrainConfig):
        super().__init__()
        self.data, self.orders = data, numpy_orders(cfg.seed, data.n_train, cfg.epochs)
        self.slices = batch_slices(data.n_train, cfg.batch_size)
        self.steps = len(self.slices)

    @property
    def num_batches(self) -> None:
        return None  # endless: `fit(steps_per_epoch=steps)` keeps one iterator across the epochs

    def __getitem__(self, k: int):
        epoch = min(k // self.steps, len(self.orders) - 1)  # a batch fetched ahead past the last epoch is not used
        rows = self.orders[epoch][self.slices[k % self.steps]]
        batch = take(self.data.x_train, rows), take(self.data.y_train, rows)  # several arrays: a tuple (tf.data)
        return batch if self.data.w_train is None else (*batch, self.data.w_train[rows])


class _StepReport(keras.callbacks.Callback):
    """Calls `on_step(None)` after every optimizer step, the model's variables holding that step's weights: the loops'
    `on_step(loss)`, without the batch's loss, which a callback does not see (its logs hold the epoch's running
    mean)."""

    def __init__(self, on_step):
        super().__init__()
        self.on_step = on_step

    def on_train_batch_end(self, batch, logs=None):
        if keras.config.backend() == "jax":
            self.model.jax_state_sync()  # JAX's fit keeps the state apart from the variables until an epoch ends
        self.on_step(None)


def train(model: keras.Model, data: HarData, cfg: TrainConfig, *, progress=None, on_step=None) -> Result:
    """`compile` with the spec's optimizer, loss (per output, with `loss_weights`) and metrics, then `model.fit`;
    validation on `data`'s validation split after every epoch when `cfg.validate`. `on_step(None)`, when given, is
    called after every optimizer step, the model's variables holding that step's weights (a callback).

    With `cfg.batch_order="numpy"`, `fit` takes the training rows as a `keras.utils.PyDataset` that serves each
    epoch's NumPy permutation in batches (`shuffle=False`), so every path sees the same batches in one `fit` call.
    """
    if model.compiled:
        raise SpecError(f"model {model.name!r} is already compiled; this path compiles it from the TrainConfig, so "
                        "pass an uncompiled model (or call model.fit yourself to keep your compile)")
    check_data(cfg, data, ensure_built(model, data.x_train))  # built, as the native loops check it: its widths
    model.compile(optimizer=keras_optimizer(cfg), loss=keras_loss(cfg), metrics=keras_metrics(cfg),
                  loss_weights=None if cfg.loss_weights is None else list(cfg.loss_weights))
    validation = (keras_inputs(data.x_val), keras_inputs(data.y_val)) if cfg.validate else None
    times = _EpochTimes()
    callbacks = [times] + ([_EpochReport(progress, cfg.epochs)] if progress else [])
    callbacks += [_StepReport(on_step)] if on_step else []
    if cfg.patience is not None:
        callbacks.append(keras.callbacks.EarlyStopping(monitor="val_loss", patience=cfg.patience,
                                                       restore_best_weights=True))
    # The whole test split in one validation batch: the same mean loss, without 16 small batches per epoch.
    fit_args = dict(epochs=cfg.epochs, validation_data=validation, validation_batch_size=VALIDATION_BATCH,
                    verbose=0, callbacks=callbacks)
    start = time.perf_counter()
    if cfg.batch_order == "engine":
        logs = model.fit(keras_inputs(data.x_train), keras_inputs(data.y_train), sample_weight=data.w_train,
                         batch_size=cfg.batch_size, shuffle=True, **fit_args).history
    else:
        batches = NumpyOrder(data, cfg)
        logs = model.fit(batches, steps_per_epoch=batches.steps, shuffle=False, **fit_args).history
    seconds = time.perf_counter() - start
    engine = keras.config.backend()
    # On JAX and TensorFlow `fit` traces and compiles its step in the first epoch, as the native loops' compiled
    # paths do theirs: set apart the same way, so that every path's training seconds are its steps alone (the
    # compile, None after one epoch, is then counted in). torch's `fit` compiles nothing.
    compile_seconds = compile_apart(times.seconds)[1] if engine != "torch" else None
    seconds -= compile_seconds or 0.0
    metrics = {key: values for key, values in logs.items() if key.removeprefix("val_") in cfg.metrics and values}
    return Result.from_training(f"keras-{engine}", engine, model.get_weights(), data, cfg, logs["loss"],
                                logs.get("val_loss", []), predict(model, data.x_test), seconds, compile_seconds,
                                metrics=metrics)


def predict(model: keras.Model, x):
    """Predictions as a float NumPy array, in inference mode (several outputs: a tuple of arrays, one each)."""
    return output_arrays(model.predict(keras_inputs(x), batch_size=4096, verbose=0))


class Wrapped(keras.Model):
    """Any Keras model (same weights, same call) under a model class whose `train_step` is written in an engine's
    code: the middle path, `fit` with your own step (`native/<engine>/train_step.py` subclass it)."""

    def __init__(self, model: keras.Model, loss):
        super().__init__(name=f"{model.name}_own_step")
        self.inner, self.spec_loss = model, loss  # the spec's loss as compile combines it (`spec.training_loss`)

    def call(self, x, training=None):
        return self.inner(x, training=training)

    def report(self, loss, y, y_pred, sample_weight, batch_size) -> dict:
        """Update the metrics as `fit` does, for a step that updates them in place (torch, TensorFlow): the loss
        weighted by the batch size, the compiled metrics (which take the sample weights only as
        `weighted_metrics`). Returns the logs, named as `fit`'s History names them. (With several outputs, `fit`
        also logs each output's loss, "<output>_loss": this step reports the total only.)"""
        skipped = set()
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(loss, sample_weight=batch_size)
            elif metric.name.endswith("_loss"):  # an output's own loss, which this step does not compute
                skipped.add(metric.name)
            else:
                metric.update_state(y, y_pred, sample_weight=sample_weight)
        return {name: value for name, value in self.get_metrics_result().items() if name not in skipped}


def train_own_step(step_model: type[Wrapped], model: keras.Model, data: HarData, cfg: TrainConfig, *,
                   progress=None, on_step=None) -> Result:
    """`train` with `step_model(model, loss)`'s own `train_step`, `loss` the spec's (`spec.training_loss`); the
    trained weights are in `model` afterwards."""
    result = train(step_model(model, training_loss(cfg)), data, cfg, progress=progress, on_step=on_step)
    return dataclasses.replace(result, path=f"keras-{keras.config.backend()}-train-step")
