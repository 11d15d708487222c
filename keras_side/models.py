"""Model builders, each a function returning a `keras.Model`. Call `seed_everything` right before building one.

The HAR is `Dense(1)` on (d1, s5, m22): trained with squared error it *is* the HAR regression. The 3-8-1 MLP is
written three ways (Sequential, Functional, subclassing) to show they are the same network.
"""
from __future__ import annotations

import contextlib

import keras
import numpy as np
from keras import layers

from keras_side import internals
from keras_side.arrays import keras_inputs, take
from keras_side.data import SEQUENCE_DAYS
from keras_side.spec import SpecError

HAR_INPUTS = 3
N_ASSETS = 6


def har(n_inputs: int = HAR_INPUTS) -> keras.Model:
    """The HAR regression: a linear `Dense(1)`, Sequential."""
    return keras.Sequential([keras.Input((n_inputs,)), layers.Dense(1, name="har")], name="har")


def mlp_sequential() -> keras.Model:
    return keras.Sequential(
        [keras.Input((HAR_INPUTS,)), layers.Dense(8, activation="relu", name="hidden"), layers.Dense(1, name="out")],
        name="mlp_sequential",
    )


def mlp_functional() -> keras.Model:
    x = keras.Input((HAR_INPUTS,), name="har_means")
    h = layers.Dense(8, activation="relu", name="hidden")(x)
    return keras.Model(x, layers.Dense(1, name="out")(h), name="mlp_functional")


class MLP(keras.Model):
    """The 3-8-1 MLP by subclassing. Its weights do not exist until the first call (or `build`), because the
    layers learn their input size from the first input they see."""

    def __init__(self, hidden: int = 8, **kwargs):
        super().__init__(**kwargs)
        self.hidden = layers.Dense(hidden, activation="relu", name="hidden")
        self.out = layers.Dense(1, name="out")

    def call(self, x, training=None):
        return self.out(self.hidden(x))


def mlp_subclass() -> keras.Model:
    return MLP(name="mlp_subclass")


def panel(n_assets: int = N_ASSETS) -> keras.Model:
    """The HAR inputs plus an asset id through `Embedding(n_assets, 1)`: a learned level per asset."""
    x = keras.Input((HAR_INPUTS,), name="har_means")
    asset = keras.Input((1,), dtype="int32", name="asset_id")
    level = layers.Flatten(name="flatten")(layers.Embedding(n_assets, 1, name="asset_level")(asset))
    both = layers.Concatenate(name="concat")([x, level])
    return keras.Model([x, asset], layers.Dense(1, name="har")(both), name="panel")


class NoisyHAR(keras.Model):
    """The HAR with `GaussianNoise(sigma)` on its inputs: noise only when `training=True`, so evaluation equals
    the noiseless network. The noise layer's seed is non-trainable state that a JAX loop must thread through."""

    def __init__(self, sigma: float = 0.1, **kwargs):
        super().__init__(**kwargs)
        self.noise = layers.GaussianNoise(sigma, name="noise")
        self.har = layers.Dense(1, name="har")

    def call(self, x, training=False):
        return self.har(self.noise(x, training=training))


def noisy_har(sigma: float = 0.1) -> keras.Model:
    return NoisyHAR(sigma, name="noisy_har")


def leverage() -> keras.Model:
    """Two inputs: the three HAR means, and yesterday's negative return min(r_{t-1}, 0)."""
    x = keras.Input((HAR_INPUTS,), name="har_means")
    lev = keras.Input((1,), name="negative_return")
    both = layers.Concatenate(name="concat")([x, lev])
    return keras.Model([x, lev], layers.Dense(1, name="har")(both), name="leverage")


# The zoo (keras_side.zoo lists each with its data and loss): real models for "the native loop is fit, unpacked".


def mlp_l2() -> keras.Model:
    """The 3-8-1 MLP with an L2 kernel regularizer and an L2 activity regularizer on its hidden layer."""
    return keras.Sequential([
        keras.Input((HAR_INPUTS,)),
        layers.Dense(8, activation="relu", kernel_regularizer=keras.regularizers.L2(0.05),
                     activity_regularizer=keras.regularizers.L2(0.01), name="hidden"),
        layers.Dense(1, name="out"),
    ], name="mlp_l2")


