"""Files written whole or not at all: a reader, or a crash, never sees half of one. The one atomic write of the
package (`compare.io` puts a command's checks and messages in front of it). Engine-free."""
from __future__ import annotations

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
