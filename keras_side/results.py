"""What a training path produced (`Result`), in the units it reports, with the seed and the libraries' versions;
the compile seconds told apart from training; the weights a data-parallel run trained. Engine-free."""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from keras_side.arrays import output_arrays, output_files, output_read
from keras_side.data import ARRAYS, HarData
from keras_side.files import save_npz

if TYPE_CHECKING:
    from keras_side.spec import TrainConfig


PACKAGES = ("keras", "numpy", "torch", "jax", "jaxlib", "optax", "tensorflow-cpu", "tensorflow")


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
    if data.source == ARRAYS:  # a user's own data (`as_data`), not standardized: in its own units
        return 1.0, "as given"
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
        """Assemble a result from what a loop measured, losses given in standardized units (`test_pred` None: no
        rows to predict on, as after a loader's batches)."""
        to_original, units = loss_units(cfg, data)
        return cls(
            path=path,
            engine=engine,
            weights=[np.array(w) for w in weights],
            train_loss=[float(v) * to_original for v in train_loss],
            val_loss=[float(v) * to_original for v in val_loss],
            test_pred=np.zeros(0, np.float32) if test_pred is None else output_arrays(test_pred),
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
        arrays = {f"w_{i}": w for i, w in enumerate(self.weights)} | output_files("test_pred", self.test_pred)
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
            weights = [z[f"w_{i}"] for i in range(sum(k.startswith("w_") for k in z.files))]
            test_pred = output_read(z, "test_pred")
        return cls(weights=weights, test_pred=test_pred, **meta)
