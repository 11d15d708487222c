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
