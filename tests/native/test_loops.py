"""The same verbs on every engine: train, grad_at, predict. Runs once per engine."""
import numpy as np
import pytest

from compare.engines import paths
from compare.referee import checks
from compare.referee.tolerances import HISTORY_ATOL, ZOO_ATOL
from keras_side import models
from keras_side.determinism import seed_everything
from keras_side.spec import TrainConfig
from tests.native.conftest import ENGINE
from tests.native.loops import SPLITS, flat, loop, three_classes, val_mse
from tests.tiers import FULL

QUICK = TrainConfig(epochs=3)


@pytest.fixture(scope="module")
def trained(har, converged):
    seed_everything(0)
    model = models.har()
    return model, loop.train(model, har, converged)


def test_native_reaches_ols(trained, har, ols_fit):
    """The referee's converged check (`compare --converge`): every seed reaches OLS's slopes and test MSE, up to
    mini-batch noise; at the run's seed no better or worse than any other."""
    found = checks.ols_reached(trained[1], har, ols_fit, checks.Band.converged())
    assert len(found) == 2 and all(c.passed for c in found), found


def test_result_and_model_agree(trained, har, converged):
    """The trained weights live in the Keras model: its own predict sees them."""
    model, result = trained
    assert result.path.startswith(ENGINE) and result.engine == ENGINE
    for got, want in zip(model.get_weights(), result.weights, strict=True):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(model.predict(har.x_test, verbose=0), result.test_pred, atol=1e-6, rtol=0)
    assert len(result.train_loss) == len(result.val_loss) == converged.epochs
    assert result.val_loss[-1] < result.val_loss[0]
    assert result.val_loss[-1] == pytest.approx(val_mse(model, har), rel=1e-4)  # measured on the validation year


def run(har, cfg=QUICK, name="har", data=None, **kwargs):
    seed_everything(cfg.seed)
    return loop.train(models.BUILDERS[name](), data or har, cfg, **kwargs)


def test_same_seed_gives_bit_identical_weights(har):
    for a, b in zip(run(har).weights, run(har).weights, strict=True):
        np.testing.assert_array_equal(a, b)


def test_another_seed_gives_other_weights(har):
    assert not np.array_equal(flat(run(har).weights), flat(run(har, QUICK.replace(seed=1)).weights))


@pytest.mark.parametrize("name", ["mlp_subclass", "mlp_functional", "panel", "noisy_har", "leverage"])
def test_other_models_train_without_change(panel, har, name):
    from compare.data import panel as har_data

    data = {"panel": har_data.prepare_panel(panel), "leverage": har_data.prepare(panel, leverage=True)}.get(name, har)
    seed_everything(0)
    model = models.ensure_built(models.BUILDERS[name](), data.x_train)
    before = flat(model.get_weights())
    result = loop.train(model, data, QUICK)
    assert result.val_loss[-1] < result.val_loss[0] and np.isfinite(result.val_loss).all()
    assert not np.array_equal(before[: len(flat(result.weights))], flat(result.weights))


def test_noise_on_while_training_off_at_evaluation(har):
    """Same init and batches: the noisy model ends elsewhere than the plain HAR (noise was on), yet its
    predictions are exactly the plain Dense of its own weights (noise off)."""
    cfg = QUICK.replace(batch_order="numpy")
    seed_everything(0)
    plain = models.har()
    init = plain.get_weights()
    noisy = models.ensure_built(models.noisy_har(0.5), har.x_train)
    noisy.set_weights(init + noisy.get_weights()[len(init):])
    plain_result = loop.train(plain, har, cfg)
    noisy_result = loop.train(noisy, har, cfg)
    kernel, bias = noisy_result.weights[:2]
    assert np.max(np.abs(kernel - plain_result.weights[0])) > 1e-3
    np.testing.assert_allclose(noisy_result.test_pred, har.x_test @ kernel + bias, atol=1e-5, rtol=0)


def test_predict_is_inference_mode(har):
    seed_everything(0)
    model = models.har()
    np.testing.assert_allclose(loop.predict(model, har.x_test), model.predict(har.x_test, verbose=0), atol=1e-6, rtol=0)


def test_train_command_prints_the_path_against_ols(capsys):
    from compare import cli

    assert cli.main(["train", "--path", f"{ENGINE}-native", "--epochs", "2"]) == 0
    text = capsys.readouterr().out
    assert f"{ENGINE}-native" in text and "OLS" in text and "test MSE" in text


