"""The Keras model trained with `tf.GradientTape` inside one `tf.function` step and the Keras optimizer's `apply`.

    native-loops train --path tensorflow-native   # or, in your code: from native.tensorflow import loop

TensorFlow's own optimizers are Keras's (`tf.keras.optimizers` is Keras 3), so this loop applies the spec's
`keras.optimizers` object: both optimizer flavours are the same here. The loss is the spec's Keras loss plus
`model.losses` (the regularizers). The step is traced once: its input signature leaves the batch dimension
open, so the short last batch reuses it.
Batch order per epoch comes from `tf.random.experimental.stateless_shuffle` seeded by (config seed, epoch).
"""
from __future__ import annotations

import time

import numpy as np
import tensorflow as tf

from keras_side.callbacks import EarlyStopping
from keras_side.config import HarData, Result, batch_slices, keras_inputs, numpy_orders, output_arrays, verb_arrays
from keras_side.metrics import EpochMetrics
from keras_side.models import ensure_built
from keras_side.spec import (TrainConfig, as_fit_shapes, check_data, keras_optimizer, state_kept, verb_loss,
                              training_loss)
from native.checkpoint import Checkpoints, fresh_curves
from native.tensorflow import checkpoint as tf_checkpoint


def _forward(model, x, training: bool):
    return model(keras_inputs(x), training=training)


def mse(y_true, y_pred):
    return tf.reduce_mean(tf.square(y_pred - y_true))


def total_loss(model, loss_fn, x, y, training: bool, sample_weight=None):
    """`(loss, outputs)`: the objective `fit` minimizes, the spec's loss plus every loss the model adds
    (regularizers, `add_loss`)."""
    outputs = _forward(model, x, training=training)
    loss = loss_fn(y, outputs, sample_weight=sample_weight)
    extra = model.losses
    return (loss + tf.add_n(extra) if extra else loss), outputs


def make_step(model, loss_fn, optimizer, x: np.ndarray | tuple, y: np.ndarray | tuple,
              metrics: EpochMetrics | None = None, weights: np.ndarray | None = None):
    """`step(rows) -> loss`: one optimizer step on the training rows `rows` (an int64 vector), one trace for every
    batch size; it updates the metrics and the epoch's loss sum (`step.total`, rows times the batch's loss) too.

    The batch is gathered inside the graph, from the training arrays held there as constants, and the loss summed
    there: in eager TensorFlow each of those ops (slicing the epoch's order, two gathers, the sum) costs 20 to 50 µs
    of dispatch, ~130 µs a step in all (a fifth of the HAR's step) for nanoseconds of work."""
    x, y = tf.nest.map_structure(tf.constant, x), tf.nest.map_structure(tf.constant, y)
    w = None if weights is None else tf.constant(weights)
    total = tf.Variable(0.0, trainable=False)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)])
    def step(rows):
        yb = take_tf(y, rows)
        with tf.GradientTape() as tape:
            loss, outputs = total_loss(model, loss_fn, take_tf(x, rows), yb, training=True,
                                       sample_weight=None if w is None else tf.gather(w, rows))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        if metrics:
            metrics.update(yb, outputs)
        total.assign_add(loss * tf.cast(tf.size(rows), tf.float32))
        return loss

    step.total = total
    return step


def batch_orders(cfg: TrainConfig, n: int) -> list[np.ndarray]:
    """One permutation per epoch (int64), from `tf.random.experimental.stateless_shuffle` seeded by (config seed,
    epoch), or the shared NumPy ones."""
    if cfg.batch_order == "numpy":
        return [o.astype(np.int64) for o in numpy_orders(cfg.seed, n, cfg.epochs)]
    rows = tf.range(n)
    return [tf.random.experimental.stateless_shuffle(rows, seed=[cfg.seed, e]).numpy().astype(np.int64)
            for e in range(cfg.epochs)]


