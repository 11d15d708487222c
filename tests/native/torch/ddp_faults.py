"""A model builder for the data-parallel fault test: rank 1 dies while building it, as a process that crashes."""
import os

from keras_side import models


def dies_on_rank_1():
    if os.environ.get("RANK") == "1":
        os._exit(3)
    return models.har()
