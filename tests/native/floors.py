"""The bench's floors (compare.speed.floors) compute what the native loop computes, without Keras: from the same
(zero) start, the same batches and Adam, the same weights. Imported by each engine's test file."""
import numpy as np

from compare.tolerances import VMAP_VS_ALONE_ATOL
from keras_side import models
from keras_side.spec import TrainConfig

CFG = TrainConfig(epochs=3, validate=False)


def check_floor_trains_as_the_loop(har, floor, train_loop):
    trained = []
    floor(har, CFG, trained=trained)
    model = models.ensure_built(models.har(), har.x_train)
    model.set_weights([np.zeros_like(w) for w in model.get_weights()])
    train_loop(model, har, CFG)
    assert not np.allclose(trained[0], 0)  # it trained
    for got, want in zip(trained, model.get_weights(), strict=True):
        np.testing.assert_allclose(got, want, atol=VMAP_VS_ALONE_ATOL, rtol=0)
