"""Atomic writes (a reader, or a crash, never sees a half-written file or report folder), and npz keywords."""
from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from compare.errors import NativeLoopsError
from keras_side import files
from keras_side.files import Lock, Locked, finite_or_null


@contextmanager
def atomic_file(path: str | Path):
    """`keras_side.files.atomic_file` (a temporary path beside `path`, moved onto it only if the block succeeds),
    with a path that cannot be written as one line naming the problem and the fix, before the block runs."""
    check_writable(path)
    with files.atomic_file(path) as tmp:
        yield tmp


def exists(path: str | Path, option: str) -> bool:
    """`Path.exists`, with a path the system refuses (a name too long, a folder without permission) as one line
    naming the option that gave it."""
    try:
        return Path(path).exists()
    except OSError as err:
        raise NativeLoopsError(f"{option} {str(path)!r}: {err.strerror}; choose another path") from None


def check_writable(path: str | Path) -> None:
    """A `NativeLoopsError` now, rather than after the work, when the file `path` could not be written; nothing
    is left behind (an existing file stays as it is)."""
    _temp_beside(Path(path)).unlink()


def _temp_beside(path: Path) -> Path:
    """A new, empty temporary file beside `path`; one line naming the problem when there can be none."""
    try:
        if path.is_dir():
            raise NativeLoopsError(f"{str(path)!r} is a folder; name a file to write")
        if path.parent.exists() and not path.parent.is_dir():
            raise NativeLoopsError(f"{str(path.parent)!r} is a file, not a folder; choose another path")
        if not path.parent.is_dir():
            raise NativeLoopsError(f"folder {str(path.parent)!r} does not exist; create it or choose another path")
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as err:  # a name too long, a folder that cannot be looked into or written
        raise NativeLoopsError(f"cannot write {str(path)!r} ({err.strerror}: {err.filename!r}); choose a writable "
                               "place") from None
    os.close(fd)
    return Path(tmp)


def write_json(path: str | Path, obj) -> None:
    """`obj` as standard JSON: a number that is not finite is written as null (`keras_side.files.finite_or_null`)."""
    with atomic_file(path) as tmp:
        tmp.write_text(json.dumps(finite_or_null(obj), indent=2, allow_nan=False) + "\n")


@contextmanager
def atomic_folder(path: str | Path):
    """Yield a temporary folder beside `path`; rename it to `path` only if the block succeeds, so `path` appears
    whole or not at all.

    `path` must not exist, or be an empty folder, so that no earlier run is ever overwritten. A lock beside it
    (`.<name>.lock`, `keras_side.files.Lock`), taken before anything else, makes a second run given the same --out
    stop at once, naming the first's pid; the lock of a run that was killed is taken over, and its temporary folder
    removed, with a line saying so. On failure, the parent folders this made are removed again; if the final rename
    itself fails, the results stay in the temporary folder and the error says where.
    """
    path = Path(path)
    try:
        made = [p for p in path.parents if not p.exists()]  # the parents this run creates, deepest first
        blocking = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
        link = path.is_symlink()
    except OSError as err:  # a parent that cannot be looked into (no permission), a name too long
        raise _cannot_create(path, err) from None
    if blocking is not None:
        raise NativeLoopsError(f"--out {str(path)!r}: {str(blocking)!r} is a file, not a folder; choose another path")
    if link:  # the final rename would replace the link, not fill the folder it names
        raise NativeLoopsError(f"--out {str(path)!r} is a symbolic link; give the folder it points to, or a new path")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = Lock(path.parent / f".{path.name}.lock", f"--out {str(path)!r}")
    except Locked as err:
        raise NativeLoopsError(str(err)) from None
    except OSError as err:  # a file where a parent folder should be, no permission, a name too long
        _remove_empty(made)
        raise _cannot_create(path, err) from None
    if lock.stale is not None:  # its temporary folder is no live run's: nobody else holds the lock
        mine = re.compile(rf"^\.{re.escape(path.name)}\.[A-Za-z0-9_]{{8}}\.tmp$")  # mkdtemp's, for this --out only
        left = [p for p in path.parent.iterdir() if mine.match(p.name) and p.is_dir()]
        for folder in left:
            shutil.rmtree(folder, ignore_errors=True)
        print(f"native-loops: --out {str(path)!r}: a run that was killed (pid {lock.stale}) left its lock"
              + (f" and {len(left)} temporary folder(s), removed" if left else "") + "; taken over", file=sys.stderr)
    tmp = None
    try:
        if path.exists() and (not path.is_dir() or any(path.iterdir())):
            what = "is a file" if not path.is_dir() else "already exists and is not an empty folder"
            raise NativeLoopsError(f"--out {str(path)!r} {what}; choose a new folder")
        try:
            tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
        except OSError as err:  # a name too long for the temporary folder's
            raise _cannot_create(path, err) from None
        tmp.chmod(0o755)
        yield tmp
        try:
            os.replace(tmp, path)  # onto a missing path or an empty folder: one atomic rename
        except OSError as err:
            kept, tmp = tmp, None
            raise NativeLoopsError(f"--out {str(path)!r} could not be put in place ({err.strerror}); the results "
                                   f"are in {str(kept)!r}") from None
        made, tmp = [], None
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        lock.release()
        _remove_empty(made)


def _cannot_create(path: Path, err: OSError) -> NativeLoopsError:
    return NativeLoopsError(f"--out {str(path)!r} cannot be created ({err.strerror}: {err.filename!r}); choose a "
                            "writable folder")


def _remove_empty(folders: list[Path]) -> None:
    """Remove the folders this run made (deepest first), as long as they are empty."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            return


def named(prefix: str, arrays) -> dict:
    """Arrays as `np.savez` keywords in order: `prefix_0`, `prefix_1`, ... (a worker's weights, outputs, gradients)."""
    return {f"{prefix}_{i}": np.asarray(a) for i, a in enumerate(arrays)}
