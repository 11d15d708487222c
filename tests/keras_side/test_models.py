import keras
import numpy as np
import pytest

from compare.data import panel as data, reference, synthetic
from compare.referee.tolerances import LEVERAGE_STD_ERRORS, MODEL_API_ATOL, SLOPE_ATOL, TRUTH_STD_ERRORS
from keras_side import fit, models
from keras_side.determinism import seed_everything
from keras_side.spec import TrainConfig

MLPS = ["mlp_sequential", "mlp_functional", "mlp_subclass"]


def build(name):
    seed_everything(0)
    return models.ensure_built(models.BUILDERS[name](), models.example_inputs(name))


@pytest.mark.parametrize("name", MLPS)
def test_mlp_has_41_parameters(name):
    assert build(name).count_params() == 3 * 8 + 8 + 8 + 1 == 41


def test_subclass_has_no_weights_until_first_call():
    model = models.mlp_subclass()
    assert model.weights == []
    model(np.zeros((1, 3), np.float32))
    assert model.count_params() == 41


def test_three_mlp_apis_agree_with_copied_weights():
    x = np.random.default_rng(0).normal(size=(64, 3)).astype(np.float32)
    source = build("mlp_sequential")
    outputs = []
    for name in MLPS:
        model = build(name)
        model.set_weights(source.get_weights())
        outputs.append(keras.ops.convert_to_numpy(model(x)))
    for other in outputs[1:]:
        np.testing.assert_allclose(other, outputs[0], atol=MODEL_API_ATOL, rtol=0)
    assert np.std(outputs[0]) > 0


def test_panel_model_layers():
    rows = models.layer_table(build("panel"))
    by_name = {r[0]: r for r in rows}
    assert by_name["asset_level"][1:] == ("Embedding", "(None, 1, 1)", 6)
    assert by_name["har"][1:] == ("Dense", "(None, 1)", 5)
    assert sum(r[3] for r in rows) == 11


def test_noise_only_when_training():
    x = np.random.default_rng(1).normal(size=(32, 3)).astype(np.float32)
    noisy = build("noisy_har")
    plain = models.har()
    plain.set_weights(noisy.get_weights()[-2:] if len(noisy.get_weights()) > 2 else noisy.get_weights())
    off = keras.ops.convert_to_numpy(noisy(x, training=False))
    np.testing.assert_allclose(off, keras.ops.convert_to_numpy(plain(x)), atol=MODEL_API_ATOL, rtol=0)
    on = keras.ops.convert_to_numpy(noisy(x, training=True))
    assert np.max(np.abs(on - off)) > 1e-3


def test_leverage_model_finds_the_leverage_term(panel):
    """Trained with fit, the two-input model's slopes approach the four-regressor OLS; leverage < 0."""
    lev = data.prepare(panel, leverage=True)
    fit4 = reference.ols_for(panel, data.DEFAULT_ASSET, data.DEFAULT_SPLIT, None, data.HAR + data.LEVERAGE)
    seed_everything(0)
    result = fit.train(models.leverage(), lev, TrainConfig(validate=False))
    _, slopes = lev.scaling.to_original(*result.weights)
    truth = synthetic.TRUE.leverage()[synthetic.ASSETS.index(data.DEFAULT_ASSET)]
    np.testing.assert_allclose(slopes[:3], fit4.slopes[:3], atol=SLOPE_ATOL, rtol=0)
    assert slopes[3] < 0
    assert abs(slopes[3] - fit4.slopes[3]) < LEVERAGE_STD_ERRORS * fit4.std_errors[3]
    assert abs(slopes[3] - truth) < TRUTH_STD_ERRORS * fit4.std_errors[3]


def test_models_command_lists_every_builder(capsys):
    from compare import cli
    from tests.keras_side.conftest import ENGINE

    assert cli.main(["models", "--engine", ENGINE]) == 0
    text = capsys.readouterr().out
    for name in models.BUILDERS:
        assert f"{name} ({ENGINE})" in text
    assert "Embedding" in text and "GaussianNoise" in text
    # and the zoo's, which bench --models, zoo --models and compare --model take (it listed none of the eight others)
    from keras_side.zoo import ZOO

    for name in set(ZOO) - set(models.BUILDERS):
        assert f"zoo: {name} ({ENGINE})" in text
    assert "LSTM" in text and "Conv1D" in text and "BatchNormalization" in text


