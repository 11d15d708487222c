"""The reference loop on JAX: what `model.fit` does, written out with JAX's own tools, public API only.

    native-loops train --path jax-native      # or, in your code: from native.jax import loop

On the JAX backend a Keras model is a pure function of its weights through `model.stateless_call`, so the step is
the Keras guide's: `jax.value_and_grad` of the loss over `stateless_call`, the optax update, all in one `jax.jit`.
The state, `(trainable, non_trainable, opt_state, metrics)`, goes in and comes out: non_trainable carries BatchNorm's
moving statistics and the seed state of Dropout and its kin, metrics the state of the spec's `keras.metrics`. Each
line that `fit` needs beyond the first loop (`native/jax/first_loop.py`) carries a `# fit:` comment saying what it
adds. The same functions, in the same order, are in `native/torch/loop.py` and `native/tensorflow/loop.py`;
docs/lesson.md reads them side by side. The fast paths (`native.jax.fast`: the 1-D convolution as a matmul;
`native.jax.scan`: every epoch in one compiled `lax.scan`) are tested to end on this loop's weights.
"""
from __future__ import annotations

import functools
import inspect
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from keras_side.arrays import first, keras_inputs, output_arrays, take
from keras_side.callbacks import EarlyStopping
from keras_side.checks import check_data
from keras_side.data import (Batches, HarData, as_data, batch_parts, batch_slices, model_floats, numpy_orders,
                             verb_inputs)
from keras_side.losses import as_fit_shapes, training_loss, verb_loss
from keras_side.metrics import keras_metrics
from keras_side.models import ensure_built, weight_constraints
from keras_side.results import Result
from keras_side.spec import TrainConfig
from native.checkpoint import Checkpoints, fresh_curves
from native.jax import checkpoint as jax_checkpoint
from native.jax import optim


def make_step(model, loss_fn, optimizer: optax.GradientTransformation, metrics=()):
    """The one jitted step: `step(state, (x, y, sample_weight or None)) -> (state, loss)`."""
    constraints = weight_constraints(model)

    @jax.jit
    def step(state, batch):
        trainable, non_trainable, opt_state, metric_state = state
        forward = functools.partial(compute_loss, model, loss_fn, training=True)  # fit: the training flag
        (loss, (non_trainable, outputs)), grads = jax.value_and_grad(forward, has_aux=True)(
            trainable, non_trainable, *batch)
        updates, opt_state = optimizer.update(grads, opt_state, trainable)
        trainable = optax.apply_updates(trainable, updates)
        trainable = [w if c is None else c(w) for c, w in zip(constraints, trainable)]  # fit: kernel_constraint=...
        # fit: the metrics, unweighted (only weighted_metrics take the sample weights), through their stateless API
        metric_state = [m.stateless_update_state(v, batch[1], outputs) for m, v in zip(metrics, metric_state)]
        return (trainable, non_trainable, opt_state, metric_state), loss

    return step


def evaluate(model, loss_fn, state, x, y, metrics=()):
    """`fit`'s validation: `(state, loss, metric values)`, the loss it minimizes (the regularizers included), in
    inference mode. The state after it is kept, as `fit` keeps it: an RNN's dropout draws its masks in inference
    too, so its seed state moves at every validation (nothing else in Keras's layers does)."""
    loss, (non_trainable, outputs) = compute_loss(model, loss_fn, state[0], state[1], x, y, training=False)
    values = [m.stateless_result(m.stateless_update_state(v, y, outputs)) for m, v in zip(metrics, fresh(metrics))]
    return (state[0], non_trainable, *state[2:]), loss, values


def batch_orders(cfg: TrainConfig, n: int) -> jax.Array:
    """One permutation of the n rows per epoch (epochs, n), from `jax.random` keys split from the spec's seed (or the
    NumPy ones every path can share, `batch_order="numpy"`)."""
    if cfg.batch_order == "numpy":
        return jnp.asarray(numpy_orders(cfg.seed, n, cfg.epochs))
    keys = jax.random.split(jax.random.key(cfg.seed), cfg.epochs)
    return jax.vmap(lambda k: jax.random.permutation(k, n))(keys)