def test_flat_targets_train_as_column_targets(har):
    """Targets of shape (n,) go through the spec's Keras loss, which shapes them as `fit` does: the same training
    as (n, 1), never an (n, n) broadcast."""
    from dataclasses import replace

    flat_y = replace(har, y_train=har.y_train[:, 0], y_val=har.y_val[:, 0], y_test=har.y_test[:, 0])
    column, flat_targets = run(har), run(har, data=flat_y)
    np.testing.assert_array_equal(flat(column.weights), flat(flat_targets.weights))
    assert flat_targets.val_loss == column.val_loss


def test_regularizers_are_part_of_the_objective(har):
    """`model.losses` is in the loss the loop minimizes: the L2 model's weights shrink against the plain MLP's."""
    from keras_side.zoo import ZOO

    seed_everything(0)
    model = models.ensure_built(ZOO["mlp_l2"].builder()(), har.x_train)
    seed_everything(0)
    plain = models.ensure_built(models.mlp_sequential(), har.x_train)
    plain.set_weights(model.get_weights())
    loop.train(model, har, QUICK.replace(batch_order="numpy"))
    loop.train(plain, har, QUICK.replace(batch_order="numpy"))
    assert np.sum(model.get_weights()[0] ** 2) < 0.9 * np.sum(plain.get_weights()[0] ** 2)


