"""Every Keras internal this package uses (a `keras.src` module, an underscore attribute), each with why.

Keras promises its public API (`keras.*`), not these. The reference loops (`native/<engine>/loop.py`) name none
(`tests/compare/test_lesson.py`); the fast paths, and the checks and model helpers of `keras_side` that every path
calls (`checks`, `models`), do, through this module only, so that a Keras release that moves one breaks here,
by name: `tests/keras_side/test_internals.py` asks each of them of the installed Keras and fails with a message
naming the Keras version. Engine-free: the engine's own Keras modules are the ones Keras loaded for its backend.
"""
from __future__ import annotations

import types

import keras

# The running engine's Keras modules (`keras/src/backend/<engine>/`): Keras loaded them for its backend, so naming
# them costs no import. Keras exports no getter for its torch device, nor the generator its seeded dropout draws from.
from keras.src.backend import core as backend_core
from keras.src.backend import get_autocast_scope  # whether `Layer.__call__` would cast inside a mixed-precision scope
from keras.src.backend import nn as backend_nn  # keras.ops.conv calls its `conv`: JAX's fast path swaps it for a matmul
from keras.src.backend import random as backend_random  # keras.random.dropout calls its `dropout`: a launcher swaps it
from keras.src.backend.common import global_state  # where `keras.utils.set_random_seed` keeps the global seed
from keras.src.layers.regularization.spatial_dropout import BaseSpatialDropout  # the SpatialDropouts' base: not public
from keras.src.layers.rnn.dropout_rnn_cell import DropoutRNNCell  # a recurrent cell's dropout: no public class
from keras.src.losses import LossFunctionWrapper  # what `compile(loss=fn)` wraps a plain function in: not exported
from keras.src.losses.loss import squeeze_or_expand_to_same_rank  # how `fit` shapes targets against outputs
from keras.src.models import functional  # the Functional graph runner's pieces: `Functional.call` exposes no hook
from keras.src.random.seed_generator import GLOBAL_SEED_GENERATOR  # the global-state keys of Keras's global seed,
from keras.src.utils.rng_utils import GLOBAL_RANDOM_SEED  # which set_random_seed sets with TensorFlow's alongside

__all__ = [  # Keras's classes and functions as they are, then ours around an underscore attribute
    "BaseSpatialDropout", "DropoutRNNCell", "LossFunctionWrapper", "squeeze_or_expand_to_same_rank", "backend_random",
    "backend_nn",
    "global_generator_layers", "all_layers", "sublayers", "has_training_arg", "held_losses", "clear_losses",
    "remat_mode", "keras_mask", "is_keras_class", "seed_generators", "initial_seed", "optimizer_variables",
    "input_layer_name", "is_functional", "has_graph", "run_graph", "keras_operation", "reduction_axes",
    "untrack_reduction_axes", "replace_moments", "autocast_scope", "torch_device", "torch_seed_generator",
    "reset_global_seed",
]


def global_generator_layers(model) -> list:
    """The layers whose masks come from torch's global generator: Keras's dropout unseeded (a Dropout with no noise
    shape, a recurrent cell's dropout) is `torch.nn.functional.dropout` on torch (Keras's torch `random.dropout`),
    and `fit`'s data loader draws from that generator too (docs/zoo.md): the loop draws other masks than `fit`."""
    def unseeded(layer) -> bool:
        generator = getattr(layer, "seed_generator", None)
        return generator is not None and initial_seed(generator) is None and (
            (isinstance(layer, keras.layers.Dropout) and type(layer).call is keras.layers.Dropout.call  # not a
             and layer.noise_shape is None and 0 < layer.rate < 1)  # SpatialDropout: it passes a noise shape
            or (isinstance(layer, DropoutRNNCell) and (layer.dropout > 0 or layer.recurrent_dropout > 0)))

    return [layer for layer in all_layers(model, include_self=True) if unseeded(layer)]


# --- Layers and models: what Keras tracks, and what `Layer.__call__` decides by ---

def all_layers(model, include_self: bool = False) -> list:
    """Every layer `model` holds, nested ones included (`_flatten_layers`): `model.layers` lists only the top ones."""
    return list(model._flatten_layers(include_self=include_self))


def sublayers(layer) -> list:
    """The layers `layer` holds directly (`_layers`): Keras has no public list for a plain `Layer`'s."""
    return layer._layers


def has_training_arg(layer) -> bool:
    """Whether `layer.call` takes `training` (`_call_has_training_arg`): `Layer.__call__` passes it only then."""
    return layer._call_has_training_arg


