"""Embedding a Keras model in a JAX program: `stateless_call` makes it a pure function of its weights.

    pure = PureModel(model)                              # any built Keras model
    state = pure.init()                                  # (trainable, non_trainable): copies, yours to donate
    outputs, state, losses = pure.apply(state, x, training=True)
    pure.write_back(state)                               # into the Keras variables: predict, save_weights
    loss, grads = panel_loss_and_grad(model)(trainable, xs, ys)   # xs: (assets, rows, 3), shared weights
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from keras_side.arrays import keras_inputs
from keras_side.losses import as_fit_shapes
from native.jax.loop import training_flag, write_back


class PureModel:
    """Any built Keras model as pure functions of its state, for a JAX program of yours: usable under `jit`, `grad`,
    `vmap` and `lax.scan`, with an optax optimizer and an orbax checkpoint of the state.

    The state is `(trainable, non_trainable)`: lists of arrays in `model.trainable_variables` and
    `model.non_trainable_variables` order. `non_trainable` carries what a layer moves while training (BatchNorm's
    statistics, the seed state of Dropout and its kin): `apply` returns it new, and the next call must get it.
    `init` copies the variables' arrays, so a step that donates its state (`jax.jit(..., donate_argnums=0)`, for
    speed) deletes only the copies: the Keras model keeps working (`predict`, `save_weights`) until `write_back`
    gives it the trained state. (Taking `v.value` directly, as the Keras guide does, hands the model's own buffers
    to the donation: XLA deletes them, and the model fails on its next use.)"""

    def __init__(self, model):
        if not model.built:
            raise ValueError(f"PureModel needs a built model (its variables exist once it is built); build "
                             f"{model.name!r} first, e.g. with keras.Input or model.build(input_shape)")
        self.model = model

    def init(self) -> tuple[list, list]:
        def own(variables):
            return [jnp.array(v.value, copy=True) for v in variables]
        return own(self.model.trainable_variables), own(self.model.non_trainable_variables)

    def apply(self, state, x, *, training: bool = False):
        """`(outputs, state, losses)`: the model's outputs for `x`, the state with its non-trainable part moved on,
        and the sum of the losses the model adds (regularizers, `add_loss`), which `fit` adds to the loss."""
        trainable, non_trainable = state
        outputs, non_trainable, losses = self.model.stateless_call(
            trainable, non_trainable, keras_inputs(x), return_losses=True, **training_flag(self.model, training))
        return outputs, (trainable, non_trainable), sum(losses, jnp.zeros((), jnp.float32))

    def write_back(self, state) -> None:
        """The state into the Keras variables, so that `model.predict` and `save_weights` see it."""
        write_back(self.model, state)


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
