import keras
import numpy as np

from compare.referee.tolerances import SHARPE_ATOL
from keras_side.ops import mean_squared_error, sharpe_ratio
from tests.keras_side.conftest import ENGINE


def engine_tensor_type():
    if ENGINE == "torch":
        import torch

        return torch.Tensor
    if ENGINE == "jax":
        import jax

        return jax.Array
    import tensorflow as tf

    return tf.Tensor


def test_sharpe_matches_pandas_on_every_asset(panel):
    wide = panel.pivot(index="fecha", columns="activo", values="rendimiento")
    want = wide.apply(lambda r: r.mean() / r.std(ddof=0) * np.sqrt(252)).to_numpy()
    got = sharpe_ratio(wide.to_numpy(np.float32))
    assert isinstance(got, engine_tensor_type())
    np.testing.assert_allclose(keras.ops.convert_to_numpy(got), want, atol=SHARPE_ATOL, rtol=0)


def test_mse_is_the_plain_mean():
    y, p = np.array([[1.0], [2.0]], np.float32), np.array([[2.0], [4.0]], np.float32)
    assert float(keras.ops.convert_to_numpy(mean_squared_error(y, p))) == 2.5
