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


@contextmanager
def atomic_folder(path: str | Path):
    """Yield a temporary folder beside `path`; rename it to `path` only if the block succeeds.

    `path` must not exist, or be an empty folder, so that no earlier run is ever overwritten.
    """
    path = Path(path)
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise NativeLoopsError(f"--out {str(path)!r} already exists and is not an empty folder; choose a new one")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
    except OSError as err:
        raise NativeLoopsError(f"--out {str(path)!r} cannot be created ({err.strerror}: {err.filename!r}); choose "
                               "a writable folder") from None
    tmp.chmod(0o755)
    try:
        yield tmp
        if path.exists():
            path.rmdir()
        os.replace(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
