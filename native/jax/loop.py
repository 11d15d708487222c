"""The Keras model trained as a pure function: `jax.jit(jax.value_and_grad)` over `model.stateless_call`, optax.

    native-loops train --path jax-native   # or, in your code: from native.jax import loop

State is `(trainable, non_trainable, opt_state)`. Batches are gathered ahead of time and padded to one shape,
with a mask for the short last batch, so the step compiles once. Two drivers share the same step: a readable
Python loop (default) and a fused `lax.scan` over batches and epochs (`driver="scan"`). The trained state is
written back into the Keras model with `assign`, so `model.predict` and `save_weights` see it.
"""
from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from keras_side.config import HarData, Result, keras_inputs, numpy_orders, take
from keras_side.spec import TrainConfig
from keras_side.models import ensure_built


def make_loss(model, training: bool):
    """Masked mean squared error: the plain batch MSE over the rows where mask is 1 (optax.l2_loss is half); zero
    for a batch with no such row."""

    def loss_fn(trainable, non_trainable, x, y, mask):
        pred, non_trainable = model.stateless_call(trainable, non_trainable, keras_inputs(x), training=training)
        loss = jnp.sum(mask[:, None] * (pred - y) ** 2) / jnp.maximum(jnp.sum(mask), 1.0)
        return loss, non_trainable

    return loss_fn


def adam(cfg: TrainConfig) -> optax.GradientTransformation:
    return optax.adam(cfg.learning_rate, b1=cfg.beta_1, b2=cfg.beta_2, eps=cfg.epsilon)


def make_step(model, optimizer: optax.GradientTransformation):
    """The one jitted step: `step(state, (x, y, mask)) -> (state, loss)`."""
    loss_fn = make_loss(model, training=True)

    @jax.jit
    def step(state, batch):
        trainable, non_trainable, opt_state = state
        (loss, non_trainable), grads = jax.value_and_grad(loss_fn, has_aux=True)(trainable, non_trainable, *batch)
        updates, opt_state = optimizer.update(grads, opt_state, trainable)
        return (optax.apply_updates(trainable, updates), non_trainable, opt_state), loss

    return step


