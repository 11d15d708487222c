import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import torch

from compare.referee.tolerances import COMPILED_VS_EAGER_ATOL, PORTABLE_ATOL
from keras_side import internals, models
from keras_side.arrays import as_tuple
from keras_side.determinism import seed_everything
from keras_side.spec import SpecError, TrainConfig
from keras_side.zoo import ZOO
from native.torch import bypass, fast, loop
from native.torch import compiled as torch_compiled
from native.torch import host as torch_host
from native.torch import losses as torch_losses
from tests.native.loops import flat
from tests.native.torch.dropouts import (first_dropout, functional_dropout, lstm_dropout, noisy_bn_dropout,
                                        sequence_dropout)
from tests.tiers import rows


def test_keras_model_is_a_torch_module_with_its_weights_as_parameters():
    seed_everything(0)
    model = models.har()
    assert isinstance(model, torch.nn.Module)
    params = [p for p in model.parameters() if p.requires_grad]
    assert sorted(p.numel() for p in params) == sorted(int(np.prod(w.shape)) for w in model.trainable_weights)


def test_functional_call_trap_gives_zero_gradients(har):
    """Why the torch loop does not use torch.func.functional_call (keras-team/keras#20279): the Keras layers
    read their own variables, not the parameters passed in, so the gradient comes out zero or missing."""
    seed_everything(0)
    model = models.har()
    params = {name: p.detach().clone().requires_grad_(True) for name, p in model.named_parameters()}
    x, y = torch.as_tensor(har.x_train[:256]), torch.as_tensor(har.y_train[:256])
    loss = torch.mean((torch.func.functional_call(model, params, (x,)) - y) ** 2)
    grads = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
    assert all(g is None or float(g.abs().max()) == 0.0 for g in grads)
    ours = fast.grad_at(model, har.x_train[:256], har.y_train[:256])
    assert all(np.all(g != 0) for g in ours)


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


PREDICT_ON_JAX = """
import sys, numpy as np
from keras_side import models
from keras_side.spec import TrainConfig
model = models.har()
model.load_weights(sys.argv[1])
np.save(sys.argv[3], model.predict(np.load(sys.argv[2]), verbose=0))
"""


def test_keras_part_of_a_torch_host_trains_and_moves_to_jax(har, tmp_path):
    seed_everything(0)
    host = torch_host.HostModel(models.har())
    names = [n for n, _ in host.named_parameters()]
    assert names == ["variables.0_kernel", "variables.1_bias", "calibrate.weight", "calibrate.bias"]
    before = host.har.get_weights()[0].copy()
    x, y = torch.as_tensor(har.x_train), torch.as_tensor(har.y_train)
    losses = torch_host.train_host(host, x, y, steps=200, lr=0.02)
    assert losses[-1] < 0.5 * losses[0]
    assert not np.array_equal(host.har.get_weights()[0], before)
    again = torch_host.HostModel(models.har())  # (n,) targets are (n, 1) ones, as fit takes them (not (n, n))
    again.load_state_dict(host.state_dict())
    assert torch_host.train_host(again, x[:8], y[:8, 0], steps=1, lr=0.0) == torch_host.train_host(
        again, x[:8], y[:8], steps=1, lr=0.0)

    from tests.native.loops import constrained_mlp  # a Keras weight's constraint holds in the host's training too

    bound = torch_host.HostModel(models.ensure_built(constrained_mlp(), har.x_train))
    torch_host.train_host(bound, x, y, steps=50, lr=0.05)
    hidden, _, output, _ = bound.har.get_weights()
    assert np.linalg.norm(hidden, axis=0).max() <= 0.3 * (1 + 1e-6) and output.min() >= 0

    weights, x_path, out = tmp_path / "har.weights.h5", tmp_path / "x.npy", tmp_path / "pred.npy"
    host.har.save_weights(str(weights))
    np.save(x_path, har.x_test)
    env = {**os.environ, "KERAS_BACKEND": "jax"}
    subprocess.run([sys.executable, "-c", PREDICT_ON_JAX, str(weights), str(x_path), str(out)], env=env, check=True,
                   capture_output=True)
    with torch.no_grad():
        here = host.har(torch.as_tensor(har.x_test)).numpy()
    np.testing.assert_allclose(np.load(out), here, atol=PORTABLE_ATOL, rtol=0)


