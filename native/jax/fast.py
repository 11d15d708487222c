"""The reference loop with Keras's 1-D convolution computed as a matmul: the path `jax-native-fast`, opt-in.

    native-loops train --path jax-native-fast   # or, in your code: from native.jax import fast; fast.train(...)

`native.jax.loop` as it is, run inside `convolution.as_matmuls()`, so the step is traced, and compiled, with a 1-D
channels-last float32 convolution on a CPU written as one matmul over the input's patches (XLA's CPU convolution is
slow, forward and for the kernel's gradient: `native.jax.convolution` says why). A model without such a convolution
trains to the bit as in the reference loop; one with it computes the same products summed in another order
(`CONV_AS_MATMUL_RTOL` a call) and ends within `ZOO_ATOL` of it after the zoo's epochs, not on its bits (tested).
The same verbs as the loop.
"""
from __future__ import annotations

import dataclasses

from keras_side.results import Result
from keras_side.spec import TrainConfig
from native.jax import convolution, loop


def train(model, data, cfg: TrainConfig, *, validation_data=None, progress=None, on_step=None, checkpoint=None,
          resume: bool = False) -> Result:
    """`loop.train` with the convolution as a matmul (the step is traced inside the block)."""
    with convolution.as_matmuls():
        result = loop.train(model, data, cfg, validation_data=validation_data, progress=progress, on_step=on_step,
                            checkpoint=checkpoint, resume=resume)
    return dataclasses.replace(result, path="jax-native-fast")


def grad_at(model, x, y, *, loss=None, training: bool = False):
    """`loop.grad_at`, the convolution as a matmul."""
    with convolution.as_matmuls():
        return loop.grad_at(model, x, y, loss=loss, training=training)


def predict(model, x):
    """`loop.predict`, the convolution as a matmul."""
    with convolution.as_matmuls():
        return loop.predict(model, x)
