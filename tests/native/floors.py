"""The bench's floors (compare.speed.floors) compute what the native loop computes, without Keras: from the Keras
model's own first weights (and seed states), the same batches and Adam, the same weights at the end. Imported by each
engine's test file, for every model the floors write on it (`floors.RAW`)."""
import numpy as np

from compare.speed import floors
from compare.referee.tolerances import FLOOR_VS_LOOP_ATOL
from keras_side import models
from keras_side.spec import TrainConfig
from keras_side.zoo import ZOO
from tests.native.many_seeds import zoo_data

CFG = TrainConfig(epochs=3, validate=False)
MODELS = floors.RAW  # engine -> its models with a floor


def check_floor_trains_as_the_loop(panel, model: str, floor, train_loop):
    data = zoo_data(panel, model)
    keras_model = models.ensure_built(ZOO[model].builder()(), data.x_train)
    start = keras_model.get_weights()
    trained = []
    floor(data, CFG, start, model, trained=trained, seeds=floors.seed_states(keras_model))
    train_loop(keras_model, data, CFG)
    assert max(np.max(np.abs(a - b)) for a, b in zip(trained, start)) > 1e-3  # it trained
    for got, want in zip(trained, keras_model.get_weights(), strict=True):
        np.testing.assert_allclose(got, want, atol=FLOOR_VS_LOOP_ATOL, rtol=0)
