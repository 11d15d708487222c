"""Files written whole or not at all: a reader, or a crash, never sees half of one. The one atomic write of the
package (`compare.io` puts a command's checks and messages in front of it), and the one lock a writer takes on what
it writes (`Lock`: a checkpoint folder, a run's --out). Engine-free."""
from __future__ import annotations

import fcntl
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path

import numpy as np


@contextmanager
def atomic_file(path: str | Path):
    """Yield a new temporary path beside `path`; move it onto `path` only if the block succeeds, else remove it."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(tmp)
    try:
        yield tmp
        os.chmod(tmp, 0o644)  # mkstemp makes it private; what this package writes is for reading
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


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


def save_npz(path, **arrays) -> None:
    """Arrays to one `.npz` at `path`, whole or not at all (`atomic_file`)."""
    with atomic_file(path) as tmp, open(tmp, "wb") as out:  # a file object: np.savez would add ".npz" to a name
        np.savez(out, **arrays)


class Locked(RuntimeError):
    """Another process, alive, holds the lock; the message names what it writes and its pid."""


class Lock:
    """An exclusive lock on the file `path`, held until `release()` or the end of this process, however it ends: the
    kernel's `flock`, which goes with its owner, so that no lock outlives a killed run. The file holds its owner's
    pid: a second writer is told who holds it (`Locked`), and a file left by an owner that is gone without removing
    it (a SIGKILL) is told apart and taken over (`stale`: that owner's pid).

        lock = Lock(folder / ".lock", f"checkpoint folder {folder}")   # Locked: one line naming the owner
        ...
        lock.release()                                                  # the file removed, the lock let go
    """

    def __init__(self, path, what: str):
        self.path = Path(path)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)  # never through a link
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                owner = _pid_in(fd)
                os.close(fd)
                mine = " (this process: a run of it that has not ended)" if owner == os.getpid() else ""
                raise Locked(f"{what} is being written by another run, pid {owner or 'unknown'}{mine}; wait for it "
                             "to end, or choose another") from None
            try:  # the file this locks is still the one at `path`: its last owner may have removed it meanwhile
                if os.stat(self.path).st_ino == os.fstat(fd).st_ino:
                    break
            except FileNotFoundError:
                pass
            os.close(fd)
        self.stale = _pid_in(fd)  # an owner that released would have removed the file: this one was killed
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self.fd, self.owner = fd, os.getpid()

    def release(self) -> None:
        """Remove the file and let the lock go (once; later calls do nothing)."""
        if self.fd is None:
            return
        if os.getpid() == self.owner:  # not a forked child's copy: the lock is its parent's
            self.path.unlink(missing_ok=True)  # while still held: nobody else can be between its lock and its check
        os.close(self.fd)
        self.fd = None

    def __del__(self):
        if getattr(self, "fd", None) is not None:
            self.release()


def _pid_in(fd: int) -> int | None:
    """The pid written in a lock file, or None (an empty file, or not a number)."""
    text = os.pread(fd, 32, 0).decode(errors="replace").strip()
    return int(text) if text.isdigit() else None