def test_host_train_and_eval_reach_the_keras_model():
    """`host.train()` turns the Keras model's Dropout on, `host.eval()` off, as for any torch submodule."""
    seed_everything(0)
    host = torch_host.HostModel(models.dropout_mlp(seed=None))
    x = torch.ones(64, 3)
    with torch.no_grad():
        host.train()
        assert not torch.equal(host(x), host(x))  # a new dropout mask each call
        host.eval()
        assert torch.equal(host(x), host(x))
        np.testing.assert_array_equal(host(x).numpy(), host.calibrate(host.har(x, training=False)).numpy())


def test_unseeded_dropout_draws_from_the_global_generator_that_fit_also_draws_from(har):
    """Why the zoo seeds its Dropout: unseeded, Keras on torch takes `torch.nn.functional.dropout` on torch's
    global generator, and `fit`'s DataLoaders draw from it too (in the NumPy order, one `fit` call: two int64 draws
    before its first epoch, none between epochs without validation, measured). Make the same two draws before the
    native loop's first epoch and its masks, hence its weights, are `fit`'s to the bit, epoch after epoch."""
    import keras

    from keras_side import fit

    cfg = TrainConfig(epochs=2, batch_order="numpy", validate=False)

    def trained(train, draws=0):
        keras.backend.clear_session()
        seed_everything(0)
        model = models.ensure_built(models.dropout_mlp(seed=None), har.x_train)
        for _ in range(draws):
            torch.empty((), dtype=torch.int64).random_()
        train(model, har, cfg)
        return flat(model.get_weights())

    want = trained(fit.train)
    with pytest.warns(UserWarning, match=r"layer 'dropout\w*' drops out unseeded: .* give it a seed"):  # said
        gap = np.max(np.abs(trained(fast.train) - want))
    print(f"unseeded Dropout, other masks than fit's: gap {gap:.1e} after {cfg.epochs} epochs")
    assert gap > 1e-3
    with pytest.warns(UserWarning, match="drops out unseeded"):
        np.testing.assert_array_equal(trained(fast.train, draws=2), want)
    assert internals.global_generator_layers(models.dropout_mlp()) == []  # seeded: its own generator, as in fit
    spatial = keras.Sequential([keras.Input((5, 2)), keras.layers.SpatialDropout1D(0.2)])  # a noise shape: Keras's
    assert internals.global_generator_layers(spatial) == []  # own generator, seeded or not
    lstm = keras.Sequential([keras.Input((5, 2)), keras.layers.LSTM(2, recurrent_dropout=0.1)])
    assert [type(layer).__name__ for layer in internals.global_generator_layers(lstm)] == ["LSTMCell"]


@pytest.mark.parametrize("name, logits", [(n, False) for n in sorted(torch_losses.TORCH_LOSSES)] +
                         [(n, True) for n in sorted(torch_losses.TORCH_LOGIT_LOSSES)])
def test_losses_written_in_torch_are_keras_losses_to_the_bit(name, logits):
    """The loop's MSE, MAE and binary cross-entropy from logits in plain torch (for speed, and one graph under
    torch.compile) against the Keras Loss object `fit` compiles with."""
    from keras_side.losses import keras_loss

    rng = np.random.default_rng(0)
    y_true, y_pred = (torch.as_tensor(rng.normal(size=(257, 1)).astype(np.float32)) for _ in range(2))
    if logits:
        y_true = (y_true > 0).to(torch.float32)  # 0/1 labels
    cfg = TrainConfig(loss=name, from_logits=logits)
    want = keras_loss(cfg)(y_true, y_pred)
    assert torch.equal(torch_losses.spec_loss(cfg, same_rank=True)(y_true, y_pred), want)
    assert torch.equal(torch_losses.spec_loss(cfg, same_rank=False)(y_true[:, 0], y_pred), want)  # Keras shapes (n,)
    half = y_pred.to(torch.bfloat16)  # a mixed-precision model's outputs: Keras's loss casts them to float32 first
    assert torch.equal(torch_losses.spec_loss(cfg, same_rank=True)(y_true, half), keras_loss(cfg)(y_true, half))
    masked = y_pred.clone()
    masked._keras_mask = torch.as_tensor(rng.uniform(size=257) > 0.3)  # a mask on the outputs: Keras weighs it out
    assert torch.equal(torch_losses.spec_loss(cfg, same_rank=True)(y_true, masked), keras_loss(cfg)(y_true, masked))


