"""native.jax.fast, the path jax-native-fast: the reference loop with Keras's 1-D convolution as a matmul, tested to end
on the reference loop's weights."""
import numpy as np
import pytest

from compare.engines import paths
from compare.referee.tolerances import ZOO_ATOL
from keras_side import models
from keras_side.determinism import seed_everything
from keras_side.spec import TrainConfig
from native.jax import fast, loop
from tests.native.loops import flat
from tests.native.many_seeds import zoo_data


def both(build, data, cfg):
    """The reference loop's result and the fast path's, each from the same seed."""
    results = []
    for train in (loop.train, paths.get("jax-native-fast").train):
        seed_everything(0)
        results.append(train(build(), data, cfg))
    return results


def test_a_model_without_a_convolution_trains_to_the_bit(har):
    """Nothing to swap: the fast path is the reference loop, its weights, losses, metrics and predictions."""
    want, got = both(models.har, har, TrainConfig(epochs=5, metrics=("mae",)))
    assert got.path == "jax-native-fast" and want.path == "jax-native"
    for a, b in zip(got.weights, want.weights, strict=True):
        np.testing.assert_array_equal(a, b)
    assert got.train_loss == want.train_loss and got.val_loss == want.val_loss and got.metrics == want.metrics
    np.testing.assert_array_equal(got.test_pred, want.test_pred)


@pytest.mark.parametrize("name", ["conv1d"])
def test_a_conv1d_ends_within_the_float32_summing_order_of_the_reference_loop(panel, name):
    """The convolution's products summed in another order (CONV_AS_MATMUL_RTOL a call), step after step: within
    ZOO_ATOL after the zoo's 3 epochs, as any two summing orders are; not the same bits."""
    data = zoo_data(panel, name)
    want, got = both(models.conv1d, data, TrainConfig(epochs=3))
    assert max(np.max(np.abs(a - b)) for a, b in zip(got.weights, want.weights)) > 0  # a matmul, not XLA's conv
    np.testing.assert_allclose(flat(got.weights), flat(want.weights), atol=ZOO_ATOL, rtol=0)
    np.testing.assert_allclose(got.val_loss, want.val_loss, rtol=1e-5)


def test_the_fast_verbs_are_the_loops(har):
    seed_everything(0)
    model = models.har()
    np.testing.assert_array_equal(fast.predict(model, har.x_test), loop.predict(model, har.x_test))
    for a, b in zip(fast.grad_at(model, har.x_val, har.y_val), loop.grad_at(model, har.x_val, har.y_val)):
        np.testing.assert_array_equal(a, b)
