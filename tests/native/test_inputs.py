"""What the loops take, on every engine: class labels, inputs by shape and kind, a user's arrays and loaders, each
mistake one line naming it. Runs once per engine."""
import numpy as np
import pytest

from compare.engines import paths
from compare.referee.tolerances import HISTORY_ATOL, ZOO_ATOL
from keras_side import models
from keras_side.determinism import seed_everything
from keras_side.spec import TrainConfig
from tests.native.conftest import ENGINE
from tests.native.loops import (SPLITS, engines_loader, flat, fresh_users_model, loop, three_classes, users_arrays,
                                users_model)


def test_class_labels_a_sparse_categorical_loss_cannot_take_are_one_error(har):
    """Keras checks none: on torch `fit` raised deep in its loss ("Target 3 is out of bounds") and on JAX it trained
    on without a word (its one-hot of such a label is zeros). Every path now refuses them before training; labels
    from 0 train."""
    import dataclasses
    import re

    import keras

    from keras_side import fit
    from keras_side.spec import SpecError

    data = dataclasses.replace(har, **{f"y_{s}": three_classes(har, getattr(har, f"y_{s}")) for s in SPLITS})
    cfg = TrainConfig(epochs=1, loss="sparse_categorical_crossentropy", from_logits=True)

    def build():
        seed_everything(0)
        return keras.Sequential([keras.Input((3,)), keras.layers.Dense(3)])

    for label, split, says in ((3, "train", "the train targets hold the label 3, which sparse_categorical_crossentropy "
                                            "cannot take: its labels are 0 to 2 (the model's 3 outputs)"),
                               (-1, "val", "the val targets hold the label -1"), (0.5, "test", "hold the label 0.5")):
        y = getattr(data, f"y_{split}").copy()
        y[7] = label
        for train in (fit.train, loop.train, paths.get(f"keras-{ENGINE}-train-step").train):
            with pytest.raises(SpecError, match=re.escape(says)):
                train(build(), dataclasses.replace(data, **{f"y_{split}": y}), cfg)
    # the width is known too of a model built by its first batch (fit), or of one with no symbolic outputs (the
    # train-step path wraps the model in a subclassed one): such labels trained on JAX without a word
    y = data.y_train.copy()
    y[7] = 3
    unbuilt = keras.Sequential([keras.layers.Dense(3)])
    with pytest.raises(SpecError, match=re.escape("its labels are 0 to 2 (the model's 3 outputs)")):
        fit.train(unbuilt, dataclasses.replace(data, y_train=y), cfg)
    assert np.isfinite(loop.train(build(), data, cfg).train_loss).all()


@pytest.mark.parametrize("build", [models.har, models.mlp_functional])
def test_inputs_of_another_shape_get_kerass_own_error(build):
    """torch's loop runs each layer's `call`, which skips Keras's check of the input's shape: it said "mat1 and mat2
    shapes cannot be multiplied"."""
    model = build()
    x = np.ones((2, 5), np.float32)  # the HAR takes 3 features
    with pytest.raises(ValueError, match="is incompatible with the layer: expected (axis -1 of input shape|shape)"):
        loop.predict(model, x)
    with pytest.raises(ValueError, match="is incompatible with the layer: expected (axis -1 of input shape|shape)"):
        loop.grad_at(model, x, np.ones((2, 1), np.float32))


def test_several_inputs_are_a_list_or_a_tuple_of_arrays_and_a_list_of_numbers_is_refused():
    """A list of arrays is how Keras takes several inputs: torch's verbs read it as one tensor and refused it. A list
    of numbers is refused on every engine, as `model.predict` refuses it: torch's verbs took it as one array, JAX's
    and TensorFlow's failed deep inside, each with its own message."""
    import keras

    a, b = keras.Input((3,)), keras.Input((2,))
    model = keras.Model([a, b], keras.layers.Dense(1)(keras.layers.Concatenate()([a, b])))
    rng = np.random.default_rng(0)
    x1, x2, y = (rng.normal(size=(4, n)).astype(np.float32) for n in (3, 2, 1))
    np.testing.assert_array_equal(loop.predict(model, [x1, x2]), loop.predict(model, (x1, x2)))
    for got, want in zip(loop.grad_at(model, [x1, x2], y), loop.grad_at(model, (x1, x2), y), strict=True):
        np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match=r"^x is a Python list of lists, not of arrays; pass np.asarray\(x\)"):
        loop.predict(models.har(), x1.tolist())
    with pytest.raises(ValueError, match=r"^y is a Python list of floats, not of arrays; pass np.asarray\(y\)"):
        loop.grad_at(models.har(), x1, y[:, 0].tolist())