@pytest.mark.parametrize("weights", [(1.0, 0.5), None])
def test_several_outputs_losses_in_torch_are_compiles_combination_to_the_bit(weights):
    """#15: two_horizons's MSE + 0.5 × MAE in torch against `OutputLosses` (Keras's losses as `compile` combines
    them, itself checked against fit's loss in the zoo), with and without sample weights."""
    from keras_side.losses import training_loss

    rng = np.random.default_rng(0)
    y_true, y_pred = ([torch.as_tensor(rng.normal(size=(129, 1)).astype(np.float32)) for _ in range(2)]
                      for _ in range(2))
    cfg = TrainConfig(loss=("mse", "mae"), loss_weights=weights)
    mine = torch_losses.spec_loss(cfg, same_rank=True)
    assert not isinstance(mine, type(training_loss(cfg)))  # the torch one
    for sample_weight in (None, torch.as_tensor(rng.uniform(size=129).astype(np.float32))):
        assert torch.equal(mine(y_true, y_pred, sample_weight), training_loss(cfg)(y_true, y_pred, sample_weight))


SAVE_IN_ANOTHER_PROCESS = """
import sys, keras, torch
from native.torch.host import HostModel
from tests.native.torch.test_fast import unnamed_model

torch.manual_seed(0)
keras.utils.set_random_seed(0)
host = HostModel(unnamed_model())
torch.save(host.state_dict(), sys.argv[1])
torch.save(host.eval()(torch.ones(4, 3)), sys.argv[2])
"""


def unnamed_model():
    """Every name auto-numbered by Keras (sequential_N, dense_N): the keys of its own state_dict depend on what the
    process built before; BatchNorm's statistics and a Dropout's seed state are variables too."""
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.BatchNormalization(),
                             keras.layers.Dropout(0.2, seed=1), keras.layers.Dense(1)])


def test_a_hosts_checkpoint_loads_in_another_process_and_in_this_one(tmp_path):
    """The Keras model's own state_dict has each weight twice, under counter-numbered keys; the host's has each
    variable once under "<index>.<name>": saved in one process, it loads in another that built other models first,
    and into a second instance in the same process."""
    import os
    import subprocess
    import sys

    from tests.conftest import REPO

    env = {**os.environ, "KERAS_BACKEND": "torch", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", SAVE_IN_ANOTHER_PROCESS, str(tmp_path / "host.pt"),
                           str(tmp_path / "out.pt")], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    saved = torch.load(tmp_path / "host.pt", weights_only=True)
    assert list(saved) == ["har.0.kernel", "har.1.bias", "har.2.gamma", "har.3.beta", "har.4.moving_mean",
                           "har.5.moving_variance", "har.6.seed_generator_state", "har.7.kernel", "har.8.bias",
                           "calibrate.weight", "calibrate.bias"]
    unnamed_model(), unnamed_model()  # this process's counters move on: its own keys now differ from the saver's
    here = torch_host.HostModel(unnamed_model())
    here.load_state_dict(saved)  # strict: every key found, none left over
    assert torch.equal(here.eval()(torch.ones(4, 3)), torch.load(tmp_path / "out.pt", weights_only=True))
    again = torch_host.HostModel(unnamed_model())
    again.load_state_dict(here.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(again.state_dict().values(), saved.values()))