def held_losses(layer) -> list:
    """The losses `layer` holds from its last call or an `add_loss` (`_losses`), which its next `__call__` clears;
    `layer.losses` adds the weight regularizers' and the sublayers'."""
    return layer._losses


def clear_losses(model) -> None:
    """Empty every layer's held losses (`_clear_losses`), as `Layer.__call__` does before an outermost call."""
    model._clear_losses()


def remat_mode(layer):
    """The layer's rematerialization mode (`_remat_mode`), None when `__call__` calls `call` as it is."""
    return getattr(layer, "_remat_mode", None)


def keras_mask(x):
    """The mask Keras put on a tensor (`_keras_mask`, what `compute_mask` returned), or None."""
    return getattr(x, "_keras_mask", None)


def is_keras_class(cls, package: str = "") -> bool:
    """One of Keras's own classes (in `keras/src/<package>`), not a subclass of yours: its `call` does only what the
    class's documentation says."""
    return cls.__module__.startswith(f"keras.src.{package}")


def seed_generators(layer) -> list:
    """The `SeedGenerator`s the layer itself tracks (`_seed_generators`): what it draws from when it trains."""
    return layer._seed_generators


def initial_seed(generator):
    """The seed a `SeedGenerator` was made with (`_initial_seed`), None when unseeded (Keras then seeds it from the
    global generator, or, for dropout on torch, draws from torch's)."""
    return generator._initial_seed


def optimizer_variables(optimizer) -> list:
    """The variables a built optimizer updates when `apply` is given none (`_trainable_variables`)."""
    return optimizer._trainable_variables


def input_layer_name(tensor) -> str:
    """The name of the `Input` layer a symbolic input tensor comes from (`_keras_history`), else the tensor's own."""
    history = getattr(tensor, "_keras_history", None)
    return history.operation.name if history else tensor.name


# --- The Functional graph runner ---

def is_functional(model) -> bool:
    """`model` is a Functional model of Keras's own class (`keras.Model(inputs, outputs)`; not a subclass, not a
    Sequential model), whose `call` is the graph runner."""
    return type(model) is functional.Functional


def has_graph(model) -> bool:
    """A Sequential model built from an `Input` (`_functional`): its call runs its graph, not its layers in order."""
    return bool(model._functional)


def run_graph(model, x, operation):
    """What `Functional.call` does with `operation(op)` as the runner's `operation_fn` (which calls a node's layer):
    the inputs standardized (`_standardize_inputs`), the graph run node by node (`_run_through_graph`), one output
    unpacked."""
    outputs = model._run_through_graph(model._standardize_inputs(x), operation_fn=operation)
    return functional.unpack_singleton(outputs)


def keras_operation(op, training: bool):
    """The runner's own call of a node's layer (`functional.operation_fn`): the training flag given to every layer
    that takes it, overriding the node's recorded one."""
    return functional.operation_fn(op, training=training)


# --- BatchNormalization ---

def reduction_axes(layer) -> tuple:
    """The axes a BatchNormalization takes its batch moments over (`_reduction_axes`)."""
    return tuple(layer._reduction_axes)


def untrack_reduction_axes(layer) -> None:
    """A BatchNormalization's reduction axes as a tuple, set past Keras's attribute tracking (which would wrap it
    into a `TrackedList` again): the same axes, which `torch.compile` can hand to `torch.mean`."""
    object.__setattr__(layer, "_reduction_axes", reduction_axes(layer))


def replace_moments(layer, moments) -> None:
    """`layer`'s batch moments from `moments(inputs, mask) -> (mean, variance)`, bound to the layer: a
    BatchNormalization's `call` asks its `_moments` method for them (a data-parallel loop's global moments)."""
    layer._moments = types.MethodType(moments, layer)


# --- The backend's own state ---

def autocast_scope():
    """The Keras autocast scope open around this call, or None."""
    return get_autocast_scope()


def torch_device() -> str:
    """The device Keras puts torch tensors on (its `get_device`; torch only)."""
    return backend_core.get_device()


def torch_seed_generator(generator):
    """The `torch.Generator` at a `SeedGenerator`'s state, which Keras's seeded dropout draws its mask from and
    advances the state past (torch only)."""
    return backend_random.torch_seed_generator(generator)


def reset_global_seed(seed: int) -> None:
    """Keras's own part of `keras.utils.set_random_seed(seed)`: the global seed set and the global `SeedGenerator`
    dropped, so that unseeded draws start afresh from it."""
    global_state.set_global_attribute(GLOBAL_RANDOM_SEED, seed)
    global_state.set_global_attribute(GLOBAL_SEED_GENERATOR, None)
