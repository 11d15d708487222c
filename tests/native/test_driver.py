"""The driver's epoch loop on a scripted engine (`native.driver.run`): what it calls, in what order, what it
records. Engine-free: every engine's suite runs it, the Keras model only holding the weights a checkpoint saves.
The paths that run on the driver are each tested against their reference loop (tests/native/torch/test_fast.py,
the launchers' tests)."""
import keras
import numpy as np
import pytest

from keras_side.spec import TrainConfig
from native import driver
from native.checkpoint import Checkpoints
from tests.native.loops import Interrupted, interrupt_at


class Scripted(driver.Engine):
    """Steps that set the weights to the step's number and return the losses it was given; a validation loss per
    epoch from `val_losses`; every call logged."""

    validates = True

    def __init__(self, val_losses=(), rows=(4, 4, 2)):
        self.model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1, use_bias=False)])
        self.val_losses, self.batch_rows, self.steps, self.log = list(val_losses), rows, 0, []

    def batches(self, epoch):
        self.log.append(("batches", epoch))
        return [(None, np.zeros((n, 1))) for n in self.batch_rows]

    def step(self, batch):
        self.steps += 1
        self.model.set_weights([np.full((1, 1), self.steps, np.float32)])
        return float(self.steps)

    def validate(self):
        self.log.append("validate")
        return self.val_losses.pop(0)

    def write(self, folder):
        folder.mkdir()
        (folder / "steps").write_text(str(self.steps))

    def read(self, folder):
        self.steps = int((folder / "steps").read_text())
        self.log.append(("read", self.steps))


def weight(engine) -> float:
    return float(engine.model.get_weights()[0][0, 0])


def test_the_epochs_loss_is_the_mean_over_its_rows_and_every_hook_comes_once_an_epoch():
    engine, seen, progress = Scripted(val_losses=[9.0, 8.0]), [], []
    curves, seconds, steps = driver.run(engine, TrainConfig(epochs=2), on_step=seen.append,
                                        progress=lambda *a: progress.append(a))
    assert curves["loss"] == [(1 * 4 + 2 * 4 + 3 * 2) / 10, (4 * 4 + 5 * 4 + 6 * 2) / 10]  # weighed by rows
    assert curves["val_loss"] == [9.0, 8.0] and seen == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert progress == [(1, 2), (2, 2)] and len(seconds) == 2 and steps is None
    assert engine.log == [("batches", 0), "validate", ("batches", 1), "validate"]


def test_early_stopping_restores_the_best_epochs_weights():
    engine = Scripted(val_losses=[3.0, 2.0, 2.5, 2.6, 1.0])
    curves, _, _ = driver.run(engine, TrainConfig(epochs=5, patience=2))
    assert curves["val_loss"] == [3.0, 2.0, 2.5, 2.6]  # two epochs past the best: stopped
    assert weight(engine) == 6.0  # the second epoch's last step


def test_an_engine_without_validation_rows_is_never_asked_to_validate():
    """The launchers and the many-model trainers have no validation rows: the spec's validation and early stopping
    do not reach them (the launchers' command lines refuse both: `native.preflight`)."""
    class Unvalidated(Scripted):
        validates = False

    engine = Unvalidated()
    curves, seconds, _ = driver.run(engine, TrainConfig(epochs=3, patience=1))
    assert curves["val_loss"] == [] and len(seconds) == 3 and "validate" not in engine.log


def test_only_the_first_epoch_run_has_its_steps_timed():
    _, _, steps = driver.run(Scripted(), TrainConfig(epochs=3, validate=False), time_steps=True)
    assert [rows for rows, _ in steps] == [4, 4, 2] and all(seconds >= 0 for _, seconds in steps)


def test_a_resumed_run_reads_the_engine_and_goes_on_after_its_checkpoint(har, tmp_path):
    cfg = TrainConfig(epochs=3, validate=False)
    first, again = Scripted(), Scripted()
    with pytest.raises(Interrupted):  # the run ends in its third epoch, two epochs on disk
        driver.run(first, cfg, saved=Checkpoints(tmp_path, first.model, har, cfg, "any", "scripted"),
                   on_step=interrupt_at(7))
    saved = Checkpoints(tmp_path, again.model, har, cfg, "any", "scripted", resume=True)
    curves, seconds, _ = driver.run(again, cfg, saved=saved)
    assert ("read", 6) in again.log and again.log[-1] == ("batches", 2)  # the third epoch only
    assert curves["loss"] == [1.8, 4.8, 7.8] and len(seconds) == 1  # the first two epochs' from the checkpoint
    assert weight(again) == 9.0