def test_a_load_with_assign_is_refused_where_the_keras_layers_would_not_see_it():
    """`load_state_dict(sd, assign=True)` said "All keys matched" and swapped torch's parameters, but the Keras
    layers went on computing with (and training) their old tensors."""
    seed_everything(0)
    source, target = torch_host.HostModel(models.har()), torch_host.HostModel(models.har())
    x = torch.ones((4, 3))
    before = target.eval()(x)
    with pytest.raises(RuntimeError, match="har: load_state_dict\\(..., assign=True\\) would put new tensors in "
                                           "torch's parameters, which the Keras layers do not compute with"):
        target.load_state_dict(source.state_dict(), assign=True)
    target.load_state_dict(source.state_dict())
    assert torch.equal(target.eval()(x), source.eval()(x)) and not torch.equal(before, target(x))


def test_a_host_keeps_its_dtypes():
    """`host.double()` cast every weight to float64 and the Keras part went on computing in float32: an answer in
    float64 at float32's precision, without a word. Refused now, before anything is cast; devices still move."""
    host = torch_host.HostModel(models.har())
    for change in (host.double, host.half, lambda: host.to(torch.float64)):
        with pytest.raises(TypeError, match=r"^HostModel keeps its dtypes: its torch.float32 weights would become "
                                            r"torch.float(64|16), but the Keras model computes in its dtype policy "
                                            r"\(float32\)"):
            change()
        assert {p.dtype for p in host.parameters()} == {torch.float32}  # nothing half-cast
    assert host.to("cpu") is host and host.float() is host


def test_a_deep_copy_of_a_host_keeps_its_keys_and_its_weights():
    """An EMA copy or a snapshot: Keras copies its model by saving and loading it, and the copy's state dict had
    Keras's numbered keys ("har._torch_params.har/kernel"), which no fresh host loads."""
    import copy

    seed_everything(0)
    host = torch_host.HostModel(models.dropout_mlp())
    clone = copy.deepcopy(host)
    assert clone.har is not host.har and list(clone.state_dict()) == list(host.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(clone.state_dict().values(), host.state_dict().values()))
    with torch.no_grad():
        clone.har.layers[0].kernel.assign(clone.har.layers[0].kernel + 1)  # its own weights, not the source's
    fresh = torch_host.HostModel(models.dropout_mlp())
    fresh.load_state_dict(clone.state_dict())
    x = torch.ones((4, 3))
    assert torch.equal(fresh.eval()(x), clone.eval()(x)) and not torch.equal(fresh(x), host.eval()(x))


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


def test_what_fit_skips_and_what_it_adds_only_in_training_the_loops_do_too(har):
    """`fit`'s optimizer skips a variable its loss never reaches (autograd gives it no gradient, so AdamW's decay
    leaves it be), and counts a loss a layer adds only while training: the eager loop and the compiled gradient,
    which would give that variable zeros (decayed), end where `fit` ends."""
    import functools
    import warnings

    from compare.referee.tolerances import ZOO_ATOL
    from keras_side import fit

    class Extra(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(1)
            self.unused = self.add_weight(shape=(2,), initializer="ones", name="unused")

        def call(self, x, training=False):
            if training:
                self.add_loss(0.5 * keras.ops.sum(self.dense.kernel ** 2))
            return self.dense(x)

    cfg = TrainConfig(epochs=2, validate=False, batch_order="numpy", optimizer="adamw", weight_decay=0.1)
    trained = {}
    for name, train in [("fit", fit.train), ("eager", fast.train),
                        ("compiled", functools.partial(fast.train, compile=True))]:
        keras.backend.clear_session(free_memory=False)  # the same names each time
        seed_everything(0)
        model = Extra()
        model(har.x_train[:2])
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "Gradients do not exist")  # fit's, about the unused variable
            train(model, har, cfg)
            trained[name] = {v.path: v.numpy() for v in model.weights}
    assert torch_compiled.stateless(model)
    for name in ("eager", "compiled"):
        assert list(trained[name]) == list(trained["fit"])
        for path, want in trained["fit"].items():
            np.testing.assert_allclose(trained[name][path], want, atol=ZOO_ATOL, rtol=0, err_msg=f"{name} {path}")
    np.testing.assert_array_equal(trained["compiled"][next(p for p in trained["fit"] if "unused" in p)], [1, 1])


