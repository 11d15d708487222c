"""Checkpoints of a native loop: written at the end of every epoch, read back to resume where the run stopped.

    result = loop.train(model, data, cfg, checkpoint="runs/ckpt")               # a checkpoint per epoch
    result = loop.train(model, data, cfg, checkpoint="runs/ckpt", resume=True)  # after a crash: go on from there

This module is the engine-free part: the folder, what it records and the checks on reading it. Each engine's
`native/<engine>/checkpoint.py` writes the optimizer state and every model variable with the engine's own tool
(`torch.save`, an orbax pytree checkpoint, `tf.train.Checkpoint`). A checkpoint is one folder per epoch,

    DIR/epoch-0003/   model.weights.h5  the Keras weights, portable: any engine's model loads them
                      state.json        the epoch, the spec, the model's variables, the data's fingerprint, the
                                        curves so far, seed, versions
                      engine/...        the engine's own files: the optimizer's state, every variable (a random
                                        layer's seed state too, which .weights.h5 does not hold)

written as a hidden temporary folder and renamed into place once complete, so a run killed at any moment leaves its
last complete epoch (the older one is renamed out of sight, then removed, once the newer one is in place). The
batch order of every epoch is a function of the seed and the data, both part of what a resume must match, so a
resumed run draws the epochs it has left exactly as the uninterrupted run would.

One run writes a folder at a time: `DIR/.lock` (`keras_side.files.Lock`) is taken before anything is read or written
and let go after the last epoch is saved, when a checkpoint cannot be read or written, or when the process ends,
however it ends. A second run on the folder is refused in one line naming the first's pid; the lock of a run that
was killed is taken over, with a warning, and so is that of an earlier run of the same thread, which has raised.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
import threading
import warnings
import weakref
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from keras_side.arrays import as_tuple
from keras_side.files import Lock, Locked, finite_or_null
from keras_side.process import interrupts_held
from keras_side.results import versions
from keras_side.spec import SpecError, TrainConfig

FORMAT = 1
EPOCH = re.compile(r"^epoch-(\d{4,})$")
LOCK = ".lock"  # in the folder: the pid of the run writing it
# The runs holding a folder's lock, by folder and thread. Runs of one thread follow each other, so one still holding
# the lock when the next starts has ended by raising (its traceback keeps it alive): the next takes its lock over.
_held: dict[tuple[str, int], weakref.ref] = {}


class CheckpointError(ValueError):
    """A checkpoint that cannot be used (damaged, another model or spec, a folder of another run); one line."""


@dataclass
class Saved:
    """The last complete checkpoint: its folder, its epoch (epochs done) and what state.json says."""

    folder: Path
    epoch: int
    state: dict


def _identity(model, data, cfg: TrainConfig, engine: str, path: str) -> dict:
    """What must match to resume: the engine, the path, the model (its variables' names, shapes and dtypes, in
    order: not the layers' auto-numbered names, which depend on what the process built before), the training data
    (a SHA-256 of its arrays: the batch orders depend on it), the validation data when the run validates (the
    validation curve goes on from the saved one) and the spec (all but `epochs`)."""
    spec = {k: v for k, v in json.loads(json.dumps(cfg.to_dict())).items() if k != "epochs"}
    validation = _fingerprint(data.n_val, data.x_val, data.y_val) if cfg.validate else None
    return {"engine": engine, "path": path,
            "model": [[v.name, list(v.shape), str(v.dtype)] for v in model.variables],
            "data": _fingerprint(data.n_train, data.x_train, data.y_train, data.w_train), "validation": validation,
            "spec": spec}


def _fingerprint(rows: int, *parts) -> str:
    """The rows and a SHA-256 of the arrays (each of `parts`: an array, a tuple of them, or None)."""
    digest = hashlib.sha256()
    for array in (a for part in parts for a in _arrays(part)):
        digest.update(str((array.shape, array.dtype.str)).encode())
        digest.update(memoryview(array).cast("B"))
    return f"{rows} rows, sha256 {digest.hexdigest()[:16]}"


def _arrays(a) -> list:
    if a is None:
        return []
    return [np.ascontiguousarray(p) for p in as_tuple(a)]


def completed(root: Path) -> list[tuple[int, Path]]:
    """The complete epoch folders under `root`, oldest first."""
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := EPOCH.match(p.name))]
    return sorted(found)


def _check_reachable(root: Path) -> None:
    """A CheckpointError when the system refuses to look at `root` at all (a name past NAME_MAX, a path past
    PATH_MAX, a folder on the way that cannot be searched), where `Path.is_dir` raises rather than answers. A folder
    still to be made, or one under a file, is left to `_check_writable`, which says why."""
    try:
        root.stat()
    except (FileNotFoundError, NotADirectoryError):
        return
    except OSError as err:
        raise CheckpointError(f"checkpoint folder {root} cannot be written ({err.strerror}); give a writable "
                              "folder") from None


def _check_writable(root: Path) -> None:
    """A CheckpointError now, not after the first epoch has trained, when `root` cannot hold checkpoints: a file, a
    folder under a file, a name too long, no permission. Folders made to find out are removed again."""
    made = []
    try:
        if root.exists() and not root.is_dir():
            raise CheckpointError(f"checkpoint folder {root} is a file; give a folder")
        made = [p for p in (root, *root.parents) if not p.exists()]
        root.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=root).close()
    except OSError as err:
        raise CheckpointError(f"checkpoint folder {root} cannot be written ({err.strerror}); give a writable "
                              "folder") from None
    finally:
        for folder in made:  # deepest first
            try:
                folder.rmdir()
            except OSError:
                pass


class Checkpoints:
    """One run's checkpoints under `root`. `resume=False` refuses a folder that holds another run's epochs (never
    overwritten); `resume=True` reads the last one (none yet: the run starts from scratch) and checks it is this
    run's: the same engine, path, model and spec (`epochs` may grow)."""

    def __init__(self, root, model, data, cfg: TrainConfig, engine: str, path: str, *, resume: bool = False):
        if cfg.patience is not None:
            raise SpecError("checkpoints do not carry early stopping's state (its best weights); drop patience or "
                            "the checkpoint")
        if not hasattr(data, "n_train"):  # a loader's batches (`Batches`): its position and order are the user's
            raise SpecError("checkpoints resume the spec's batch orders, not a loader's; train on arrays, or save "
                            "from a loop of yours (native.torch.host.save_checkpoint, orbax: docs/embedding.md)")
        self.root, self.cfg = Path(root), cfg
        self.identity = _identity(model, data, cfg, engine, path)
        self.lock, self.made = None, []
        try:
            _check_reachable(self.root)
            self._take_lock()  # before anything is read: a run writing there now is named, never read half-way
            listed = self.root.iterdir() if self.root.is_dir() else ()
            squatters = sorted(p.name for p in listed if EPOCH.match(p.name) and not p.is_dir())
            if squatters:  # after the first epoch, its folder could not be renamed into place
                raise CheckpointError(f"checkpoint folder {self.root} holds a file named {squatters[0]}, where an "
                                      "epoch's folder goes; move it away, or give another folder")
            found = completed(self.root)
            self.saved = None
            if found and not resume:
                raise CheckpointError(f"{self.root} holds the checkpoints of a run (epoch {found[-1][0]}); pass "
                                      "resume (--resume) to continue it, or give an empty folder")
            if found:
                self.saved = self._read(*found[-1])
            if self.start < cfg.epochs:  # epochs left to save: a resumed run with none left only reads
                _check_writable(self.root)
            else:
                self.release()
        except BaseException:
            self.release()
            raise

    def _take_lock(self) -> None:
        """The folder's lock (made with the folder, if there is none), or one line naming the run that holds it. A
        folder that cannot be made is left to `_check_writable`, which says why."""
        made = []
        try:
            if self.root.exists() and not self.root.is_dir():
                return
            made = [p for p in (self.root, *self.root.parents) if not p.exists()]  # deepest first
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError:
            for folder in made:
                with contextlib.suppress(OSError):
                    folder.rmdir()
            return
        self.made = made
        key = (os.path.realpath(self.root), threading.get_ident())
        earlier = _held.get(key)
        if earlier is not None and earlier() is not None:  # a run of this thread that raised: it is over
            earlier().release()
        try:
            self.lock = Lock(self.root / LOCK, f"checkpoint folder {self.root}")
        except Locked as err:
            raise CheckpointError(str(err)) from None
        except OSError as err:  # a lock file this user cannot open (another's, in a shared folder), a link
            raise CheckpointError(f"checkpoint folder {self.root}: its lock ({LOCK}) cannot be taken "
                                  f"({err.strerror}); give a folder of your own") from None
        _held[key] = weakref.ref(self)
        if self.lock.stale:
            warnings.warn(f"checkpoint folder {self.root}: the lock of pid {self.lock.stale}, a run that is gone "
                          "(killed), is taken over", stacklevel=3)

    def release(self) -> None:
        """Let the folder's lock go (and remove the folder, if this run made it and saved nothing there): after the
        last epoch is saved, or on a failure before training. The end of the process lets it go too."""
        if self.lock is not None:
            self.lock.release()
            self.lock = None
            _held.pop((os.path.realpath(self.root), threading.get_ident()), None)
        for folder in self.made:  # deepest first, each only if empty
            with contextlib.suppress(OSError):
                folder.rmdir()
        self.made = []

    def _read(self, epoch: int, folder: Path) -> Saved:
        try:
            state = json.loads((folder / "state.json").read_text())
            if not isinstance(state, dict) or state.get("format") != FORMAT or state.get("epoch") != epoch:
                raise ValueError("unknown format")
            if not all(key in state for key in (*self.identity, "curves") if key != "validation"):
                raise KeyError("a field is missing")
            if not (isinstance(state["spec"], dict) and _curves_of(state["curves"], epoch)):
                raise TypeError("a field is not what it should be")
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise CheckpointError(f"checkpoint {folder} is damaged ({type(err).__name__}); start afresh in an empty "
                                  "folder") from None
        for key in ("engine", "path", "model", "data", "validation"):
            if state.get(key) != self.identity[key]:  # a checkpoint written before the validation was recorded too
                raise CheckpointError(f"checkpoint {folder} is of another {key} ({_short(state.get(key))}, this run: "
                                      f"{_short(self.identity[key])}); resume with the same {key}, or give an "
                                      "empty folder")
        changed = [k for k in self.identity["spec"] if state["spec"].get(k) != self.identity["spec"][k]]
        if changed:
            k = changed[0]
            raise CheckpointError(f"checkpoint {folder} was trained with {k}={state['spec'].get(k)!r}, this run "
                                  f"has {k}={self.identity['spec'][k]!r}; resume with the same spec (only epochs "
                                  "may change)")
        if epoch > self.cfg.epochs:
            raise CheckpointError(f"checkpoint {folder} is at epoch {epoch}, past this run's {self.cfg.epochs} "
                                  "epochs; ask for at least as many")
        return Saved(folder, epoch, state)

    @property
    def start(self) -> int:
        """The first epoch to train (0 when there is nothing to resume)."""
        return self.saved.epoch if self.saved else 0

    @property
    def curves(self) -> dict:
        """The per-epoch curves of the epochs already done (loss, val_loss and the metrics' history), as the loop
        keeps them: a fresh copy, which the loop appends to."""
        return _nan_for_null(self.saved.state["curves"]) if self.saved else fresh_curves()

    def restore(self, read):
        """`read(folder)` the engine's files of the saved epoch, and return what it returns (each engine's
        `checkpoint.read(folder, state) -> state`); any failure there is a damaged checkpoint."""
        try:
            return read(self.saved.folder / "engine")
        except Exception as err:  # each engine's reader raises its own kinds: a missing file, a bad one, a mismatch
            self.release()  # the run ends here
            raise CheckpointError(f"checkpoint {self.saved.folder} is damaged: its engine state cannot be read "
                                  f"({type(err).__name__}); start afresh in an empty folder") from None

    def save(self, epoch: int, model, curves: dict, write_engine) -> Path:
        """Write epoch `epoch` (epochs done) completely, then put it in place and drop the older ones.
        `write_engine(folder)` writes the engine's files into a folder it creates."""
        self.root.mkdir(parents=True, exist_ok=True)
        final = self.root / f"epoch-{epoch:04d}"
        tmp = self.root / f".{final.name}.tmp-{os.getpid()}"
        for leftover in self.root.glob(".epoch-*"):  # a write or a removal a killed run did not finish; only once
            shutil.rmtree(leftover, ignore_errors=True)  # this run writes, so a refused resume changes nothing
        try:
            tmp.mkdir()
            model.save_weights(str(tmp / "model.weights.h5"))
            write_engine(tmp / "engine")
            state = {"format": FORMAT, "epoch": epoch, **self.identity, "curves": curves, "seed": self.cfg.seed,
                     "versions": versions()}
            (tmp / "state.json").write_text(json.dumps(finite_or_null(state), indent=1, allow_nan=False))
        except BaseException as err:
            shutil.rmtree(tmp, ignore_errors=True)
            self.release()  # the run ends here: another may take the folder (and resume it)
            why = _disk_failure(err)
            if why:  # a full disk, a folder gone or made read-only: the disk's doing, not the run's
                kept = [e for e, _ in completed(self.root)]
                raise CheckpointError(f"checkpoint {final} could not be written ({why}); "
                                      + (f"epoch {kept[-1]} is kept there" if kept else "no epoch is saved yet")
                                      + ": free space (or fix the folder) and resume") from None
            raise
        with interrupts_held():  # the new epoch in place and the older ones gone, or neither: never both in view
            shutil.rmtree(final, ignore_errors=True)  # a run resumed from an earlier epoch writes this one again
            os.rename(tmp, final)
            for older, folder in completed(self.root):
                if older < epoch:  # out of sight first: a kill while it is being removed leaves no half epoch in view
                    trash = self.root / f".{folder.name}.old-{os.getpid()}"
                    os.rename(folder, trash)
                    shutil.rmtree(trash, ignore_errors=True)
        self.made = []  # it holds an epoch now: the folder stays
        if epoch >= self.cfg.epochs:  # the run's last epoch: another run may take the folder
            self.release()
        return final


def _disk_failure(err: BaseException) -> str | None:
    """Why a checkpoint could not be written when the disk is the cause, as each engine's tool says it: an OSError
    (torch.save, h5py), TensorFlow's ResourceExhaustedError, orbax's ValueError "RESOURCE_EXHAUSTED" (measured on a
    full tmpfs); None for anything else."""
    if isinstance(err, OSError):
        return err.strerror or str(err)
    text = f"{type(err).__name__}: {err}"
    if "No space left on device" in text:
        return "No space left on device"
    return "the disk is full" if "RESOURCE_EXHAUSTED" in text or "ResourceExhausted" in text else None


def _curves_of(curves, epochs: int) -> bool:
    """Whether `curves` are a run's after `epochs` epochs: a loss per epoch, and a validation loss per epoch or none
    (the metrics' values are each loop's own form)."""
    def numbers(values, counts):  # null: a loss that was not finite (a diverged epoch)
        return isinstance(values, list) and len(values) in counts and all(
            v is None or isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)

    return isinstance(curves, dict) and numbers(curves.get("loss"), (epochs,)) and numbers(
        curves.get("val_loss"), (0, epochs)) and all(isinstance(curves.get(k, []), (list, dict))
                                                     for k in ("metrics", "val_metrics"))


# state.json is standard JSON: a diverged epoch's loss is written as null (`finite_or_null`) and read back as NaN.
def _nan_for_null(curves):
    """A fresh copy of saved curves, which the loop appends to, with NaN for each null."""
    if isinstance(curves, dict):
        return {k: _nan_for_null(v) for k, v in curves.items()}
    if isinstance(curves, list):
        return [float("nan") if v is None else _nan_for_null(v) for v in curves]
    return curves


def fresh_curves() -> dict:
    """The curves of a run with no epoch behind it."""
    return {"loss": [], "val_loss": [], "metrics": {}}


def _short(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."
