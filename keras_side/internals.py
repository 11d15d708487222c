"""Every Keras internal this package uses (a `keras.src` module, an underscore attribute), each with why.

Keras promises its public API (`keras.*`), not these. The reference loops (`native/<engine>/loop.py`) use none;
the fast paths and a few checks do, through this module only, so that a Keras release that moves one breaks here,
by name: `tests/keras_side/test_internals.py` asks each of them of the installed Keras and fails with a message
naming the Keras version.
"""
from __future__ import annotations

import keras

from keras.src.layers.rnn.dropout_rnn_cell import DropoutRNNCell  # a recurrent cell's dropout: no public class

from keras_side.models import drawing_layers


def global_generator_layers(model) -> list:
    """The layers whose masks come from torch's global generator: Keras's dropout unseeded (a Dropout with no noise
    shape, a recurrent cell's dropout) is `torch.nn.functional.dropout` on torch (`keras.src.backend.torch.random`),
    and `fit`'s data loader draws from that generator too (docs/zoo.md): the loop draws other masks than `fit`."""
    def unseeded(layer) -> bool:
        generator = getattr(layer, "seed_generator", None)
        return generator is not None and generator._initial_seed is None and (
            (isinstance(layer, keras.layers.Dropout) and type(layer).call is keras.layers.Dropout.call  # not a
             and layer.noise_shape is None and 0 < layer.rate < 1)  # SpatialDropout: it passes a noise shape
            or (isinstance(layer, DropoutRNNCell) and (layer.dropout > 0 or layer.recurrent_dropout > 0)))

    return [layer for layer in drawing_layers(model) if unseeded(layer)]
