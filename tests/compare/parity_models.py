"""Models and losses for the gradient-parity tests, importable by every engine's worker."""
import keras
from keras import layers, ops

from keras_side import models


def dense_stack():
    return keras.Sequential([keras.Input((5,)), layers.Dense(16, activation="tanh"), layers.Dense(8, activation="relu"),
                             layers.Dense(1)])


def embedding_model():
    return keras.Sequential([keras.Input((7,), dtype="int32"), layers.Embedding(10, 4), layers.GlobalAveragePooling1D(),
                             layers.Dense(1)])


def conv1d_model():
    return keras.Sequential([keras.Input((12, 2)), layers.Conv1D(4, 3, activation="tanh"), layers.Flatten(),
                             layers.Dense(1)])


def lstm_model():
    return keras.Sequential([keras.Input((6, 2)), layers.LSTM(4), layers.Dense(1)])


def layernorm_model():
    return keras.Sequential([keras.Input((5,)), layers.Dense(8), layers.LayerNormalization(), layers.Dense(1)])


class Cubic(layers.Layer):
    """A custom layer written with keras.ops: w·x + v·x³."""

    def build(self, input_shape):
        self.w = self.add_weight(shape=(input_shape[-1], 1), name="w")
        self.v = self.add_weight(shape=(input_shape[-1], 1), name="v")

    def call(self, x):
        return ops.matmul(x, self.w) + ops.matmul(ops.power(x, 3), self.v)


def custom_layer_model():
    return keras.Sequential([keras.Input((3,)), Cubic(name="cubic")])


class BackendDependent(layers.Layer):
    """Deliberately not portable: adds a constant times the input that differs by backend."""

    def build(self, input_shape):
        self.kernel = self.add_weight(shape=(input_shape[-1], 1), name="kernel")

    def call(self, x):
        scale = 1.5 if keras.config.backend() == "torch" else 1.0
        return ops.matmul(x * scale, self.kernel)


def backend_dependent_model():
    return keras.Sequential([keras.Input((3,)), BackendDependent(name="odd")])


def failing_model():
    raise RuntimeError("this builder always fails")


def a_layer():
    """Not a model: a builder's mistake."""
    return layers.Dense(1)


class SqrtBelowTen(layers.Layer):
    """sqrt(x - 10): NaN for every input under 10, and so is the gradient behind it."""

    def call(self, x):
        return ops.sqrt(x - 10.0)


def nan_inside():
    """Finite inputs, a NaN output and a NaN gradient on every engine."""
    return keras.Sequential([keras.Input((3,)), layers.Dense(2), SqrtBelowTen(), layers.Dense(1)])


def bfloat16_mlp():
    """Computes in bfloat16 (Keras's "mixed_bfloat16" policy): its layers' outputs are bfloat16."""
    from keras_side.precision import mixed_bfloat16

    with mixed_bfloat16():
        return keras.Sequential([keras.Input((3,)), layers.Dense(3, activation="tanh", name="h"),
                                 layers.Dense(1, name="o")])


def dead_relu():
    """A ReLU that never fires: every kernel's gradient is 0, and Adagrad with no epsilon and an empty accumulator
    divides 0 by 0 at the first step, on every path alike."""
    return keras.Sequential([keras.Input((3,)), layers.Dense(3, activation="relu", name="h",
                                                             bias_initializer=keras.initializers.Constant(-100.0)),
                             layers.Dense(1, name="o")])


def all_frozen():
    """Nothing to train: its only layer frozen."""
    model = keras.Sequential([keras.Input((3,)), layers.Dense(1)])
    model.trainable = False
    return model


def log_cosh(y_true, y_pred):
    """A loss written with keras.ops."""
    return ops.mean(ops.log(ops.cosh(y_pred - y_true)), axis=-1)


har = models.har
mlp_subclass = models.mlp_subclass


def regularized():
    """A Dense(1) with an L2(0.05) kernel penalty: its training objective's gradient adds 0.1·kernel."""
    return keras.Sequential([keras.Input((3,)), layers.Dense(1, kernel_regularizer=keras.regularizers.L2(0.05))])


class Skew(layers.Layer):
    """Deliberately not portable, and without weights: scales its input by 1.5 on torch only."""

    def call(self, x):
        return x * (1.5 if keras.config.backend() == "torch" else 1.0)


def skewed_middle():
    """A skew in the middle of three layers: every layer after it differs too, the first to differ is `skew`."""
    return keras.Sequential([keras.Input((3,)), layers.Dense(4, activation="tanh", name="first"), Skew(name="skew"),
                             layers.Dense(1, name="last")])


def frozen_layer():
    """A frozen Dense between two trainable ones: its weights are not trainable, and each engine draws its own."""
    frozen = layers.Dense(4, name="frozen")
    frozen.trainable = False
    return keras.Sequential([keras.Input((3,)), layers.Dense(4, name="first"), frozen, layers.Dense(1, name="last")])


def with_backbone():
    """A Functional sub-model inside a Sequential: forward parity compares the whole model's output."""
    inputs = keras.Input((3,))
    backbone = keras.Model(inputs, layers.Dense(4, activation="tanh")(inputs), name="backbone")
    return keras.Sequential([keras.Input((3,)), backbone, layers.Dense(1, name="head")])


class TorchGradientSkew(layers.Layer):
    """Deliberately not portable: the same output everywhere, but on torch the gradient through this layer is 1.01
    times the true one (a custom gradient gone wrong): x·w + 0.01·(x·w − stop_gradient(x·w)) adds zero forward."""

    def build(self, input_shape):
        self.kernel = self.add_weight(shape=(input_shape[-1], 1), name="kernel")

    def call(self, x):
        out = ops.matmul(x, self.kernel)
        if keras.config.backend() == "torch":
            out = out + 0.01 * (out - ops.stop_gradient(out))
        return out


def gradient_skewed():
    return keras.Sequential([keras.Input((3,)), layers.Dense(4, activation="tanh", name="first"),
                             TorchGradientSkew(name="odd_gradient")])


def batchnorm_model():
    """Dense, BatchNormalization, Dense: training moves BatchNorm's moving mean and variance (non-trainable). The
    first Dense has no bias, as before any BatchNorm: the batch mean it subtracts would leave the bias a gradient of
    zero in exact arithmetic, and rounding noise that Adam scales to full steps, on every engine its own."""
    return keras.Sequential([keras.Input((3,)), layers.Dense(4, use_bias=False, name="first"),
                             layers.BatchNormalization(name="bn"),
                             layers.Dense(1, name="last")])


def batchnorm_with_bias():
    """`batchnorm_model` with a bias before BatchNorm: a weight whose exact gradient is zero."""
    return keras.Sequential([keras.Input((3,)), layers.Dense(4, name="first"), layers.BatchNormalization(name="bn"),
                             layers.Dense(1, name="last")])


def dropout_model():
    """Dense, a seeded Dropout, Dense: the training flag changes the Dropout's output."""
    return keras.Sequential([keras.Input((3,)), layers.Dense(4, name="first"), layers.Dropout(0.3, seed=1, name="drop"),
                             layers.Dense(1, name="last")])