def test_a_bias_before_batchnorm_has_no_gradient_yet_adam_moves_it(har):
    """BatchNorm subtracts the batch mean, so a bias just before it has a true-zero gradient: what autograd returns
    is rounding noise. Adam divides by the root of its own square, so it steps on that noise as on a signal, held
    back only by ε: the bias drifts thousands of times further than gradient descent would take it, and two correct
    loops part on it (the zoo's BatchNorm MLP has no such bias)."""
    seed_everything(0)
    model = models.ensure_built(models.bn_mlp(use_bias=True), har.x_train)
    kernel, bias = loop.grad_at(model, har.x_train[:256], har.y_train[:256], training=True)[:2]
    assert np.max(np.abs(bias)) < 1e-6 * np.max(np.abs(kernel))
    cfg = TrainConfig(epochs=1, batch_order="numpy")
    loop.train(model, har, cfg)
    gradient_descent = cfg.learning_rate * np.max(np.abs(bias)) * -(-har.n_train // cfg.batch_size)
    drift = np.max(np.abs(model.get_weights()[1]))
    print(f"{ENGINE}: bias gradient {np.max(np.abs(bias)):.1e}, drift {drift:.1e} ({drift / gradient_descent:.0e}×)")
    assert drift > 1e3 * gradient_descent


def test_metrics_are_reported_as_fit_reports_them(panel):
    """Accuracy over the epoch's samples (not a mean of batch accuracies) and a validation value, per epoch, equal
    to `fit`'s History, from the same weights and batches."""
    import keras

    from compare.data import panel as har_data
    from compare.referee.tolerances import HISTORY_ATOL
    from keras_side import fit

    data = har_data.prepare_direction(panel)
    cfg = TrainConfig(epochs=2, batch_order="numpy", loss="binary_crossentropy", from_logits=True,
                      metrics=("binary_accuracy", "mse"))

    def history(train):
        keras.backend.clear_session()
        seed_everything(0)
        return train(models.ensure_built(models.classifier(), data.x_train), data, cfg).metrics

    want, got = history(fit.train), history(loop.train)
    assert sorted(got) == sorted(want) == ["binary_accuracy", "mse", "val_binary_accuracy", "val_mse"]
    for name, values in want.items():
        np.testing.assert_allclose(got[name], values, atol=HISTORY_ATOL, rtol=0, err_msg=name)
    assert 0.3 < want["val_binary_accuracy"][-1] < 0.7  # a coin flip: the synthetic returns are unpredictable


def test_sample_weights_change_the_objective(panel):
    """`HarData.w_train` reaches the loss as `fit`'s `sample_weight`: weighted least squares ends elsewhere than
    plain least squares from the same start (the zoo's `har_recent` checks it equals `fit`)."""
    from compare.data import panel as har_data

    weighted = har_data.prepare_recent(panel)
    plain, recent = run(weighted, data=har_data.prepare(panel)), run(weighted, data=weighted)
    assert np.max(np.abs(flat(plain.weights) - flat(recent.weights))) > 1e-3


def test_early_stopping_stops_and_restores_where_fit_does(har):
    """Patience 2 on the validation loss with restore_best_weights: the loop stops at fit's epoch and ends at fit's
    best weights, from the same start and batches."""
    import keras

    from keras_side import fit

    cfg = TrainConfig(epochs=20, batch_order="numpy", learning_rate=0.05, patience=2)

    def trained(train):
        keras.backend.clear_session()
        seed_everything(0)
        model = models.ensure_built(models.mlp_sequential(), har.x_train)
        return train(model, har, cfg), flat(model.get_weights())

    (want, want_weights), (got, got_weights) = trained(fit.train), trained(loop.train)
    assert len(got.val_loss) == len(want.val_loss) < cfg.epochs  # it stopped, at the same epoch
    best = int(np.argmin(want.val_loss))
    assert best < len(want.val_loss) - 1  # and the weights came back from an earlier epoch
    print(f"{ENGINE}: stopped after {len(got.val_loss)} of {cfg.epochs} epochs, best {best + 1}, "
          f"gap to fit {np.max(np.abs(got_weights - want_weights)):.1e}")
    np.testing.assert_allclose(got_weights, want_weights, atol=ZOO_ATOL, rtol=0)


def test_a_mixed_bfloat16_model_trains_as_fit_trains_it(har):
    """Under Keras's mixed_bfloat16 policy the layers compute in bfloat16 on float32 weights; the loop ends where
    `fit` ends, from the same start and batches."""
    import keras

    from keras_side import fit
    from keras_side.precision import mixed_bfloat16

    cfg = TrainConfig(epochs=2, batch_order="numpy")

    def trained(train):
        keras.backend.clear_session()
        seed_everything(0)
        with mixed_bfloat16():
            model = models.ensure_built(models.mlp_sequential(), har.x_train)
        assert model.layers[0].compute_dtype == "bfloat16" and model.layers[0].kernel.dtype == "float32"
        train(model, har, cfg)
        return flat(model.get_weights())

    want, got = trained(fit.train), trained(loop.train)
    print(f"{ENGINE}: mixed_bfloat16 gap to fit {np.max(np.abs(got - want)):.1e}")
    np.testing.assert_allclose(got, want, atol=ZOO_ATOL, rtol=0)


def test_a_model_whose_call_takes_no_training_flag_trains_as_fit_trains_it(har):
    """`call(self, x)` with no `training`: Keras's trainers call it without the flag; JAX's loop passed it to
    `stateless_call` (TypeError in train, grad_at and predict)."""
    import keras

    from keras_side import fit

    class NoFlag(keras.Model):
        def __init__(self):
            super().__init__()
            self.hidden, self.out = keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(1)

        def call(self, x):
            return self.out(self.hidden(x))

    cfg = TrainConfig(epochs=2, batch_order="numpy", validate=False)

    def trained(train):
        keras.backend.clear_session()
        seed_everything(0)
        model = models.ensure_built(NoFlag(), har.x_train)
        train(model, har, cfg)
        return model

    want, model = trained(fit.train), trained(loop.train)
    np.testing.assert_allclose(flat(model.get_weights()), flat(want.get_weights()), atol=ZOO_ATOL, rtol=0)
    np.testing.assert_allclose(loop.predict(model, har.x_test[:8]), want.predict(har.x_test[:8], verbose=0),
                               atol=ZOO_ATOL, rtol=0)
    assert all(np.any(g != 0) for g in loop.grad_at(model, har.x_train[:64], har.y_train[:64]))


def test_heads_of_different_widths_train_and_predict_as_fit_does(har, tmp_path):
    """A forecast and a class's logits: every path trained to the end, then failed on NumPy's "inhomogeneous shape"
    stacking the test predictions. Several outputs are now a tuple of arrays, one each, as targets are."""
    import dataclasses

    import keras

    from keras_side import fit
    from keras_side.results import Result

    data = dataclasses.replace(har, **{f"y_{s}": (getattr(har, f"y_{s}"), three_classes(har, getattr(har, f"y_{s}")))
                                       for s in SPLITS})
    cfg = TrainConfig(epochs=1, batch_order="numpy", loss=("mse", "sparse_categorical_crossentropy"), from_logits=True)

    def trained(train):
        keras.backend.clear_session()
        seed_everything(0)
        inputs = keras.Input((3,))
        hidden = keras.layers.Dense(4, activation="tanh")(inputs)
        model = keras.Model(inputs, [keras.layers.Dense(1)(hidden), keras.layers.Dense(3)(hidden)])
        return model, train(model, data, cfg)

    (_, want), (model, got) = trained(fit.train), trained(loop.train)
    assert [p.shape for p in got.test_pred] == [p.shape for p in want.test_pred] == [(data.n_test, 1), (data.n_test, 3)]
    for a, b in zip(got.test_pred, want.test_pred, strict=True):
        np.testing.assert_allclose(a, b, atol=ZOO_ATOL, rtol=0)
    for a, b in zip(loop.predict(model, data.x_test), got.test_pred, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)
    got.save(tmp_path)
    again = Result.load(tmp_path, got.path)  # what a worker sends the referee
    assert all(np.array_equal(a, b) for a, b in zip(again.test_pred, got.test_pred, strict=True))
    assert all(np.array_equal(a, b) for a, b in zip(again.weights, got.weights, strict=True))


def test_a_two_output_model_trains_as_fit_trains_it(panel):
    """Two outputs, a loss each and `loss_weights`: the loop minimizes what `compile` makes of them and reports,
    per epoch, the training and validation loss `fit` reports, from the same start and batches; a spec with one
    loss for two targets is one clear error."""
    import dataclasses

    import keras

    from compare.data import panel as har_data
    from compare.referee.tolerances import HISTORY_ATOL
    from keras_side import fit
    from keras_side.spec import SpecError

    data = har_data.prepare_horizons(panel)
    cfg = TrainConfig(epochs=2, batch_order="numpy", loss=("mse", "mae"), loss_weights=(1.0, 0.5))

    def trained(train, cfg=cfg):
        keras.backend.clear_session()
        seed_everything(0)
        model = models.ensure_built(models.two_horizons(), data.x_train)
        return train(model, data, cfg), flat(model.get_weights())

    (want, want_weights), (got, got_weights) = trained(fit.train), trained(loop.train)
    np.testing.assert_allclose(got_weights, want_weights, atol=ZOO_ATOL, rtol=0)
    for curve in ("train_loss", "val_loss"):
        np.testing.assert_allclose(getattr(got, curve), getattr(want, curve), atol=HISTORY_ATOL, rtol=0)
    assert [p.shape for p in got.test_pred] == [p.shape for p in want.test_pred] == [(data.n_test, 1)] * 2
    _, unweighted = trained(loop.train, cfg.replace(loss_weights=None))
    assert np.max(np.abs(unweighted - got_weights)) > 1e-4  # the weights take part: the objective moved
    with pytest.raises(SpecError, match="the data has 2 targets"):
        trained(loop.train, cfg.replace(loss="mse", loss_weights=None))
    one_target = dataclasses.replace(data, y_train=data.y_train[0], y_val=data.y_val[0], y_test=data.y_test[0])
    with pytest.raises(SpecError, match="the model has 2 outputs but the data has 1 target"):  # was an internal error
        loop.train(models.two_horizons(), one_target, TrainConfig(epochs=1))
    with pytest.raises(SpecError, match="the model has 2 outputs but the data has 1 target"):  # fit's check is ours
        fit.train(models.two_horizons(), one_target, TrainConfig(epochs=1))


def test_weight_constraints_bind_after_every_step_as_fit_applies_them(har):
    """A kernel's `MaxNorm` and `NonNeg` bind while training: the loop applies each constraint after every step, as
    Keras's optimizer does, and ends where `fit` ends from the same start and batches (left out, 0.8 away from
    `fit`)."""
    from keras_side import fit
    from tests.native.loops import constrained_mlp

    def build(constrained=True):
        return models.ensure_built(constrained_mlp(constrained), har.x_train)

    cfg = TrainConfig(epochs=2, batch_order="numpy", learning_rate=0.05)
    seed_everything(0)
    start = build().get_weights()
    fast = {"torch": "torch-native-compile", "jax": "jax-native-scan"}.get(ENGINE)  # the engine's fast path too
    runs = [("fit", fit.train, True), ("loop", loop.train, True), ("free", loop.train, False)]
    trained = {}
    for name, train, constrained in runs + ([("fast", paths.get(fast).train, True)] if fast else []):
        model = build(constrained)
        model.set_weights(start)
        train(model, har, cfg)
        trained[name] = model.get_weights()
    hidden, _, output, _ = trained["loop"]
    assert np.linalg.norm(hidden, axis=0).max() <= 0.3 * (1 + 1e-6) and output.min() >= 0
    free_hidden, _, free_output, _ = trained["free"]
    assert np.linalg.norm(free_hidden, axis=0).max() > 0.4 and free_output.min() < 0  # both constraints bound
    for name in {"loop", "fast"} & set(trained):
        np.testing.assert_allclose(flat(trained[name]), flat(trained["fit"]), atol=ZOO_ATOL, rtol=0)


def test_an_rnns_dropout_draws_as_fit_draws_it_validation_included(panel):
    """A recurrent layer's `dropout` and `recurrent_dropout` draw their masks on every call, in inference too, so a
    validation moves their seed state, and `fit` keeps that. The loop does the same: the torch loop's probe call
    moves no state (it drew once before the first step: every mask one draw late, 5e-2 from `fit`), and the JAX loop
    keeps the state its validation leaves (it kept the one before: 3e-2 from the second epoch on). `fit` with our
    `train_step` too: building its wrapper (a call) drew once (`ensure_built` now puts the seed states back)."""
    import dataclasses

    import keras

    from compare.data import panel as har_data
    from keras_side import fit

    whole = har_data.prepare_kind(panel, "sequence")
    # 300 training rows (10 batches, the last of 12 rows) and 100 validation rows: a validation between epochs is all
    # this needs, and the whole panel took most of a minute through three paths.
    data = dataclasses.replace(whole, x_train=whole.x_train[:300], y_train=whole.y_train[:300],
                               x_val=whole.x_val[:100], y_val=whole.y_val[:100])

    def build():  # make test: an LSTM's two dropouts; make test-full: a GRU after it, which draws its own
        rnn = [keras.layers.LSTM(4, dropout=0.2, recurrent_dropout=0.2, seed=3, return_sequences=FULL)]
        rnn += [keras.layers.GRU(4, dropout=0.2, seed=5)] if FULL else []
        return models.ensure_built(keras.Sequential([keras.Input(data.x_train.shape[1:]), *rnn,
                                                     keras.layers.Dense(1)]), data.x_train)

    seed_everything(0)
    start, trained = build().get_weights(), {}
    from compare.engines import paths

    own_step = paths.get(f"keras-{ENGINE}-train-step").load().train  # fit with our train_step: its wrapper's build
    for name, train in (("fit", fit.train), ("loop", loop.train), ("train-step", own_step)):  # call drew once
        model = build()
        model.set_weights(start)
        trained[name] = train(model, data, TrainConfig(epochs=2, batch_order="numpy"))
    for name in ("loop", "train-step"):
        np.testing.assert_allclose(flat(trained[name].weights), flat(trained["fit"].weights), atol=ZOO_ATOL, rtol=0)
        np.testing.assert_allclose(trained[name].val_loss, trained["fit"].val_loss, atol=HISTORY_ATOL, rtol=0)


def test_a_stateful_rnn_is_refused_in_one_line_by_the_loop_and_fit():
    """A `stateful=True` RNN carries its state across batches of one fixed size in a fixed order; every path here
    shuffles and calls the model on a probe row or a whole split. It failed deep inside Keras (a batch size it did not
    expect on JAX, torch's in-place error in `fit`)."""
    import keras

    from keras_side import fit
    from keras_side.data import HarData, Scaling
    from keras_side.spec import SpecError

    x = np.random.default_rng(0).normal(size=(64, 10, 2)).astype("float32")
    y = x[:, -1, :1].copy()
    data = HarData(x[:48], y[:48], x[48:], y[48:], x[48:], y[48:], Scaling.identity(3),
                   ("a",), "test", "test")
    for train in (loop.train, fit.train):
        model = keras.Sequential([keras.Input((10, 2), batch_size=16), keras.layers.LSTM(4, stateful=True),
                                  keras.layers.Dense(1)])
        with pytest.raises(SpecError, match=r"layer 'lstm\w*' is stateful \(stateful=True\).*stateful=False"):
            train(model, data, TrainConfig(epochs=1, batch_size=16))
