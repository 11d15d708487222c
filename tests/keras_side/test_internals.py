"""Every Keras internal of `keras_side/internals.py`, asked of the installed Keras: still there, and doing what the
code that uses it assumes. A failure names the Keras version and the internal, so that a Keras upgrade that moves
one says which, and where to mend it. Runs once per engine; an internal of one engine only is asserted there."""
import importlib
import random

import keras
import numpy as np
import pytest

from keras_side import internals
from tests.keras_side.conftest import ENGINE


def moved(what: str) -> str:
    return f"keras {keras.__version__} moved {what}: see keras_side/internals.py"


# (module, name) of each `keras.src` import in internals.py
IMPORTS = [("keras.src.backend", "core"), ("keras.src.backend", "nn"), ("keras.src.backend", "get_autocast_scope"), ("keras.src.backend", "random"),
           ("keras.src.backend.common", "global_state"),
           ("keras.src.layers.regularization.spatial_dropout", "BaseSpatialDropout"),
           ("keras.src.layers.rnn.dropout_rnn_cell", "DropoutRNNCell"), ("keras.src.losses", "LossFunctionWrapper"),
           ("keras.src.losses.loss", "squeeze_or_expand_to_same_rank"), ("keras.src.models", "functional"),
           ("keras.src.random.seed_generator", "GLOBAL_SEED_GENERATOR"),
           ("keras.src.utils.rng_utils", "GLOBAL_RANDOM_SEED")]


@pytest.mark.parametrize("module, name", IMPORTS, ids=[f"{m}.{n}" for m, n in IMPORTS])
def test_each_keras_src_import_is_there(module, name):
    try:
        found = hasattr(importlib.import_module(module), name)
    except ImportError:
        found = False
    assert found, moved(f"{module}.{name}")


def test_the_engines_own_keras_modules():
    assert internals.backend_random.__name__ == f"keras.src.backend.{ENGINE}.random", moved("keras.src.backend.random")
    assert internals.backend_core.__name__ == f"keras.src.backend.{ENGINE}.core", moved("keras.src.backend.core")
    assert internals.backend_nn.__name__ == f"keras.src.backend.{ENGINE}.nn", moved("keras.src.backend.nn")
    if ENGINE == "torch":  # the torch fast path's device and Dropout generator
        import torch

        assert torch.device(internals.torch_device()).type == keras.ops.zeros(1).device.type, \
            moved("keras.src.backend.torch.core.get_device")
        generator = keras.random.SeedGenerator(3)
        before = keras.ops.convert_to_numpy(generator.state.value)
        assert isinstance(internals.torch_seed_generator(generator), torch.Generator), \
            moved("keras.src.backend.torch.random.torch_seed_generator")
        assert not np.array_equal(keras.ops.convert_to_numpy(generator.state.value), before), \
            moved("torch_seed_generator (it no longer advances the seed state)")


def test_keras_random_dropout_calls_the_backend_modules_dropout(monkeypatch):
    """mirrored.py swaps `backend_random.dropout` for its own: `keras.random.dropout` must look it up per call."""
    called = []
    own = internals.backend_random.dropout
    monkeypatch.setattr(internals.backend_random, "dropout", lambda *a, **k: called.append(1) or own(*a, **k))
    keras.random.dropout(keras.ops.ones((2, 3)), 0.5, seed=1)
    assert called, moved("keras.random.dropout's call of keras.src.backend.random.dropout")


def test_keras_ops_conv_calls_the_backend_modules_conv(monkeypatch):
    """JAX's fast path (native/jax/convolution.py) swaps `backend_nn.conv`: `keras.ops.conv` must look it up per call,
    with Keras's argument order (inputs, kernel, strides, padding, data_format, dilation_rate)."""
    called = []
    own = internals.backend_nn.conv
    monkeypatch.setattr(internals.backend_nn, "conv", lambda *a, **k: called.append(len(a) + len(k)) or own(*a, **k))
    keras.ops.conv(keras.ops.ones((1, 5, 2)), keras.ops.ones((3, 2, 4)))
    assert called == [6], moved("keras.ops.conv's call of keras.src.backend.nn.conv")


