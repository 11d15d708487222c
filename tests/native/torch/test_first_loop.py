"""The first torch loop (`python -m native.torch.first_loop`) ends on the reference loop's weights, to the bit, and
near OLS's slopes."""
import numpy as np

from compare.referee.tolerances import SLOPE_ATOL
from keras_side import models
from keras_side.determinism import seed_everything
from keras_side.spec import TrainConfig
from native.torch import first_loop, loop


def test_the_first_loop_is_the_reference_loop_on_the_har(ols_fit, capsys):
    model, data = first_loop.main()
    printed = capsys.readouterr().out
    seed_everything(0)
    want = loop.train(models.har(), data, TrainConfig())
    for got, expected in zip(model.get_weights(), want.weights, strict=True):
        np.testing.assert_array_equal(got, expected)
    _, slopes = data.scaling.to_original(*model.get_weights())
    np.testing.assert_allclose(slopes, ols_fit.slopes, atol=SLOPE_ATOL, rtol=0)
    assert "epoch 40:" in printed and "OLS:" in printed
