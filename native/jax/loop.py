"""The Keras model trained as a pure function: `jax.jit(jax.value_and_grad)` over `model.stateless_call`, optax.

    native-loops train --path jax-native   # or, in your code: from native.jax import loop

State is `(trainable, non_trainable, opt_state, metrics)`: non_trainable carries BatchNorm's moving statistics and
the seed state of Dropout and GaussianNoise, so the loop draws the masks `fit` draws; metrics is the state of the
spec's `keras.metrics`, through their stateless API. The loss is the spec's Keras loss
plus the losses the model adds (`return_losses=True`: regularizers, `add_loss`). The optimizer is the spec's
(`native.jax.optim`: Keras-exact by default). Batches come as `fit` cuts them: full batches, then the short last
one as it is, so no padded row ever reaches a layer (BatchNorm's batch statistics would see it); the step
compiles once per batch shape, two at most. Two drivers share the step: a readable Python loop (default) and a
fused `lax.scan` over each epoch's full batches (`driver="scan"`). On a CPU, every call of the model computes a
1-D channels-last float32 convolution of one group as a matmul over the input's patches, not with XLA's CPU
convolution (`native.jax.convolution`: the same products in another order; the zoo's Conv1D twice as
fast), and so do `native.jax.many`'s trainers. The trained state is written back into the Keras model with
`assign`, so `model.predict` and `save_weights` see it.
"""
from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from keras_side.callbacks import EarlyStopping
from keras_side.config import HarData, Result, first, keras_inputs, numpy_orders, output_arrays, verb_arrays
from keras_side.models import ensure_built, weight_constraints
from keras_side.spec import (SpecError, TrainConfig, as_fit_shapes, check_data, keras_metrics, verb_loss,
                              training_loss)
from native.checkpoint import Checkpoints
from native.jax import checkpoint as jax_checkpoint
from native.jax import convolution
from native.jax import optim


def make_loss(model, loss_fn, training: bool):
    """`compute_loss(trainable, non_trainable, x, y, sample_weight=None) -> (loss, (non_trainable, outputs))`: what
    `fit` minimizes."""

    def compute_loss(trainable, non_trainable, x, y, sample_weight=None):
        pred, non_trainable, losses = convolution.stateless_call(model, trainable, non_trainable, keras_inputs(x),
                                                                 training=training, return_losses=True)
        loss = loss_fn(y, pred, sample_weight=sample_weight)
        return (loss + sum(losses) if losses else loss), (non_trainable, pred)

    return compute_loss


def make_step(model, loss_fn, optimizer: optax.GradientTransformation, metrics=()):
    """The one jitted step: `step(state, (x, y[, sample_weight])) -> (state, loss)`; the metrics' state through
    their stateless API."""
    compute_loss = make_loss(model, loss_fn, training=True)
    constraints = weight_constraints(model)

    @jax.jit
    def step(state, batch):
        trainable, non_trainable, opt_state, metric_state = state
        (loss, (non_trainable, pred)), grads = jax.value_and_grad(compute_loss, has_aux=True)(
            trainable, non_trainable, *batch)
        updates, opt_state = optimizer.update(grads, opt_state, trainable)
        # Unweighted, as fit updates compile(metrics=...): only weighted_metrics take the sample weights.
        metric_state = [m.stateless_update_state(v, batch[1], pred) for m, v in zip(metrics, metric_state)]
        trainable = optax.apply_updates(trainable, updates)
        # after the update, each variable's constraint, as Keras's optimizer applies it
        trainable = [w if c is None else c(w) for c, w in zip(constraints, trainable)]
        return (trainable, non_trainable, opt_state, metric_state), loss

    return step


def fresh(metrics) -> list:
    """The metrics' state at the start of an epoch (Keras resets it every epoch)."""
    return [[v.value for v in m.variables] for m in metrics]


def make_evaluate(model, loss_fn, metrics=()):
    """`evaluate(trainable, non_trainable, x, y) -> (loss, metric values, non_trainable)`: `fit`'s validation, in
    inference mode, and the state after it, which `fit` keeps: an RNN's dropout draws its masks in inference too, so
    its seed state moves at every validation (nothing else in Keras's layers does)."""
    compute_loss = make_loss(model, loss_fn, training=False)

    def evaluate(trainable, non_trainable, x, y):
        loss, (non_trainable, pred) = compute_loss(trainable, non_trainable, x, y)
        values = [m.stateless_result(m.stateless_update_state(v, y, pred)) for m, v in zip(metrics, fresh(metrics))]
        return loss, values, non_trainable

    return evaluate


