"""Checkpoint and resume in this engine's native loop: a run killed with SIGKILL in the middle of an epoch, then
resumed, ends bit-identical to the run that was never stopped; a checkpoint of another run, or a damaged one, is
one clear error, and the folder stays as it was."""
import json
import os
from dataclasses import replace
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest

from compare.engines import paths
from keras_side.determinism import seed_everything
from keras_side.spec import SpecError, TrainConfig
from native.checkpoint import LOCK, CheckpointError, completed
from tests.conftest import REPO, wait_for
from tests.native.checkpoint_models import renamed_mlp, stateful_mlp
from tests.native.conftest import ENGINE
from tests.tiers import fast_only_on

PATH = paths.get(f"{ENGINE}-native")
CFG = TrainConfig(epochs=4, batch_size=256, seed=3)  # 2,263 training days: 9 steps an epoch
KILL_AT_STEP = 22  # in the middle of the third epoch: two complete epochs are on disk
KILLED_RUN = """
import json, os, signal, sys
from compare.engines import paths
from keras_side.data import HarData
from keras_side.determinism import seed_everything
from keras_side.spec import TrainConfig
from tests.native.checkpoint_models import stateful_mlp

data, cfg = HarData.load(sys.argv[1]), TrainConfig(**json.loads(sys.argv[2]))
steps = []

def on_step(loss=None):
    steps.append(loss)
    if len(steps) == int(sys.argv[4]):
        os.kill(os.getpid(), signal.SIGKILL)  # no handler, no cleanup: as a crash or an out-of-memory kill

seed_everything(cfg.seed)
paths.get(sys.argv[5]).train(stateful_mlp(), data, cfg, checkpoint=sys.argv[3], on_step=on_step)
"""


def train(har, **kwargs):
    seed_everything(CFG.seed)
    return PATH.train(stateful_mlp(), har, CFG, **kwargs)


def test_a_run_killed_mid_epoch_resumes_bit_identically(har, tmp_path):
    whole = train(har)
    har.save(tmp_path / "data.npz")
    folder = tmp_path / "checkpoints"
    env = {**os.environ, "KERAS_BACKEND": ENGINE, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", KILLED_RUN, str(tmp_path / "data.npz"), json.dumps(CFG.to_dict()),
                           str(folder), str(KILL_AT_STEP), PATH.name], env=env, capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert [epoch for epoch, _ in completed(folder)] == [2]  # the last complete epoch, nothing half-written
    # nothing hidden but the killed run's lock file, its pid in it, which no process holds any more
    assert [p.name for p in folder.iterdir() if p.name.startswith(".")] == [LOCK]
    with pytest.warns(UserWarning, match=f"the lock of pid {int((folder / LOCK).read_text())}, a run that is gone"):
        resumed = train(har, checkpoint=folder, resume=True)
    assert not (folder / LOCK).exists()  # let go after the last epoch
    for a, b in zip(whole.weights, resumed.weights, strict=True):
        np.testing.assert_array_equal(a, b)  # BatchNorm's statistics too; the Dropout masks drew alike
    assert resumed.train_loss == whole.train_loss and resumed.val_loss == whole.val_loss
    assert [epoch for epoch, _ in completed(folder)] == [CFG.epochs]


HELD_RUN = """
import json, pathlib, sys, time
from compare.engines import paths
from keras_side.data import HarData
from keras_side.determinism import seed_everything
from keras_side.spec import TrainConfig
from tests.native.checkpoint_models import stateful_mlp

data, cfg, folder, signals = HarData.load(sys.argv[1]), TrainConfig(**json.loads(sys.argv[2])), sys.argv[3], \
    pathlib.Path(sys.argv[4])
steps = []

def on_step(loss=None):  # at the first step: say the folder is held, and wait to be let go on
    steps.append(loss)
    if len(steps) == 1:
        (signals / "held").touch()
        while not (signals / "go").exists():
            time.sleep(0.05)

seed_everything(cfg.seed)
paths.get(sys.argv[5]).train(stateful_mlp(), data, cfg, checkpoint=folder, on_step=on_step)
"""
HANG_GUARD_S = 600  # a bound on waiting for the other run to reach its first step: against a hang, not a speed


