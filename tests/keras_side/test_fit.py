import numpy as np
import pytest

from compare.referee import checks
from keras_side import fit, models
from keras_side.determinism import seed_everything
from keras_side.results import Result
from keras_side.spec import TrainConfig
from tests.keras_side.conftest import ENGINE


@pytest.fixture(scope="module")
def trained(har, converged):
    seed_everything(0)
    model = models.har()
    return model, fit.train(model, har, converged)


def test_fit_reaches_ols(trained, har, ols_fit):
    """The referee's converged check (`compare --converge`): every seed reaches OLS's slopes and test MSE, up to
    mini-batch noise; at the run's seed no better or worse than any other."""
    found = checks.ols_reached(trained[1], har, ols_fit, checks.Band.converged())
    assert len(found) == 2 and all(c.passed for c in found), found


def test_the_steps_compile_is_apart_where_fit_compiles_it(trained, har):
    """On JAX and TensorFlow `fit` traces and compiles its step in its first epoch: that excess over a typical epoch
    is its compile, as the native loops' compiled paths report theirs (it was in `fit`'s training seconds, and every
    × fit ratio of the bench counted it); torch's `fit` compiles nothing. One epoch has nothing to tell it by."""
    result = trained[1]
    assert (result.compile_seconds is None) == (ENGINE == "torch") and result.train_seconds > 0
    seed_everything(0)
    assert fit.train(models.har(), har, TrainConfig(epochs=1)).compile_seconds is None


def test_result_shape(trained, har, tmp_path, converged):
    model, result = trained
    assert result.path == f"keras-{ENGINE}" and result.engine == ENGINE
    assert [w.shape for w in result.weights] == [(3, 1), (1,)]
    assert len(result.train_loss) == len(result.val_loss) == converged.epochs
    assert result.val_loss[-1] < result.val_loss[0]
    # The curve is in original units, on the validation year: its last point is the MSE the model's predictions
    # of those days give (and not the test split's).
    mse = float(np.mean((fit.predict(model, har.x_val) - har.y_val) ** 2)) * har.scaling.y_std**2
    assert result.val_loss[-1] == pytest.approx(mse, rel=1e-4)
    test_mse = float(np.mean((result.test_pred - har.y_test) ** 2)) * har.scaling.y_std**2
    assert abs(result.val_loss[-1] - test_mse) > 1e-3
    assert result.train_seconds > 0 and result.versions["keras"] == "3.15.1" and result.seed == 0
    result.save(tmp_path)
    again = Result.load(tmp_path, result.path)
    assert again.val_loss == result.val_loss
    np.testing.assert_array_equal(again.weights[0], result.weights[0])


def test_weights_file_round_trip(trained, har, tmp_path):
    model, result = trained
    path = tmp_path / "har.weights.h5"
    result.save_weights(path, models.har)
    fresh = models.har()
    fresh.load_weights(path)
    np.testing.assert_array_equal(fit.predict(fresh, har.x_test), result.test_pred)


def test_numpy_batch_order_is_reproducible_without_reseeding(har):
    cfg = TrainConfig(epochs=3, validate=False, batch_order="numpy")
    runs = []
    for _ in range(2):
        seed_everything(1)
        init = models.har().get_weights()
        model = models.har()
        model.set_weights(init)
        runs.append(fit.train(model, har, cfg).weights)
    for a, b in zip(*runs, strict=True):
        np.testing.assert_array_equal(a, b)


def test_numpy_batch_order_is_one_fit_call_an_epoch_on_each_permutation(har):
    """#15: `fit` takes the NumPy order as one stream (`fit.NumpyOrder`, one call, one trace); it is the plain way,
    one `fit` call per epoch on that epoch's permutation with `shuffle=False`, to the bit (weights and losses)."""
    from keras_side.data import numpy_orders
    from keras_side.results import loss_units
    from keras_side.losses import keras_loss
    from keras_side.optimizers import keras_optimizer

    cfg = TrainConfig(epochs=3, batch_order="numpy")
    seed_everything(0)
    init = models.har().get_weights()
    streamed = fit.train(_at(init), har, cfg)
    model, losses = _at(init), []
    model.compile(optimizer=keras_optimizer(cfg), loss=keras_loss(cfg))
    for epoch, order in enumerate(numpy_orders(cfg.seed, har.n_train, cfg.epochs)):
        losses += model.fit(har.x_train[order], har.y_train[order], batch_size=cfg.batch_size, shuffle=False,
                            epochs=epoch + 1, initial_epoch=epoch, verbose=0).history["loss"]
    assert all(np.array_equal(a, b) for a, b in zip(streamed.weights, model.get_weights(), strict=True))
    to_original = loss_units(cfg, har)[0]  # a Result's losses are in the data's own units
    assert streamed.train_loss == [loss * to_original for loss in losses]
    batches = fit.NumpyOrder(har, cfg)
    orders = numpy_orders(cfg.seed, har.n_train, cfg.epochs)
    np.testing.assert_array_equal(batches[batches.steps + 1][0], har.x_train[orders[1][128:256]])  # epoch 1, batch 1


def _at(weights):
    model = models.har()
    model.set_weights(weights)
    return model