def batch_orders(cfg: TrainConfig, n: int) -> jax.Array:
    """One permutation of the n rows per epoch (epochs, n), from `jax.random` (or the shared NumPy ones)."""
    if cfg.batch_order == "numpy":
        return jnp.asarray(numpy_orders(cfg.seed, n, cfg.epochs))
    keys = jax.random.split(jax.random.key(cfg.seed), cfg.epochs)
    return jax.vmap(lambda k: jax.random.permutation(k, n))(keys)


def split_batches(order, batch_size: int):
    """One epoch's row order cut as `fit` cuts it: (full batches, batch_size) and the short rest (maybe empty)."""
    full = order.shape[-1] // batch_size * batch_size
    return order[..., :full].reshape(*order.shape[:-1], -1, batch_size), order[..., full:]


def arrays(data: HarData):
    """The training split as (x, y[, sample_weight]) and the validation split as (x, y), jax arrays."""
    train_xy = jax.tree.map(jnp.asarray, (data.x_train, data.y_train))
    if data.w_train is not None:  # fit's sample_weight: a third array that every batch takes its rows of
        train_xy += (jnp.asarray(data.w_train),)
    return train_xy, jax.tree.map(jnp.asarray, (data.x_val, data.y_val))


def init_state(model, optimizer, metrics=()):
    trainable = [v.value for v in model.trainable_variables]
    non_trainable = [v.value for v in model.non_trainable_variables]
    return trainable, non_trainable, optimizer.init(trainable), fresh(metrics)


def write_back(model, state) -> None:
    """Copy the trained arrays into the Keras variables."""
    trainable, non_trainable = state[:2]
    for variable, value in zip(model.trainable_variables, trainable, strict=True):
        variable.assign(value)
    for variable, value in zip(model.non_trainable_variables, non_trainable, strict=True):
        variable.assign(value)


def train(model, data: HarData, cfg: TrainConfig, *, driver: str = "loop", progress=None, on_step=None,
          checkpoint=None, resume: bool = False) -> Result:
    """The spec's loss and optimizer; `driver="loop"` steps from Python, `driver="scan"` runs each epoch's full
    batches in one compiled `lax.scan`. `on_step(loss)` is called after every optimizer step of the Python loop
    with the step's batch loss, the state written back into the model's variables (the training-parity check reads
    the weights there). `checkpoint=DIR` writes a checkpoint at the end of every epoch of the Python loop
    (`native.checkpoint`: the state as an orbax pytree checkpoint); `resume=True` goes on from the last one there."""
    if cfg.patience is not None and driver == "scan":
        raise SpecError("the fused scan runs every epoch in one call, so it cannot stop early; use driver='loop' "
                        "with patience")
    if on_step is not None and driver == "scan":
        raise SpecError("the fused scan runs every step inside one compiled call, so nothing can look in after a "
                        "step; use driver='loop' with on_step")
    if checkpoint is not None and driver == "scan":
        raise SpecError("the fused scan runs every epoch in one call, so no epoch ends where a checkpoint could be "
                        "written; use driver='loop' with checkpoint")
    check_data(cfg, data, ensure_built(model, data.x_train))
    optimizer, loss_fn, metrics = optim.build(cfg), training_loss(cfg), keras_metrics(cfg)
    state = init_state(model, optimizer, metrics)
    saved = Checkpoints(checkpoint, model, data, cfg, "jax", "jax-native", resume=resume) if checkpoint else None
    if saved and saved.saved:
        restored = []
        saved.restore(lambda folder: restored.append(jax_checkpoint.read(folder, state)))
        state = restored[0]
    train_xy, val = arrays(data)
    step = make_step(model, loss_fn, optimizer, metrics)
    evaluate = jax.jit(make_evaluate(model, loss_fn, metrics))
    run = _scan_driver if driver == "scan" else _loop_driver
    if on_step:  # after every step, the state in the model's variables, where the caller reads it
        run = functools.partial(run, after=lambda state, loss: (write_back(model, state), on_step(loss)))
    if saved:

        def save(epoch, state, curves):
            write_back(model, state)  # the portable .weights.h5 is written from the Keras variables
            saved.save(epoch + 1, model, _plain(curves), lambda folder: jax_checkpoint.write(folder, state))

        run = functools.partial(run, first_epoch=saved.start, curves=_loaded(saved.curves), on_epoch=save)
    orders = np.asarray(batch_orders(cfg, data.n_train))
    state, curves, compile_seconds, seconds = run(step, evaluate, metrics, state, train_xy, orders, val, cfg,
                                                  progress)
    write_back(model, state)
    path = "jax-native-scan" if driver == "scan" else "jax-native"
    history = _history(metrics, curves, cfg.validate)
    return Result.from_training(path, "jax", model.get_weights(), data, cfg, curves["loss"], curves["val_loss"],
                                predict(model, data.x_test), seconds, compile_seconds, metrics=history,
                                first_run_seconds=curves.get("first_run_seconds"))


