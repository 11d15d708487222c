"""The fused scan on JAX: every epoch of the reference loop's step in one compiled `lax.scan`, opt-in.

    native-loops train --path jax-native-scan   # or, in your code: from native.jax import scan; scan.train(...)

The same jitted step as `native.jax.loop` (`loop.make_step`), scanned over each epoch's full batches, the short last
batch after them with its own shape as `fit` cuts it, the validation after every epoch, and every epoch in one
call: one compiled program trains the whole run, so no Python runs between steps. What it gives up for that: it
cannot stop early, look in after a step (`on_step`) or write a checkpoint between epochs (each is a `SpecError`
naming the path that can). Keras's 1-D convolution is computed as a matmul over the input's patches while it traces
(`native.jax.convolution`), as in `native.jax.fast`. Tested to end within `SCAN_VS_LOOP_ATOL` of the reference
loop; `native.jax.many` vmaps the same program over seeds.
"""
from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from keras_side.checks import check_data
from keras_side.data import HarData, as_whole_arrays
from keras_side.losses import training_loss
from keras_side.metrics import keras_metrics
from keras_side.models import ensure_built
from keras_side.results import Result
from keras_side.spec import SpecError, TrainConfig
from native.jax import convolution, loop, optim


def train(model, data, cfg: TrainConfig, *, validation_data=None, progress=None, on_step=None, checkpoint=None,
          resume: bool = False) -> Result:
    """The reference loop's training (`loop.train`), every epoch in one compiled call; the trained state is
    written back into the model. `data` and `validation_data` as `loop.train` takes arrays (a loader of batches is
    the reference loop's alone). `on_step`, `checkpoint` and `patience` are refused: nothing runs between steps."""
    if cfg.patience is not None:
        raise SpecError("the fused scan runs every epoch in one call, so it cannot stop early; use the path "
                        "jax-native (native.jax.loop) with patience")
    if on_step is not None:
        raise SpecError("the fused scan runs every step inside one compiled call, so nothing can look in after a "
                        "step; use the path jax-native (native.jax.loop) with on_step")
    if checkpoint is not None:
        raise SpecError("the fused scan runs every epoch in one call, so no epoch ends where a checkpoint could be "
                        "written; use the path jax-native (native.jax.loop) with checkpoint")
    data, cfg = as_whole_arrays(model, data, cfg, validation_data, path="jax-native-scan", reference="jax-native")
    check_data(cfg, data, ensure_built(model, data.x_train))
    optimizer, loss_fn, metrics = optim.build(cfg), training_loss(cfg), keras_metrics(cfg)
    state = loop.init_state(model, optimizer, metrics)
    train_xy, val = arrays(data)
    orders = np.asarray(loop.batch_orders(cfg, data.n_train))
    with convolution.as_matmuls():  # traced inside: the compiled program keeps the matmul
        step = loop.make_step(model, loss_fn, optimizer, metrics)
        state, curves, compile_seconds, seconds = _scan_driver(step, make_evaluate(model, loss_fn, metrics), metrics,
                                                               state, train_xy, orders, val, cfg, progress)
        loop.write_back(model, state)
        predictions = loop.predict(model, data.x_test)
    return Result.from_training("jax-native-scan", "jax", model.get_weights(), data, cfg, curves["loss"],
                                curves["val_loss"], predictions, seconds, compile_seconds,
                                metrics=_history(metrics, curves, cfg.validate),
                                first_run_seconds=curves["first_run_seconds"])


def make_evaluate(model, loss_fn, metrics=()):
    """`evaluate(state, x, y) -> (state, loss, metric values)`: the reference loop's validation (`loop.evaluate`)."""
    return functools.partial(loop.evaluate, model, loss_fn, metrics=metrics)


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


def make_fused(step, evaluate, metrics, train_xy, val, cfg: TrainConfig):
    """`run(state, orders, epochs=None) -> (state, (train_loss, metric values, (val_loss, val metric values)))`, one
    value per epoch: every epoch's full batches in one `lax.scan`, the short last batch after them. With `epochs` (a
    traced count, the same for every model under a vmap: batched, the `lax.cond` would run every epoch), only the
    first `epochs` of them run, the rest answer zeros: the driver's first run is this program with none. The fused
    scan driver compiles it; `native.jax.many` compiles it vmapped over seeds. `evaluate` is `make_evaluate`'s."""
    reset = loop.fresh(metrics)

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
            state, loss, val_values = evaluate(state, *val)
            measured = (loss, val_values)
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
    training takes (docs/dev-notes.md, "A program's first run")."""
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


def _history(metrics, curves: dict, validate: bool) -> dict[str, list[float]]:
    """Each metric's per-epoch values, named as `fit`'s History names them."""
    history = {m.name: [float(v[i]) for v in curves["metrics"]] for i, m in enumerate(metrics)}
    if validate:
        history |= {f"val_{m.name}": [float(v[i]) for v in curves["val_metrics"]] for i, m in enumerate(metrics)}
    return history


def _rows(arrays, idx):
    """Rows `idx` of every array of (x, y[, sample_weight]), x being one array or a tuple of inputs."""
    return jax.tree.map(lambda a: a[idx], arrays)
