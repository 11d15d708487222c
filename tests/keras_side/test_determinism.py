import numpy as np

from keras_side import fit, models
from keras_side.spec import TrainConfig
from keras_side.determinism import seed_everything

FIVE_EPOCHS = TrainConfig(epochs=5, validate=False)


def fit_once(har, seed=None):
    if seed is not None:
        seed_everything(seed)
    return fit.train(models.har(), har, FIVE_EPOCHS).weights


def test_same_seed_gives_bit_identical_weights(har):
    first, second = fit_once(har, seed=0), fit_once(har, seed=0)
    for a, b in zip(first, second, strict=True):
        np.testing.assert_array_equal(a, b)


def test_without_reseeding_the_run_differs(har):
    first = fit_once(har, seed=0)
    second = fit_once(har)  # the random state has moved on: new initial weights and batch order
    assert any(not np.array_equal(a, b) for a, b in zip(first, second, strict=True))
