"""What a worker's request names, as every task reads it: the model builder ("module:function", the HAR's unless it
names another), and a fresh model from it, built for the data. Worker side: imports Keras through the builder."""
from __future__ import annotations

from keras_side import models
from keras_side.data import HarData
from keras_side.spec import resolve
from keras_side.zoo import ZOO


def builder(request: dict):
    """The request's model builder (the HAR's unless it names another)."""
    return resolve(request.get("build", ZOO["har"].build))


def model_for(request: dict, data: HarData):
    """A fresh model from the request's builder, built for `data`."""
    return models.ensure_built(builder(request)(), data.x_train)