def train(model, data: HarData, cfg: TrainConfig, *, progress=None, on_step=None, checkpoint=None,
          resume: bool = False) -> Result:
    """The spec's loss and optimizer over shuffled mini-batches; the validation loss after every epoch.
    `on_step(loss)` is called after every optimizer step with the step's batch loss (the training-parity check reads
    the weights there). `checkpoint=DIR` writes a checkpoint at the end of every epoch (`native.checkpoint`: the
    optimizer with `tf.train.Checkpoint`); `resume=True` goes on from the last one there."""
    check_data(cfg, data, ensure_built(model, data.x_train))
    optimizer, loss_fn, metrics = keras_optimizer(cfg), training_loss(cfg), EpochMetrics(cfg)
    optimizer.build(model.trainable_variables)
    saved = Checkpoints(checkpoint, model, data, cfg, "tensorflow", "tensorflow-native", resume=resume) \
        if checkpoint else None
    if saved and saved.saved:
        saved.restore(lambda folder: tf_checkpoint.read(folder, model, optimizer))
    x, y = data.x_train, data.y_train
    start = time.perf_counter()
    step = make_step(model, loss_fn, optimizer, x, y, metrics, data.w_train)
    step.get_concrete_function()  # trace and compile now, so training time is training
    compile_seconds = time.perf_counter() - start
    curves = saved.curves if saved else fresh_curves()  # a resumed run's epochs so far
    train_loss, val_loss, metrics.history = curves["loss"], curves["val_loss"], curves["metrics"]
    stop = EarlyStopping(cfg.patience) if cfg.patience else None
    start = time.perf_counter()
    for epoch, order in enumerate(batch_orders(cfg, data.n_train)):
        if saved and epoch < saved.start:
            continue  # done before the checkpoint: every epoch's order is drawn all the same, so the rest match
        step.total.assign(0.0)
        for rows in batch_slices(data.n_train, cfg.batch_size):
            loss = step(order[rows])  # a NumPy view of the epoch's order: the batch is gathered in the graph
            if on_step:
                on_step(loss)
        train_loss.append(float(step.total) / data.n_train)
        metrics.close()
        if cfg.validate:
            loss, outputs = total_loss(model, loss_fn, data.x_val, data.y_val, training=False)
            val_loss.append(float(loss))
            metrics.update(data.y_val, outputs)
            metrics.close("val_")
        if saved:
            saved.save(epoch + 1, model, curves, lambda folder: tf_checkpoint.write(folder, model, optimizer))
        if progress:
            progress(epoch + 1, cfg.epochs)
        if stop and stop.update(epoch, val_loss[-1], model.get_weights):
            break
    if stop:
        model.set_weights(stop.best_weights)  # restore_best_weights
    seconds = time.perf_counter() - start
    return Result.from_training("tensorflow-native", "tensorflow", model.get_weights(), data, cfg, train_loss,
                                val_loss, predict(model, data.x_test), seconds, compile_seconds,
                                metrics=metrics.history)


def take_tf(x, idx):
    return tuple(tf.gather(a, idx) for a in x) if isinstance(x, tuple) else tf.gather(x, idx)


def grad_at(model, x, y, *, loss=None, training: bool = False) -> list[np.ndarray]:
    """Tape gradient of the training objective at the current weights, in `model.trainable_weights` order: the
    batch loss plus the model's own losses (regularizers). The loss is MSE (each output's, summed, for several
    outputs) unless `loss` says otherwise: a spec's loss by name ("mae"), or `loss(y_true, y_pred)` of yours,
    which gets the targets and predictions as they are."""
    x, y = verb_arrays(x), verb_arrays(y, "y")
    ensure_built(model, x)
    with state_kept(model), tf.GradientTape() as tape:  # at the current state: training=True would move it
        target, pred = as_fit_shapes(keras_inputs(y), _forward(model, x, training=training))
        value = verb_loss(loss, mse, target, pred, tf.reduce_mean)
        value = value + tf.add_n(model.losses) if model.losses else value
    # An embedding's gradient is sparse (IndexedSlices): densify it for a plain array.
    # A weight the loss does not reach: zero, as on JAX (the tape gives None; its UnconnectedGradients.ZERO cannot
    # read a Keras variable's dtype).
    grads = tape.gradient(value, model.trainable_variables)
    return [np.zeros(v.shape, v.dtype) if g is None else tf.convert_to_tensor(g).numpy()
            for g, v in zip(grads, model.trainable_variables, strict=True)]


def predict(model, x):
    """Inference-mode predictions as NumPy (several outputs: a tuple of arrays, one each)."""
    x = verb_arrays(x)
    ensure_built(model, x)
    return output_arrays(tf.nest.map_structure(lambda t: t.numpy(), _forward(model, x, training=False)))