# The zoo rows that take each branch of the fast path: a Sequential model's layers in order, each through its `call`
# (har, har_recent's sample weights); a layer with an activity regularizer through Keras's wrapper (mlp_l2);
# BatchNorm's moving statistics (bn_mlp); a seeded Dropout (dropout_mlp, whose masks the compiled step draws outside
# its graph); torch's LSTM op (lstm); a pooling that makes no mask (conv1d); a Functional model's graph by Keras's
# runner with two outputs and the combined loss in torch (two_horizons); the logits' loss in torch (classifier);
# two inputs, one of them integers (panel).
REFERENCE_ROWS = ["har", "har_recent", "mlp_l2", "bn_mlp", "dropout_mlp", "lstm", "conv1d", "two_horizons",
                  "classifier", "panel"]


def _trained(train, name, panel, **options):
    """`train`'s Result on a zoo model, from the weights and batches every path starts from."""
    from compare.data import panel as har_data

    entry = ZOO[name]
    data, cfg = har_data.prepare_kind(panel, entry.data), TrainConfig(epochs=2).replace(**entry.spec)
    seed_everything(0)
    return train(entry.builder()(), data, cfg, **options)


@pytest.mark.parametrize("name", rows(REFERENCE_ROWS, fast=REFERENCE_ROWS))  # a second each: every row, always
def test_the_fast_loop_ends_on_the_reference_loops_weights_to_the_bit(panel, name):
    """The eager fast path (Keras's wrapper bypassed, torch's LSTM op, the losses in torch) is the reference loop
    made fast, not another loop: the same weights, losses and predictions, to the bit."""
    reference, ours = _trained(loop.train, name, panel), _trained(fast.train, name, panel)
    assert ours.path == "torch-native-fast" and reference.path == "torch-native"
    assert [w.shape for w in ours.weights] == [w.shape for w in reference.weights]
    assert all(np.array_equal(a, b) for a, b in zip(ours.weights, reference.weights))
    assert ours.train_loss == reference.train_loss and ours.val_loss == reference.val_loss
    assert all(np.array_equal(a, b)
               for a, b in zip(as_tuple(ours.test_pred), as_tuple(reference.test_pred), strict=True))


@pytest.mark.parametrize("name", rows(REFERENCE_ROWS, fast=["har", "dropout_mlp"]))
def test_the_compiled_loop_ends_on_the_reference_loops_weights(panel, name):
    """`compile=True` against the reference loop, within what torch.compile's fused kernels round differently."""
    reference, ours = _trained(loop.train, name, panel), _trained(fast.train, name, panel, compile=True)
    assert ours.path == "torch-native-compile"
    np.testing.assert_allclose(flat(ours.weights), flat(reference.weights), atol=COMPILED_VS_EAGER_ATOL, rtol=0)


def test_the_fast_verbs_take_inputs_by_name_as_the_loops_verbs_do():
    """`fast.predict` and `fast.grad_at` take a dict keyed by the model's input names, as `loop`'s do (they took
    arrays only), and give what the same arrays in the model's order give."""
    from tests.native.test_loops import users_model

    model = users_model()
    rng = np.random.default_rng(0)
    x = {"volumes": rng.normal(size=(16, 2)).astype(np.float32), "returns": rng.normal(size=(16, 3)).astype(np.float32)}
    y, ordered = rng.normal(size=(16, 1)).astype(np.float32), (x["returns"], x["volumes"])
    np.testing.assert_array_equal(fast.predict(model, x), fast.predict(model, ordered))
    for by_name, by_order in zip(fast.grad_at(model, x, y), fast.grad_at(model, ordered, y), strict=True):
        np.testing.assert_array_equal(by_name, by_order)


