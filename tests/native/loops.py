"""The native loop of this pytest process's engine, and helpers the native tests share."""
import numpy as np

from compare.engines import paths
from keras_side.determinism import seed_everything
from keras_side.spec import TrainConfig
from tests.native.conftest import ENGINE

loop = paths.loop(ENGINE)


def val_mse(model, data) -> float:
    """The model's MSE on the validation rows, in original units: what the last validation loss reports."""
    return float(np.mean((loop.predict(model, data.x_val) - data.y_val) ** 2)) * data.scaling.y_std**2


def flat(arrays) -> np.ndarray:
    return np.concatenate([np.ravel(a) for a in arrays])


def constrained_mlp(constrained: bool = True):
    """A 3-6-1 MLP whose kernels carry a `MaxNorm(0.3)` and a `NonNeg` constraint (or none), both binding on the HAR
    at a rate of 0.05."""
    import keras

    keep = (lambda c: c) if constrained else (lambda c: None)  # noqa: E731
    return keras.Sequential([keras.Input((3,)),
                             keras.layers.Dense(6, kernel_constraint=keep(keras.constraints.MaxNorm(0.3))),
                             keras.layers.Dense(1, kernel_constraint=keep(keras.constraints.NonNeg()))])


def engines_loader(x, y, w, batch_size: int):
    """`(x, y[, w])` in unshuffled batches of `batch_size` rows, the way this engine's users load data: a torch
    `DataLoader` over a dict `Dataset`, a `tf.data.Dataset`, and for JAX an iterable of NumPy batches of their own."""
    arrays = (x, y) if w is None else (x, y, w)
    rows = len(y)
    if ENGINE == "torch":
        from torch.utils.data import DataLoader

        class Rows:  # a map-style Dataset (rows by index); the default collate stacks them into tensors, dicts kept
            def __len__(self):
                return rows

            def __getitem__(self, i):
                return tuple({k: v[i] for k, v in a.items()} if isinstance(a, dict) else a[i] for a in arrays)

        return DataLoader(Rows(), batch_size=batch_size)
    if ENGINE == "tensorflow":
        import tensorflow as tf

        return tf.data.Dataset.from_tensor_slices(arrays).batch(batch_size)

    class Batches:  # a JAX user's own iterable: a new pass at each iter()
        def __iter__(self):
            for start in range(0, rows, batch_size):
                cut = slice(start, start + batch_size)
                yield tuple({k: v[cut] for k, v in a.items()} if isinstance(a, dict) else a[cut] for a in arrays)

    return Batches()


def users_model():
    """A model of a user's own: two named inputs (a list, as the loops carry several), one named output."""
    import keras

    a, b = keras.Input((3,), name="returns"), keras.Input((2,), name="volumes")
    hidden = keras.layers.Dense(4, activation="tanh", name="hidden")(keras.layers.Concatenate()([a, b]))
    return keras.Model([a, b], keras.layers.Dense(1, name="forecast")(hidden))


def fresh_users_model(compiled: TrainConfig | None = None):
    """`users_model()` from seed 0 in a fresh Keras session; `compiled`: compiled for `fit` with that spec's
    optimizer and MSE."""
    import keras

    from keras_side.optimizers import keras_optimizer

    keras.backend.clear_session()
    seed_everything(0)
    model = users_model()
    if compiled is not None:
        model.compile(optimizer=keras_optimizer(compiled), loss="mse")
    return model


def users_arrays():
    """Arrays of a user's own for `users_model`, as `fit` takes them: inputs as a dict by name (float64, cast as fit
    casts them), targets, sample weights (96 rows), and validation_data (32 rows)."""
    rng = np.random.default_rng(0)
    x = {"volumes": rng.normal(size=(96, 2)), "returns": rng.normal(size=(96, 3))}
    y, w = rng.normal(size=(96, 1)), rng.uniform(0.5, 2.0, 96)
    val = ({"returns": rng.normal(size=(32, 3)), "volumes": rng.normal(size=(32, 2))}, rng.normal(size=(32, 1)))
    return x, y, w, val


class Unread:
    """A loader that fails the test if it is read: what is refused must be refused before reading it."""

    def __iter__(self):
        raise AssertionError("the loader was read")


SPLITS = ("train", "val", "test")


def three_classes(har, y):
    """Class labels 0, 1, 2 of targets `y`: the HAR's training terciles."""
    return np.digitize(y, np.quantile(har.y_train, [1 / 3, 2 / 3])).astype(np.float32)


class Interrupted(Exception):
    """Raised from an `on_step`: the run ends mid-epoch, as a crash would, its checkpoints on disk."""


def interrupt_at(step: int):
    """An `on_step` that ends the run at its `step`-th optimizer step (from 1), raising `Interrupted`."""
    seen = []

    def on_step(loss):
        seen.append(loss)
        if len(seen) == step:
            raise Interrupted
    return on_step
