"""The middle path on torch: `fit` runs the loop (batching, callbacks, history), the training step is ours.

    native-loops train --path keras-torch-train-step   # or: from native.torch import train_step

As in the Keras guide "Customizing what happens in fit() with PyTorch": `train_step` computes the loss, calls
`backward()` and hands the gradients to the compiled Keras optimizer. `OwnStep` wraps any Keras model (same weights,
same call), so the zoo's models need no subclass of their own.
"""
from __future__ import annotations

import keras
import torch

from keras_side import fit
from keras_side.arrays import first
from keras_side.data import HarData
from keras_side.results import Result
from keras_side.spec import TrainConfig


class OwnStep(fit.Wrapped):
    """Any Keras model, trained by `fit` with the step below."""

    def train_step(self, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        y_pred = self(x, training=True)
        loss = self.spec_loss(y, y_pred, sample_weight)  # the spec's loss, as compile combines it ...
        if self.losses:
            loss = loss + sum(self.losses)  # ... plus the regularizers, as fit's compute_loss adds them
        self.zero_grad()
        loss.backward()
        variables = self.trainable_weights
        with torch.no_grad():
            self.optimizer.apply([v.value.grad for v in variables], variables)
        return self.report(loss, y, y_pred, sample_weight, batch_size=len(first(y)))


def train(model, data: HarData, cfg: TrainConfig, *, progress=None, on_step=None) -> Result:
    """`fit` (compiled from the spec) with our `train_step`; the trained weights are in `model` afterwards."""
    return fit.train_own_step(OwnStep, model, data, cfg, progress=progress, on_step=on_step)