@fast_only_on(ENGINE == "torch")  # the lock is engine-free (native/checkpoint.py): make test takes it on torch
def test_a_second_run_on_a_checkpoint_folder_is_refused_in_one_line_and_the_first_resumes_bit_identically(
        har, tmp_path):
    """Two runs writing one folder deleted each other's temporary epochs (orbax's NOT_FOUND on JAX) and mixed their
    epochs: the second, by the command line, is refused in one line naming the first's pid; the first's
    checkpoints stay whole, and resume to the uninterrupted run's weights."""
    whole = train(har)
    har.save(tmp_path / "data.npz")
    folder, signals = tmp_path / "checkpoints", tmp_path / "signals"
    signals.mkdir()
    env = {**os.environ, "KERAS_BACKEND": ENGINE, "PYTHONPATH": str(REPO)}
    first = subprocess.Popen([sys.executable, "-c", HELD_RUN, str(tmp_path / "data.npz"),
                              json.dumps(CFG.replace(epochs=2).to_dict()), str(folder), str(signals), PATH.name],
                             env=env, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: (signals / "held").exists() or first.poll() is not None, HANG_GUARD_S)
        assert (signals / "held").exists(), first.stderr.read()[-2000:] if first.poll() is not None else "hung"
        second = subprocess.run([sys.executable, "-m", "compare.cli", "train", "--path", PATH.name, "--epochs", "2",
                                 "--checkpoint", str(folder)], env=env, capture_output=True, text=True)
        ours = [line for line in second.stderr.splitlines() if line.startswith("native-loops:")]  # not TF's logs
        assert second.returncode == 2 and len(ours) == 1 and second.stderr.splitlines()[-1] == ours[0], \
            second.stderr[-2000:]
        assert f"checkpoint folder {folder} is being written by another run, pid {first.pid}" in second.stderr
    finally:
        (signals / "go").touch()
        _, err = first.communicate()
    assert first.returncode == 0, err[-2000:]
    assert [epoch for epoch, _ in completed(folder)] == [2] and not (folder / LOCK).exists()
    resumed = train(har, checkpoint=folder, resume=True)
    for a, b in zip(whole.weights, resumed.weights, strict=True):
        np.testing.assert_array_equal(a, b)


