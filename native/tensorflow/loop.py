"""The reference loop on TensorFlow: what `model.fit` does, written out with TensorFlow's own tools, public API only.

    native-loops train --path tensorflow-native   # or, in your code: from native.tensorflow import loop

On the TensorFlow backend a Keras model's weights are `tf.Variable`s and TensorFlow's optimizers are Keras's own
(`tf.keras` is Keras 3), so the Keras guide's step trains it: `model(x, training=True)` and the loss under a
`tf.GradientTape`, `tape.gradient`, `optimizer.apply`, in one `tf.function`. Each line that `fit` needs beyond the
first loop (`native/tensorflow/first_loop.py`) carries a `# fit:` comment saying what it adds. The same functions, in
the same order, are in `native/torch/loop.py` and `native/jax/loop.py`; docs/lesson.md reads them side by side.
"""
from __future__ import annotations

import time

import numpy as np
import tensorflow as tf

from keras_side.arrays import keras_inputs, output_arrays
from keras_side.callbacks import EarlyStopping
from keras_side.checks import check_data
from keras_side.data import as_data, batch_slices, numpy_orders, verb_inputs
from keras_side.losses import as_fit_shapes, training_loss, verb_loss
from keras_side.metrics import EpochMetrics
from keras_side.models import ensure_built, state_kept
from keras_side.optimizers import keras_optimizer
from keras_side.results import Result
from keras_side.spec import TrainConfig
from native.checkpoint import Checkpoints, fresh_curves
from native.tensorflow import checkpoint as tf_checkpoint


def make_step(model, loss_fn, optimizer, metrics: EpochMetrics, arrays: tuple):
    """`step(rows) -> loss`: one optimizer step on the training rows `rows` (int64), of the training arrays
    `arrays = (x, y, sample_weight)`, one trace for every batch size; the metrics and the epoch's loss sum
    (`step.total`) are updated in its graph, as `fit`'s `train_step` updates its metrics.

    Where torch's step takes the batch, `step(x, y, sample_weight)`, this one takes the batch's row numbers and
    gathers the batch in its graph, from the training arrays held there as constants: TensorFlow's dispatch charges
    every eager op and every array a `tf.function` takes, a large share of a small model's step, and a step fed the
    batch's arrays trains the HAR markedly slower (docs/dev-notes.md, "TensorFlow: eager ops around the step")."""
    x, y, w = (None if a is None else tf.nest.map_structure(tf.constant, a) for a in arrays)
    total = tf.Variable(0.0, trainable=False)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)])  # fit: the short last batch, the same graph
    def step(rows):
        x_batch, y_batch = take_tf(x, rows), take_tf(y, rows)
        with tf.GradientTape() as tape:
            outputs = model(keras_inputs(x_batch), training=True)  # fit: the training flag (Dropout, BatchNorm)
            loss = loss_fn(y_batch, outputs, take_tf(w, rows)) + sum(model.losses)  # fit: sample_weight, regularizers
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)  # fit: its schedule, clipping and constraints are in apply
        metrics.update(y_batch, outputs)  # fit: compile(metrics=...), unweighted
        total.assign_add(loss * tf.cast(tf.size(rows), tf.float32))  # fit: the epoch's loss, a mean over its rows
        return loss

    step.total = total
    return step


def evaluate(model, loss_fn, x, y, metrics: EpochMetrics) -> float:
    """`fit`'s validation: the loss it minimizes (the regularizers included) and the metrics, in inference mode."""
    outputs = model(keras_inputs(x), training=False)
    loss = loss_fn(y, outputs) + sum(model.losses)
    metrics.update(y, outputs)
    metrics.close("val_")
    return float(loss)


def batch_orders(cfg: TrainConfig, n: int) -> list[np.ndarray]:
    """One permutation of the n rows per epoch (int64), from `tf.random.experimental.stateless_shuffle` seeded by
    (the spec's seed, the epoch), or the NumPy ones every path can share (`batch_order="numpy"`)."""
    if cfg.batch_order == "numpy":
        return [o.astype(np.int64) for o in numpy_orders(cfg.seed, n, cfg.epochs)]
    rows = tf.range(n)
    return [tf.random.experimental.stateless_shuffle(rows, seed=[cfg.seed, e]).numpy().astype(np.int64)
            for e in range(cfg.epochs)]


