"""The first loop of this process's engine (`python -m native.<engine>.first_loop`, docs/lesson.md) ends on the
reference loop's weights, to the bit, and near OLS's slopes. Its shape is checked engine-free:
tests/compare/test_lesson.py."""
import importlib
import re

import numpy as np

from compare.referee.tolerances import SLOPE_ATOL
from keras_side import models
from keras_side.determinism import seed_everything
from keras_side.spec import TrainConfig
from tests.conftest import REPO
from tests.native.conftest import ENGINE
from tests.native.loops import loop

first_loop = importlib.import_module(f"native.{ENGINE}.first_loop")
# The slopes are printed to 3 decimals: another CPU or release may round one across its last digit (1e-3), no further.
PRINTED_ATOL = 1.5e-3


def test_the_first_loop_is_the_reference_loop_on_the_har(ols_fit, capsys):
    model, data = first_loop.main()
    printed = capsys.readouterr().out
    seed_everything(first_loop.SEED)
    want = loop.train(models.har(), data, TrainConfig())
    for got, expected in zip(model.get_weights(), want.weights, strict=True):
        np.testing.assert_array_equal(got, expected)
    _, slopes = data.scaling.to_original(*model.get_weights())
    np.testing.assert_allclose(slopes, ols_fit.slopes, atol=SLOPE_ATOL, rtol=0)
    assert f"epoch {first_loop.EPOCHS}:" in printed and "OLS:" in printed
    if ENGINE == "torch":  # docs/lesson.md prints torch's answer line: this run's
        shown = re.search(r"```text\n(slopes .*)\n```", (REPO / "docs" / "lesson.md").read_text()).group(1)
        line = next(line for line in printed.splitlines() if line.startswith("slopes"))
        numbers = [[float(v) for v in re.findall(r"-?\d+\.\d*", text)] for text in (shown, line)]
        assert len(numbers[0]) == len(numbers[1]) == 6, (shown, line)
        np.testing.assert_allclose(numbers[1], numbers[0], atol=PRINTED_ATOL, rtol=0)
