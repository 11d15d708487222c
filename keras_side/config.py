"""The shapes every path shares: the prepared data and a path's result (the training spec is `keras_side.spec`).

Nothing here imports Keras or an engine, so the runner can build and read these before any backend exists.
"""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from keras_side.spec import TrainConfig

ENGINES = ("torch", "jax", "tensorflow")
SEQUENCE_DAYS = 22  # days of log RV a sequence model reads: the HAR's longest mean, as a sequence
PACKAGES = ("keras", "numpy", "torch", "jax", "jaxlib", "optax", "tensorflow-cpu", "tensorflow")


@dataclass(frozen=True)
class Scaling:
    """Training-set statistics: standardized = (original - mean) / std."""

    x_mean: np.ndarray
    x_std: np.ndarray
    y_mean: float
    y_std: float

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
        """One `.npz` that a worker process reloads: the arrays plus the scaling and labels."""
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
        np.savez(path, meta=np.array(json.dumps(meta)), **arrays)

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


def first(a):
    """The first array of a tuple (or list) of arrays, or the array itself."""
    return a[0] if isinstance(a, (tuple, list)) else a


def first_nonfinite_row(a: np.ndarray) -> int | None:
    """The first row of a float array that holds a NaN or an infinity, or None (always None for ints)."""
    if not np.issubdtype(a.dtype, np.inexact) or np.isfinite(a).all():
        return None
    return int(np.argmax(~np.isfinite(a.reshape(len(a), -1)).all(axis=1)))


def finite_or_null(obj):
    """`obj` (dicts, lists, tuples, numbers) for standard JSON, which has no NaN or infinity: such a number (a
    diverged loss, a gap between NaN weights) becomes None (null), where Python's `json` would write `NaN`, which
    other readers (`jq`, a browser) refuse."""
    if isinstance(obj, float):
        return obj if np.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_or_null(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_or_null(v) for v in obj]
    return obj


def as_tuple(a) -> tuple:
    """A tuple (or list) of arrays as a tuple, one array as a tuple of one."""
    return tuple(a) if isinstance(a, (tuple, list)) else (a,)


def verb_arrays(x, what: str = "x"):
    """What a verb (`grad_at`, `predict`) was given, as this package carries it: one array, or a tuple of arrays, one
    per model input (or output). A list of arrays is how Keras takes several, so it becomes a tuple on every engine.
    A list of numbers (or of lists of numbers) is refused, as `model.predict` refuses it: is it one array, or one
    input per item? Arrays of any engine pass as they are."""
    if not isinstance(x, (list, tuple)):
        return x
    if not x or not all(hasattr(a, "shape") for a in x):
        per = "input" if what == "x" else "output"
        held = f"of {type(next(a for a in x if not hasattr(a, 'shape'))).__name__}s" if x else "with nothing in it"
        raise ValueError(f"{what} is a Python {type(x).__name__} {held}, not of arrays; pass np.asarray({what}) (a "
                         f"list or tuple holds one array per model {per}, as in Keras)")
    return tuple(x)


def compile_apart(epoch_seconds: list[float], first_steps: list[tuple[int, float]] | None = None
                  ) -> tuple[float, float | None]:
    """(training seconds, compile seconds) of a run that compiles its step in its first epoch: the compile is the
    first epoch's excess over a typical epoch. A run of one epoch has no other epoch to compare it with: given
    `first_steps`, that epoch's steps as (batch rows, seconds), the compile is each batch shape's first step's excess
    over a typical step (`compile_in_steps`); else None."""
    if len(epoch_seconds) < 2:
        compile_seconds = compile_in_steps(first_steps) if first_steps and epoch_seconds else None
        return sum(epoch_seconds) - (compile_seconds or 0.0), compile_seconds
    compile_seconds = max(0.0, epoch_seconds[0] - float(np.median(epoch_seconds[1:])))
    return sum(epoch_seconds) - compile_seconds, compile_seconds


def compile_in_steps(steps: list[tuple[int, float]]) -> float | None:
    """The compile in one epoch's steps, (batch rows, seconds) each: a step compiles at the first batch of each shape
    (the full batch, a short last one), so the compile is those steps' excess over a typical step, the median of
    the steps that came after a shape's first. None when there is none (every step a shape's first)."""
    seen, first, later = set(), [], []
    for rows, seconds in steps:
        (later if rows in seen else first).append(seconds)
        seen.add(rows)
    if not later:
        return None
    typical = float(np.median(later))
    return sum(max(0.0, seconds - typical) for seconds in first)


