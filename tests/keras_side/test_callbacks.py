"""The early-stopping rule every loop applies is Keras's: the same stopping epoch and best epoch as
`keras.callbacks.EarlyStopping(restore_best_weights=True)` on the same validation losses."""
import keras
import numpy as np
import pytest

from keras_side import models
from keras_side.callbacks import EarlyStopping


def keras_verdict(losses, patience):
    model = models.har()
    model.stop_training = False  # what fit sets before its first epoch
    callback = keras.callbacks.EarlyStopping(monitor="val_loss", patience=patience, restore_best_weights=True)
    callback.set_model(model)
    callback.on_train_begin()
    for epoch, value in enumerate(losses):
        model.set_weights([np.full((3, 1), epoch, np.float32), np.zeros(1, np.float32)])  # weights name the epoch
        callback.on_epoch_end(epoch, {"val_loss": value})
        if model.stop_training:
            break
    callback.on_train_end()
    return epoch, int(model.get_weights()[0][0, 0])


def our_verdict(losses, patience):
    stop = EarlyStopping(patience)
    for epoch, value in enumerate(losses):
        if stop.update(epoch, value, lambda: epoch):
            break
    return epoch, stop.best_weights


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("patience", [1, 2, 4])
def test_the_rule_stops_and_restores_as_keras_does(seed, patience):
    rng = np.random.default_rng(seed)
    losses = list(np.cumsum(rng.normal(0, 1, size=12)) + rng.choice([0.0, 1.0], size=12))  # ups, downs, ties
    assert our_verdict(losses, patience) == keras_verdict(losses, patience)
