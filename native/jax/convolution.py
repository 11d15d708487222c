"""Keras's 1-D convolution as the JAX loop computes it on a CPU: one matmul over the input's patches.

    pred, _ = convolution.stateless_call(model, trainable, non_trainable, x)   # every call of native.jax's trainers
    with convolution.as_matmuls():                                              # or, around any code of yours
        pred, _ = model.stateless_call(trainable, non_trainable, x)

XLA's CPU convolution is slow, forward and for the kernel's gradient: written as one matmul over the input's patches,
the zoo's `Conv1D(4, 5)` over 22 days trains markedly faster in the fused scan (measured in docs/dev-notes.md, "The
Conv1D as a matmul in JAX"; openxla/xla#34273 is a related report, XLA's CPU convolution against PyTorch's). The
patches are what a GEMM-based convolution builds ("im2col"): row t holds the `width` input rows that output t reads,
each channel of each, so output t is that row times the flattened kernel, every filter at once. It is the same
products, summed in another order: within `CONV_AS_MATMUL_RTOL` of XLA's convolution, outputs and gradients (tested),
not its bits. The patches hold `width` copies of the input, as a GEMM-based convolution's do.

`as_matmuls()` puts `conv1d_as_matmul` in place of Keras's JAX convolution (`keras.src.backend.jax.nn.conv`, through
`keras_side.internals`, which
`keras.ops.conv` calls, and so `Conv1D`, `Conv2D`, `Conv3D` and a separable convolution's pointwise step; a transposed
or depthwise convolution has ops of its own) while any block runs: the JAX loop enters it where it calls the model
(`stateless_call`), so its step is traced with it. It takes a 1-D (rank-3) channels-last float32 convolution of one
group on a CPU, with any width, stride, dilation and padding ("causal" is Conv1D's own padding before a "valid"
convolution); every other convolution goes to Keras's own, unchanged. Only code inside a block computes the matmul: the
function is swapped process-wide while any block is open (`keras_side.swap`: blocks may nest and overlap across
threads), but it computes the matmul only where a `contextvars` depth says its caller is inside one, so another thread
(a thread started inside a block too) gets Keras's own convolution meanwhile; an asyncio task or a
`contextvars.copy_context()` made inside a block is inside it while a block is open (tested). This holds when a program
is traced: a `jax.jit` traced inside a block keeps the matmul in its compiled program, called from anywhere, as every
trainer of this package traces its step inside one.
"""
from __future__ import annotations

import contextlib
import contextvars

import jax
import jax.numpy as jnp
import keras

from keras_side import swap
from keras_side.internals import backend_nn as keras_jax_nn  # Keras's JAX `conv`, which keras.ops.conv calls
from keras_side.internals import has_training_arg

_depth = contextvars.ContextVar("as_matmuls_depth", default=0)  # blocks open in this thread's context


def _one(value) -> int | None:
    """A stride or dilation given for one spatial axis (an int or a sequence of one), else None."""
    if isinstance(value, int):
        return value
    value = tuple(value)
    return value[0] if len(value) == 1 else None


def conv1d_as_matmul(inputs, kernel, strides: int, padding: str, dilation: int):
    """`jax.lax.conv_general_dilated` of (batch, steps, channels) inputs and a (width, channels, filters) kernel, as
    Keras's JAX convolution calls it, written as the matmul of the input's patches with the flattened kernel."""
    width, channels, filters = kernel.shape
    reach = (width - 1) * dilation + 1  # the input rows one output spans
    ((low, high),) = jax.lax.padtype_to_pads(inputs.shape[1:2], (reach,), (strides,), padding.upper())
    x = jnp.pad(inputs, ((0, 0), (low, high), (0, 0)))
    steps = (x.shape[1] - reach) // strides + 1
    patches = jnp.concatenate([x[:, k * dilation:k * dilation + (steps - 1) * strides + 1:strides]
                               for k in range(width)], axis=-1)  # (batch, steps, width * channels), tap by tap
    return patches @ kernel.reshape(width * channels, filters)


def _conv(inputs, kernel, strides=1, padding="valid", data_format=None, dilation_rate=1):
    """Keras's `conv` signature: `conv1d_as_matmul` inside a block where it applies, else what was in place."""
    if _depth.get() > 0 and _applies(inputs, kernel, _one(strides), padding, data_format, _one(dilation_rate)):
        return conv1d_as_matmul(jnp.asarray(inputs), jnp.asarray(kernel), _one(strides), padding, _one(dilation_rate))
    return swap.before(keras_jax_nn, "conv")(inputs, kernel, strides, padding, data_format, dilation_rate)


def _applies(inputs, kernel, stride, padding, data_format, dilation) -> bool:
    """A 1-D channels-last float32 convolution of one group on a CPU, with an output (an empty one is left to
    Keras's own, which raises its error)."""
    if not (jax.default_backend() == "cpu" and stride and dilation and str(padding).lower() in ("valid", "same")):
        return False
    if not (len(inputs.shape) == len(kernel.shape) == 3
            and (data_format or keras.config.image_data_format()).lower() == "channels_last"):
        return False
    if not keras.backend.standardize_dtype(inputs.dtype) == keras.backend.standardize_dtype(kernel.dtype) == "float32":
        return False
    reach = (kernel.shape[0] - 1) * dilation + 1
    return inputs.shape[-1] == kernel.shape[1] and (padding.lower() == "same" or inputs.shape[1] >= reach)


def stateless_call(model, *args, **kwargs):
    """Keras's `model.stateless_call`, its 1-D convolutions as matmuls (`as_matmuls`): how every JAX trainer of
    this package calls the model, so that training, gradients and predictions compute a convolution alike. A model
    whose `call` takes no `training` is called without it, as Keras's JAX trainer calls it (the flag would be a
    TypeError)."""
    if not has_training_arg(model):
        kwargs.pop("training", None)
    with as_matmuls():
        return model.stateless_call(*args, **kwargs)


@contextlib.contextmanager
def as_matmuls():
    """While the block runs, Keras's JAX convolution is `conv1d_as_matmul` where that applies (module docstring)."""
    with swap.swapped(keras_jax_nn, "conv", _conv):
        _depth.set(_depth.get() + 1)
        try:
            yield
        finally:
            _depth.set(_depth.get() - 1)
