"""The fast forward (`native.torch.bypass`): a layer's `call` where Keras's `Layer.__call__` has nothing to do,
torch's own LSTM op, the Dropouts' masks drawn before the step (`native.torch.compiled.Draws`): each the model's own
call, to the bit."""
import keras
import numpy as np
import pytest
import torch

from keras_side import models
from keras_side.determinism import seed_everything
from keras_side.spec import TrainConfig
from native.torch import bypass, fast
from native.torch import compiled as torch_compiled
from tests.native.torch.dropouts import (first_dropout, functional_dropout, lstm_dropout, noisy_bn_dropout,
                                         sequence_dropout)


def test_a_wrapped_torch_module_keeps_the_compiled_loss():
    """A torch module inside a Keras layer (Keras wraps it in a `TorchModuleWrapper`) computes with its own torch
    parameters, which no mapping of Keras's variables reaches: its gradient would be zero; it is not `stateless`."""
    class Wrapped(keras.layers.Layer):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(3, 1)

        def call(self, x):
            return self.linear(x)

    model = keras.Sequential([keras.Input((3,)), Wrapped()])
    assert not torch_compiled.stateless(model) and torch_compiled.stateless(models.har())


@pytest.mark.parametrize("build, rates, shape", [(noisy_bn_dropout, [0.3, 0.5], (3,)),
                                                 (first_dropout, [0.4], (3,)),
                                                 (sequence_dropout, [0.25], (5, 2)),
                                                 (lstm_dropout, [0.25], (5, 2)),
                                                 (functional_dropout, [0.3, 0.3], (3,))])
def test_draws_are_the_masks_and_seed_states_of_kerass_own_dropout(build, rates, shape):
    """#15: each mask drawn before the step is the one the layer's call would draw, applied as its call applies
    it, and each seed state moves as the call moves it: to the bit, twice; a Dropout first, on a sequence, after an
    LSTM, two, and one called twice in a Functional model's graph."""
    seed_everything(0)
    model = build()
    probed = _state(model)
    draws = torch_compiled.Draws.of(model, np.zeros((2, *shape), np.float32))
    assert all(np.array_equal(a, b) for a, b in zip(probed, _state(model)))  # its probe call moved no state
    assert [layer.rate for layer in draws.layers] == rates
    seeds = [layer.seed_generator.state for layer in draws.layers]
    x = torch.as_tensor(np.random.default_rng(0).normal(size=(16, *shape)).astype(np.float32))
    for _ in range(2):
        before, seeds_before = _state(model), [np.array(s) for s in seeds]
        keras_out, keras_after = model(x, training=True), _state(model)
        for v, value in zip(model.variables, before):
            v.assign(value)
        ours = bypass.forward(model, x, training=True, masks=draws(len(x)))
        assert torch.equal(ours, keras_out)
        assert all(np.array_equal(a, b) for a, b in zip(keras_after, _state(model)))
        assert all(not np.array_equal(a, np.array(s)) for a, s in zip(seeds_before, seeds))  # every seed moved


class _Subclassed(keras.Model):
    def __init__(self):
        super().__init__()
        self.dropout, self.out = keras.layers.Dropout(0.3, seed=1), keras.layers.Dense(1)

    def call(self, x, training=False):
        return self.out(self.dropout(x, training=training))


