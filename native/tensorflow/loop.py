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

from keras_side.arrays import first, keras_inputs, output_arrays
from keras_side.callbacks import EarlyStopping
from keras_side.checks import check_data
from keras_side.data import Batches, as_data, batch_parts, batch_slices, numpy_orders, verb_inputs
from keras_side.losses import as_fit_shapes, training_loss, verb_loss
from keras_side.metrics import EpochMetrics
from keras_side.models import ensure_built, state_kept
from keras_side.optimizers import keras_optimizer
from keras_side.results import Result
from keras_side.spec import TrainConfig
from native.checkpoint import Checkpoints, fresh_curves
from native.tensorflow import checkpoint as tf_checkpoint


def make_step(model, loss_fn, optimizer, metrics: EpochMetrics, arrays: tuple | None = None):
    """`step(rows) -> loss`: one optimizer step on the training rows `rows` (int64), of the training arrays
    `arrays = (x, y, sample_weight)`, one trace for every batch size; without `arrays`, `step(x, y, sample_weight)`
    on a batch of a `tf.data.Dataset`. The metrics and the epoch's loss sum (`step.total`, over `step.rows` rows)
    are updated in its graph, as `fit`'s `train_step` updates its metrics.

    Where torch's step takes the batch, this one takes the batch's row numbers and gathers the batch in its graph,
    from the training arrays held there as constants: TensorFlow's dispatch charges every eager op and every array a
    `tf.function` takes, a large share of a small model's step, and a step fed the batch's arrays trains the HAR
    markedly slower (docs/dev-notes.md, "TensorFlow: eager ops around the step")."""
    total, seen = tf.Variable(0.0, trainable=False), tf.Variable(0.0, trainable=False)

    def train_step(x, y, w):
        with tf.GradientTape() as tape:
            outputs = model(keras_inputs(x), training=True)  # fit: the training flag (Dropout, BatchNorm)
            loss = loss_fn(y, outputs, w) + sum(model.losses)  # fit: sample_weight, the regularizers
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)  # fit: its schedule, clipping and constraints are in apply
        metrics.update(y, outputs)  # fit: compile(metrics=...), unweighted
        rows = tf.cast(tf.shape(tf.nest.flatten(y)[0])[0], tf.float32)
        total.assign_add(loss * rows)  # fit: the epoch's loss, a mean over its rows
        seen.assign_add(rows)
        return loss

    if arrays is None:  # fit: a tf.data.Dataset of yours, its batches as they come
        step = tf.function(train_step)
    else:
        x, y, w = (None if a is None else tf.nest.map_structure(tf.constant, a) for a in arrays)

        @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)])  # fit: the short last batch, the same graph
        def step(rows):
            return train_step(take_tf(x, rows), take_tf(y, rows), take_tf(w, rows))

    step.total, step.rows = total, seen
    return step


def evaluate(model, loss_fn, batches, metrics: EpochMetrics) -> float:
    """`fit`'s validation: the loss it minimizes (the regularizers included) and the metrics, in inference mode,
    over the validation batches `(x, y, sample_weight)`: the mean over their rows."""
    total, rows = 0.0, 0
    for x, y, w in batches:
        outputs = model(keras_inputs(x), training=False)
        loss = loss_fn(y, outputs, w) + sum(model.losses)
        metrics.update(y, outputs)
        total, rows = total + float(loss) * len(first(y)), rows + len(first(y))
    metrics.close("val_")
    return total / rows


def batch_orders(cfg: TrainConfig, n: int) -> list[np.ndarray]:
    """One permutation of the n rows per epoch (int64), from `tf.random.experimental.stateless_shuffle` seeded by
    (the spec's seed, the epoch), or the NumPy ones every path can share (`batch_order="numpy"`)."""
    if cfg.batch_order == "numpy":
        return [o.astype(np.int64) for o in numpy_orders(cfg.seed, n, cfg.epochs)]
    rows = tf.range(n)
    return [tf.random.experimental.stateless_shuffle(rows, seed=[cfg.seed, e]).numpy().astype(np.int64)
            for e in range(cfg.epochs)]


def epoch_batches(model, data, cfg: TrainConfig) -> tuple:
    """`(batches(epoch), validation(), first)`: the epoch's arguments of the step, one tuple per batch (the rows of
    the spec's shuffled mini-batches, or a dataset's `(x, y, sample_weight)` batches as it gives them, floats cast to
    the model's dtype as `fit` casts them); the validation batches `(x, y, sample_weight)`; the first batch's
    arguments, to trace the step on before the epochs."""
    if isinstance(data, Batches):  # fit: a tf.data.Dataset of yours, one pass per epoch
        def as_tensors(dataset):
            for x, y, w in (batch_parts(model, batch) for batch in dataset):
                yield tuple(None if a is None else tf.nest.map_structure(
                    lambda t: floats_as(t, model.compute_dtype), a) for a in (x, y, w))
        return ((lambda epoch: as_tensors(data.train)), (lambda: as_tensors(data.val)),
                next(as_tensors([data.first])))
    orders = batch_orders(cfg, data.n_train)

    def batches(epoch):
        # fit: the short last batch as it comes; a NumPy view of the epoch's order
        return ((orders[epoch][rows],) for rows in batch_slices(data.n_train, cfg.batch_size))
    return batches, lambda: [(data.x_val, data.y_val, None)], (orders[0][:cfg.batch_size],)


