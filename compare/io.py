"""Atomic writes: a reader (or a crash) never sees a half-written file or report folder."""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

from compare.errors import NativeLoopsError


@contextmanager
def atomic_file(path: str | Path):
    """Yield a temporary path beside `path`; move it into place only if the block succeeds."""
    path = Path(path)
    if not path.parent.is_dir():
        raise NativeLoopsError(f"folder {str(path.parent)!r} does not exist; create it or choose another --out")
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as err:
        raise NativeLoopsError(f"cannot write {str(path)!r} ({err.strerror}: {err.filename!r}); choose a writable "
                               "place") from None
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o644)  # mkstemp makes it private; a report is for reading
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def check_writable(path: str | Path) -> None:
    """A `NativeLoopsError` now, rather than after the work, when `path` could not be written."""
    with atomic_file(path):
        pass


def write_json(path: str | Path, obj) -> None:
    with atomic_file(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, allow_nan=True) + "\n")


LOCK = ".native-loops-running"  # inside an --out folder while a run owns it


@contextmanager
def atomic_folder(path: str | Path):
    """Yield a temporary folder beside `path`; rename it to `path` only if the block succeeds.

    `path` must not exist, or be an empty folder, so that no earlier run is ever overwritten. The run holds it with
    a lock file from the start, so a second run given the same --out stops at once instead of after its work. On
    failure, `path` and the parent folders this made are removed again.
    """
    path = Path(path)
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise NativeLoopsError(f"--out {str(path)!r} already exists and is not an empty folder; choose a new one")
    made = [p for p in (path, *path.parents) if not p.exists()]  # what this run creates, deepest first
    try:
        path.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
    except OSError as err:
        _remove_empty(made)
        raise NativeLoopsError(f"--out {str(path)!r} cannot be created ({err.strerror}: {err.filename!r}); choose "
                               "a writable folder") from None
    try:
        os.close(os.open(path / LOCK, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        tmp.rmdir()
        raise NativeLoopsError(f"--out {str(path)!r} is being written by another run; choose a new one") from None
    tmp.chmod(0o755)
    try:
        yield tmp
        (path / LOCK).unlink()
        path.rmdir()
        os.replace(tmp, path)
        made = made[1:]  # the run folder stays
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if made and made[0] == path:
            (path / LOCK).unlink(missing_ok=True)
        elif path.is_dir() and (path / LOCK).exists():  # an empty --out that was there before: leave it empty
            (path / LOCK).unlink()
        _remove_empty(made)


def _remove_empty(folders: list[Path]) -> None:
    """Remove the folders this run made (deepest first), as long as they are empty."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            return