@pytest.mark.parametrize("build", [
    lambda L: [L.Dense(4), L.Dropout(0.3)],  # unseeded: torch's own dropout on its global generator
    lambda L: [L.Dense(4), L.Dropout(0.3, noise_shape=(None, 1), seed=1)],
    lambda L: [L.Dense(4), L.Dropout(0.3, seed=1), L.GaussianNoise(0.1, seed=2)],  # another layer that draws
    lambda L: [L.Dense(4), L.Dropout(0.3, seed=1, activity_regularizer="l2")],  # its wrapper adds a loss
    lambda L: [L.Dense(4)],  # nothing to draw
    lambda L: "subclassed",  # not called layer by layer
    lambda L: "masked",  # the Dropout's input carries a mask, which its wrapper would pass on
])
def test_draws_are_none_where_the_masks_are_not_drawn_as_a_seeded_dropout_draws_them(build):
    L, x = keras.layers, np.zeros((2, 3), np.float32)
    layers = build(L)
    if layers == "subclassed":
        model = _Subclassed()
    elif layers == "masked":
        model = keras.Sequential([keras.Input((3,), dtype="int32"), L.Embedding(5, 2, mask_zero=True),
                                  L.Dropout(0.3, seed=1), L.GlobalAveragePooling1D(), L.Dense(1)])
        x = np.zeros((2, 3), np.int32)
    else:
        model = keras.Sequential([keras.Input((3,)), *layers, L.Dense(1)])
    assert torch_compiled.Draws.of(model, x) is None


def test_masks_no_layer_takes_are_an_error():
    model = first_dropout()
    masks = torch_compiled.Draws.of(model, np.zeros((2, 3), np.float32))(4)
    x = torch.ones((4, 3))
    with pytest.raises(RuntimeError, match="internal: Draws drew 1 more Dropout mask"):
        bypass.forward(model, x, training=True, masks=masks * 2)
    with pytest.raises(RuntimeError, match="for a model this call does not run layer by layer"):
        bypass.forward(model, torch.ones((4, 3), dtype=torch.float64), training=True, masks=masks)


def _state(model) -> list[np.ndarray]:
    return [np.array(v) for v in model.variables]  # weights, moving statistics, seed states


@pytest.mark.parametrize("name", ["har", "mlp_l2", "bn_mlp", "dropout_mlp", "lstm", "conv1d", "classifier"])
@pytest.mark.parametrize("training", [True, False])
def test_a_sequential_models_layers_in_order_are_the_model(name, training):
    """#15: the loop calls a Sequential model's layers one after another (Keras's graph runner costs more than a
    Dense layer on torch): the same outputs, the same model losses (regularizers), the same state moved, to the bit."""
    from keras_side.zoo import ZOO

    seed_everything(0)
    model = ZOO[name].builder()()
    x = torch.as_tensor(np.random.default_rng(0).normal(size=(64, *model.inputs[0].shape[1:])).astype(np.float32))
    assert bypass.in_order(model) is not None
    before = _state(model)
    whole, whole_losses, whole_after = model(x, training=training), list(model.losses), _state(model)
    for v, value in zip(model.variables, before):
        v.assign(value)  # the Dropout seed and the moving statistics back where they were
    layered = bypass.forward(model, x, training=training)
    assert torch.equal(whole, layered)
    assert len(whole_losses) == len(model.losses) and all(torch.equal(a, b) for a, b in zip(whole_losses, model.losses))
    assert all(np.array_equal(a, b) for a, b in zip(whole_after, _state(model)))


def _called_whole(monkeypatch) -> list[str]:
    """The names of the layers then called through `Layer.__call__` (the others through their `call`)."""
    called, keras_call = [], keras.Layer.__call__

    def spy(layer, *args, **kwargs):
        called.append(layer.name)
        return keras_call(layer, *args, **kwargs)

    monkeypatch.setattr(keras.Layer, "__call__", spy)  # every layer class that keeps Keras's __call__ gets the spy
    return called


@pytest.mark.parametrize("name, whole", [("har", []), ("bn_mlp", []), ("dropout_mlp", []), ("classifier", []),
                                         ("mlp_l2", ["hidden"]), ("lstm", []), ("conv1d", [])])