def test_batchnorm_takes_its_batch_moments_from_moments_only_when_training():
    """The data-parallel loops synchronize a BatchNormalization by replacing `_moments` (torch) or setting
    `synchronized` (TensorFlow), private parts of Keras 3.15.1: this pins that `call` asks `_moments` for the batch
    moments in training and uses what it returns, so an upgrade that stops doing so fails here, not silently."""
    model = models.bn_mlp()
    x = np.random.default_rng(0).normal(size=(16, 3)).astype("float32")
    model(x)
    (bn,) = models.batchnorm_layers(model)
    calls = []

    def planted(inputs, mask):
        calls.append(tuple(inputs.shape))
        return keras.ops.zeros((8,)), keras.ops.ones((8,))

    bn._moments = planted
    hidden = keras.Model(model.inputs[0], model.get_layer("bn").output)
    out = keras.ops.convert_to_numpy(hidden(x, training=True))
    assert calls == [(16, 8)]  # asked once, for the batch's moments
    pre = keras.ops.convert_to_numpy(model.get_layer("hidden")(x))
    np.testing.assert_allclose(out, pre / np.sqrt(1 + bn.epsilon), rtol=1e-6)  # normalized by what it returned
    hidden(x, training=False)
    assert calls == [(16, 8)]  # inference: the moving statistics, not `_moments`


def _attention(dropout: float) -> keras.Model:
    x = keras.Input((5, 4))
    return keras.Model(x, keras.layers.MultiHeadAttention(2, 2, dropout=dropout)(x, x))


class NoisyDropout(keras.layers.Dropout):
    """A Dropout of rate 0 whose own call draws: counted by its generator, not its rate."""

    def __init__(self, rate, **kwargs):
        super().__init__(rate, **kwargs)  # which builds the layer: its state is locked after
        self._tracker.unlock()
        self._noise = keras.random.SeedGenerator(2)
        self._tracker.lock()

    def call(self, x, training=False):
        return x + keras.random.normal(keras.ops.shape(x), seed=self._noise) if training else x


class DrawsInItsCall(keras.Model):
    def __init__(self):
        super().__init__()
        self.generator, self.out = keras.random.SeedGenerator(1), keras.layers.Dense(1)

    def call(self, x, training=False):
        return self.out(x + keras.random.normal(keras.ops.shape(x), seed=self.generator) if training else x)


@pytest.mark.parametrize("model, drawing", [
    (lambda: models.lstm(), []),  # its cell holds a SeedGenerator and, with no dropout, never draws
    (lambda: keras.Sequential([keras.Input((22, 1)), keras.layers.LSTM(4, recurrent_dropout=0.2)]), ["LSTMCell"]),
    (lambda: keras.Sequential([keras.Input((3,)), keras.layers.Dropout(0.0)]), []),
    (lambda: models.dropout_mlp(), ["Dropout"]),
    (lambda: keras.Sequential([keras.Input((3,)), keras.layers.GaussianNoise(0.1)]), ["GaussianNoise"]),
    (lambda: DrawsInItsCall(), ["DrawsInItsCall"]),
    (lambda: keras.Sequential([keras.Input((22, 1)), keras.layers.GRU(4), keras.layers.Reshape((4, 1)),
                               keras.layers.SimpleRNN(2, dropout=0.1)]), ["SimpleRNNCell"]),
    (lambda: keras.Sequential([keras.Input((22, 1)), keras.layers.Bidirectional(keras.layers.LSTM(2, dropout=0.1))]),
     ["LSTMCell", "LSTMCell"]),
    (lambda: _attention(0.0), []),
    (lambda: _attention(0.2), ["Dropout"]),  # MultiHeadAttention's own
    (lambda: keras.Sequential([keras.Input((3,)), NoisyDropout(0.0)]), ["NoisyDropout"]),
])
def test_drawing_layers_are_those_that_draw_when_they_train(model, drawing):
    """What data parallelism must draw as one process does, or refuse: not an LSTM cell with no dropout (the zoo's
    LSTM was refused by DDP when every holder of a SeedGenerator counted)."""
    assert [type(layer).__name__ for layer in models.drawing_layers(model())] == drawing


def test_a_builder_that_returns_no_model_is_a_spec_error_the_launchers_say_in_one_line(har):
    """A TypeError, as before, and a SpecError, which every launcher prints as one line, exit 2 (it was a traceback
    from every process)."""
    from keras_side.spec import SpecError

    for error in (TypeError, SpecError):
        with pytest.raises(error, match="^the model builder returned Dense, not a keras.Model; return the model"):
            models.ensure_built(keras.layers.Dense(1), har.x_train)
