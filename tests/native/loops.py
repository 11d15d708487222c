"""The native loop of this pytest process's engine, and helpers the native tests share."""
import numpy as np

from compare import paths
from tests.native.conftest import ENGINE

loop = paths.loop(ENGINE)


def original_mse(result, data) -> float:
    """Test MSE in original units."""
    return float(np.mean((result.test_pred - data.y_test) ** 2)) * data.scaling.y_std**2


def flat(arrays) -> np.ndarray:
    return np.concatenate([np.ravel(a) for a in arrays])