def test_a_layer_is_called_through_its_call_when_its_wrapper_has_nothing_to_do(monkeypatch, name, whole):
    """#15: `Layer.__call__` costs a Dense more than its `call` on torch; the loop calls `call` unless the wrapper
    has work: mlp_l2's hidden layer has an activity regularizer. The Conv1D's pooling has its own `compute_mask`,
    which makes no mask from an unmasked input (the next test has one that does).
    The LSTM runs as torch's own LSTM op (the next tests). The outputs are the model's to the bit (and in every
    state: the test above)."""
    from keras_side.zoo import ZOO

    seed_everything(0)
    model = ZOO[name].builder()()
    x = torch.as_tensor(np.random.default_rng(0).normal(size=(16, *model.inputs[0].shape[1:])).astype(np.float32))
    want = model(x, training=False)
    called = _called_whole(monkeypatch)
    assert torch.equal(bypass.forward(model, x, training=False), want) and called == whole


@pytest.mark.parametrize("name, whole", [("two_horizons", []), ("panel", ["asset_level", "concat"]),
                                         ("mlp_functional", [])])
@pytest.mark.parametrize("training", [True, False])
def test_a_functional_models_graph_run_by_keras_runner_is_the_model(monkeypatch, name, whole, training):
    """#15: a Functional model's graph through Keras's own runner (`_run_through_graph`), each layer through its
    `call` where its wrapper has nothing to do: the panel's Embedding (integer input, its own mask) and Concatenate
    (a list) go through Keras's `__call__`. The same outputs to the bit."""
    seed_everything(0)
    model = getattr(models, name)()
    rng = np.random.default_rng(0)
    x = torch.as_tensor(rng.normal(size=(16, 3)).astype(np.float32))
    if name == "panel":
        x = (x, torch.as_tensor(rng.integers(0, models.N_ASSETS, size=(16, 1)), dtype=torch.int32))
    want = model(list(x) if isinstance(x, tuple) else x, training=training)
    called = _called_whole(monkeypatch)
    got = bypass.forward(model, x, training=training)
    assert called == whole and bypass.own_graph(model)
    for a, b in zip(*(w if isinstance(w, list) else [w] for w in (want, got)), strict=True):
        assert torch.equal(a, b)


def _lstms() -> dict:
    L = keras.layers
    return {"zoo": lambda: models.lstm(),
            "stacked": lambda: keras.Sequential([keras.Input((10, 4)), L.LSTM(5, return_sequences=True), L.LSTM(3),
                                                 L.Dense(2)]),
            "stacked_wide": lambda: keras.Sequential([keras.Input((10, 4)), L.LSTM(256, return_sequences=True),
                                                      L.LSTM(3), L.Dense(2)]),  # a time-major input, 256 wide
            "no_bias": lambda: keras.Sequential([keras.Input((10, 4)), L.LSTM(5, use_bias=False), L.Dense(2)]),
            "float64": lambda: keras.Sequential([keras.Input((10, 4), dtype="float64"), L.LSTM(5, dtype="float64"),
                                                 L.Dense(2, dtype="float64")]),
            "functional": lambda: _functional_lstm()}


def _functional_lstm():
    inputs = keras.Input((10, 4))
    return keras.Model(inputs, keras.layers.Dense(1)(keras.layers.LSTM(3)(inputs)))


def _outputs_and_gradients(model, forward):
    model.zero_grad(set_to_none=True)
    out = forward()
    torch.mean(out ** 2).backward()  # outside the LSTM's call: the backward runs as the loop's does
    return [out.detach()] + [p.grad for p in model.parameters() if p.requires_grad]