def batch_plan(cfg: TrainConfig, n: int) -> tuple[jax.Array, jax.Array]:
    """Row indices (epochs, batches, batch_size) and mask; the padding repeats row 0 with mask 0."""
    if cfg.batch_order == "numpy":
        orders = jnp.asarray(numpy_orders(cfg.seed, n, cfg.epochs))
    else:
        keys = jax.random.split(jax.random.key(cfg.seed), cfg.epochs)
        orders = jax.vmap(lambda k: jax.random.permutation(k, n))(keys)
    n_batches = -(-n // cfg.batch_size)
    pad = n_batches * cfg.batch_size - n
    idx = jnp.pad(orders, ((0, 0), (0, pad))).reshape(cfg.epochs, n_batches, cfg.batch_size)
    mask = jnp.pad(jnp.ones((cfg.epochs, n), jnp.float32), ((0, 0), (0, pad)))
    return idx, mask.reshape(cfg.epochs, n_batches, cfg.batch_size)


def init_state(model, optimizer):
    trainable = [v.value for v in model.trainable_variables]
    non_trainable = [v.value for v in model.non_trainable_variables]
    return trainable, non_trainable, optimizer.init(trainable)


def write_back(model, state) -> None:
    """Copy the trained arrays into the Keras variables."""
    trainable, non_trainable, _ = state
    for variable, value in zip(model.trainable_variables, trainable, strict=True):
        variable.assign(value)
    for variable, value in zip(model.non_trainable_variables, non_trainable, strict=True):
        variable.assign(value)


def train(model, data: HarData, cfg: TrainConfig, *, driver: str = "loop", progress=None) -> Result:
    """Adam + MSE; `driver="loop"` steps from Python, `driver="scan"` runs every epoch in one compiled call."""
    ensure_built(model, data.x_train)
    optimizer = adam(cfg)
    state = init_state(model, optimizer)
    x, y = jax.tree.map(jnp.asarray, data.x_train), jnp.asarray(data.y_train)
    test = (jax.tree.map(jnp.asarray, data.x_test), jnp.asarray(data.y_test), jnp.ones(data.n_test))
    idx, mask = batch_plan(cfg, data.n_train)
    run = _scan_driver if driver == "scan" else _loop_driver
    state, train_loss, val_loss, compile_seconds, seconds = run(model, optimizer, state, (x, y), idx, mask, test,
                                                                cfg, progress)
    write_back(model, state)
    path = "jax-native-scan" if driver == "scan" else "jax-native"
    return Result.from_training(path, "jax", model.get_weights(), data, cfg, train_loss, val_loss,
                                predict(model, data.x_test), seconds, compile_seconds)


def _loop_driver(model, optimizer, state, train_xy, idx, mask, test, cfg, progress):
    step = make_step(model, optimizer)
    evaluate = jax.jit(make_loss(model, training=False))
    x, y = train_xy
    epochs, n_batches = idx.shape[:2]
    start = time.perf_counter()
    step = step.lower(state, (take(x, idx[0, 0]), y[idx[0, 0]], mask[0, 0])).compile()  # compile time apart
    compile_seconds = time.perf_counter() - start
    start = time.perf_counter()
    # Every batch of every epoch gathered once, as NumPy: a NumPy view per step is free and the compiled step
    # takes it as is, while indexing a jax array from Python costs ~70 µs a time, more than the step itself.
    idx, mask = np.asarray(idx), np.asarray(mask)
    batches = (take(jax.tree.map(np.asarray, x), idx), np.asarray(y)[idx], mask)
    train_loss, val_loss = [], []
    for epoch in range(epochs):
        losses = []
        for b in range(n_batches):
            state, loss = step(state, jax.tree.map(lambda a: a[epoch, b], batches))
            losses.append(loss)
        train_loss.append(float(_epoch_mean(np.asarray(jax.device_get(losses)), mask[epoch])))
        if cfg.validate:
            val_loss.append(float(evaluate(state[0], state[1], *test)[0]))
        if progress:
            progress(epoch + 1, cfg.epochs)
    jax.block_until_ready(state)
    return state, train_loss, val_loss, compile_seconds, time.perf_counter() - start


def _epoch_mean(losses, mask):
    """Batch losses weighted by their real row counts: the epoch's mean training loss, as `fit` reports it."""
    counts = mask.sum(axis=1)
    return (losses * counts).sum() / counts.sum()


def _scan_driver(model, optimizer, state, train_xy, idx, mask, test, cfg, progress):
    step = make_step(model, optimizer)
    evaluate = make_loss(model, training=False)
    x, y = train_xy

    def epoch(state, plan):
        idx_e, mask_e = plan
        state, losses = jax.lax.scan(step, state, (take(x, idx_e), y[idx_e], mask_e))
        val = evaluate(state[0], state[1], *test)[0] if cfg.validate else jnp.nan
        return state, (_epoch_mean(losses, mask_e), val)

    start = time.perf_counter()
    fused = jax.jit(lambda s, i, m: jax.lax.scan(epoch, s, (i, m))).lower(state, idx, mask).compile()
    compile_seconds = time.perf_counter() - start
    start = time.perf_counter()
    state, (train_loss, val_loss) = jax.block_until_ready(fused(state, idx, mask))
    seconds = time.perf_counter() - start
    if progress:
        progress(cfg.epochs, cfg.epochs)
    val = [float(v) for v in val_loss] if cfg.validate else []
    return state, [float(v) for v in train_loss], val, compile_seconds, seconds


def grad_at(model, x, y, *, loss=None, training: bool = False) -> list[np.ndarray]:
    """`jax.grad` of the batch loss (MSE unless `loss(y_true, y_pred)` says otherwise) at the model's current
    weights, in `model.trainable_weights` order."""
    ensure_built(model, x)
    non_trainable = [v.value for v in model.non_trainable_variables]
    x, y = jax.tree.map(jnp.asarray, x), jnp.asarray(y)

    def batch_loss(trainable):
        pred, _ = model.stateless_call(trainable, non_trainable, keras_inputs(x), training=training)
        return jnp.mean((pred - y) ** 2) if loss is None else jnp.mean(loss(y, pred))

    return [np.asarray(g) for g in jax.grad(batch_loss)([v.value for v in model.trainable_variables])]


def predict(model, x) -> np.ndarray:
    """Inference-mode predictions through `stateless_call`, as NumPy."""
    ensure_built(model, x)
    trainable = [v.value for v in model.trainable_variables]
    non_trainable = [v.value for v in model.non_trainable_variables]
    pred, _ = model.stateless_call(trainable, non_trainable, keras_inputs(jax.tree.map(jnp.asarray, x)), training=False)
    return np.asarray(pred)