def bn_mlp(use_bias: bool = False) -> keras.Model:
    """Dense → BatchNormalization → relu → Dense. The Dense before the BatchNorm has no bias: BatchNorm subtracts
    the batch mean, so such a bias has a true-zero gradient, and Adam turns its rounding noise into full steps."""
    return keras.Sequential([
        keras.Input((HAR_INPUTS,)),
        layers.Dense(8, use_bias=use_bias, name="hidden"),
        layers.BatchNormalization(name="bn"),
        layers.ReLU(name="relu"),
        layers.Dense(1, name="out"),
    ], name="bn_mlp")


def dropout_mlp(seed: int | None = 7) -> keras.Model:
    """A 3-16-1 MLP with Dropout(0.2). The dropout is seeded: an unseeded Dropout on torch takes Keras's fast path,
    `torch.nn.functional.dropout` on torch's global generator, which `fit`'s DataLoaders also draw from (as they
    are made: before the first epoch, at each validation), so no loop of yours would draw `fit`'s masks; a seeded
    one draws from its own SeedGenerator state."""
    return keras.Sequential([
        keras.Input((HAR_INPUTS,)),
        layers.Dense(16, activation="relu", name="hidden"),
        layers.Dropout(0.2, seed=seed, name="dropout"),
        layers.Dense(1, name="out"),
    ], name="dropout_mlp")


def lstm() -> keras.Model:
    return keras.Sequential([keras.Input((SEQUENCE_DAYS, 1)), layers.LSTM(8, name="lstm"), layers.Dense(1, name="out")],
                            name="lstm")


def conv1d() -> keras.Model:
    return keras.Sequential([
        keras.Input((SEQUENCE_DAYS, 1)),
        layers.Conv1D(4, 5, activation="relu", name="conv"),
        layers.GlobalAveragePooling1D(name="pool"),
        layers.Dense(1, name="out"),
    ], name="conv1d")


def classifier() -> keras.Model:
    """Tomorrow's return up or down from the HAR means: logits, trained with binary cross-entropy."""
    return keras.Sequential([
        keras.Input((HAR_INPUTS,)),
        layers.Dense(8, activation="relu", name="hidden"),
        layers.Dense(1, name="logit"),
    ], name="classifier")


def two_horizons() -> keras.Model:
    """One trunk, two outputs: the day's log RV ("day") and the mean log RV of the next five days ("week"), from
    the HAR means through a shared Dense(8). Trained with a loss per output and `loss_weights`."""
    x = keras.Input((HAR_INPUTS,), name="har_means")
    h = layers.Dense(8, activation="relu", name="hidden")(x)
    return keras.Model(x, [layers.Dense(1, name="day")(h), layers.Dense(1, name="week")(h)], name="two_horizons")


BUILDERS = {
    "har": har,
    "mlp_sequential": mlp_sequential,
    "mlp_functional": mlp_functional,
    "mlp_subclass": mlp_subclass,
    "panel": panel,
    "noisy_har": noisy_har,
    "leverage": leverage,
}


def batchnorm_layers(model: keras.Model) -> list[layers.BatchNormalization]:
    """Every BatchNormalization in `model`, nested ones included (what data parallelism must synchronize)."""
    return [layer for layer in internals.all_layers(model) if isinstance(layer, layers.BatchNormalization)]


def drawing_layers(model: keras.Model) -> list[layers.Layer]:
    """The model's layers that draw random numbers when they train (what data parallelism must draw as one process
    would): those holding a Keras `SeedGenerator`, the model itself included (a subclassed model drawing in its own
    `call`), but Keras's own RNN cells with no dropout and Dropouts of rate 0, which may hold one and never draw
    (every Keras RNN cell holds one). A subclass with a `call` of its own counts by its generator."""
    def draws(layer) -> bool:
        if isinstance(layer, internals.DropoutRNNCell) and internals.is_keras_class(type(layer)):
            return layer.dropout > 0 or layer.recurrent_dropout > 0
        if isinstance(layer, layers.Dropout) and type(layer).call is layers.Dropout.call:
            return layer.rate > 0
        return bool(internals.seed_generators(layer))

    return [layer for layer in internals.all_layers(model, include_self=True) if draws(layer)]


def inference_drawing_layers(model: keras.Model) -> list[layers.Layer]:
    """The layers that draw in inference too: Keras's recurrent cells with dropout (an RNN draws its masks on every
    call, `training` or not), whose seed state each validation moves, and `fit` keeps."""
    return [layer for layer in drawing_layers(model) if isinstance(layer, internals.DropoutRNNCell)]