def _history(metrics, curves: dict, validate: bool) -> dict[str, list[float]]:
    """Each metric's per-epoch values, named as `fit`'s History names them."""
    history = {m.name: [float(v[i]) for v in curves["metrics"]] for i, m in enumerate(metrics)}
    if validate:
        history |= {f"val_{m.name}": [float(v[i]) for v in curves["val_metrics"]] for i, m in enumerate(metrics)}
    return history


def _rows(arrays, idx):
    """Rows `idx` of every array of (x, y[, sample_weight]), x being one array or a tuple of inputs."""
    return jax.tree.map(lambda a: a[idx], arrays)


def _rows_in(batch) -> int:
    """How many rows a batch (x, y[, sample_weight]) holds: the length of its (first) target."""
    return len(first(batch[1]))


def _plain(curves: dict) -> dict:
    """The driver's curves as JSON: the loss curves, and each epoch's metric values as floats."""
    return {k: [float(v) if k.endswith("loss") else [float(x) for x in v] for v in values]
            for k, values in curves.items()}


def _loaded(saved: dict) -> dict:
    """A checkpoint's curves in the driver's form (no metrics were recorded: none per epoch)."""
    return {"loss": list(saved["loss"]), "val_loss": list(saved["val_loss"]),
            "metrics": list(saved.get("metrics") or []), "val_metrics": list(saved.get("val_metrics") or [])}


def _loop_driver(step, evaluate, metrics, state, train_xy, orders, val, cfg, progress, after=None, first_epoch=0,
                 curves=None, on_epoch=None):
    arrays = jax.tree.map(np.asarray, train_xy)  # (x, y) or (x, y, sample_weight)
    full, rest = split_batches(orders, cfg.batch_size)
    # Every batch of every epoch gathered once, as NumPy: a NumPy view per step is free and the compiled step
    # takes it as is, while indexing a jax array from Python costs ~70 µs a time, more than the step itself.
    batches = [_rows(arrays, full[:, b]) for b in range(full.shape[1])]
    if rest.shape[1]:
        batches.append(_rows(arrays, rest))
    start = time.perf_counter()  # compile each batch shape now, so training time is training
    by_epoch = lambda b, e: jax.tree.map(lambda a: a[e], b)  # noqa: E731  (a batch of every epoch -> one epoch's)
    step = {_rows_in(by_epoch(b, 0)): step.lower(state, by_epoch(b, 0)).compile() for b in batches}
    compile_seconds = time.perf_counter() - start
    start = time.perf_counter()
    curves = curves or {"loss": [], "val_loss": [], "metrics": [], "val_metrics": []}
    reset, stop = state[3], EarlyStopping(cfg.patience) if cfg.patience else None
    for epoch in range(first_epoch, cfg.epochs):  # after a checkpoint, the epochs it has left
        losses, sizes = [], []
        for batch in (by_epoch(b, epoch) for b in batches):
            state, loss = step[_rows_in(batch)](state, batch)
            if after:
                after(state, loss)
            losses.append(loss)
            sizes.append(_rows_in(batch))
        curves["loss"].append(float(np.average(jax.device_get(losses), weights=sizes)))  # as fit reports it
        curves["metrics"].append([m.stateless_result(v) for m, v in zip(metrics, state[3])])
        state = (*state[:3], reset)  # Keras resets the metrics every epoch
        if cfg.validate:
            loss, values, non_trainable = evaluate(state[0], state[1], *val)
            state = (state[0], non_trainable, *state[2:])
            curves["val_loss"].append(float(loss))
            curves["val_metrics"].append(values)
        if on_epoch:
            on_epoch(epoch, state, curves)
        if progress:
            progress(epoch + 1, cfg.epochs)
        if stop and stop.update(epoch, curves["val_loss"][-1], lambda: state[:2]):
            break
    if stop:
        state = (*stop.best_weights, *state[2:])  # restore_best_weights: the weights and state of the best epoch
    jax.block_until_ready(state)
    return state, curves, compile_seconds, time.perf_counter() - start