@fast_only_on(ENGINE == "torch")  # the lock's owner is engine-free (native/checkpoint.py): make test takes it on torch
def test_a_run_that_raised_lets_the_next_run_of_its_thread_resume(har, tmp_path):
    """A run that raises mid-epoch keeps its lock while its traceback lives (a notebook keeps it): the next run of
    the same thread takes it over and resumes; a run of another thread meanwhile is refused, naming this process."""
    import threading

    def fail_at_the_second_epoch(epoch, epochs):
        if epoch == 2:
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom") as failed:
        train(har, checkpoint=tmp_path / "c", progress=fail_at_the_second_epoch)
    refused = []
    other = threading.Thread(target=lambda: refused.append(pytest.raises(CheckpointError, train, har,
                                                                         checkpoint=tmp_path / "c", resume=True)))
    other.start()
    other.join()
    assert refused and "this process" in str(refused[0].value)
    resumed = train(har, checkpoint=tmp_path / "c", resume=True)  # `failed` still holds the first run's frames
    assert failed.value is not None and [e for e, _ in completed(tmp_path / "c")] == [CFG.epochs]
    for a, b in zip(train(har).weights, resumed.weights, strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_folder_lock_names_its_owner_and_goes_with_it(tmp_path):
    """The lock itself, engine-free: a second taker is refused with the owner's pid; released, the file is gone and
    the lock free; a file left by a killed owner (a pid in it, no lock held) is taken over and its pid reported."""
    from keras_side.files import Lock, Locked

    first = Lock(tmp_path / ".lock", "this folder")
    with pytest.raises(Locked, match=f"this folder is being written by another run, pid {os.getpid()} \\(this "):
        Lock(tmp_path / ".lock", "this folder")
    first.release()
    assert not (tmp_path / ".lock").exists()
    (tmp_path / ".lock").write_text("4194305\n")  # above Linux's largest pid: no such process
    taken = Lock(tmp_path / ".lock", "this folder")
    assert taken.stale == 4194305 and (tmp_path / ".lock").read_text() == f"{os.getpid()}\n"
    taken.release()


def test_a_run_resumed_where_its_layers_are_named_otherwise_ends_where_it_would_have(har, tmp_path):
    """A checkpoint is the model's, whatever names its layers got in the process that wrote it: torch numbered the
    optimizer's state in `model.parameters()` order, which is by path, so a resuming process whose layers sorted
    otherwise gave each parameter another's moments (a silent wrong run, or a shape error where the shapes
    differed)."""
    whole = train(har)
    seed_everything(CFG.seed)
    PATH.train(stateful_mlp(), har, CFG.replace(epochs=2), checkpoint=tmp_path / "c")
    seed_everything(CFG.seed)
    resumed = PATH.train(renamed_mlp(), har, CFG, checkpoint=tmp_path / "c", resume=True)
    for a, b in zip(whole.weights, resumed.weights, strict=True):
        np.testing.assert_array_equal(a, b)
    assert resumed.train_loss == whole.train_loss


@fast_only_on(ENGINE == "torch")  # state.json is engine-free (native/checkpoint.py): make test runs it on torch
def test_a_diverged_runs_checkpoint_is_standard_json_and_resumes_where_the_run_would_have(har, tmp_path):
    """A learning rate that blows the weights up: each epoch's loss is NaN, which state.json holds as null (Python's
    `json` wrote NaN, which `jq` and other readers refuse) and a resumed run reads back as NaN, so its curves and
    weights are the uninterrupted run's."""
    cfg = CFG.replace(learning_rate=1e30, epochs=3)
    seed_everything(cfg.seed)
    whole = PATH.train(stateful_mlp(), har, cfg)
    assert np.isnan(whole.train_loss).all()  # what the test is about: no finite loss to write
    seed_everything(cfg.seed)
    PATH.train(stateful_mlp(), har, cfg.replace(epochs=2), checkpoint=tmp_path / "c")
    [(_, folder)] = completed(tmp_path / "c")

    def refuse(constant):
        raise AssertionError(f"state.json holds {constant}, which standard JSON has not")

    state = json.loads((folder / "state.json").read_text(), parse_constant=refuse)
    assert state["curves"]["loss"] == [None, None]
    seed_everything(cfg.seed)
    resumed = PATH.train(stateful_mlp(), har, cfg, checkpoint=tmp_path / "c", resume=True)
    np.testing.assert_array_equal(resumed.train_loss, whole.train_loss)  # NaN where NaN
    np.testing.assert_array_equal(resumed.val_loss, whole.val_loss)
    for a, b in zip(whole.weights, resumed.weights, strict=True):
        np.testing.assert_array_equal(a, b)


def test_the_portable_weights_are_the_models(har, tmp_path):
    """Each checkpoint has the Keras `.weights.h5` any engine's model loads: the trained weights."""
    result = train(har, checkpoint=tmp_path / "c")
    model = stateful_mlp()
    model.load_weights(str(tmp_path / "c" / f"epoch-{CFG.epochs:04d}" / "model.weights.h5"))
    for a, b in zip(result.weights, model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.fixture(scope="module")
def two_epochs(har, tmp_path_factory):
    """The checkpoints of the first 2 epochs of a run, trained once: each case below damages a copy."""
    folder = tmp_path_factory.mktemp("two_epochs") / "c"
    seed_everything(CFG.seed)
    PATH.train(stateful_mlp(), har, CFG.replace(epochs=2), checkpoint=folder)
    return folder


def snapshot(folder):
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("change, message", [
    (lambda: dict(cfg=CFG.replace(learning_rate=0.02)), "trained with learning_rate=0.01, this run has "
                                                        "learning_rate=0.02; resume with the same spec"),
    (lambda: dict(build=lambda: __import__("keras_side.models").models.har()), "is of another model"),
    (lambda: dict(cfg=CFG.replace(epochs=1)), "is at epoch 2, past this run's 1 epochs"),
    (lambda: dict(resume=False), "holds the checkpoints of a run \\(epoch 2\\); pass resume"),
    (lambda: dict(damage="{not json"), "is damaged \\(JSONDecodeError\\); start afresh"),
    # JSON, but not a checkpoint's: each was a traceback from deep in the loop (AttributeError, TypeError)
    (lambda: dict(damage="[]"), "is damaged \\(ValueError\\); start afresh"),
    (lambda: dict(damage={"spec": 5}), "is damaged \\(TypeError\\); start afresh"),
    (lambda: dict(damage={"curves": []}), "is damaged \\(TypeError\\); start afresh"),
    (lambda: dict(damage={"curves": {"loss": 5, "val_loss": [], "metrics": []}}), "is damaged \\(TypeError\\)"),
    (lambda: dict(damage={"curves": {"loss": [0.5], "val_loss": [], "metrics": []}}), "is damaged \\(TypeError\\)"),
    (lambda: dict(damage="engine"), "is damaged: its engine state cannot be read"),
    (lambda: dict(data="fewer rows"), 'is of another data \\("2263 rows, sha256 .*this run: "2000 rows'),
    # the same training rows, another validation set: the resumed curve would join two sets' losses
    (lambda: dict(data="other validation"), 'is of another validation \\("\\d+ rows, sha256 .*this run: "100 rows'),
    # a checkpoint written before the validation data was recorded: it cannot show it is the same (was a KeyError)
    (lambda: dict(damage="no validation"), 'is of another validation \\(null, this run: "\\d+ rows, sha256 '),
])
def test_a_checkpoint_of_another_run_is_one_error_and_stays_as_it_was(har, tmp_path, two_epochs, change, message):
    folder = shutil.copytree(two_epochs, tmp_path / "c")
    options = change()
    damage = options.pop("damage", None)
    if damage == "engine":
        for f in (folder / "epoch-0002" / "engine").rglob("*"):
            if f.is_file():
                f.write_bytes(b"damaged")
    elif damage == "no validation":
        state = folder / "epoch-0002" / "state.json"
        state.write_text(json.dumps({k: v for k, v in json.loads(state.read_text()).items() if k != "validation"}))
    elif isinstance(damage, dict):  # fields of state.json replaced
        state = folder / "epoch-0002" / "state.json"
        state.write_text(json.dumps(json.loads(state.read_text()) | damage))
    elif damage:
        (folder / "epoch-0002" / "state.json").write_text(damage)
    (folder / ".epoch-0003.tmp-1").mkdir()  # a write a killed run left: a refused resume leaves it too
    before = snapshot(folder), sorted(p.name for p in folder.iterdir())
    build, cfg = options.pop("build", stateful_mlp), options.pop("cfg", CFG)
    data = {None: har, "fewer rows": replace(har, x_train=har.x_train[:2000], y_train=har.y_train[:2000]),
            "other validation": replace(har, x_val=har.x_val[:100], y_val=har.y_val[:100])}[options.pop("data", None)]
    with pytest.raises(CheckpointError, match=message):
        seed_everything(CFG.seed)
        PATH.train(build(), data, cfg, checkpoint=folder, **{"resume": True, **options})
    assert (snapshot(folder), sorted(p.name for p in folder.iterdir())) == before


@pytest.mark.parametrize("where, message", [
    ("file/c", "cannot be written (Not a directory)"), ("a/" + "c" * 300, "cannot be written (File name too long)"),
    ("c" * 300, "cannot be written (File name too long)"),
    ("/".join(["c" * 200] * 25), "cannot be written (File name too long)"),
    ("file", "is a file; give a folder"),
], ids=["under-a-file", "long-name-under-new", "long-name", "long-path", "file"])
def test_a_checkpoint_folder_that_cannot_be_written_is_refused_before_training(har, tmp_path, where, message):
    """Found out at the first save, after an epoch of training, it was a traceback; the folders made to find out
    are removed again. A name past NAME_MAX in a folder that exists, or a path past PATH_MAX, made the first look at
    the folder raise: a traceback too."""
    (tmp_path / "file").write_text("")
    steps = []
    with pytest.raises(CheckpointError, match=message.replace("(", r"\(").replace(")", r"\)")):
        train(har, checkpoint=tmp_path / where, on_step=lambda loss=None: steps.append(loss))
    assert steps == [] and [p.name for p in tmp_path.iterdir()] == ["file"]


@fast_only_on(ENGINE == "torch")  # what is left to save is engine-free (native/checkpoint.py): torch only in make test
def test_a_finished_run_resumes_from_a_folder_it_cannot_write(har, tmp_path, monkeypatch):
    """Its last epoch is the run's: nothing is left to save, so a read-only folder (an archive, another user's) gives
    the run's result; it was refused as unwritable. With epochs left, the same folder is refused before training."""
    import tempfile

    whole = train(har, checkpoint=tmp_path / "c")
    before = snapshot(tmp_path / "c")

    def refused(*args, **kwargs):  # as the folder answers a user without write permission (root has it everywhere)
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "TemporaryFile", refused)
    resumed = train(har, checkpoint=tmp_path / "c", resume=True)
    for a, b in zip(whole.weights, resumed.weights, strict=True):
        np.testing.assert_array_equal(a, b)
    assert resumed.train_loss == whole.train_loss and snapshot(tmp_path / "c") == before
    steps = []
    with pytest.raises(CheckpointError, match=r"cannot be written \(Permission denied\)"):
        seed_everything(CFG.seed)
        PATH.train(stateful_mlp(), har, CFG.replace(epochs=CFG.epochs + 1), checkpoint=tmp_path / "c", resume=True,
                   on_step=lambda loss=None: steps.append(loss))
    assert steps == [] and snapshot(tmp_path / "c") == before


def test_a_file_named_as_an_epoch_is_refused_before_training(har, tmp_path):
    """After the first epoch the epoch's folder could not be renamed onto the file: a traceback, and the hidden
    temporary folder left behind."""
    (tmp_path / "epoch-0001").write_text("mine")
    steps = []
    with pytest.raises(CheckpointError, match=f"checkpoint folder {tmp_path} holds a file named epoch-0001, where an "
                                              "epoch's folder goes; move it away, or give another folder"):
        train(har, checkpoint=tmp_path, on_step=lambda loss=None: steps.append(loss))
    assert steps == [] and [p.name for p in tmp_path.iterdir()] == ["epoch-0001"]
    assert (tmp_path / "epoch-0001").read_text() == "mine"


@pytest.mark.parametrize("full", [OSError(28, "No space left on device"),  # torch.save, h5py
                                  ValueError("RESOURCE_EXHAUSTED: Error writing local file: Failed to write 683 bytes "
                                             "to file 5: No space left on device [os_error_code='28']")])  # orbax
def test_a_checkpoint_that_cannot_be_written_is_one_error_and_the_last_epoch_stays(har, tmp_path, monkeypatch, full):
    """A full disk at the second epoch (a real one: hundreds of lines of tracebacks, orbax's among them) is one
    error that says which epoch is kept, and nothing half-written is left in view."""
    import importlib

    writer = importlib.import_module(f"native.{ENGINE}.checkpoint")
    real, calls = writer.write, []

    def write(folder, *args, **kwargs):
        calls.append(folder)
        if len(calls) == 2:
            raise full
        return real(folder, *args, **kwargs)

    monkeypatch.setattr(writer, "write", write)
    with pytest.raises(CheckpointError, match=r"epoch-0002 could not be written \(No space left on device\); epoch 1 "
                                              r"is kept there: free space \(or fix the folder\) and resume$"):
        train(har, checkpoint=tmp_path / "c")
    assert [p.name for p in (tmp_path / "c").iterdir()] == ["epoch-0001"]


def test_early_stopping_is_refused_with_a_checkpoint(har, tmp_path):
    with pytest.raises(SpecError, match="checkpoints do not carry early stopping"):
        PATH.train(stateful_mlp(), har, CFG.replace(patience=2), checkpoint=tmp_path / "c")


@fast_only_on(ENGINE == "torch")  # the options are engine-free (native/checkpoint.py): torch only in make test
def test_the_train_command_checkpoints_and_resumes(tmp_path, capsys):
    from compare import cli

    folder = str(tmp_path / "c")
    assert cli.main(["train", "--path", PATH.name, "--epochs", "2", "--checkpoint", folder]) == 0
    assert cli.main(["train", "--path", PATH.name, "--epochs", "3", "--checkpoint", folder, "--resume"]) == 0
    assert [epoch for epoch, _ in completed(tmp_path / "c")] == [3]
    capsys.readouterr()
    assert cli.main(["train", "--path", PATH.name, "--epochs", "3", "--checkpoint", folder]) == 2
    err = capsys.readouterr().err
    assert "holds the checkpoints of a run (epoch 3); pass resume" in err and len(err.strip().splitlines()) == 1
    assert cli.main(["train", "--path", PATH.name, "--epochs", "1", "--checkpoint", str(tmp_path / ("c" * 300))]) == 2
    err = capsys.readouterr().err
    assert "cannot be written (File name too long)" in err and len(err.strip().splitlines()) == 1
    assert cli.main(["train", "--path", f"keras-{ENGINE}", "--checkpoint", folder]) == 2
    assert (f"--checkpoint: keras-{ENGINE} writes no checkpoints: fit has keras.callbacks.BackupAndRestore"
            in capsys.readouterr().err)
    # a native loop, but one whose epochs run in one call (it was told that fit has BackupAndRestore)
    assert cli.main(["train", "--path", "jax-native-scan", "--checkpoint", folder]) == 2
    assert "no epoch ends where a checkpoint could be written; use --path jax-native" in capsys.readouterr().err
