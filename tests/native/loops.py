"""The native loop of this pytest process's engine, and helpers the native tests share."""
import numpy as np

from compare.engines import paths
from tests.native.conftest import ENGINE

loop = paths.loop(ENGINE)


def val_mse(model, data) -> float:
    """The model's MSE on the validation rows, in original units: what the last validation loss reports."""
    return float(np.mean((loop.predict(model, data.x_val) - data.y_val) ** 2)) * data.scaling.y_std**2


def flat(arrays) -> np.ndarray:
    return np.concatenate([np.ravel(a) for a in arrays])


def constrained_mlp(constrained: bool = True):
    """A 3-6-1 MLP whose kernels carry a `MaxNorm(0.3)` and a `NonNeg` constraint (or none), both binding on the HAR
    at a rate of 0.05."""
    import keras

    keep = (lambda c: c) if constrained else (lambda c: None)  # noqa: E731
    return keras.Sequential([keras.Input((3,)),
                             keras.layers.Dense(6, kernel_constraint=keep(keras.constraints.MaxNorm(0.3))),
                             keras.layers.Dense(1, kernel_constraint=keep(keras.constraints.NonNeg()))])