def test_the_fast_loop_takes_a_users_arrays_and_refuses_a_loader_in_one_line():
    """What the reference loop takes as `fit` does (inputs as a dict by name, float64 cast as fit casts them, sample
    weights, validation_data; 96 rows in batches of 40, the last one short), the fast loop takes too, and ends on
    its weights, to the bit; a loader, whose batches it cannot cut from whole arrays, is one line naming the
    reference loop, refused before the loader is read."""
    from tests.native.loops import Unread, engines_loader, fresh_users_model, users_arrays

    x, y, w, val = users_arrays()
    cfg = TrainConfig(epochs=3, batch_size=40, learning_rate=0.05)
    looped, fasted = (train(fresh_users_model(), (x, y, w), cfg, validation_data=val) for train in (loop.train,
                                                                                                     fast.train))
    assert fasted.path == "torch-native-fast" and fasted.units == looped.units == "as given"
    for mine, reference in zip(fasted.weights, looped.weights, strict=True):
        np.testing.assert_array_equal(mine, reference)
    assert fasted.val_loss == looped.val_loss and len(fasted.val_loss) == 3

    for loader, compile in ((engines_loader(x, y, w, 40), False), (Unread(), False), (Unread(), True)):
        name = "torch-native-compile" if compile else "torch-native-fast"
        with pytest.raises(SpecError, match=rf"^the path {name} cuts its batches from whole arrays and cannot train "
                                            r"on a loader of batches; .* on the path torch-native$"):
            fast.train(fresh_users_model(), loader, cfg, compile=compile)
    with pytest.raises(SpecError, match=r"^the path torch-native-fast .* cannot train on a loader of batches; give "
                                        r"validation_data=\(x_val, y_val\) arrays"):
        fast.train(fresh_users_model(), (x, y), cfg, validation_data=Unread())


class Interrupted(Exception):
    """Raised from an `on_step`: the run ends mid-epoch, as a crash would, its checkpoints on disk."""


def test_the_drivers_epochs_stop_resume_and_report_as_the_reference_loops_do(har, tmp_path):
    """The fast loop's epochs are the driver's (`native.driver.run`), not the reference loop's, so each thing the
    driver does is checked against the reference loop, to the bit: early stopping with the best weights restored,
    the metrics, `progress` and `on_step`; and a checkpoint resumed after a run ended in the middle of an epoch."""
    from tests.native.checkpoint_models import stateful_mlp

    cfg = TrainConfig(epochs=20, batch_order="numpy", learning_rate=0.05, patience=2, metrics=("mae",))

    def trained(train, **options):
        seed_everything(0)
        calls = {"progress": [], "on_step": []}
        result = train(models.ensure_built(models.mlp_sequential(), har.x_train), har, cfg,
                       progress=lambda *a: calls["progress"].append(a),
                       on_step=lambda loss: calls["on_step"].append(float(loss)), **options)
        return result, calls

    (reference, looked), (ours, seen) = trained(loop.train), trained(fast.train)
    assert len(ours.val_loss) < cfg.epochs  # it stopped early
    assert ours.train_loss == reference.train_loss and ours.val_loss == reference.val_loss
    assert ours.metrics == reference.metrics and set(ours.metrics) == {"mae", "val_mae"}
    assert seen == looked and len(seen["on_step"]) > len(seen["progress"]) > 0
    for mine, want in zip(ours.weights, reference.weights, strict=True):
        np.testing.assert_array_equal(mine, want)  # the best epoch's, restored

    cfg = TrainConfig(epochs=3, batch_size=256, seed=3)  # 9 steps an epoch: the run ends in its third epoch
    steps = []

    def crash(loss):
        steps.append(loss)
        if len(steps) == 22:
            raise Interrupted

    seed_everything(cfg.seed)
    whole = loop.train(stateful_mlp(), har, cfg)
    seed_everything(cfg.seed)
    with pytest.raises(Interrupted):
        fast.train(stateful_mlp(), har, cfg, checkpoint=tmp_path, on_step=crash)
    seed_everything(cfg.seed)
    resumed = fast.train(stateful_mlp(), har, cfg, checkpoint=tmp_path, resume=True)
    for mine, want in zip(resumed.weights, whole.weights, strict=True):
        np.testing.assert_array_equal(mine, want)  # BatchNorm's statistics and the Dropout's seed state too
    assert resumed.train_loss == whole.train_loss and resumed.val_loss == whole.val_loss
