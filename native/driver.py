"""The epoch loop of every training path beyond the reference loops, engine-free: one `run` over an `Engine`.

    curves, epoch_seconds, steps = driver.run(engine, cfg, saved=..., progress=..., on_step=...)

Keras's own trainers split training this way: one epoch loop with its callbacks (`keras.src.trainers`), over a small
`train_step` per engine. Here the engine's part is an `Engine`: its batches, its step, its validation, its
checkpoint files. The loop's part is written once: the epochs (a resumed run's after its checkpoint), the epoch's
mean loss and metrics, validation, early stopping with the best weights restored, a checkpoint after every epoch,
`progress`, `on_step(loss)`, and the timing. The reference loops (`native/<engine>/loop.py`) write this loop out
themselves, for the lesson; the paths that make the step fast (`native.torch.fast`), shard it (`native.torch.ddp`,
`native.jax.sharded`, `native.tensorflow.mirrored`) or stack many models (`native.torch.many`) hand their step to
`run`, and are tested to end on the reference loops' weights.
"""
from __future__ import annotations

import contextlib
import time

from keras_side.arrays import first
from keras_side.callbacks import EarlyStopping
from keras_side.spec import TrainConfig
from native.checkpoint import Checkpoints, fresh_curves


class Engine:
    """One engine's training as `run` drives it. `batches` and `step` are the engine's to write; the rest has a
    default that fits an engine without validation, metrics or checkpoints."""

    model = None  # the Keras model, whose weights a checkpoint holds (`Checkpoints.save`)
    metrics = None  # the spec's metrics (`EpochMetrics`), which `step` updates; `run` closes them every epoch
    validates = False  # it has validation rows (`validate`); without them `run` neither validates nor stops early

    def batches(self, epoch: int):
        """The epoch's batches, in order, each what `step` takes."""
        raise NotImplementedError

    def step(self, batch):
        """One optimizer step on `batch`; returns the batch's mean loss, which may stay on the device."""
        raise NotImplementedError

    def rows(self, batch) -> int:
        """The batch's rows (default: of `(x, y, ...)`'s targets)."""
        return len(first(batch[1]))

    def epoch_loss(self, losses: list, rows: list[int]) -> float:
        """The epoch's loss as `fit` reports it: the mean over its rows of the steps' `losses`, each of a batch of
        `rows` rows. Where the device is waited for: once an epoch. (Many models at once: each model's, an array;
        steps that keep their loss inside a compiled graph: None.)"""
        return sum(float(loss) * n for loss, n in zip(losses, rows)) / sum(rows)

    def epoch_scope(self, epoch: int):
        """A context the epoch's steps run in (default: none)."""
        return contextlib.nullcontext()

    def end_epoch(self) -> None:
        """After the epoch's last step, before validation."""

    def validate(self) -> float:
        """The validation loss after an epoch (called when the engine `validates` and the spec asks for it)."""
        raise NotImplementedError

    def synchronize(self) -> None:
        """Wait for the device to run what it was given (called when steps are timed)."""

    def get_weights(self) -> list:
        return self.model.get_weights()

    def set_weights(self, weights) -> None:
        self.model.set_weights(weights)

    def write(self, folder) -> None:
        """The engine's checkpoint files (optimizer, scheduler) into `folder`, which this creates."""
        raise NotImplementedError

    def read(self, folder) -> None:
        """The engine's state from the checkpoint files in `folder`."""
        raise NotImplementedError


def run(engine: Engine, cfg: TrainConfig, *, saved: Checkpoints | None = None, progress=None, on_step=None,
        time_steps: bool = False) -> tuple[dict, list[float], list[tuple[int, float]] | None]:
    """Train `engine` for the spec's epochs as `fit` does.

    Args:
        saved: where to resume from and write a checkpoint to after every epoch.
        progress: `progress(epoch, epochs)` after every epoch.
        on_step: `on_step(loss)` after every optimizer step, with the step's batch loss.
        time_steps: time every step of the first epoch run (for a run with no other epoch to set its compile
            apart against: `keras_side.results.compile_apart`).

    Returns:
        `(curves, epoch_seconds, steps)`: the curves (`loss`, `val_loss`, `metrics`: a resumed run's from its
        start), each epoch's seconds, and with `time_steps` the first epoch's steps as (rows, seconds), else None.
    """
    if saved and saved.saved:
        saved.restore(engine.read)
    curves = saved.curves if saved else fresh_curves()  # a resumed run's epochs so far
    if engine.metrics is not None:
        engine.metrics.history = curves["metrics"]
    validate = cfg.validate and engine.validates
    stop = EarlyStopping(cfg.patience) if cfg.patience and validate else None
    epoch_seconds, steps = [], [] if time_steps else None
    for epoch in range(saved.start if saved else 0, cfg.epochs):
        start, losses, rows = time.perf_counter(), [], []
        timed = steps is not None and not epoch_seconds
        mark = _clock(engine) if timed else None
        with engine.epoch_scope(epoch):
            for batch in engine.batches(epoch):
                loss = engine.step(batch)
                losses.append(loss)
                rows.append(engine.rows(batch))
                if on_step:
                    on_step(loss)
                if timed:
                    now = _clock(engine)
                    steps.append((rows[-1], now - mark))
                    mark = now
        curves["loss"].append(engine.epoch_loss(losses, rows))
        engine.end_epoch()
        if engine.metrics is not None:
            engine.metrics.close()  # the epoch's values recorded, the metrics reset, as fit does
        if validate:
            curves["val_loss"].append(engine.validate())
        epoch_seconds.append(time.perf_counter() - start)
        if saved:
            saved.save(epoch + 1, engine.model, curves, engine.write)
        if progress:
            progress(epoch + 1, cfg.epochs)
        if stop and stop.update(epoch, curves["val_loss"][-1], engine.get_weights):
            break
    if stop:
        engine.set_weights(stop.best_weights)  # restore_best_weights
    return curves, epoch_seconds, steps


def _clock(engine: Engine) -> float:
    engine.synchronize()
    return time.perf_counter()