@pytest.mark.parametrize("name", list(_lstms()))
def test_an_lstm_runs_as_torchs_own_lstm_op_to_the_bit(monkeypatch, name):
    """#15: Keras's torch LSTM on CPU is a Python loop over the time steps (the zoo's eager step was 1.4× its
    `fit`); the loop runs it as `torch.lstm` on the layer's own weights, with oneDNN off so that torch's cell is
    ATen's, op for op Keras's: the same outputs and the same gradients, to the bit, and oneDNN back on after."""
    seed_everything(0)
    model = _lstms()[name]()
    dtype = torch.float64 if name == "float64" else torch.float32
    x = torch.as_tensor(np.random.default_rng(0).normal(size=(32, *model.inputs[0].shape[1:]))).to(dtype)
    lstm = next(layer for layer in model.layers if isinstance(layer, keras.layers.LSTM))
    assert bypass._plain_lstm(lstm, x)
    want = _outputs_and_gradients(model, lambda: model(x, training=True))
    called = _called_whole(monkeypatch)
    got = _outputs_and_gradients(model, lambda: bypass.forward(model, x, training=True))
    assert not any("lstm" in layer for layer in called) and torch.backends.mkldnn.enabled
    assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want))
    torch.backends.mkldnn.enabled = False  # off before the call: off after it
    try:
        bypass.forward(model, x, training=True)
        assert not torch.backends.mkldnn.enabled
    finally:
        torch.backends.mkldnn.enabled = True


def test_a_bfloat16_lstm_pair_as_torchs_op_to_the_bit():
    """Half precision rounds every step, so any other order of the ops would show: outputs and gradients equal."""
    seed_everything(0)
    half = dict(dtype="bfloat16", recurrent_initializer="glorot_uniform")  # torch has no bfloat16 QR (orthogonal)
    first, second = keras.layers.LSTM(32, return_sequences=True, **half), keras.layers.LSTM(16, **half)
    x = torch.as_tensor(np.random.default_rng(0).normal(size=(32, 10, 4))).to(torch.bfloat16)
    pair = keras.Sequential([first, second])  # no Input: its parameters, not a graph (bfloat16 builds none)
    pair(x)
    assert bypass._plain_lstm(first, x) and bypass._plain_lstm(second, first(x))
    want = _outputs_and_gradients(pair, lambda: second(first(x, training=True), training=True))
    got = _outputs_and_gradients(pair, lambda: bypass._lstm(second, bypass._lstm(first, x, True), True))
    assert len(got) == 7 and all(torch.equal(a, b) for a, b in zip(got, want, strict=True))  # output, 6 gradients


@pytest.mark.parametrize("change", [dict(dropout=0.3), dict(recurrent_dropout=0.3), dict(go_backwards=True),
                                    dict(use_cudnn=False), dict(activation="relu"), dict(return_state=True),
                                    dict(stateful=True), "hook", "mask", "one row", "one step", "cell dtype",
                                    "autocast"])
def test_an_lstm_keras_computes_otherwise_goes_through_keras(change):
    """Dropout, going backwards, Keras's cell-by-cell loop, another activation, states returned, a stateful layer,
    a hook of yours, a mask, weights in another dtype or torch's autocast: each makes Keras's LSTM compute something
    torch's op does not, so Keras calls it; so do one row or one time step, where torch would round the input's
    projection otherwise."""
    seed_everything(0)
    lstm = keras.layers.LSTM(3, **(change if isinstance(change, dict) else {}))
    x = torch.as_tensor(np.random.default_rng(0).normal(size=(4, 10, 2)).astype(np.float32))
    plain = keras.layers.LSTM(3)
    lstm(x), plain(x)
    if change == "hook":
        lstm.register_forward_hook(lambda *args: None)
    assert bypass._plain_lstm(plain, x)
    if change == "mask":
        x = x.clone()
        x._keras_mask = torch.ones((4, 10), dtype=torch.bool)  # as a masking layer before it leaves it
    x = {"one row": x[:1], "one step": x[:, :1]}.get(change, x) if isinstance(change, str) else x  # bias folded
    if change == "cell dtype":
        lstm.dtype_policy = "float64"  # set after the build: the cell's weights stay float32
        x = x.double()
    with torch.autocast("cpu", enabled=change == "autocast"):
        assert not bypass._plain_lstm(lstm, x) and not bypass._direct(lstm, x)
    if change in ("one row", "one step"):
        assert torch.equal(bypass.forward(keras.Sequential([lstm]), x, training=False), lstm(x))


