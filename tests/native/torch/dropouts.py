"""Small models with seeded Dropouts, for the tests of `Draws` (test_fast.py) and of the compiled loop that draws
their masks outside its graph (test_compile.py)."""
import keras


def noisy_bn_dropout():
    L = keras.layers
    return keras.Sequential([keras.Input((3,)), L.Dense(8, use_bias=False), L.BatchNormalization(),
                             L.Dropout(0.3, seed=3), L.Dense(4), L.Dropout(0.5, seed=4), L.Dense(1)])


def first_dropout():
    return keras.Sequential([keras.Input((3,)), keras.layers.Dropout(0.4, seed=5), keras.layers.Dense(1)])


def sequence_dropout():
    L = keras.layers
    return keras.Sequential([keras.Input((5, 2)), L.Dense(4), L.Dropout(0.25, seed=6), L.Flatten(), L.Dense(1)])


def lstm_dropout():  # the LSTM's cell holds a SeedGenerator and, with no dropout of its own, draws nothing
    L = keras.layers
    return keras.Sequential([keras.Input((5, 2)), L.LSTM(3, return_sequences=True), L.Dropout(0.25, seed=7),
                             L.Flatten(), L.Dense(1)])


def functional_dropout():
    inputs = keras.Input((3,))
    hidden = keras.layers.Dense(4)(inputs)
    dropped = keras.layers.Dropout(0.3, seed=1)
    return keras.Model(inputs, keras.layers.Dense(1)(dropped(hidden) + dropped(hidden)))  # one layer, two calls

