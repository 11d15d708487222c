"""Model builders for the data-parallel fault tests: the second process dies while building the model, as a process
that crashes (torchrun sets RANK; a jax.distributed process knows its index)."""
import os

import keras

from keras_side import models


def dies_in_the_second_process():
    second = os.environ.get("RANK") == "1"
    if keras.config.backend() == "jax":
        import jax

        second = jax.process_index() == 1
    if second:
        os._exit(3)
    return models.har()
