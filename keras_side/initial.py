"""A model's initial weights for many seeds at once, each drawn with the model's own initializers.

    init = InitialWeights.of(build, x)        # builds the model once, noting what every variable starts from
    trainable, non_trainable = init.draw([0, 1, 2])    # NumPy lists, each array stacked (seeds, ...)

Every variable starts from what its layer gave it: a `Constant(0.5)` bias is 0.5 for every seed, an LSTM's
recurrent kernel is orthogonal, BatchNorm's moving variance is ones. A random initializer that the model left
unseeded (Keras's defaults: `glorot_uniform`, `orthogonal`...) draws anew for every seed, with a seed of its own per
(seed, variable); one the user seeded draws the same weights for every seed, as building the model again would.
A Dropout's (or any layer's) seed generator starts at its own seed per model, so each draws its own masks.

Why not build the model once per seed: a build costs far more than every seed's draws together (measured in
docs/seeds.md, "The many-model trainers").
Variables are noted as Keras creates them: `keras.Variable.__init__` sees each one's initializer, which the
variable forgets once it holds its value.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from unittest import mock

import keras
import numpy as np

from keras_side.models import ensure_built

SEED_STATE = "seed_generator_state"  # the name Keras gives a SeedGenerator's state variable


@dataclass(frozen=True)
class InitialWeights:
    """Each trainable and non-trainable variable of one model (in `model.trainable_variables` and
    `model.non_trainable_variables` order): its shape, dtype and what it starts from."""

    model: keras.Model
    trainable: tuple
    non_trainable: tuple

    @classmethod
    def of(cls, build, x) -> InitialWeights:
        """Build the model once (on a row of `x`), noting each variable's initializer, or its value when it was
        created from one."""
        starts = {}
        create = keras.Variable.__init__

        def noting(variable, initializer=None, *args, **kwargs):
            create(variable, initializer, *args, **kwargs)
            if isinstance(initializer, str):
                initializer = keras.initializers.get(initializer)
            starts[id(variable)] = initializer if callable(initializer) else keras.ops.convert_to_numpy(
                variable.value)

        with mock.patch.object(keras.Variable, "__init__", noting):
            model = ensure_built(build(), x)
        note = lambda variables: tuple((v, starts[id(v)]) for v in variables)  # noqa: E731
        return cls(model, note(model.trainable_variables), note(model.non_trainable_variables))

    def draw(self, seeds) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """(trainable, non_trainable): every variable's start for each seed, stacked on a first axis."""
        variables = self.trainable + self.non_trainable
        values = [np.stack([_start(v, start, seed, i) for seed in seeds]) for i, (v, start) in enumerate(variables)]
        return values[: len(self.trainable)], values[len(self.trainable):]

    def draw_grid(self, shape: tuple[int, ...], seed: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """`draw` for a grid of models, each array stacked (*shape, ...), every model's seed from `seed`."""
        return tuple([a.reshape(*shape, *a.shape[1:]) for a in arrays]
                     for arrays in self.draw(grid_seeds(shape, seed)))


def grid_seeds(shape: tuple[int, ...], seed: int) -> list[int]:
    """A seed per model of a grid of models (a walk-forward's assets × refits), all derived from the run's seed."""
    return [seed * 2**24 + i for i in range(int(np.prod(shape)))]


def own_seed(seed: int, index: int) -> int:
    """The seed of variable `index` in the model of `seed`: distinct per pair, in Keras's seed range."""
    return int(np.random.default_rng([seed, index]).integers(1, 10**9))


def _start(variable, start, seed: int, index: int) -> np.ndarray:
    if not callable(start):  # created from a value: the same for every seed
        return start
    if variable.name == SEED_STATE:  # a SeedGenerator starts at [seed, 0]
        return np.array([own_seed(seed, index), 0], dtype=keras.backend.standardize_dtype(variable.dtype))
    if isinstance(start, keras.initializers.Initializer) and getattr(start, "_init_seed", 0) is None:
        start = copy.copy(start)  # a random initializer the model left unseeded: a seed of its own
        start.seed = own_seed(seed, index)
    return keras.ops.convert_to_numpy(start(tuple(variable.shape), dtype=variable.dtype))
