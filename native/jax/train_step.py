"""The middle path on JAX: `fit` runs the loop (batching, callbacks, history), the training step is ours.

    native-loops train --path keras-jax-train-step   # or: from native.jax import train_step

As in the Keras guide "Customizing what happens in fit() with JAX": `train_step(state, data)` is pure. It takes
`jax.value_and_grad` of a loss over `stateless_call`, steps the compiled Keras optimizer through its stateless API,
and returns the new state; Keras jits it and threads the state. `OwnStep` wraps any Keras model (same weights, same
call), so the zoo's models need no subclass of their own.
"""
from __future__ import annotations

import jax
import keras

from keras_side import fit
from keras_side.arrays import first
from keras_side.data import HarData
from keras_side.results import Result
from keras_side.spec import TrainConfig


class OwnStep(fit.Wrapped):
    """Any Keras model, trained by `fit` with the step below."""

    def loss_and_state(self, trainable, non_trainable, x, y, sample_weight=None):
        y_pred, non_trainable, losses = self.stateless_call(trainable, non_trainable, x, training=True,
                                                            return_losses=True)
        loss = self.spec_loss(y, y_pred, sample_weight)  # the spec's loss, plus the regularizers as fit adds them
        return (loss + sum(losses) if losses else loss), (non_trainable, y_pred)

    def train_step(self, state, data):
        trainable, non_trainable, optimizer_variables, metrics_variables = state
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        grad_fn = jax.value_and_grad(self.loss_and_state, has_aux=True)
        (loss, (non_trainable, y_pred)), grads = grad_fn(trainable, non_trainable, x, y, sample_weight)
        trainable, optimizer_variables = self.optimizer.stateless_apply(optimizer_variables, grads, trainable)
        logs, metrics_variables = report(self, metrics_variables, loss, y, y_pred, sample_weight)
        return logs, (trainable, non_trainable, optimizer_variables, metrics_variables)


def report(model: keras.Model, metrics_variables, loss, y, y_pred, sample_weight=None):
    """The epoch's mean loss, weighted by batch size as `fit` reports it, and the compiled metrics, through the
    metrics' stateless API."""
    logs, updated = {}, []
    for metric in model.metrics:
        own = metrics_variables[len(updated): len(updated) + len(metric.variables)]
        if metric.name == "loss":
            own = metric.stateless_update_state(own, loss, sample_weight=first(y).shape[0])
        elif metric.name.endswith("_loss"):  # each output's loss (several outputs): this step reports the total
            updated += list(own)
            continue
        else:
            own = metric.stateless_update_state(own, y, y_pred, sample_weight=sample_weight)
        result = metric.stateless_result(own)
        logs |= result if isinstance(result, dict) else {metric.name: result}  # named as fit's History names them
        updated += list(own)
    return logs, updated


def train(model, data: HarData, cfg: TrainConfig, *, progress=None, on_step=None) -> Result:
    """`fit` (compiled from the spec) with our `train_step`; the trained weights are in `model` afterwards."""
    return fit.train_own_step(OwnStep, model, data, cfg, progress=progress, on_step=on_step)
