"""A function of Keras's swapped for one of ours while blocks run, as `native.jax.convolution.as_matmuls` swaps its
JAX convolution and `native.tensorflow.mirrored.rows_of_global_batch` its TensorFlow dropout:

    with swap.swapped(keras_jax_nn, "conv", ours):
        ...                                  # keras_jax_nn.conv is `ours`, in every thread
    swap.before(keras_jax_nn, "conv")        # what the blocks found there: what `ours` falls back to

The swap is process-wide, since Keras looks the function up in its module at each call. Blocks may nest and overlap
across threads: one swap per attribute, its blocks counted, and what the first block found comes back when the last
one ends, whichever that is (a block that put back what it found would, ending before another, end that one's swap
early, and ending after it, leave that one's function behind).
"""
from __future__ import annotations

import contextlib
import threading

_LOCK = threading.Lock()
_open: dict[tuple[int, str], list] = {}  # (id(owner), name): [blocks open, what the first found, the replacement]


@contextlib.contextmanager
def swapped(owner, name: str, replacement):
    """While the block runs, `owner.<name>` is `replacement` (module docstring). A block with another replacement
    while one is open is an error: one of the two would silently not run."""
    key = (id(owner), name)
    with _LOCK:
        if key not in _open:
            found = getattr(owner, name)
            setattr(owner, name, replacement)
            _open[key] = [0, found, replacement]
        elif _open[key][2] is not replacement:
            raise RuntimeError(f"{name} is swapped for {_open[key][2].__qualname__} already; a block swapping it for "
                               f"{replacement.__qualname__} cannot open meanwhile")
        _open[key][0] += 1
    try:
        yield
    finally:
        with _LOCK:
            _open[key][0] -= 1
            if not _open[key][0]:
                setattr(owner, name, _open.pop(key)[1])


def before(owner, name: str):
    """What `owner.<name>` was before the blocks open now swapped it; the attribute itself when none is open."""
    with _LOCK:
        found = _open.get((id(owner), name))
        return found[1] if found else getattr(owner, name)
