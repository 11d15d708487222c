"""The fast loop (`native.torch.fast`, eager and compiled) against the reference loop, and the driver it runs on."""
import keras
import numpy as np
import pytest
import torch

from compare.engines import paths
from compare.referee.tolerances import COMPILED_VS_EAGER_ATOL
from keras_side import internals, models
from keras_side.arrays import as_tuple
from keras_side.determinism import seed_everything
from keras_side.spec import SpecError, TrainConfig
from keras_side.zoo import ZOO
from native.torch import fast, loop
from native.torch import compiled as torch_compiled
from tests.native.loops import Interrupted, flat, interrupt_at
from tests.tiers import rows


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
    with pytest.warns(UserWarning, match="drops out unseeded") as said:
        np.testing.assert_array_equal(trained(fast.train, draws=2), want)
    assert {w.filename for w in said if "unseeded" in str(w.message)} == {__file__}  # at train()'s caller
    assert internals.global_generator_layers(models.dropout_mlp()) == []  # seeded: its own generator, as in fit
    spatial = keras.Sequential([keras.Input((5, 2)), keras.layers.SpatialDropout1D(0.2)])  # a noise shape: Keras's
    assert internals.global_generator_layers(spatial) == []  # own generator, seeded or not
    lstm = keras.Sequential([keras.Input((5, 2)), keras.layers.LSTM(2, recurrent_dropout=0.1)])
    assert [type(layer).__name__ for layer in internals.global_generator_layers(lstm)] == ["LSTMCell"]


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
    from tests.native.loops import users_model

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
    for name in ("torch-native-engine", "torch-native-compile-engine"):  # the path's own name, not the fast loop's
        with pytest.raises(SpecError, match=rf"^the path {name} cuts its batches from whole arrays"):
            paths.get(name).train(fresh_users_model(), Unread(), cfg)


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
    seed_everything(cfg.seed)
    whole = loop.train(stateful_mlp(), har, cfg)
    seed_everything(cfg.seed)
    with pytest.raises(Interrupted):
        fast.train(stateful_mlp(), har, cfg, checkpoint=tmp_path, on_step=interrupt_at(22))
    seed_everything(cfg.seed)
    resumed = fast.train(stateful_mlp(), har, cfg, checkpoint=tmp_path, resume=True)
    for mine, want in zip(resumed.weights, whole.weights, strict=True):
        np.testing.assert_array_equal(mine, want)  # BatchNorm's statistics and the Dropout's seed state too
    assert resumed.train_loss == whole.train_loss and resumed.val_loss == whole.val_loss


def test_the_fast_engine_is_freed_when_its_run_ends(har):
    """No reference cycle keeps the engine (its model, optimizer and compiled step) alive after its run: it goes with
    its last reference (DDP's engine: tests/native/torch/test_ddp.py, where a cycle aborted a rank)."""
    import gc
    import weakref

    from keras_side import models
    from native import driver

    gc.disable()
    try:
        cfg = TrainConfig(epochs=1)
        engine = fast.FastSteps(models.ensure_built(models.har(), har.x_train), har, cfg, compile=False,
                                looked_in=False)
        driver.run(engine, cfg)
        freed = weakref.ref(engine)
        del engine
        assert freed() is None
    finally:
        gc.enable()