def output_arrays(pred):
    """A model's predictions as this package carries them: one NumPy array, or a tuple of arrays, one per output
    (as several targets travel). Stacked on a first axis, as they were, outputs of different widths (a forecast and
    a class's logits) failed after the whole training with NumPy's "inhomogeneous shape"."""
    if isinstance(pred, (list, tuple)):
        return tuple(np.asarray(p) for p in pred)
    return np.asarray(pred)


def output_files(name: str, pred) -> dict[str, np.ndarray]:
    """`pred` (`output_arrays`) as `np.savez` keywords: `name`, or `name.0`, `name.1`... for several outputs."""
    return {f"{name}.{i}": p for i, p in enumerate(pred)} if isinstance(pred, tuple) else {name: pred}


def output_read(z, name: str):
    """What `output_files(name, ...)` wrote, from a loaded `.npz`."""
    if name in z:
        return z[name]
    return tuple(z[f"{name}.{i}"] for i in range(sum(k.startswith(f"{name}.") for k in z)))


def output_gap(a, b) -> float:
    """The largest absolute difference between two predictions (`output_arrays`), over every output."""
    pairs = zip(a, b, strict=True) if isinstance(a, tuple) else [(a, b)]
    return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in pairs)


def keras_inputs(x):
    """Several inputs (or targets) travel here as a tuple of arrays; a Keras model takes them as a list."""
    return list(x) if isinstance(x, tuple) else x


def take(x, idx):
    """Rows `idx` of one array, or of each array of a tuple (several inputs or targets)."""
    return tuple(a[idx] for a in x) if isinstance(x, tuple) else x[idx]


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


def save_npz(path, **arrays) -> None:
    """Arrays to one `.npz`, whole or not at all: written beside `path`, then renamed onto it."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}.npz")
    try:
        np.savez(tmp, **arrays)
        os.replace(tmp, path)
    except BaseException:  # nothing left beside it (a full disk, `path` a folder)
        tmp.unlink(missing_ok=True)
        raise


def save_trained(path, weights, seconds: float, cpus: list[list[int] | None] | None = None, *,
                 seed: int | None = None) -> None:
    """What a data-parallel run (or its one-process baseline) trained: the weights and the training seconds, the
    libraries' versions, and the run's seed when given; with `cpus`, the cores each of its processes could compute
    on, one list per process (`keras_side.cores.cores_in_use`)."""
    cores = {} if cpus is None else {"cpus": np.asarray(json.dumps(cpus))}
    record = {"versions": np.asarray(json.dumps(versions()))} | ({} if seed is None else {"seed": seed})
    save_npz(path, seconds=seconds, **cores, **record, **{f"w_{i}": np.asarray(w) for i, w in enumerate(weights)})


def load_trained(path) -> tuple[list[np.ndarray], float]:
    """`save_trained`'s weights, in order, and seconds."""
    with np.load(path) as z:
        return [z[f"w_{i}"] for i in range(sum(f.startswith("w_") for f in z.files))], float(z["seconds"])


def trained_record(path) -> dict:
    """The seed and versions `save_trained` recorded (the seed None where none was given)."""
    with np.load(path) as z:
        return {"seed": int(z["seed"]) if "seed" in z.files else None, "versions": json.loads(str(z["versions"]))}


def trained_cpus(path) -> list[list[int] | None] | None:
    """The cores `save_trained` recorded, one list a process, or None."""
    with np.load(path) as z:
        return json.loads(str(z["cpus"])) if "cpus" in z.files else None


def exit_reason(code: int) -> str:
    """How a process ended, from its return code (negative: the signal that killed it)."""
    if code >= 0:
        return f"exit code {code}"
    try:
        return f"killed by signal {-code} ({signal.Signals(-code).name})"
    except ValueError:  # a signal number without a name
        return f"killed by signal {-code}"


def versions() -> dict[str, str]:
    """Installed versions of the libraries a result depends on (read from metadata, nothing imported)."""
    found = {}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return found


