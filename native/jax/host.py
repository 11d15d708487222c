"""Embedding a Keras model in a JAX program: `stateless_call` makes it a pure function of its weights.

    loss, grads = panel_loss_and_grad(model)(trainable, xs, ys)   # xs: (assets, rows, 3), shared weights
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from keras_side.losses import as_fit_shapes
from native.jax.loop import training_flag


def panel_loss_and_grad(model):
    """A jitted program: `jax.vmap` of the Keras model over assets, the mean of per-asset MSEs, and its gradient.
    The model runs in inference mode with its non-trainable values (BatchNorm's moving statistics) as they are when
    this is called: baked into the program, which a later change to them does not reach (make it again)."""
    non_trainable = [v.value for v in model.non_trainable_variables]
    flag = training_flag(model, False)  # a `call` without `training` is called without it, as Keras's trainer

    def asset_mse(trainable, x, y):
        pred, _ = model.stateless_call(trainable, non_trainable, x, **flag)
        y, pred = as_fit_shapes(y, pred)  # a (rows,) target is a (rows, 1) one, as fit takes it: not (rows, rows)
        return jnp.mean((pred - y) ** 2)

    def panel_loss(trainable, xs, ys):
        return jnp.mean(jax.vmap(asset_mse, in_axes=(None, 0, 0))(trainable, xs, ys))

    return jax.jit(jax.value_and_grad(panel_loss))