def epoch_batches(model, data, cfg: TrainConfig) -> tuple:
    """`(batches(epoch), validation(), shapes)`: the epoch's `(x, y, sample_weight or None)` batches as NumPy, the spec's
    shuffled mini-batches of the training arrays or a loader's batches as it gives them (`Batches`, floats cast to
    the model's dtype as `fit` casts them); the validation rows as one `(x, y)`; a batch of each shape to compile
    the step for before the epochs (a loader's other shapes compile when they come)."""
    if isinstance(data, Batches):  # fit: an iterable of batches of yours, one pass per epoch
        def on_host(loader):
            return (jax.tree.map(functools.partial(model_floats, model), batch_parts(model, b)) for b in loader)
        # the validation batches as one: the mean over their rows, as fit's (its batches weighed by their rows)
        return ((lambda epoch: on_host(data.train)), lambda: jax.tree.map(lambda *a: np.concatenate(a),
                *[batch[:2] for batch in on_host(data.val)]), list(on_host([data.first])))
    orders = np.asarray(batch_orders(cfg, data.n_train))  # NumPy rows: a gather of a jax array costs more than a step
    slices = batch_slices(data.n_train, cfg.batch_size)  # fit: the short last batch as it comes (its own compile)
    return ((lambda epoch: (rows_of(data, orders[epoch][rows]) for rows in slices)), lambda: (data.x_val, data.y_val),
            [rows_of(data, orders[0][s]) for s in (slices[0], slices[-1])])


def train(model, data, cfg: TrainConfig, *, validation_data=None, progress=None, on_step=None, checkpoint=None,
          resume: bool = False) -> Result:
    """Train `model` on `data` as `fit` would with the spec `cfg`: the spec's loss and optimizer over shuffled
    mini-batches, the validation loss after every epoch; the trained state is written back into the model.

    Args:
        data: a `HarData`; `(x, y)` or `(x, y, sample_weight)` arrays as `fit` takes them (`as_data`); or an
            iterable of such batches (`Batches`), trained on as it gives them.
        validation_data: `(x_val, y_val)` arrays with arrays for `data`, an iterable of batches with one; without it
            the loop does not validate.
        progress: `progress(epoch, epochs)` after every epoch.
        on_step: `on_step(loss)` after every optimizer step, the state written back into the model's variables
            first (the training-parity check reads the weights there).
        checkpoint: a folder to write a checkpoint to after every epoch (`native.checkpoint`).
        resume: go on from the last checkpoint in `checkpoint`.
    """
    data, cfg = as_data(model, data, cfg, validation_data)  # fit: your arrays or batches, as given
    check_data(cfg, data, ensure_built(model, data.x_train))
    optimizer = optim.build(cfg)  # fit: Keras's own update rule, as an optax transformation
    loss_fn, metrics = training_loss(cfg), keras_metrics(cfg)
    step = make_step(model, loss_fn, optimizer, metrics)
    validate = jax.jit(lambda state, x, y: evaluate(model, loss_fn, state, x, y, metrics))  # compiled as the step
    state = init_state(model, optimizer, metrics)
    saved = Checkpoints(checkpoint, model, data, cfg, "jax", "jax-native", resume=resume) if checkpoint else None
    if saved and saved.saved:
        state = saved.restore(lambda folder: jax_checkpoint.read(folder, state))
    curves = saved.curves if saved else fresh_curves()  # a resumed run's epochs so far
    stop = EarlyStopping(cfg.patience) if cfg.patience else None  # fit: callbacks=[EarlyStopping(...)]
    batches, validation, shapes = epoch_batches(model, data, cfg)
    compile_seconds = compile_step(step, state, shapes)
    epoch_seconds = []
    for epoch in range(saved.start if saved else 0, cfg.epochs):  # a resumed run goes on after its checkpoint
        start, losses, rows = time.perf_counter(), [], []
        for batch in batches(epoch):
            state, loss = step(state, batch)
            losses.append(loss)
            rows.append(len(first(batch[1])))
            if on_step:
                write_back(model, state)
                on_step(loss)
        # fit: the epoch's loss is the mean over its rows; one wait for the device per epoch
        curves["loss"].append(float(np.average(jax.device_get(losses), weights=rows)))
        record(curves["metrics"], metrics, [m.stateless_result(v) for m, v in zip(metrics, state[3])])
        state = (*state[:3], fresh(metrics))  # fit: the metrics start again every epoch
        if cfg.validate:
            state, loss, values = validate(state, *validation())
            curves["val_loss"].append(float(loss))
            record(curves["metrics"], metrics, values, "val_")
        epoch_seconds.append(time.perf_counter() - start)
        if saved:
            write_back(model, state)  # the portable .weights.h5 is written from the Keras variables
            saved.save(epoch + 1, model, curves, lambda folder: jax_checkpoint.write(folder, state))
        if progress:
            progress(epoch + 1, cfg.epochs)
        if stop and stop.update(epoch, curves["val_loss"][-1], lambda: state[:2]):
            break
    if stop:
        state = (*stop.best_weights, *state[2:])  # fit: restore_best_weights (the weights and state of the best epoch)
    write_back(model, state)
    test_pred = None if data.x_test is None else predict(model, data.x_test)  # a loader's batches: no test rows
    return Result.from_training("jax-native", "jax", model.get_weights(), data, cfg, curves["loss"],
                                curves["val_loss"], test_pred, sum(epoch_seconds), compile_seconds,
                                metrics=curves["metrics"])


