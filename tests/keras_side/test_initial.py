"""Each seed's initial weights come from the model's own initializers (keras_side.initial). Runs once per engine."""
import keras
import numpy as np

from keras_side import models
from keras_side.initial import SEED_STATE, InitialWeights

X = np.zeros((4, 3), np.float32)


def own_initializers():
    """A kernel Keras draws, a bias that is 0.5, a kernel the user seeded, and BatchNorm's statistics."""
    inputs = keras.Input((3,))
    h = keras.layers.Dense(4, bias_initializer=keras.initializers.Constant(0.5))(inputs)
    h = keras.layers.BatchNormalization()(h)
    h = keras.layers.Dropout(0.1)(h)
    out = keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(seed=7))(h)
    return keras.Model(inputs, out)


def test_each_variable_starts_from_its_own_initializer():
    init = InitialWeights.of(own_initializers, X)
    (kernel, bias, gamma, beta, head, head_bias), state = init.draw([0, 1, 2])
    assert kernel.shape == (3, 3, 4) and not np.allclose(kernel[0], kernel[1])  # drawn anew per seed
    limit = np.sqrt(6 / (3 + 4))
    assert np.all(np.abs(kernel) <= limit)  # Glorot-uniform's range
    np.testing.assert_array_equal(bias, 0.5)  # Constant(0.5), for every seed
    np.testing.assert_array_equal(gamma, 1.0)
    np.testing.assert_array_equal(beta, 0.0)
    np.testing.assert_array_equal(head[0], head[1])  # the user's seeded initializer: the same for every seed
    np.testing.assert_array_equal(head_bias, 0.0)
    names = [v.name for v in init.model.non_trainable_variables]
    moving_var = state[names.index("moving_variance")]
    np.testing.assert_array_equal(moving_var, 1.0)
    seeds = state[names.index(SEED_STATE)]  # Dropout's generator: its own seed per model
    assert len(set(seeds[:, 0].tolist())) == 3


def test_the_same_seed_draws_the_same_weights():
    init = InitialWeights.of(models.har, X)
    for a, b in zip(init.draw([5, 6])[0], init.draw([5])[0], strict=True):
        np.testing.assert_array_equal(a[:1], b)


def test_an_lstm_starts_orthogonal_for_every_seed():
    init = InitialWeights.of(models.lstm, np.zeros((4, 22, 1), np.float32))
    names = [v.name for v in init.model.trainable_variables]
    recurrent = init.draw([0, 1])[0][names.index("recurrent_kernel")]  # (seeds, units, 4·units)
    for r in recurrent:  # Keras's Orthogonal over (units, 4·units): orthonormal rows
        np.testing.assert_allclose(r @ r.T, np.eye(r.shape[0]), atol=1e-5)
    assert not np.allclose(recurrent[0], recurrent[1])
