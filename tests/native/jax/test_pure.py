"""`PureModel`: any Keras model as pure functions for a JAX program of yours. A loop written with it, `jit`,
`value_and_grad` and the package's optax optimizer ends on the reference loop's weights to the bit (so on `fit`'s);
its state can be donated without breaking the Keras model."""
import functools

import jax
import numpy as np
import optax
import pytest

from keras_side import models
from keras_side.data import batch_slices
from keras_side.determinism import seed_everything
from keras_side.losses import training_loss
from keras_side.spec import TrainConfig
from native.jax import loop, optim
from native.jax.host import PureModel
from tests.native import users_models
from tests import tiers

CFG = TrainConfig(epochs=2, validate=False)


def users_step(pure, optimizer, loss_fn, *, donate: bool = False):
    """What a JAX user writes: a jitted step over `PureModel.apply`, the optimizer's state beside the model's."""
    @functools.partial(jax.jit, donate_argnums=0 if donate else ())
    def step(state, opt_state, x, y):
        def loss_of(trainable):
            outputs, new_state, losses = pure.apply((trainable, state[1]), x, training=True)
            return loss_fn(y, outputs) + losses, new_state
        (loss, new_state), grads = jax.value_and_grad(loss_of, has_aux=True)(state[0])
        updates, opt_state = optimizer.update(grads, opt_state, state[0])
        return (optax.apply_updates(state[0], updates), new_state[1]), opt_state, loss

    return step


def users_loop(model, data, cfg, *, donate: bool):
    """The user's step over the reference loop's batch orders."""
    pure, optimizer = PureModel(model), optim.build(cfg)
    step = users_step(pure, optimizer, training_loss(cfg), donate=donate)
    state = pure.init()
    opt_state = optimizer.init(state[0])
    for order in np.asarray(loop.batch_orders(cfg, data.n_train)):  # the reference loop's batch orders
        for rows in batch_slices(data.n_train, cfg.batch_size):
            state, opt_state, _ = step(state, opt_state, data.x_train[order[rows]], data.y_train[order[rows]])
    return pure, state


@pytest.mark.parametrize("build", [models.har, models.dropout_mlp, models.bn_mlp], ids=["har", "dropout", "bn"])
def test_a_loop_of_yours_over_the_pure_model_is_the_reference_loop(har, build):
    seed_everything(0)
    want = loop.train(build(), har, CFG).weights
    seed_everything(0)
    model = models.ensure_built(build(), har.x_train)
    pure, state = users_loop(model, har, CFG, donate=False)
    pure.write_back(state)
    for got, expected in zip(model.get_weights(), want, strict=True):
        np.testing.assert_array_equal(got, expected)


def test_a_donated_state_leaves_the_keras_model_working(har):
    seed_everything(0)
    model = models.ensure_built(models.har(), har.x_train)
    before = model.predict(har.x_test, verbose=0)
    pure, state = users_loop(model, har, CFG, donate=True)
    np.testing.assert_array_equal(model.predict(har.x_test, verbose=0), before)  # its own buffers, not donated
    pure.write_back(state)
    assert not np.array_equal(model.predict(har.x_test, verbose=0), before)


def test_an_unbuilt_model_is_one_line():
    import keras

    with pytest.raises(ValueError, match="PureModel needs a built model"):
        PureModel(keras.Sequential([keras.layers.Dense(1)]))


# make test: the state threaded (BatchNorm), two inputs, a seeded Dropout; the recurrent and attention models, which
# compile longest, and the add_loss layer in make test-full (torch's test takes all six in make test).
@pytest.mark.parametrize("name", tiers.rows(list(users_models.MODELS), fast=["two_inputs", "layernorm_dropout", "batchnorm"]))
def test_a_users_model_trains_through_the_pure_model_as_fit_trains_it(name):
    """The six models of a user's own (tests/native/users_models.py), each through `PureModel` in a jitted step of
    the user's with the package's Keras-exact optax Adam, fed by an iterator of the user's batches, and through `fit`
    fed the same batches (a PyDataset): the same weights, to the bit (BatchNorm's statistics and the dropout seed
    states threaded)."""
    import keras

    from keras_side.arrays import take

    x, y = users_models.data(name)
    cfg, epochs = TrainConfig(learning_rate=0.01), 3

    def batches():
        for rows in batch_slices(len(y), 32):
            xb = take(x, rows)
            yield (list(xb) if isinstance(xb, tuple) else xb), y[rows]

    class Batches(keras.utils.PyDataset):
        def __len__(self):
            return len(batch_slices(len(y), 32))

        def __getitem__(self, i):
            return list(batches())[i]

    want = users_models.compiled(name, cfg)
    want.fit(Batches(), epochs=epochs, shuffle=False, verbose=0)  # the batches in the order given

    model = users_models.fresh(name)
    pure, optimizer = PureModel(model), optim.build(cfg)
    step = users_step(pure, optimizer, keras.losses.MeanSquaredError())
    state = pure.init()
    opt_state = optimizer.init(state[0])
    for _ in range(epochs):
        for xb, yb in batches():
            state, opt_state, _ = step(state, opt_state, xb, yb)
    pure.write_back(state)
    for got, expected in zip(model.get_weights(), want.get_weights(), strict=True):
        np.testing.assert_array_equal(got, expected)