def test_recurrent_and_spatial_dropout_classes():
    cell = keras.layers.LSTM(2, dropout=0.2, recurrent_dropout=0.1).cell
    assert isinstance(cell, internals.DropoutRNNCell) and (cell.dropout, cell.recurrent_dropout) == (0.2, 0.1), \
        moved("keras.src.layers.rnn.dropout_rnn_cell.DropoutRNNCell")
    assert issubclass(keras.layers.SpatialDropout1D, internals.BaseSpatialDropout), \
        moved("keras.src.layers.regularization.spatial_dropout.BaseSpatialDropout")


def test_a_plain_loss_function_wrapped_as_compile_wraps_it():
    wrapped = internals.LossFunctionWrapper(lambda t, p: keras.ops.abs(t - p), name="abs")
    value = wrapped(keras.ops.zeros((2, 1)), keras.ops.convert_to_tensor([[1.0], [3.0]]))
    assert isinstance(wrapped, keras.losses.Loss) and float(value) == 2.0, moved("keras.src.losses.LossFunctionWrapper")


def test_targets_shaped_against_outputs_as_fit_shapes_them():
    y, pred = internals.squeeze_or_expand_to_same_rank(keras.ops.zeros((4,)), keras.ops.zeros((4, 1)))
    assert tuple(y.shape) == tuple(pred.shape) == (4, 1), moved("keras.src.losses.loss.squeeze_or_expand_to_same_rank")


def test_the_global_seed_reset_is_keras_own_part_of_set_random_seed():
    keras.utils.set_random_seed(5)
    keras_draw = keras.ops.convert_to_numpy(keras.random.uniform((3,)))
    keras.utils.set_random_seed(6)
    random.seed(5)  # the rest of set_random_seed: an unseeded SeedGenerator takes its seed from Python's
    internals.reset_global_seed(5)
    assert np.array_equal(keras.ops.convert_to_numpy(keras.random.uniform((3,))), keras_draw), \
        moved("the global seed's keys (GLOBAL_RANDOM_SEED, GLOBAL_SEED_GENERATOR)")


def test_an_autocast_scope_is_seen_inside_a_mixed_precision_call():
    seen = []

    class Looks(keras.layers.Layer):
        def call(self, x):
            seen.append(internals.autocast_scope())
            return x

    assert internals.autocast_scope() is None, moved("keras.src.backend.get_autocast_scope")
    Looks(dtype="mixed_float16")(keras.ops.ones((1, 2)))
    assert seen[0] is not None, moved("keras.src.backend.get_autocast_scope (Layer.__call__ no longer opens one)")


def test_what_a_layer_tracks():
    inner = keras.layers.Dense(1)
    model = keras.Sequential([keras.Input((3,)), keras.Sequential([inner]), keras.layers.Dropout(0.5, seed=1)])
    assert inner in internals.all_layers(model) and model not in internals.all_layers(model), \
        moved("Layer._flatten_layers")
    assert model in internals.all_layers(model, include_self=True), moved("Layer._flatten_layers(include_self)")
    assert inner in internals.sublayers(model.layers[0]) and internals.sublayers(inner) == [], \
        moved("Layer._layers")
    assert internals.has_training_arg(model.layers[1]) and not internals.has_training_arg(keras.layers.Flatten()), \
        moved("Layer._call_has_training_arg")
    assert internals.seed_generators(model.layers[1]) == [model.layers[1].seed_generator], \
        moved("Layer._seed_generators")
    assert internals.seed_generators(inner) == [], moved("Layer._seed_generators")
    assert internals.initial_seed(model.layers[1].seed_generator) == 1, moved("SeedGenerator._initial_seed")
    unseeded = keras.layers.Dropout(0.5).seed_generator
    assert internals.initial_seed(unseeded) is None, moved("SeedGenerator._initial_seed")


def test_a_layers_held_losses_and_their_clearing():
    layer = keras.layers.Dense(1, activity_regularizer=keras.regularizers.L2(0.1))
    model = keras.Sequential([keras.Input((3,)), layer])
    model(keras.ops.ones((2, 3)))
    assert len(internals.held_losses(layer)) == 1 and len(model.losses) == 1, moved("Layer._losses")
    internals.clear_losses(model)
    assert internals.held_losses(layer) == [] and model.losses == [], moved("Layer._clear_losses")


