"""What both many-model trainers (`native.jax.many`, `native.torch.many`) must do: each seed of the vmapped trainer
ends where the engine's native loop ends with that seed, from the same start. Imported by each engine's test_many."""
import dataclasses

import numpy as np

from compare.data import panel as har_data
from compare.referee.tolerances import VMAP_VS_ALONE_ATOL
from keras_side.arrays import take
from keras_side.initial import InitialWeights
from keras_side.spec import TrainConfig
from keras_side.zoo import ZOO

ROWS = 300  # training rows: enough for three batches and a short one, and a fast compile


def zoo_data(panel, name: str):
    data = har_data.prepare_kind(panel, ZOO[name].data)
    return dataclasses.replace(data, x_train=take(data.x_train, slice(0, ROWS)),
                               y_train=take(data.y_train, slice(0, ROWS)),
                               w_train=None if data.w_train is None else data.w_train[:ROWS])


def alone(model, start, i: int):
    """Set model i's start into the Keras model (trainable and non-trainable)."""
    for variable, value in zip(model.trainable_variables, start[0], strict=True):
        variable.assign(value[i])
    for variable, value in zip(model.non_trainable_variables, start[1], strict=True):
        variable.assign(value[i])
    return model


def check_each_seed_trains_as_alone(many, train_alone, panel, name: str, seeds=(3, 4), epochs: int = 2,
                                    learning_rates=None):
    """`train_alone(model, data, cfg)` is the engine's native loop. With `learning_rates`, every rate trains every
    seed (rate-major), each checked against the loop at that rate."""
    data = zoo_data(panel, name)
    cfg = TrainConfig(epochs=epochs).replace(**ZOO[name].spec)
    init = InitialWeights.of(ZOO[name].builder(), data.x_train)
    rates = learning_rates or [cfg.learning_rate]
    one = init.draw(seeds)
    start = [[np.concatenate([w] * len(rates)) for w in ws] for ws in one]
    orders = np.concatenate([np.asarray(many.seed_orders(cfg, seeds, data.n_train))] * len(rates))
    trained = many.train_seeds(init.model, data, cfg, start, orders,
                               None if learning_rates is None else np.repeat(rates, len(seeds)))
    for r, rate in enumerate(rates):
        for k, seed in enumerate(seeds):
            i = r * len(seeds) + k
            model = alone(ZOO[name].builder()(), start, i)
            train_alone(model, data, cfg.replace(seed=seed, learning_rate=rate))
            assert not np.array_equal(np.asarray(trained["trainable"][0][i]), start[0][0][i])  # it trained
            for variable, value in zip(model.trainable_variables, trained["trainable"], strict=True):
                np.testing.assert_allclose(np.asarray(value[i]), _numpy(variable), atol=VMAP_VS_ALONE_ATOL, rtol=0)
            for variable, value in zip(model.non_trainable_variables, trained["non_trainable"], strict=True):
                np.testing.assert_allclose(np.asarray(value[i]).astype(float), _numpy(variable).astype(float),
                                           atol=VMAP_VS_ALONE_ATOL, rtol=0)
    return trained


def _numpy(variable):
    import keras

    return keras.ops.convert_to_numpy(variable.value)


def check_predict_seeds_of_heads_of_different_widths(many, panel):
    """A forecast and a class's logits: `predict_seeds` stacked the outputs and failed on NumPy's "inhomogeneous
    shape" after every seed had trained. Several outputs are a tuple, one (models, n, width) array each, and model i's
    predictions are the model's own with its weights."""
    import keras

    def build():
        inputs = keras.Input((3,))
        hidden = keras.layers.Dense(4, activation="tanh")(inputs)
        return keras.Model(inputs, [keras.layers.Dense(1)(hidden), keras.layers.Dense(3)(hidden)])

    data = zoo_data(panel, "har")
    init = InitialWeights.of(build, data.x_train)
    model, (trainable, non_trainable) = init.model, init.draw([0, 1])
    x = data.x_test[:7]
    got = many.predict_seeds(model, trainable, non_trainable, x)
    assert isinstance(got, tuple) and [g.shape for g in got] == [(2, 7, 1), (2, 7, 3)]
    for i in range(2):
        want = alone(model, (trainable, non_trainable), i).predict(x, verbose=0)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g[i], w, atol=1e-6, rtol=0)