@pytest.mark.parametrize("training", [True, False])
def test_a_functional_models_layers_with_recorded_flags_take_their_call(monkeypatch, training):
    """Keras records `training` (and an LSTM's `mask=None`) on a Functional node when the layer takes them; the
    runner's flag overrides the recorded one, as Keras's `operation_fn` does, and the layer takes its `call`:
    the same outputs, moving statistics and seed states, to the bit."""
    seed_everything(0)
    inputs = keras.Input((10, 2))
    h = keras.layers.LSTM(4, return_sequences=True)(inputs)
    h = keras.layers.BatchNormalization()(keras.layers.Flatten()(h))
    h = keras.layers.Dropout(0.3, seed=1)(h, training=False)
    model = keras.Model(inputs, keras.layers.Dense(1)(h))
    x = torch.as_tensor(np.random.default_rng(0).normal(size=(16, 10, 2)).astype(np.float32))
    before = _state(model)
    want, want_state = model(x, training=training), _state(model)
    for v, value in zip(model.variables, before):
        v.assign(value)
    called = _called_whole(monkeypatch)
    got = bypass.forward(model, x, training=training)
    assert called == [] and torch.equal(got, want)
    assert all(np.array_equal(a, b) for a, b in zip(want_state, _state(model)))


def test_a_torch_hook_or_another_dtype_sends_a_layer_through_keras_call(monkeypatch):
    """What the wrapper would do is done: a forward hook of yours fires, a float64 input is cast to the layer's
    float32, and a mixed-precision layer runs under Keras's autocast scope."""
    model = models.har()
    x = torch.ones((4, 3))
    want, seen = model(x), []
    handle = model.layers[0].register_forward_hook(lambda module, args, out: seen.append(tuple(out.shape)))
    called = _called_whole(monkeypatch)
    assert torch.equal(bypass.forward(model, x, training=True), want) and seen == [(4, 1)]
    assert called == ["har"]  # the Dense layer (named as its model)
    handle.remove()
    assert torch.equal(bypass.forward(model, x, training=True), want) and called == ["har"]  # hook gone: bare
    assert bypass._bare(model.layers[0], x) and not bypass._bare(model.layers[0], x.double())
    mixed = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1, dtype="mixed_bfloat16")])
    assert not bypass._bare(mixed.layers[0], x) and bypass.forward(mixed, x, True).dtype == torch.bfloat16


def test_a_hook_on_a_sequential_model_itself_fires_in_every_verb(har):
    """A hook on the model (not a layer) was skipped by the layers-in-order call: `predict`, `grad_at` and `train`
    computed the model without it, silently. Now the model is called whole, and the hook fires in each."""
    seed_everything(0)
    model = models.har()
    x = har.x_train[:64]
    plain = fast.predict(model, x)
    seen = []
    model.register_forward_hook(lambda module, args, out: seen.append(1) or out + 100.0)
    assert bypass.in_order(model) is None
    np.testing.assert_allclose(fast.predict(model, x), plain + 100.0, rtol=1e-6)
    assert seen and fast.grad_at(model, x, har.y_train[:64]) and len(seen) >= 2
    result = fast.train(model, har, TrainConfig(epochs=1, validate=False))
    assert result.train_loss[0] > 1000  # outputs 100 off every target: the hook is in the loss


def test_masks_ride_on_the_tensors_between_layers_in_order():
    """A mask made by one layer (Embedding's zeros) reaches the next (the LSTM skips the padded days) as it does
    through Keras's graph: masks travel on the tensors, as in Keras's own layer-by-layer Sequential."""
    seed_everything(0)
    model = keras.Sequential([keras.Input((5,), dtype="int32"), keras.layers.Embedding(4, 3, mask_zero=True),
                              keras.layers.LSTM(2), keras.layers.Dense(1)])
    x = torch.as_tensor([[1, 2, 3, 0, 0], [3, 0, 0, 0, 0]], dtype=torch.int32)
    assert torch.equal(model(x, training=True), bypass.forward(model, x, training=True))
    unmasked = bypass.forward(model, torch.as_tensor([[1, 2, 3, 3, 3], [3, 3, 3, 3, 3]], dtype=torch.int32),
                                   training=True)
    assert not torch.equal(unmasked, bypass.forward(model, x, training=True))  # the mask did something


