"""Six models of a user's own, none of them the zoo's: what a torch or JAX codebase brings to `KerasModule` and
`PureModel`. Each takes `(rows, 6, 3)` sequences or `(rows, 3)` rows, as `INPUTS[name]` says, and has one output."""
import keras
import numpy as np
from keras import layers


class PenaltyLayer(layers.Layer):
    """The identity, adding 0.01·mean(x²) to the model's losses (`add_loss`), as a custom activity penalty does."""

    def call(self, x):
        self.add_loss(0.01 * keras.ops.mean(x**2))
        return x


def layernorm_dropout():
    return keras.Sequential([keras.Input((3,)), layers.Dense(8, kernel_regularizer=keras.regularizers.L2(1e-3)),
                             layers.LayerNormalization(), layers.Dropout(0.2, seed=2), layers.Dense(1)])


def attention():
    x = keras.Input((6, 3))
    h = layers.MultiHeadAttention(num_heads=2, key_dim=4, seed=3)(x, x)
    return keras.Model(x, layers.Dense(1)(layers.GlobalAveragePooling1D()(h)))


def masked_gru():
    return keras.Sequential([keras.Input((6, 3)), layers.Masking(0.0), layers.GRU(4, dropout=0.1, seed=4),
                             layers.Dense(1)])


def two_inputs():
    a, b = keras.Input((6, 3)), keras.Input((3,))
    h = layers.Concatenate()([layers.Flatten()(a), b])
    return keras.Model([a, b], layers.Dense(1)(layers.Dense(4, activation="tanh")(h)))


def add_loss():
    return keras.Sequential([keras.Input((3,)), layers.Dense(4, activation="tanh"), PenaltyLayer(), layers.Dense(1)])


def batchnorm():
    return keras.Sequential([keras.Input((3,)), layers.Dense(4, use_bias=False), layers.BatchNormalization(),
                             layers.Dense(1)])


MODELS = {f.__name__: f for f in (layernorm_dropout, attention, masked_gru, two_inputs, add_loss, batchnorm)}


def fresh(name: str):
    """Model `name` built afresh from seed 0: the same initial weights each time."""
    from keras_side.determinism import seed_everything

    keras.backend.clear_session()
    seed_everything(0)
    return MODELS[name]()


def compiled(name: str, cfg):
    """`fresh(name)` compiled as `fit` trains it: the spec's Keras optimizer, MSE."""
    from keras_side.optimizers import keras_optimizer

    model = fresh(name)
    model.compile(optimizer=keras_optimizer(cfg), loss="mse")
    return model


def data(name: str, rows: int = 96, seed: int = 0):
    """`(x, y)` NumPy float32 arrays for model `name`: x one array, or a tuple for two inputs; a masked GRU's
    sequences end in zero rows (masked) of varying length."""
    rng = np.random.default_rng(seed)
    sequences = rng.normal(size=(rows, 6, 3)).astype(np.float32)
    if name == "masked_gru":
        sequences[np.arange(6)[None, :] >= rng.integers(2, 7, size=rows)[:, None]] = 0.0
    x = {"attention": sequences, "masked_gru": sequences, "two_inputs": (sequences, sequences[:, -1])}.get(
        name, sequences[:, -1])
    return x, rng.normal(size=(rows, 1)).astype(np.float32)