def weight_constraints(model: keras.Model) -> list:
    """Each trainable variable's constraint (`kernel_constraint=MaxNorm(...)`, ...) or None, in
    `model.trainable_variables` order. Keras's optimizer applies them after every update, `w = constraint(w)` (in
    `BaseOptimizer.apply`), so every native loop does too, after its own optimizer's step."""
    return [v.constraint for v in model.trainable_variables]


class BuilderError(SpecError, TypeError):
    """A model builder that returned something other than a `keras.Model`: a TypeError, and a SpecError, so that
    every path and launcher says it in one line."""


def ensure_built(model: keras.Model, x) -> keras.Model:
    """Create a subclassed model's weights by calling it once on a row of `x` (a no-op once built), leaving the
    seed states of the weights it already had as they were. What a model builder returned: anything but a
    `keras.Model` is a TypeError naming it."""
    if not isinstance(model, keras.Model):
        raise BuilderError(f"the model builder returned {type(model).__name__}, not a keras.Model; return the model "
                        "(a layer goes in keras.Sequential([...]))")
    if not model.built or not model.weights:
        # The call may draw (an RNN's dropout draws in inference too): the seed states of the weights there were
        # before it, as they were (else a wrapper around a built model, `fit.Wrapped`, would draw its masks one draw
        # late).
        kept = [(v, keras.ops.convert_to_numpy(v.value)) for v in model.non_trainable_variables]
        model(keras_inputs(take(x, slice(0, 1))))
        for variable, value in kept:
            variable.assign(value)
    return model


def layer_outputs(model: keras.Model, x, *, training: bool = False) -> dict[str, np.ndarray]:
    """Every layer's output on `x`, by layer name, in the model's order: for a Sequential or Functional model, one
    Keras model over the same graph with every layer's output as an output (a Functional model lists its inputs
    too; a layer called twice gives its first call). A model whose graph cannot be read so (subclassed, or holding
    a Functional sub-model, whose `output` is its own graph's) gives its final output only, under its name. A layer
    with several outputs gives "name:0", "name:1". A bfloat16 output comes back as float32 (NumPy has no bfloat16 of
    its own: `np.load` would read it back as raw bytes), exactly."""
    def numpy(value):
        value = keras.ops.convert_to_numpy(value)
        return value.astype(np.float32) if keras.backend.standardize_dtype(value.dtype) == "bfloat16" else value

    def final():
        return {model.name: numpy(model(keras_inputs(x), training=training))}

    inputs = getattr(model, "inputs", None)
    if not inputs:
        return final()
    names, outputs = [], []
    for layer in model.layers:
        out = layer.output
        parts = out if isinstance(out, (list, tuple)) else [out]
        names += [layer.name] if len(parts) == 1 else [f"{layer.name}:{i}" for i in range(len(parts))]
        outputs += list(parts)
    try:
        every_layer = keras.Model(inputs, outputs)
    except ValueError:  # not connected to the model's inputs: a sub-model's own graph
        return final()
    values = every_layer(keras_inputs(x), training=training)
    values = values if isinstance(values, (list, tuple)) else [values]  # a one-layer model's single output
    return {name: numpy(v) for name, v in zip(names, values, strict=True)}


def example_inputs(name: str, rows: int = 2):
    """Inputs of the right shape and dtype for a builder, for listings and smoke tests."""
    x = np.zeros((rows, HAR_INPUTS), np.float32)
    if name == "panel":
        return [x, np.zeros((rows, 1), np.int32)]
    if name == "leverage":
        return [x, np.zeros((rows, 1), np.float32)]
    return x


def layer_table(model: keras.Model) -> list[tuple[str, str, str, int]]:
    """(name, type, output shape, parameter count) for each layer, like `model.summary()` but as data."""
    rows = []
    for layer in model.layers:
        try:
            shape = str(tuple(layer.output.shape))
        except (AttributeError, ValueError):  # subclassed models have no symbolic outputs
            shape = "?"
        rows.append((layer.name, type(layer).__name__, shape, layer.count_params()))
    return rows


@contextlib.contextmanager
def state_kept(model):
    """The model's non-trainable variables (BatchNorm's moving statistics, a random layer's seed state) as they were
    before the block: a verb's call with `training=True` moves them on torch and TensorFlow, where JAX's
    `stateless_call` returns the new values apart."""
    kept = [v.numpy().copy() for v in model.non_trainable_variables]
    try:
        yield
    finally:
        for variable, value in zip(model.non_trainable_variables, kept):
            variable.assign(value)