def train(model, data, cfg: TrainConfig, *, validation_data=None, progress=None, on_step=None, checkpoint=None,
          resume: bool = False) -> Result:
    """Train `model` on `data` as `fit` would with the spec `cfg`: the spec's loss and optimizer over shuffled
    mini-batches, the validation loss after every epoch.

    Args:
        data: a `HarData`, or `(x, y)` or `(x, y, sample_weight)` arrays as `fit` takes them (`as_data`).
        validation_data: `(x_val, y_val)` arrays, with arrays for `data`; without them the loop does not validate.
        progress: `progress(epoch, epochs)` after every epoch.
        on_step: `on_step(loss)` after every optimizer step (the training-parity check reads the weights there).
        checkpoint: a folder to write a checkpoint to after every epoch (`native.checkpoint`).
        resume: go on from the last checkpoint in `checkpoint`.
    """
    data, cfg = as_data(model, data, cfg, validation_data)  # fit: your arrays, as given
    check_data(cfg, data, ensure_built(model, data.x_train))
    optimizer = keras_optimizer(cfg)  # fit: the spec's Keras optimizer, as compile(optimizer=...) builds it
    optimizer.build(model.trainable_variables)
    loss_fn, metrics = training_loss(cfg), EpochMetrics(cfg)
    saved = Checkpoints(checkpoint, model, data, cfg, "tensorflow", "tensorflow-native", resume=resume) \
        if checkpoint else None
    if saved and saved.saved:
        saved.restore(lambda folder: tf_checkpoint.read(folder, (model, optimizer)))
    start = time.perf_counter()
    step = make_step(model, loss_fn, optimizer, metrics, (data.x_train, data.y_train, data.w_train))
    step.get_concrete_function()  # trace and compile now, so that the epochs' time is training (reported apart)
    compile_seconds = time.perf_counter() - start
    curves = saved.curves if saved else fresh_curves()  # a resumed run's epochs so far
    metrics.history = curves["metrics"]
    stop = EarlyStopping(cfg.patience) if cfg.patience else None  # fit: callbacks=[EarlyStopping(...)]
    epoch_seconds = []
    for epoch, order in enumerate(batch_orders(cfg, data.n_train)):
        if epoch < (saved.start if saved else 0):
            continue  # trained before the checkpoint; every epoch's order is drawn all the same
        start = time.perf_counter()
        step.total.assign(0.0)
        for rows in batch_slices(data.n_train, cfg.batch_size):  # fit: the short last batch as it comes
            loss = step(order[rows])  # a NumPy view of the epoch's order
            if on_step:
                on_step(loss)
        curves["loss"].append(float(step.total) / data.n_train)
        metrics.close()
        if cfg.validate:
            curves["val_loss"].append(evaluate(model, loss_fn, data.x_val, data.y_val, metrics))
        epoch_seconds.append(time.perf_counter() - start)
        if saved:
            saved.save(epoch + 1, model, curves, lambda folder: tf_checkpoint.write(folder, (model, optimizer)))
        if progress:
            progress(epoch + 1, cfg.epochs)
        if stop and stop.update(epoch, curves["val_loss"][-1], model.get_weights):
            break
    if stop:
        model.set_weights(stop.best_weights)  # fit: restore_best_weights
    return Result.from_training("tensorflow-native", "tensorflow", model.get_weights(), data, cfg, curves["loss"],
                                curves["val_loss"], predict(model, data.x_test), sum(epoch_seconds),
                                compile_seconds, metrics=metrics.history)


def take_tf(x, rows):
    """Rows `rows` of one tensor, of each tensor of a tuple (several inputs or targets), or None (no sample weights)."""
    if x is None:
        return None
    return tuple(tf.gather(a, rows) for a in x) if isinstance(x, tuple) else tf.gather(x, rows)


def grad_at(model, x, y, *, loss=None, training: bool = False) -> list[np.ndarray]:
    """The tape's gradient of the training objective at the current weights, in `model.trainable_weights` order:
    the batch loss plus the model's own losses (regularizers). The loss is MSE (each output's, summed, for several
    outputs) unless `loss` says otherwise: a spec's loss by name ("mae"), or `loss(y_true, y_pred)` of yours,
    which gets the targets and predictions as they are."""
    x, y = verb_inputs(model, x), verb_inputs(model, y, "y")
    ensure_built(model, x)
    with state_kept(model), tf.GradientTape() as tape:  # at the current state: training=True would move it
        target, pred = as_fit_shapes(keras_inputs(y), model(keras_inputs(x), training=training))
        value = verb_loss(loss, lambda t, p: tf.square(p - t), target, pred, tf.reduce_mean) + sum(model.losses)
    grads = tape.gradient(value, model.trainable_variables)
    # An Embedding's gradient is sparse (tf.IndexedSlices): densified for a plain array. A weight the loss does not
    # reach: zero, as on JAX (the tape gives None; its UnconnectedGradients.ZERO cannot read a Keras variable's dtype).
    return [np.zeros(v.shape, v.dtype) if g is None else tf.convert_to_tensor(g).numpy()
            for g, v in zip(grads, model.trainable_variables, strict=True)]


def predict(model, x):
    """Inference-mode predictions as NumPy (several outputs: a tuple of arrays, one each)."""
    x = verb_inputs(model, x)
    ensure_built(model, x)
    outputs = model(keras_inputs(x), training=False)
    return output_arrays(tf.nest.map_structure(lambda t: t.numpy(), outputs))
