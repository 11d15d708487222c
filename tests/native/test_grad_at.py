"""`grad_at` on every engine: the gradient of what `fit` minimizes, at the current state. Runs once per engine."""
import numpy as np
import pytest

from compare.data import reference
from compare.referee.tolerances import GRAD_RTOL_F32, GRAD_RTOL_F64
from keras_side import models
from keras_side.determinism import seed_everything
from keras_side.precision import FLOAT64_UPSTREAM_CAUSE, TRUE_FLOAT64, float64
from tests.native.conftest import ENGINE
from tests.native.loops import flat, loop


def fixed(har):
    x, y, weights = reference.fixed_batch(har.x_train, har.y_train, seed=0)
    want = reference.mse_gradient(x, y, *weights)
    return x, y, weights, want


def test_gradient_equals_formula_and_is_not_zero(har):
    x, y, weights, want = fixed(har)
    model = models.har()
    model.set_weights(weights)
    got = loop.grad_at(model, x, y)
    assert [g.shape for g in got] == [w.shape for w in weights]
    assert np.all(flat(got) != 0)
    assert reference.relative_error(flat(got), flat(want)) <= GRAD_RTOL_F32


@pytest.mark.xfail(ENGINE not in TRUE_FLOAT64, reason=FLOAT64_UPSTREAM_CAUSE, strict=True)
def test_float64_gradient_equals_formula(har):
    x, y, weights, want = fixed(har)
    with float64():
        model = models.har()
        model.set_weights([w.astype(np.float64) for w in weights])
        got = loop.grad_at(model, x.astype(np.float64), y.astype(np.float64))
    assert all(g.dtype == np.float64 for g in got)
    error = reference.relative_error(flat(got), flat(want))
    print(f"{ENGINE}: float64 gradient relative error {error:.1e}")
    assert error <= GRAD_RTOL_F64


def test_grad_at_in_training_mode_leaves_the_models_state_as_it_was(har):
    """`training=True` moved BatchNorm's moving statistics and the Dropout's seed state on torch and TensorFlow (not
    on JAX, whose stateless_call returns them apart): two calls gave two gradients, and a later predict another
    model. Now every engine computes at the current state and leaves it there."""
    import keras

    seed_everything(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.BatchNormalization(),
                              keras.layers.Dropout(0.3, seed=3), keras.layers.Dense(1)])
    state = [v.numpy().copy() for v in model.non_trainable_variables]
    x, y = har.x_train[:64], har.y_train[:64]
    first, again = (loop.grad_at(model, x, y, training=True) for _ in range(2))
    assert all(np.array_equal(a, b) for a, b in zip(state, [v.numpy() for v in model.non_trainable_variables]))
    assert all(np.array_equal(a, b) for a, b in zip(first, again)) and any(np.any(g != 0) for g in first)


def test_a_weight_the_loss_does_not_reach_has_a_zero_gradient(har):
    """A layer built but not called: its gradient is zero, as `jax.grad` gives it. torch's autograd raised "One of the
    differentiated Tensors appears to not have been used in the graph" and TensorFlow's tape "Attempt to convert a
    value (None)"."""
    import keras

    class Idle(keras.Model):
        def __init__(self):
            super().__init__()
            self.used, self.idle = keras.layers.Dense(1), keras.layers.Dense(2)

        def build(self, shape):
            self.used.build(shape)
            self.idle.build(shape)

        def call(self, x):
            return self.used(x)

    seed_everything(0)
    model = models.ensure_built(Idle(), har.x_train)
    x, y = har.x_train[:64], har.y_train[:64]
    grads = dict(zip(map(id, model.trainable_weights), loop.grad_at(model, x, y), strict=True))
    for w in model.idle.trainable_weights:
        assert grads[id(w)].shape == tuple(w.shape) and not grads[id(w)].any()
    want = reference.mse_gradient(x, y, model.used.kernel.numpy(), model.used.bias.numpy())
    for w, g in zip((model.used.kernel, model.used.bias), want, strict=True):
        np.testing.assert_allclose(grads[id(w)], g, rtol=GRAD_RTOL_F32, atol=1e-6)


def test_grad_at_of_two_outputs_is_the_sum_of_each_outputs_loss(har):
    """With the default MSE a list of predictions was a TypeError on every engine ("unsupported operand type(s) for -:
    'list' and 'tuple'"); one loss for several outputs is each output's mean loss, summed, as `compile` takes it.
    Two heads on one input: each head's gradient is its own output's MSE gradient (the formula)."""
    import keras

    seed_everything(0)
    inputs = keras.Input((3,))
    model = keras.Model(inputs, [keras.layers.Dense(1, name="a")(inputs), keras.layers.Dense(1, name="b")(inputs)])
    x, y1, y2 = har.x_train[:64], har.y_train[:64], har.y_train[64:128]
    grads = loop.grad_at(model, x, [y1, y2])
    weights = {w.path: w.numpy() for w in model.trainable_weights}
    for head, y, found in (("a", y1, grads[:2]), ("b", y2, grads[2:])):
        want = reference.mse_gradient(x, y, weights[f"{head}/kernel"], weights[f"{head}/bias"])
        for g, w in zip(found, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=GRAD_RTOL_F32, atol=1e-6)


def test_grad_at_shapes_targets_as_fit_does(har):
    """A (n,) target against a (n, 1) prediction is the same target, as in `fit` (it broadcast to (n, n): a wrong
    gradient, without a word); a target with other rows is one error."""
    x, y, weights = reference.fixed_batch(har.x_train, har.y_train, seed=0)
    model = models.har()
    model.set_weights(weights)
    column = loop.grad_at(model, x, y)
    for got, want in zip(loop.grad_at(model, x, y[:, 0]), column, strict=True):
        np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match="y has 1 rows and x 256; give one target per example"):
        loop.grad_at(model, x, y[:1])


def test_grad_at_is_the_gradient_of_what_fit_minimizes(har):
    """`grad_at` includes the model's own losses: an L2(0.05) kernel penalty adds 2·0.05·kernel to the kernel's
    gradient, at the same weights."""
    import keras

    def dense(regularizer=None):
        return keras.Sequential([keras.Input((3,)), keras.layers.Dense(1, kernel_regularizer=regularizer)])

    x, y, weights = reference.fixed_batch(har.x_train, har.y_train, seed=0)
    plain, penalized = dense(), dense(keras.regularizers.L2(0.05))
    plain.set_weights(weights)
    penalized.set_weights(weights)
    want, got = loop.grad_at(plain, x, y), loop.grad_at(penalized, x, y)
    np.testing.assert_allclose(got[0] - want[0], 0.1 * weights[0], rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(got[1], want[1])


def test_grad_at_takes_a_loss_by_the_specs_name(har):
    """`grad_at(..., loss="mae")` is the gradient of the spec's MAE, as of a callable written for it (a name was
    "'str' object is not callable"); a name the spec does not know is its one-line SpecError."""
    import keras

    from keras_side.spec import SpecError

    x, y, weights = reference.fixed_batch(har.x_train, har.y_train, seed=0)
    model = models.har()
    model.set_weights(weights)
    named = loop.grad_at(model, x, y, loss="mae")
    by_hand = loop.grad_at(model, x, y, loss=lambda t, p: keras.ops.abs(p - t))
    for a, b in zip(named, by_hand, strict=True):
        np.testing.assert_allclose(a, b, rtol=GRAD_RTOL_F32, atol=0)
    assert not np.allclose(flat(named), flat(loop.grad_at(model, x, y)))  # not MSE's
    with pytest.raises(SpecError, match="unknown loss 'maee'"):
        loop.grad_at(model, x, y, loss="maee")