def test_rematerialization_and_masks():
    with keras.RematScope(mode="full"):
        remat = keras.layers.Dense(1)
    assert internals.remat_mode(remat) is not None and internals.remat_mode(keras.layers.Dense(1)) is None, \
        moved("Layer._remat_mode")
    masked = keras.layers.Embedding(5, 2, mask_zero=True)(np.array([[0, 1]]))
    assert internals.keras_mask(masked) is not None, moved("the tensor attribute _keras_mask")
    assert internals.keras_mask(keras.ops.ones((1,))) is None, moved("the tensor attribute _keras_mask")


def test_keras_own_classes_are_told_from_yours():
    class Mine(keras.layers.Dense):
        pass

    assert internals.is_keras_class(keras.layers.Dense, "layers."), moved("keras.src.layers (the classes' module)")
    assert internals.is_keras_class(keras.layers.LSTMCell) and not internals.is_keras_class(Mine), \
        moved("keras.src (the classes' module)")


def test_optimizer_variables_and_input_names():
    variables = [keras.Variable(np.ones(2, "float32"))]
    optimizer = keras.optimizers.Adam()
    optimizer.build(variables)
    assert list(internals.optimizer_variables(optimizer)) == variables, moved("Optimizer._trainable_variables")
    assert internals.input_layer_name(keras.Input((3,), name="days")) == "days", moved("KerasTensor._keras_history")


class Flag(keras.layers.Layer):
    """Records the `training` each call gets."""

    def __init__(self):
        super().__init__()
        self.flags = []

    def call(self, x, training=None):
        self.flags.append(training)
        return x * 2.0


def test_the_functional_graph_runner():
    flag = Flag()
    inputs = keras.Input((3,))
    model = keras.Model(inputs, keras.layers.Dense(1)(flag(inputs)))
    assert internals.is_functional(model), moved("keras.src.models.functional.Functional")
    sequential = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    assert not internals.is_functional(sequential) and internals.has_graph(sequential), moved("Sequential._functional")
    assert not internals.has_graph(keras.Sequential([keras.layers.Dense(1)])), moved("Sequential._functional")
    x = keras.ops.ones((2, 3))
    flag.flags.clear()
    ran = internals.run_graph(model, x, lambda op: internals.keras_operation(op, True))
    assert flag.flags == [True], moved("keras.src.models.functional.operation_fn")
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(ran), keras.ops.convert_to_numpy(model(x, training=False)),
                                  err_msg=moved("Functional._run_through_graph / _standardize_inputs"))


def test_batchnorm_axes_and_moments():
    layer = keras.layers.BatchNormalization()
    layer.build((None, 3))
    assert internals.reduction_axes(layer) == (0,), moved("BatchNormalization._reduction_axes")
    x = keras.ops.convert_to_tensor(np.arange(6, dtype="float32").reshape(2, 3))
    before = keras.ops.convert_to_numpy(layer(x, training=True))
    internals.untrack_reduction_axes(layer)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(layer(x, training=True)), before,
                                  err_msg=moved("BatchNormalization._reduction_axes"))
    internals.replace_moments(layer, lambda self, inputs, mask: (keras.ops.zeros((3,)), keras.ops.ones((3,))))
    np.testing.assert_allclose(keras.ops.convert_to_numpy(layer(x, training=True)),
                               keras.ops.convert_to_numpy(x) / np.sqrt(1 + layer.epsilon), rtol=1e-6,
                               err_msg=moved("BatchNormalization._moments (its call no longer asks it)"))


def test_global_generator_layers_are_the_unseeded_dropouts():
    seeded, unseeded = keras.layers.Dropout(0.2, seed=1), keras.layers.Dropout(0.2)
    lstm = keras.layers.LSTM(2, dropout=0.2)
    model = keras.Sequential([keras.Input((4, 3)), lstm, seeded, unseeded, keras.layers.Dense(1)])
    assert {id(layer) for layer in internals.global_generator_layers(model)} == {id(lstm.cell), id(unseeded)}