def make_fused(step, evaluate, metrics, train_xy, val, cfg: TrainConfig):
    """`run(state, orders, epochs=None) -> (state, (train_loss, metric values, (val_loss, val metric values)))`, one
    value per epoch: every epoch's full batches in one `lax.scan`, the short last batch after them. With `epochs` (a
    traced count, the same for every model under a vmap: batched, the `lax.cond` would run every epoch), only the
    first `epochs` of them run, the rest answer zeros: the driver's first run is this program with none. The fused
    scan driver compiles it; `native.jax.many` compiles it vmapped over seeds."""
    reset = fresh(metrics)

    def epoch(state, order):
        state = (*state[:3], reset)  # Keras resets the metrics every epoch
        full, rest = split_batches(order, cfg.batch_size)
        state, losses = jax.lax.scan(step, state, _rows(train_xy, full))
        total = jnp.sum(losses) * cfg.batch_size
        if rest.shape[0]:  # the short last batch: its own shape, as in fit
            state, last = step(state, _rows(train_xy, rest))
            total += last * rest.shape[0]
        values = [m.stateless_result(v) for m, v in zip(metrics, state[3])]
        measured = (jnp.nan, [jnp.nan for _ in metrics])
        if cfg.validate:
            loss, val_values, non_trainable = evaluate(state[0], state[1], *val)
            state, measured = (state[0], non_trainable, *state[2:]), (loss, val_values)
        return state, (total / order.shape[0], values, measured)

    def some(state, order_on):  # an epoch, or nothing in its place
        order, on = order_on
        zeros = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), jax.eval_shape(epoch, state, order)[1])
        return jax.lax.cond(on, epoch, lambda state, order: (state, zeros), state, order)

    def run(state, orders, epochs=None):
        if epochs is None:
            return jax.lax.scan(epoch, state, orders)
        return jax.lax.scan(some, state, (orders, jnp.arange(orders.shape[0]) < epochs))

    return run


def _scan_driver(step, evaluate, metrics, state, train_xy, orders, val, cfg, progress):
    """Every epoch in one compiled call, timed after the program's first run, which trains nothing (no epoch in it)
    and counts in the compile time, its own seconds in `curves["first_run_seconds"]`: XLA's CPU runtime spends about
    a millisecond the first time it runs a program, whatever the program does, as much as the HAR's whole fused
    training takes (docs/speed.md, "A program's first run")."""
    orders = jnp.asarray(orders)
    start = time.perf_counter()
    fused = jax.jit(make_fused(step, evaluate, metrics, train_xy, val, cfg)).lower(state, orders, 0).compile()
    compiled = time.perf_counter()
    jax.block_until_ready(fused(state, orders, 0))  # the first run: no epoch, nothing trained
    compile_seconds, first_run_seconds = time.perf_counter() - start, time.perf_counter() - compiled
    start = time.perf_counter()
    state, (train_loss, values, (val_loss, val_values)) = jax.block_until_ready(fused(state, orders, len(orders)))
    seconds = time.perf_counter() - start
    if progress:
        progress(cfg.epochs, cfg.epochs)
    per_epoch = lambda columns: [[c[e] for c in columns] for e in range(cfg.epochs)]  # noqa: E731
    curves = {"loss": [float(v) for v in train_loss], "metrics": per_epoch(values),
              "val_loss": [float(v) for v in val_loss] if cfg.validate else [], "val_metrics": per_epoch(val_values),
              "first_run_seconds": first_run_seconds}
    return state, curves, compile_seconds, seconds


def grad_at(model, x, y, *, loss=None, training: bool = False) -> list[np.ndarray]:
    """`jax.grad` of the training objective at the model's current weights, in `model.trainable_weights` order: the
    batch loss plus the model's own losses (regularizers). The loss is MSE (each output's, summed, for several
    outputs) unless `loss` says otherwise: a spec's loss by name ("mae"), or `loss(y_true, y_pred)` of yours,
    which gets the targets and predictions as they are."""
    x, y = verb_arrays(x), verb_arrays(y, "y")
    ensure_built(model, x)
    non_trainable = [v.value for v in model.non_trainable_variables]
    x, y = jax.tree.map(jnp.asarray, (x, y))
    y = keras_inputs(y)  # several targets: a tuple of arrays, one per output

    def batch_loss(trainable):
        pred, _, losses = convolution.stateless_call(model, trainable, non_trainable, keras_inputs(x),
                                                     training=training, return_losses=True)
        target, pred = as_fit_shapes(y, pred)
        value = verb_loss(loss, lambda t, p: (p - t) ** 2, target, pred, jnp.mean)
        return value + sum(losses) if losses else value

    return [np.asarray(g) for g in jax.grad(batch_loss)([v.value for v in model.trainable_variables])]


def predict(model, x):
    """Inference-mode predictions through `stateless_call`, as NumPy (several outputs: a tuple of arrays, one
    each)."""
    x = verb_arrays(x)
    ensure_built(model, x)
    trainable = [v.value for v in model.trainable_variables]
    non_trainable = [v.value for v in model.non_trainable_variables]
    pred, _ = convolution.stateless_call(model, trainable, non_trainable, keras_inputs(jax.tree.map(jnp.asarray, x)),
                                         training=False)
    return output_arrays(pred)
