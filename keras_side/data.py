"""The prepared data every path trains on (`HarData`: three splits, standardized, and what maps them back) and the
batches cut from it: in order, per epoch, and per replica.

Engine-free: nothing here imports Keras or an engine, so the runner builds and reads these before any backend exists.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from keras_side.arrays import as_tuple, first, first_nonfinite_row, take, verb_arrays
from keras_side.files import save_npz
from keras_side.spec import SpecError, TrainConfig


SEQUENCE_DAYS = 22  # days of log RV a sequence model reads: the HAR's longest mean, as a sequence


@dataclass(frozen=True)
class Scaling:
    """Training-set statistics: standardized = (original - mean) / std."""

    x_mean: np.ndarray
    x_std: np.ndarray
    y_mean: float
    y_std: float

    @classmethod
    def identity(cls, features: int = 1) -> Scaling:
        """No scaling: data taken as given (a user's arrays, a check's inputs)."""
        return cls(np.zeros(features), np.ones(features), 0.0, 1.0)

    def to_original(self, kernel: np.ndarray, bias: float) -> tuple[float, np.ndarray]:
        """Map a linear model fitted in standardized units back to original units: (intercept, slopes)."""
        slopes = np.asarray(kernel, np.float64).reshape(-1) * self.y_std / self.x_std
        intercept = self.y_mean + self.y_std * float(np.asarray(bias).reshape(-1)[0]) - float(slopes @ self.x_mean)
        return intercept, slopes


SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class HarData:
    """Float32 model inputs and targets (standardized with training statistics) plus what maps them back.

    Three splits: `train` (what a model trains on), `val` (its validation curve after every epoch: the year before
    the split date, carved out of training, or the test split itself when `validation == "test"`) and `test` (the
    final report). `x_*` is one array, or a tuple of arrays for models with several inputs (panel, leverage); `y_*`
    one array, or a tuple for models with several outputs (one target per output). `w_train`, when given, weighs
    each training row in the loss (`fit`'s `sample_weight`).
    """

    x_train: np.ndarray | tuple[np.ndarray, ...]
    y_train: np.ndarray | tuple[np.ndarray, ...]
    x_val: np.ndarray | tuple[np.ndarray, ...]
    y_val: np.ndarray | tuple[np.ndarray, ...]
    x_test: np.ndarray | tuple[np.ndarray, ...]
    y_test: np.ndarray | tuple[np.ndarray, ...]
    scaling: Scaling
    features: tuple[str, ...]
    asset: str
    source: str
    w_train: np.ndarray | None = None
    validation: str = "last-year"

    def __post_init__(self):
        """A data set every path can train on, or a ValueError naming what is wrong with it: each split's inputs,
        targets (and training weights) with as many rows, some training rows, no NaN or infinity (a loop would
        train on fewer rows than given, or return NaN weights, without a word). A tuple of one array is that array,
        as Keras takes a list of one (a loop read it as several inputs or targets and failed)."""
        for name in (f"{xy}_{split}" for split in SPLITS for xy in "xy"):
            value = getattr(self, name)
            if isinstance(value, tuple) and len(value) == 1:
                object.__setattr__(self, name, value[0])
        for split in SPLITS:
            named = {f"{xy}_{split}": getattr(self, f"{xy}_{split}") for xy in "xy"}
            if split == "train" and self.w_train is not None:
                named["w_train"] = self.w_train
            arrays = {f"{name}[{i}]" if isinstance(value, tuple) else name: np.asarray(a)
                      for name, value in named.items() for i, a in enumerate(as_tuple(value))}
            rows = {name: len(a) if a.ndim else 0 for name, a in arrays.items()}
            if len(set(rows.values())) > 1:
                lengths = ", ".join(f"{n}: {r}" for n, r in rows.items())
                raise ValueError(f"HarData's {split} split has arrays of different lengths ({lengths}); give one row "
                                 "per example to each")
            if split == "train" and not max(rows.values()):
                raise ValueError("HarData has no training rows; give at least one")
            for name, a in arrays.items():
                if (row := first_nonfinite_row(a)) is not None:
                    raise ValueError(f"HarData's {name} holds NaN or inf (first in row {row}); drop or fill those rows")

    def save(self, path: Path) -> None:
        """One `.npz` that a worker process reloads: the arrays plus the scaling and labels, written whole."""
        arrays, counts = {}, {}
        for name in (f"{xy}_{split}" for split in SPLITS for xy in "xy"):
            value = getattr(self, name)
            parts = value if isinstance(value, tuple) else (value,)
            arrays |= {f"{name}_{i}": a for i, a in enumerate(parts)}
            counts[name] = len(parts) if isinstance(value, tuple) else 0  # 0: one array, not a tuple
        arrays |= {"x_mean": self.scaling.x_mean, "x_std": self.scaling.x_std}
        if self.w_train is not None:
            arrays["w_train"] = self.w_train
        meta = {"y_mean": self.scaling.y_mean, "y_std": self.scaling.y_std, "features": self.features,
                "asset": self.asset, "source": self.source, "validation": self.validation, "counts": counts}
        save_npz(path, meta=np.array(json.dumps(meta)), **arrays)

    @classmethod
    def load(cls, path: Path) -> HarData:
        with np.load(path) as z:
            meta = json.loads(str(z["meta"]))
            arrays = {name: tuple(z[f"{name}_{i}"] for i in range(count)) if count else z[f"{name}_0"]
                      for name, count in meta["counts"].items()}
            scaling = Scaling(z["x_mean"], z["x_std"], meta["y_mean"], meta["y_std"])
            return cls(**arrays, scaling=scaling, features=tuple(meta["features"]), asset=meta["asset"],
                       source=meta["source"], w_train=z["w_train"] if "w_train" in z.files else None,
                       validation=meta["validation"])

    @property
    def n_train(self) -> int:
        return len(first(self.y_train))

    @property
    def n_val(self) -> int:
        return len(first(self.y_val))

    @property
    def n_test(self) -> int:
        return len(first(self.y_test))

    @property
    def outputs(self) -> int:
        """How many outputs the targets are for: 1, or the length of the targets' tuple."""
        return len(self.y_train) if isinstance(self.y_train, tuple) else 1


# `HarData.source` of data a user gave as arrays (`as_data`): taken as given, so its losses are in its own units.
ARRAYS = "arrays"


def as_data(model, data, cfg: TrainConfig, validation_data=None) -> tuple[HarData, TrainConfig]:
    """What a loop trains on, from what `fit` takes: `HarData` as it is, or `(x, y)` or `(x, y, sample_weight)`,
    each of x and y one array, a tuple or list of arrays (several inputs or outputs, in the model's order), or a
    dict of arrays by the model's input (output) names; `validation_data=(x_val, y_val)` likewise. Arrays are taken
    as given (not standardized) and their floats cast to the model's dtype, as `fit` casts them; the result's
    predictions are made on the validation rows. Without validation data the loop does not validate (as `fit`), so
    `cfg` comes back with `validate=False`. A loader of batches (`Batches`) is taken as `fit` takes one. Bad data is a
    `SpecError` naming it and the fix."""
    if isinstance(data, HarData):
        if validation_data is not None:
            raise SpecError("validation_data is for data given as arrays: HarData carries its own validation split "
                            "(x_val, y_val); drop validation_data")
        return data, cfg
    if _is_loader(data):
        return Batches.of(model, data, cfg, validation_data)
    if not isinstance(data, (tuple, list)) or len(data) not in (2, 3):
        raise SpecError(f"data is {_shown(data)}; give (x, y) or (x, y, sample_weight) arrays, as fit takes them, "
                        "a loader of such batches (a DataLoader, a tf.data.Dataset), or a HarData")
    x, y = _model_order(model, data[0], "x"), _model_order(model, data[1], "y")
    w = None if len(data) == 2 or data[2] is None else np.asarray(data[2], np.float32)
    if validation_data is None:
        if cfg.patience:
            raise SpecError("early stopping (patience) watches the validation loss: give validation_data=(x_val, "
                            "y_val), or drop patience")
        x_val, y_val, cfg = take(x, slice(0, 0)), take(y, slice(0, 0)), cfg.replace(validate=False)
    elif _is_loader(validation_data):
        raise SpecError("validation_data is a loader of batches but data is arrays; give validation_data=(x_val, "
                        "y_val) arrays, or both as loaders")
    elif not isinstance(validation_data, (tuple, list)) or len(validation_data) != 2:
        raise SpecError(f"validation_data is {_shown(validation_data)}; give (x_val, y_val), as fit takes it")
    else:
        x_val, y_val = (_model_order(model, v, xy) for v, xy in zip(validation_data, ("x_val", "y_val")))
    features = first(x).shape[-1] if first(x).ndim > 1 else 1
    try:
        found = HarData(x, y, x_val, y_val, x_val, y_val, Scaling.identity(features),
                        features=(), asset="", source=ARRAYS, w_train=w,
                        validation="none" if validation_data is None else "given")
    except ValueError as e:  # HarData names its own fields (x_train...): name what the user gave
        raise SpecError(str(e).replace("HarData's ", "the data's ").replace("HarData", "the data")) from None
    return found, cfg


def as_whole_arrays(model, data, cfg: TrainConfig, validation_data=None, *, path: str,
                    reference: str) -> tuple[HarData, TrainConfig]:
    """`as_data` for a fast path, which cuts its batches from whole arrays: a loader of batches is refused in one
    line naming the reference loop that trains on one (`path`, `reference`: the paths' names), before it is read."""
    refused = f"the path {path} cuts its batches from whole arrays and cannot train on a loader of batches"
    if _is_loader(data):
        raise SpecError(f"{refused}; give (x, y) arrays or a HarData, or train the loader on the path {reference}")
    if validation_data is not None and _is_loader(validation_data):
        raise SpecError(f"{refused}; give validation_data=(x_val, y_val) arrays, or train both loaders on the path "
                        f"{reference}")
    return as_data(model, data, cfg, validation_data)


@dataclass(frozen=True)
class Batches:
    """A user's own batches, as `fit` takes them: a torch `DataLoader`, a `tf.data.Dataset`, or any iterable of
    `(x, y)` or `(x, y, sample_weight)` batches whose `iter()` starts a new pass (a class with `__iter__`), each part
    as `as_data` takes arrays. The loops train on them as they come, one pass per epoch: the loader's own batch size,
    order and last batch, not the spec's (`batch_size`, `batch_order`).

    `x_train`, `y_train` and `w_train` are the first batch's: what the model is built and checked on before training,
    taken from a pass of its own, as `fit` on torch takes a first batch to build its step (a shuffling loader's
    generator moves for it). The losses are reported as given (`source` is `ARRAYS`)."""

    train: object
    val: object | None
    x_train: np.ndarray | tuple[np.ndarray, ...]
    y_train: np.ndarray | tuple[np.ndarray, ...]
    w_train: np.ndarray | None = None
    source: str = ARRAYS
    x_test = None  # nothing to predict on at the end: call the loop's `predict` on rows of yours

    @classmethod
    def of(cls, model, train, cfg: TrainConfig, validation_data=None) -> tuple[Batches, TrainConfig]:
        for name, loader in (("data", train), ("validation_data", validation_data)):
            if _is_loader(loader) and iter(loader) is loader and (name == "validation_data" or cfg.epochs > 1):
                raise SpecError(f"{name} is an iterator, which its first pass uses up; give an iterable whose iter() "
                                "starts a new pass (a DataLoader, a tf.data.Dataset, a class with __iter__)"
                                + (", or epochs=1" if name == "data" else ""))
        if validation_data is None and cfg.patience:
            raise SpecError("early stopping (patience) watches the validation loss: give validation_data (a loader of "
                            "(x_val, y_val) batches), or drop patience")
        if validation_data is not None and not _is_loader(validation_data):
            raise SpecError(f"validation_data is {_shown(validation_data)} but data is a loader of batches; give "
                            "validation_data as a loader of (x_val, y_val) batches too")
        first_batch = next(iter(train), None)
        if first_batch is None:
            raise SpecError("data is a loader that gives no batch; give it at least one (x, y) batch")
        x, y, w = batch_parts(model, first_batch)
        batches = cls(train, validation_data, x, y, w)
        return batches, cfg if validation_data is not None else cfg.replace(validate=False)

    @property
    def outputs(self) -> int:
        return len(self.y_train) if isinstance(self.y_train, tuple) else 1

    @property
    def first(self) -> tuple:
        """The first batch, `(x, y[, sample_weight])`, as the loader gave it."""
        return (self.x_train, self.y_train) + (() if self.w_train is None else (self.w_train,))


def batch_parts(model, batch) -> tuple:
    """`(x, y, sample_weight or None)` of one batch a loader gave: x and y as `verb_inputs` takes them (a dict by the
    model's input or output names becomes a tuple in the model's order), arrays of any engine as they are."""
    if not isinstance(batch, (tuple, list)) or len(batch) not in (2, 3):
        raise SpecError(f"a batch of the loader is {_shown(batch)}; give (x, y) or (x, y, sample_weight) batches, as "
                        "fit takes them from a DataLoader or a tf.data.Dataset")
    x, y = verb_inputs(model, batch[0]), verb_inputs(model, batch[1], "y")
    return x, y, batch[2] if len(batch) == 3 else None


def _is_loader(value) -> bool:
    """Whether `value` is a loader of batches, not arrays: iterable, and none of the containers arrays come in."""
    return (hasattr(value, "__iter__") and not isinstance(value, (tuple, list, dict, str, bytes))
            and not hasattr(value, "shape"))


def verb_inputs(model, value, what: str = "x"):
    """What a verb (`grad_at`, `predict`) was given, as the loops carry it: a dict of arrays keyed by the model's input
    (`what="y"`: output) names as a tuple in the model's order; anything else as `verb_arrays` takes it (arrays of
    any engine as they are)."""
    if isinstance(value, dict):
        kind = "input" if what.startswith("x") else "output"
        if isinstance(getattr(model, kind, None), dict):
            raise SpecError(f"the model takes its {kind}s as a dict, which the package's loops do not carry (they "
                            f"carry several as a tuple): build it with a list of {kind}s, keras.Model([a, b], ...)")
        names = _names(model, kind)
        missing = [n for n in names if n not in value]
        if not names or missing or len(value) != len(names):
            raise SpecError(f"{what} is a dict of {sorted(value)} but the model's {kind}s are named {names}; give "
                            f"one array per {kind}, keyed by its name (or a tuple in the model's order)")
        value = tuple(value[n] for n in names)
    return verb_arrays(value, "x" if what.startswith("x") else "y")


def _model_order(model, value, what: str):
    """One NumPy array, or a tuple of them in the model's input (output) order (`verb_inputs`), floats cast to the
    model's dtype."""
    value = verb_inputs(model, value, what)
    return tuple(model_floats(model, a) for a in value) if isinstance(value, tuple) else model_floats(model, value)


def model_floats(model, a) -> np.ndarray:
    """One array (of any engine, on the host) as NumPy, floats cast to the model's dtype as `fit` casts them."""
    a = np.asarray(a)
    dtype = np.float64 if getattr(model, "compute_dtype", None) == "float64" else np.float32
    return a.astype(dtype) if np.issubdtype(a.dtype, np.floating) else a


def _names(model, kind: str) -> list[str]:
    """The model's input names (its Input layers') or output names; none for a model that declares none."""
    try:
        if kind == "output":
            return list(getattr(model, "output_names", None) or [])
        from keras_side.internals import input_layer_name

        return [input_layer_name(t) for t in model.inputs]
    except (AttributeError, ValueError):
        return []


def _shown(value) -> str:
    return f"a {type(value).__name__}" + (f" of {len(value)}" if isinstance(value, (tuple, list)) else "")


def batch_slices(n: int, batch_size: int) -> list[slice]:
    """Consecutive batches over n rows; the last one is short when batch_size does not divide n."""
    return [slice(i, min(i + batch_size, n)) for i in range(0, n, batch_size)]


def whole_batches(data: HarData, batch_size: int, parts: int) -> HarData:
    """The data cut so that every batch splits evenly over `parts` devices (what Keras's distributed `fit` needs):
    the training rows to whole batches (a batch size that `parts` divides), the validation and test rows to a
    multiple of `parts`."""
    def cut(a, multiple):
        return take(a, slice(0, len(first(a)) // multiple * multiple))

    return dataclasses.replace(data, x_train=cut(data.x_train, batch_size), y_train=cut(data.y_train, batch_size),
                               x_val=cut(data.x_val, parts), y_val=cut(data.y_val, parts),
                               x_test=cut(data.x_test, parts), y_test=cut(data.y_test, parts))


def shard(rows: slice, rank: int, world: int) -> slice:
    """A replica's (or a process's) contiguous part of a global batch's rows; the first ones take one row more when
    the batch does not split evenly."""
    size = rows.stop - rows.start
    share, extra = divmod(size, world)
    start = rows.start + rank * share + min(rank, extra)
    return slice(start, start + share + (rank < extra))


def numpy_orders(seed: int, n: int, epochs: int) -> np.ndarray:
    """One NumPy permutation of the n rows per epoch: the batch order shared by every path when
    `batch_order="numpy"`."""
    rng = np.random.default_rng(seed)
    return np.stack([rng.permutation(n) for _ in range(epochs)])
