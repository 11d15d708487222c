"""native.jax.convolution: Keras's 1-D convolution as a matmul over the input's patches, what the JAX fast paths run."""
import contextvars
import itertools
import threading

import jax
import jax.numpy as jnp
import keras
import numpy as np
import pytest
from keras.src.backend.jax import nn as keras_jax_nn

from compare.referee.tolerances import CONV_AS_MATMUL_RTOL, SCAN_VS_LOOP_ATOL
from keras_side import models
from keras_side.determinism import seed_everything
from keras_side.spec import TrainConfig
from native.jax import convolution
from native.jax import fast as jax_fast
from native.jax import loop as jax_loop
from native.jax import scan as jax_scan
from tests.native.loops import flat
from tests.native.many_seeds import zoo_data

KERAS_CONV = keras_jax_nn.conv


def close(got, want):
    """Within CONV_AS_MATMUL_RTOL of the largest magnitude of `want`."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=0, atol=CONV_AS_MATMUL_RTOL * np.abs(want).max())


# Every width (4: "same" pads one more row after than before) with each padding, under three settings of channels,
# stride and dilation that together take every value of each.
@pytest.mark.parametrize("width,channels,stride,dilation,padding", [
    (width, *setting, padding) for width, padding in itertools.product((1, 4, 5), ("valid", "same"))
    for setting in ((1, 1, 1), (3, 3, 2), (3, 1, 2))])
def test_conv1d_as_matmul_is_xlas_convolution_and_its_gradients(width, channels, stride, dilation, padding):
    rng = np.random.default_rng(width * 100 + channels * 10 + stride + dilation)
    x = jnp.asarray(rng.normal(size=(4, 22, channels)).astype(np.float32))
    kernel = jnp.asarray(rng.normal(size=(width, channels, 4)).astype(np.float32))
    weights = jnp.asarray(rng.normal(size=KERAS_CONV(x, kernel, stride, padding, "channels_last", dilation).shape))

    def keras_conv(x, kernel):
        return KERAS_CONV(x, kernel, stride, padding, "channels_last", dilation)

    def ours(x, kernel):
        return convolution.conv1d_as_matmul(x, kernel, stride, padding, dilation)

    close(ours(x, kernel), keras_conv(x, kernel))
    for got, want in zip(jax.grad(lambda *a: jnp.sum(ours(*a) * weights), argnums=(0, 1))(x, kernel),
                         jax.grad(lambda *a: jnp.sum(keras_conv(*a) * weights), argnums=(0, 1))(x, kernel)):
        close(got, want)


@pytest.fixture
def calls(monkeypatch):
    """How many times the block's convolution was computed as a matmul."""
    counted = []
    matmul = convolution.conv1d_as_matmul
    monkeypatch.setattr(convolution, "conv1d_as_matmul", lambda *a: counted.append(a) or matmul(*a))
    return counted


@pytest.mark.parametrize("layer,shape,ours", [
    (lambda: keras.layers.Conv1D(4, 5, padding="causal", dilation_rate=2), (4, 22, 1), True),
    (lambda: keras.layers.Conv1D(4, 3, strides=2, padding="same"), (4, 22, 3), True),
    (lambda: keras.layers.Conv1D(4, 3, groups=2), (4, 22, 2), False),  # two groups
    (lambda: keras.layers.Conv1D(4, 3, dtype="bfloat16"), (4, 22, 1), False),
    (lambda: keras.layers.Conv2D(4, 3), (4, 8, 8, 1), False),
])
def test_as_matmuls_takes_one_group_float32_1d_convolutions_and_leaves_the_rest_to_keras(layer, shape, ours, calls):
    layer = layer()
    x = np.random.default_rng(0).normal(size=shape).astype(np.float32)
    want = layer(x)
    with convolution.as_matmuls():
        got = layer(x)
    assert bool(calls) == ours
    if ours:
        close(got, want)
    else:
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))  # Keras's own convolution, to the bit


def test_a_thread_outside_every_block_computes_kerass_convolution_while_another_is_inside(calls):
    """The swap is process-wide while a block is open, the matmul only for code inside one: a thread outside every
    block, started inside this thread's, computes Keras's own convolution, to the bit."""
    layer, x = keras.layers.Conv1D(4, 5), np.random.default_rng(0).normal(size=(4, 22, 1)).astype(np.float32)
    want, got = layer(x), {}
    with convolution.as_matmuls():
        thread = threading.Thread(target=lambda: got.update(y=layer(x)))
        thread.start()
        thread.join()
    assert not calls
    np.testing.assert_array_equal(np.asarray(got["y"]), np.asarray(want))


def test_a_context_copied_inside_a_block_is_inside_it(calls):
    """What an asyncio task made inside a block runs in, a copy of the block's context, is inside it, here run by
    another thread while the block is open."""
    layer, x = keras.layers.Conv1D(4, 5), np.zeros((2, 22, 1), np.float32)
    with convolution.as_matmuls():
        thread = threading.Thread(target=contextvars.copy_context().run, args=(layer, x))
        thread.start()
        thread.join()
    assert calls


def test_as_matmuls_gives_keras_its_convolution_back_after_an_error_and_keeps_its_empty_output_error():
    with pytest.raises(ValueError, match="empty output"), convolution.as_matmuls():
        assert keras_jax_nn.conv is not KERAS_CONV
        keras.ops.conv(np.zeros((2, 3, 1), np.float32), np.zeros((5, 1, 4), np.float32))  # 3 steps, a width of 5
    assert keras_jax_nn.conv is KERAS_CONV


def test_every_verb_of_the_fast_paths_computes_a_conv1d_through_the_matmul_and_the_loops_do_not(panel, calls):
    data = zoo_data(panel, "conv1d")
    cfg = TrainConfig(epochs=2, validate=False)
    found = {}
    for name, module in (("fast", jax_fast), ("scan", jax_scan)):
        seed_everything(0)
        calls.clear()
        found[name] = module.train(model := models.conv1d(), data, cfg)
        assert calls, name  # traced through conv1d_as_matmul
    np.testing.assert_allclose(flat(found["scan"].weights), flat(found["fast"].weights), atol=SCAN_VS_LOOP_ATOL,
                               rtol=0)
    for verb in (lambda: jax_fast.predict(model, data.x_test), lambda: jax_fast.grad_at(model, data.x_test,
                                                                                          data.y_test)):
        calls.clear()
        verb()
        assert calls
    calls.clear()
    seed_everything(0)
    jax_loop.train(model := models.conv1d(), data, cfg)  # the reference loop: Keras's own convolution
    jax_loop.predict(model, data.x_test)
    jax_loop.grad_at(model, data.x_test, data.y_test)
    assert not calls
    assert keras_jax_nn.conv is KERAS_CONV