def test_data_that_the_models_inputs_do_not_take_is_one_spec_error(har, panel):
    """Keras said it from inside the first call: on torch in 9 lines about the loop's one-row probe, `(1, 4)`."""
    import dataclasses

    from compare.data import panel as har_data
    from keras_side import fit
    from keras_side.spec import SpecError

    wide = dataclasses.replace(har, **{f"x_{s}": np.ones((len(getattr(har, f"x_{s}")), 4), np.float32)
                                       for s in ("train", "val", "test")})
    for train in (loop.train, fit.train):
        with pytest.raises(SpecError, match=r"^x has rows of shape \(4,\) but the model's input 'input_layer\w*' "
                                            r"takes \(3,\); give data of the model's input shape"):
            train(models.har(), wide, TrainConfig(epochs=1))
    two = har_data.prepare_kind(panel, "panel")
    one = dataclasses.replace(two, x_train=two.x_train[0], x_val=two.x_val[0], x_test=two.x_test[0])
    with pytest.raises(SpecError, match=r"^the model has 2 input\(s\) but x holds 1 array\(s\)"):
        loop.train(models.panel(), one, TrainConfig(epochs=1))
    import keras  # what Keras runs, a sequence of another length than declared (it warns), trains as it did

    days = np.zeros((40, 12, 2), np.float32)
    longer = dataclasses.replace(har, x_train=days, y_train=days[:, 0, :1], x_val=days[:8], y_val=days[:8, 0, :1],
                                 x_test=days[:8], y_test=days[:8, 0, :1])
    rnn = keras.Sequential([keras.Input((10, 2)), keras.layers.SimpleRNN(2), keras.layers.Dense(1)])
    assert len(loop.train(rnn, longer, TrainConfig(epochs=1, batch_size=20)).train_loss) == 1


def test_a_users_arrays_train_as_fit_trains_them():
    """The loop takes what `fit` takes: inputs as a dict by name (float64, cast as fit casts them), targets, sample
    weights and validation_data. One batch of every row (so that no batch order is in play) for three epochs: the
    loop ends at `fit`'s weights and reports its validation losses, in the data's own units."""
    x, y, w, val = users_arrays()
    cfg = TrainConfig(epochs=3, batch_size=96, learning_rate=0.05)

    want = fresh_users_model(compiled=cfg)
    history = want.fit(x, y, sample_weight=w, validation_data=val, batch_size=96, epochs=3, shuffle=False, verbose=0)
    got = loop.train(model := fresh_users_model(), (x, y, w), cfg, validation_data=val)
    np.testing.assert_allclose(flat(model.get_weights()), flat(want.get_weights()), atol=ZOO_ATOL, rtol=0)
    np.testing.assert_allclose(got.val_loss, history.history["val_loss"], atol=HISTORY_ATOL, rtol=0)
    assert got.units == "as given" and got.test_pred.shape == (32, 1)
    alone = loop.train(fresh_users_model(), (x, y), cfg.replace(epochs=1))  # no validation_data: none, as in fit
    assert alone.val_loss == [] and len(alone.train_loss) == 1
    ordered = tuple(x[name].astype(np.float32) for name in ("returns", "volumes"))  # the verbs take the dict too
    np.testing.assert_array_equal(loop.predict(model, x), loop.predict(model, ordered))
    for by_name, by_order in zip(loop.grad_at(model, x, y), loop.grad_at(model, ordered, y), strict=True):
        np.testing.assert_array_equal(by_name, by_order)