def test_a_layer_that_makes_a_mask_is_called_through_keras(monkeypatch):
    """Masking marks the all-zero days of a float input (its `compute_mask` makes a mask where the input had none), so
    it goes through `Layer.__call__`, which puts the mask on its output, and the LSTM after it, given a masked input,
    skips those days through Keras too; a global pooling, whose `compute_mask` makes none, is called bare."""
    seed_everything(0)
    model = keras.Sequential([keras.Input((5, 1)), keras.layers.Masking(0.0), keras.layers.LSTM(2),
                              keras.layers.Dense(1)])
    x = torch.as_tensor([[1, 2, 3, 0, 0], [3, 0, 0, 0, 0]], dtype=torch.float32)[..., None]
    want = model(x, training=True)
    called = _called_whole(monkeypatch)
    assert torch.equal(bypass.forward(model, x, training=True), want)
    assert called[:2] == [model.layers[0].name, model.layers[1].name]  # then the LSTM's cell, a day at a time
    assert model.layers[2].name not in called  # the Dense after them: bare
    assert not bypass._makes_no_mask(model.layers[0], x)
    assert bypass._makes_no_mask(keras.layers.GlobalAveragePooling1D(), x)
    unmasked = keras.Sequential([keras.Input((5, 1)), model.layers[1], model.layers[2]])
    assert not torch.equal(unmasked(x), want)  # the mask did something


def test_a_lambda_is_called_through_keras_so_its_layers_see_the_training_flag(monkeypatch):
    """A Dropout inside a Lambda's function (untracked) reads `training` from the call context that Keras's
    `Layer.__call__` opens: called bare, it would not drop."""
    dropout = keras.layers.Dropout(0.5, seed=0)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Lambda(lambda x: dropout(x))])
    called = _called_whole(monkeypatch)
    out = bypass.forward(model, torch.ones((4, 64)), training=True)
    assert model.layers[0].name in called and (out == 0).any() and (out == 2).any()


def test_a_layer_holding_layers_without_a_training_flag_keeps_the_model_whole():
    """Its inner Dropout reads `training` from the model's call: called alone it would not see it. A Sequential
    subclass with its own `call` is called whole too."""
    class Block(keras.layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.dropout = keras.layers.Dropout(0.5)

        def call(self, x):
            return self.dropout(x)

    class Doubled(keras.Sequential):
        def call(self, x, training=None):
            return 2 * super().call(x, training=training)

    model = keras.Sequential([keras.Input((3,)), Block(), keras.layers.Dense(1)])
    assert bypass.in_order(model) is None and bypass.in_order(models.mlp_functional()) is None
    doubled = Doubled([keras.Input((3,)), keras.layers.Dense(1)])
    assert bypass.in_order(doubled) is None  # its own call is the model
    assert torch.equal(bypass.forward(doubled, torch.ones((2, 3)), training=True), doubled(torch.ones((2, 3))))
    x = torch.ones((1000, 3))
    assert not torch.equal(model(x, training=True), model(x, training=False))  # the flag reached the Dropout
    assert torch.equal(bypass.forward(model, x, training=False), model(x, training=False))


def test_inputs_the_models_graph_would_adjust_go_through_the_model_whole():
    """A (n,) vector for a model declared on (n, 1): Keras's graph adds the axis; the layers alone would not."""
    seed_everything(0)
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(2)])
    x = torch.ones(4)
    assert torch.equal(bypass.forward(model, x, training=False), model(x, training=False))
    assert bypass.as_declared(model, torch.ones((4, 1))) and not bypass.as_declared(model, x)