def train(model, data, cfg: TrainConfig, *, validation_data=None, progress=None, on_step=None, checkpoint=None,
          resume: bool = False) -> Result:
    """Train `model` on `data` as `fit` would with the spec `cfg`: the spec's loss and optimizer over shuffled
    mini-batches, the validation loss after every epoch.

    Args:
        data: a `HarData`; `(x, y)` or `(x, y, sample_weight)` arrays as `fit` takes them (`as_data`); or a
            `tf.data.Dataset` of such batches (`Batches`), trained on as it gives them.
        validation_data: `(x_val, y_val)` arrays with arrays for `data`, a `tf.data.Dataset` with one; without it the
            loop does not validate.
        progress: `progress(epoch, epochs)` after every epoch.
        on_step: `on_step(loss)` after every optimizer step (the training-parity check reads the weights there).
        checkpoint: a folder to write a checkpoint to after every epoch (`native.checkpoint`).
        resume: go on from the last checkpoint in `checkpoint`.
    """
    data, cfg = as_data(model, data, cfg, validation_data)  # fit: your arrays or dataset, as given
    check_data(cfg, data, ensure_built(model, data.x_train))
    optimizer = keras_optimizer(cfg)  # fit: the spec's Keras optimizer, as compile(optimizer=...) builds it
    optimizer.build(model.trainable_variables)
    loss_fn, metrics = training_loss(cfg), EpochMetrics(cfg)
    saved = Checkpoints(checkpoint, model, data, cfg, "tensorflow", "tensorflow-native", resume=resume) \
        if checkpoint else None
    if saved and saved.saved:
        saved.restore(lambda folder: tf_checkpoint.read(folder, (model, optimizer)))
    start = time.perf_counter()
    step = make_step(model, loss_fn, optimizer, metrics,
                     None if isinstance(data, Batches) else (data.x_train, data.y_train, data.w_train))
    batches, validation, first_batch = epoch_batches(model, data, cfg)
    step.get_concrete_function(*first_batch)  # trace and compile now, so that the epochs' time is training
    compile_seconds = time.perf_counter() - start
    curves = saved.curves if saved else fresh_curves()  # a resumed run's epochs so far
    metrics.history = curves["metrics"]
    stop = EarlyStopping(cfg.patience) if cfg.patience else None  # fit: callbacks=[EarlyStopping(...)]
    epoch_seconds = []
    for epoch in range(saved.start if saved else 0, cfg.epochs):  # a resumed run goes on after its checkpoint
        start = time.perf_counter()
        step.total.assign(0.0), step.rows.assign(0.0)
        for batch in batches(epoch):
            loss = step(*batch)
            if on_step:
                on_step(loss)
        curves["loss"].append(float(step.total) / float(step.rows))
        metrics.close()
        if cfg.validate:
            curves["val_loss"].append(evaluate(model, loss_fn, validation(), metrics))
        epoch_seconds.append(time.perf_counter() - start)
        if saved:
            saved.save(epoch + 1, model, curves, lambda folder: tf_checkpoint.write(folder, (model, optimizer)))
        if progress:
            progress(epoch + 1, cfg.epochs)
        if stop and stop.update(epoch, curves["val_loss"][-1], model.get_weights):
            break
    if stop:
        model.set_weights(stop.best_weights)  # fit: restore_best_weights
    test_pred = None if data.x_test is None else predict(model, data.x_test)  # a dataset's batches: no test rows
    return Result.from_training("tensorflow-native", "tensorflow", model.get_weights(), data, cfg, curves["loss"],
                                curves["val_loss"], test_pred, sum(epoch_seconds), compile_seconds,
                                metrics=metrics.history)


def take_tf(x, rows):
    """Rows `rows` of one tensor, of each tensor of a tuple (several inputs or targets), or None (no sample weights)."""
    if x is None:
        return None
    return tuple(tf.gather(a, rows) for a in x) if isinstance(x, tuple) else tf.gather(x, rows)


def floats_as(t, dtype: str):
    """A tensor (or array) as a tensor, floats cast to `dtype`."""
    t = tf.convert_to_tensor(t)
    return tf.cast(t, dtype) if t.dtype.is_floating else t


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