def loss_units(cfg: TrainConfig, data: HarData) -> tuple[float, str]:
    """(factor, units) that map a loss on the standardized data to what `Result` reports: an MSE to log RV², an
    MAE to log RV, when every output's loss is that one (a regularizer's penalty is scaled with it); any other loss
    as computed."""
    kinds = set(cfg.losses)
    if kinds == {"mse"}:
        return data.scaling.y_std**2, "log RV²"
    if kinds == {"mae"}:
        return data.scaling.y_std, "log RV"
    return 1.0, "as computed"


@dataclass
class Result:
    """What one training path produced. Weights are NumPy in `model.weights` order; losses in `units` (see
    `loss_units`); `metrics` per epoch as `fit`'s History names them ("binary_accuracy", "val_binary_accuracy"...),
    on the standardized data; `test_pred` in standardized units (what crosses engines; several outputs a tuple of
    arrays, `output_arrays`); `test_loss`, when the referee asked for it, the spec's loss on the test split."""

    path: str
    engine: str
    weights: list[np.ndarray]
    train_loss: list[float]
    val_loss: list[float]
    test_pred: np.ndarray | tuple[np.ndarray, ...]
    train_seconds: float
    compile_seconds: float | None = None
    seed: int = 0
    versions: dict[str, str] = field(default_factory=versions)
    metrics: dict[str, list[float]] = field(default_factory=dict)
    units: str = "as computed"
    test_loss: float | None = None
    first_run_seconds: float | None = None  # JAX's fused scan: its program's first run, in compile_seconds

    @classmethod
    def from_training(cls, path: str, engine: str, weights, data: HarData, cfg: TrainConfig, train_loss, val_loss,
                      test_pred, seconds: float, compile_seconds: float | None = None, metrics=None,
                      first_run_seconds: float | None = None) -> Result:
        """Assemble a result from what a loop measured, losses given in standardized units."""
        to_original, units = loss_units(cfg, data)
        return cls(
            path=path,
            engine=engine,
            weights=[np.array(w) for w in weights],
            train_loss=[float(v) * to_original for v in train_loss],
            val_loss=[float(v) * to_original for v in val_loss],
            test_pred=output_arrays(test_pred),
            train_seconds=seconds,
            compile_seconds=compile_seconds,
            seed=cfg.seed,
            metrics={name: [float(v) for v in values] for name, values in (metrics or {}).items()},
            units=units,
            first_run_seconds=first_run_seconds,
        )

    def save(self, folder: Path) -> None:
        """Write `<path>.json` (everything but arrays) and `<path>.npz` (weights, predictions)."""
        folder = Path(folder)
        arrays_only = ("weights", "test_pred")
        meta = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in arrays_only}
        arrays = {f"w{i}": w for i, w in enumerate(self.weights)} | output_files("test_pred", self.test_pred)
        np.savez(folder / f"{self.path}.npz", **arrays)
        (folder / f"{self.path}.json").write_text(json.dumps(meta, indent=1))

    def save_weights(self, path: Path, build) -> None:
        """Write the weights as a Keras `.weights.h5` file (what moves between engines), through a fresh model
        from the zero-argument builder `build`."""
        model = build()
        model.set_weights(self.weights)
        model.save_weights(str(path))

    @classmethod
    def load(cls, folder: Path, path: str) -> Result:
        folder = Path(folder)
        meta = json.loads((folder / f"{path}.json").read_text())
        with np.load(folder / f"{path}.npz") as z:
            weights = [z[f"w{i}"] for i in range(sum(k.startswith("w") for k in z.files))]
            test_pred = output_read(z, "test_pred")
        return cls(weights=weights, test_pred=test_pred, **meta)


@contextmanager
def interrupts_held():
    """Hold Ctrl-C and SIGTERM for the block, then deliver them as they came: for a step that must not be cut in
    two (raised inside `subprocess.Popen` after the fork, an interrupt would lose the started process, which then
    outlives the run; between a checkpoint's rename and the removal of the one before it, it would leave both).
    Only the main thread receives signals; elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = []
    previous = {s: signal.signal(s, lambda signum, frame: held.append(signum)) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for signum in held:
            signal.raise_signal(signum)  # to the handler that was there: KeyboardInterrupt, Terminated, or the default