def compute_loss(model, loss_fn, trainable, non_trainable, x, y, sample_weight=None, *, training: bool):
    """The Keras guide's `compute_loss_and_updates`: `(loss, (non_trainable, outputs))`, the loss what `fit`
    minimizes: the spec's loss plus the losses the model adds (regularizers, `add_loss`)."""
    outputs, non_trainable, losses = model.stateless_call(trainable, non_trainable, keras_inputs(x),
                                                          return_losses=True, **training_flag(model, training))
    loss = loss_fn(y, outputs, sample_weight=sample_weight) + sum(losses)  # fit: the regularizers, add_loss
    return loss, (non_trainable, outputs)  # fit: the state a layer moves (BatchNorm's statistics, a seed), new


def training_flag(model, training: bool) -> dict:
    """`training=...` for a model whose `call` takes it, as Keras's trainer passes it (a `call` of yours may not)."""
    return {"training": training} if "training" in inspect.signature(model.call).parameters else {}


def rows_of(data: HarData, rows) -> tuple:
    """The batch `(x, y, sample_weight or None)` of the training rows `rows`, as NumPy."""
    return take(data.x_train, rows), take(data.y_train, rows), None if data.w_train is None else data.w_train[rows]


def compile_step(step, state, batches) -> float:
    """Seconds to trace and compile the step for each batch shape (a full batch, the short last one) before the
    epochs, so that their time is training; the steps' results are dropped."""
    start = time.perf_counter()
    for batch in batches:
        jax.block_until_ready(step(state, batch))
    return time.perf_counter() - start


def record(history: dict, metrics, values, prefix: str = "") -> None:
    """Each metric's value of the epoch, named as `fit`'s History names it ("val_" for validation)."""
    for metric, value in zip(metrics, values):
        history.setdefault(prefix + metric.name, []).append(float(value))


def fresh(metrics) -> list:
    """The metrics' state with nothing seen (Keras resets it every epoch)."""
    return [[v.value for v in m.variables] for m in metrics]


def init_state(model, optimizer, metrics=()) -> tuple:
    """The state the step threads, from the Keras model's variables."""
    trainable = [v.value for v in model.trainable_variables]
    non_trainable = [v.value for v in model.non_trainable_variables]
    return trainable, non_trainable, optimizer.init(trainable), fresh(metrics)


def write_back(model, state) -> None:
    """Copy the trained arrays into the Keras variables, so `model.predict` and `save_weights` see them."""
    trainable, non_trainable = state[:2]
    for variable, value in zip(model.trainable_variables, trainable, strict=True):
        variable.assign(value)
    for variable, value in zip(model.non_trainable_variables, non_trainable, strict=True):
        variable.assign(value)


def grad_at(model, x, y, *, loss=None, training: bool = False) -> list[np.ndarray]:
    """`jax.grad` of the training objective at the model's current weights, in `model.trainable_weights` order: the
    batch loss plus the model's own losses (regularizers). The loss is MSE (each output's, summed, for several
    outputs) unless `loss` says otherwise: a spec's loss by name ("mae"), or `loss(y_true, y_pred)` of yours,
    which gets the targets and predictions as they are."""
    x, y = verb_inputs(model, x), verb_inputs(model, y, "y")
    ensure_built(model, x)
    non_trainable = [v.value for v in model.non_trainable_variables]
    x, y = jax.tree.map(jnp.asarray, (x, y))

    def batch_loss(trainable):
        pred, _, losses = model.stateless_call(trainable, non_trainable, keras_inputs(x), return_losses=True,
                                               **training_flag(model, training))
        target, pred = as_fit_shapes(keras_inputs(y), pred)  # several targets: a list, one per output
        return verb_loss(loss, lambda t, p: (p - t) ** 2, target, pred, jnp.mean) + sum(losses)

    return [np.asarray(g) for g in jax.grad(batch_loss)([v.value for v in model.trainable_variables])]


def predict(model, x):
    """Inference-mode predictions through `stateless_call`, as NumPy (several outputs: a tuple of arrays, one
    each)."""
    x = verb_inputs(model, x)
    ensure_built(model, x)
    trainable = [v.value for v in model.trainable_variables]
    non_trainable = [v.value for v in model.non_trainable_variables]
    pred, _ = model.stateless_call(trainable, non_trainable, keras_inputs(jax.tree.map(jnp.asarray, x)),
                                   **training_flag(model, False))
    return output_arrays(pred)
