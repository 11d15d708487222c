"""Many small Keras models at once: `jax.vmap` of a fused trainer over models, masked windows, one jit.

    compiled, args = train_many(model, x, y, mask, keys, cfg, devices=jax.devices())
    params = compiled(*args)

Each model m trains on the rows where `mask[m]` is 1 (a walk-forward's expanding window, padded to one length).
An epoch shuffles the valid rows to the front, so a model sees ceil(n_m / batch) real batches, the last one short
and masked; batches with no valid row leave its weights and Adam state untouched. A model therefore trains
exactly as it would alone, and `fit_one` (the unbatched trainer) is the test of that. With several devices the
model axis is sharded over them (`jax.sharding`), so the same code scales to more chips or hosts.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from keras_side.config import TrainConfig
from native.jax_loop import adam


def init_params(model, key) -> list[jax.Array]:
    """One model's starting weights: Glorot-uniform matrices, zero vectors (Keras's Dense defaults)."""
    params = []
    for variable, k in zip(model.trainable_variables, jax.random.split(key, len(model.trainable_variables))):
        shape = tuple(variable.shape)
        if len(shape) >= 2:
            limit = np.sqrt(6.0 / (shape[-2] + shape[-1]))
            params.append(jax.random.uniform(k, shape, jnp.float32, -limit, limit))
        else:
            params.append(jnp.zeros(shape, jnp.float32))
    return params


def valid_first(perm, mask):
    """Reorder a permutation of all rows so this model's valid rows come first, each group in `perm`'s order.

    A stable partition by prefix sums: O(rows), where sorting each model's rows would be O(rows·log rows) per
    model and per epoch (the slowest part of an earlier version).
    """
    valid = mask[perm] > 0
    n_valid = jnp.sum(valid)
    pos = jnp.where(valid, jnp.cumsum(valid) - 1, n_valid + jnp.cumsum(~valid) - 1)
    return jnp.zeros_like(perm).at[pos].set(perm)


def make_fit_one(model, cfg: TrainConfig, n_rows: int):
    """`fit_one(params, x, y, mask, key) -> params`: the fused trainer of one model, ready for `jax.vmap`.

    `key` draws one permutation of all rows per epoch; share it across models (vmap with `in_axes=None`) and
    the permutation is drawn once for all of them.
    """
    optimizer = adam(cfg)
    n_batches = -(-n_rows // cfg.batch_size)
    pad = n_batches * cfg.batch_size - n_rows

    def loss_fn(params, xb, yb, mb):
        pred, _ = model.stateless_call(params, [], xb)
        return jnp.sum(mb[:, None] * (pred - yb) ** 2) / jnp.maximum(jnp.sum(mb), 1.0)

    def fit_one(params, x, y, mask, key):
        def epoch(carry, epoch_key):
            order = valid_first(jax.random.permutation(epoch_key, n_rows), mask)
            idx = jnp.pad(order, (0, pad)).reshape(n_batches, cfg.batch_size)
            live_rows = jnp.pad(mask[order], (0, pad)).reshape(n_batches, cfg.batch_size)

            def step(carry, batch):
                params, opt_state = carry
                grads = jax.grad(loss_fn)(params, *batch)
                updates, new_state = optimizer.update(grads, opt_state, params)
                live = jnp.sum(batch[2]) > 0  # an all-padding batch is no step at all
                keep = lambda new, old: jnp.where(live, new, old)  # noqa: E731
                return (jax.tree.map(keep, optax.apply_updates(params, updates), params),
                        jax.tree.map(keep, new_state, opt_state)), None

            return jax.lax.scan(step, carry, (x[idx], y[idx], live_rows))[0], None  # one gather per epoch

        carry = (params, optimizer.init(params))
        return jax.lax.scan(epoch, carry, jax.random.split(key, cfg.epochs))[0][0]

    return fit_one


def train_many(model, x, y, mask, keys, cfg: TrainConfig, *, devices=None):
    """Compile the trainer of one model per leading index of x (models, rows, features), y (models, rows, 1) and
    mask (models, rows); the number of models must divide by the number of devices.

    Returns `(compiled, args)`: `compiled(*args)` trains and returns the params stacked on the model axis, so
    callers time compile and run apart.
    """
    fit_many = jax.vmap(make_fit_one(model, cfg, x.shape[1]), in_axes=(0, 0, 0, 0, None))
    params = jax.vmap(lambda k: init_params(model, k))(keys)
    args = (params, jnp.asarray(x), jnp.asarray(y), jnp.asarray(mask), jax.random.fold_in(keys[0], 1))
    if devices is not None and len(devices) > 1:
        mesh = Mesh(np.asarray(devices), ("models",))
        per_model, shared = NamedSharding(mesh, PartitionSpec("models")), NamedSharding(mesh, PartitionSpec())
        args = (*jax.device_put(args[:4], per_model), jax.device_put(args[4], shared))
    return jax.jit(fit_many).lower(*args).compile(), args


def predict_many(model, params, x) -> np.ndarray:
    """Each model's predictions on its own rows: params stacked on the model axis, x (models, rows, features)."""
    one = lambda p, xm: model.stateless_call(p, [], xm)[0]  # noqa: E731
    return np.asarray(jax.jit(jax.vmap(one))(params, jnp.asarray(x)))