def test_a_users_loader_trains_as_fit_trains_its_batches():
    """The loop takes the engine's loader as `fit` does (torch's `DataLoader`, a `tf.data.Dataset`, an iterable of
    NumPy batches for JAX): its batches as they come, a short last one, a dict of inputs by name, sample weights, and a
    loader of validation batches. It ends bit-identical to `fit` over the same batches (its arrays unshuffled) and
    reports its validation losses."""
    rng = np.random.default_rng(1)
    x = {"returns": rng.normal(size=(100, 3)), "volumes": rng.normal(size=(100, 2))}
    y, w = rng.normal(size=(100, 1)), rng.uniform(0.5, 2.0, 100)
    x_val, y_val = {k: v[:36] for k, v in x.items()}, y[:36]
    cfg = TrainConfig(epochs=3, batch_size=40, learning_rate=0.05)  # 40, 40 and a short 20: the loader's own sizes

    want = fresh_users_model(compiled=cfg)
    history = want.fit(x, y, sample_weight=w, validation_data=(x_val, y_val), batch_size=40, validation_batch_size=16,
                       epochs=3, shuffle=False, verbose=0)
    got = loop.train(model := fresh_users_model(), engines_loader(x, y, w, 40), cfg.replace(batch_size=7),  # not the spec's
                     validation_data=engines_loader(x_val, y_val, None, 16))
    for mine, fits in zip(model.get_weights(), want.get_weights(), strict=True):
        np.testing.assert_array_equal(mine, fits)
    np.testing.assert_allclose(got.val_loss, history.history["val_loss"], atol=HISTORY_ATOL, rtol=0)
    np.testing.assert_allclose(got.train_loss, history.history["loss"], atol=HISTORY_ATOL, rtol=0)
    assert got.units == "as given" and got.test_pred.size == 0  # no test rows: predict on rows of yours
    assert loop.train(fresh_users_model(), engines_loader(x, y, None, 40), cfg).val_loss == []  # no validation_data: none


def test_a_users_bad_loader_is_one_line_naming_it():
    from keras_side.spec import SpecError

    x, y = {"returns": np.zeros((8, 3)), "volumes": np.zeros((8, 2))}, np.zeros((8, 1))
    loader = engines_loader(x, y, None, 4)
    cases = [(iter([(x, y)]), {}, "data is an iterator, which its first pass uses up; give an iterable"),
             (engines_loader(x["returns"], y, None, 4), {}, "the model has 2 input"),
             (loader, {"validation_data": (x, y)}, "validation_data is a tuple of 2 but data is a loader"),
             ((x, y), {"validation_data": loader}, "validation_data is a loader of batches but data is arrays"),
             (loader, {"checkpoint": "unused"}, "checkpoints resume the spec's batch orders, not a loader's"),
             (loader, {"cfg": TrainConfig(epochs=2, patience=1)}, "early stopping \\(patience\\) watches")]
    for data, extra, message in cases:
        cfg = extra.pop("cfg", TrainConfig(epochs=2))
        with pytest.raises(SpecError, match=message):
            loop.train(users_model(), data, cfg, **extra)


def test_a_users_bad_arrays_are_one_line_naming_them():
    from keras_side.spec import SpecError

    x, y = {"returns": np.zeros((8, 3)), "volumes": np.zeros((8, 2))}, np.zeros((8, 1))
    cases = [((x["returns"], y), {}, "the model has 2 input"),
             (({"returns": x["returns"]}, y), {}, "x is a dict of \\['returns'\\] but the model's inputs are named"),
             ("x.npy", {}, "data is a str; give \\(x, y\\) or \\(x, y, sample_weight\\) arrays"),
             ((x, y[:5]), {}, "the data's train split has arrays of different lengths"),
             ((x, y), {"validation_data": x}, "validation_data is a dict; give \\(x_val, y_val\\)")]
    for data, extra, message in cases:
        with pytest.raises(SpecError, match=message):
            loop.train(users_model(), data, TrainConfig(epochs=1), **extra)
    with pytest.raises(SpecError, match="early stopping \\(patience\\) watches the validation loss"):
        loop.train(users_model(), (x, y), TrainConfig(epochs=1, patience=2))
