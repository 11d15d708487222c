"""How arrays travel in this package: one array, or a tuple of arrays (one per model input, or output), as NumPy
between engines, as a list where Keras takes several. Engine-free."""
from __future__ import annotations

import numpy as np


def first(a):
    """The first array of a tuple (or list) of arrays, or the array itself."""
    return a[0] if isinstance(a, (tuple, list)) else a


def first_nonfinite_row(a: np.ndarray) -> int | None:
    """The first row of a float array that holds a NaN or an infinity, or None (always None for ints)."""
    if not np.issubdtype(a.dtype, np.inexact) or np.isfinite(a).all():
        return None
    return int(np.argmax(~np.isfinite(a.reshape(len(a), -1)).all(axis=1)))


def as_tuple(a) -> tuple:
    """A tuple (or list) of arrays as a tuple, one array as a tuple of one."""
    return tuple(a) if isinstance(a, (tuple, list)) else (a,)


def verb_arrays(x, what: str = "x"):
    """What a verb (`grad_at`, `predict`) was given, as this package carries it: one array, or a tuple of arrays, one
    per model input (or output). A list of arrays is how Keras takes several, so it becomes a tuple on every engine.
    A list of numbers (or of lists of numbers) is refused, as `model.predict` refuses it: is it one array, or one
    input per item? Arrays of any engine pass as they are."""
    if not isinstance(x, (list, tuple)):
        return x
    if not x or not all(hasattr(a, "shape") for a in x):
        per = "input" if what == "x" else "output"
        held = f"of {type(next(a for a in x if not hasattr(a, 'shape'))).__name__}s" if x else "with nothing in it"
        raise ValueError(f"{what} is a Python {type(x).__name__} {held}, not of arrays; pass np.asarray({what}) (a "
                         f"list or tuple holds one array per model {per}, as in Keras)")
    return tuple(x)


def output_arrays(pred):
    """A model's predictions as this package carries them: one NumPy array, or a tuple of arrays, one per output
    (as several targets travel). Stacked on a first axis, as they were, outputs of different widths (a forecast and
    a class's logits) failed after the whole training with NumPy's "inhomogeneous shape"."""
    if isinstance(pred, (list, tuple)):
        return tuple(np.asarray(p) for p in pred)
    return np.asarray(pred)


def output_files(name: str, pred) -> dict[str, np.ndarray]:
    """`pred` (`output_arrays`) as `np.savez` keywords: `name`, or `name.0`, `name.1`... for several outputs."""
    return {f"{name}.{i}": p for i, p in enumerate(pred)} if isinstance(pred, tuple) else {name: pred}


def output_read(z, name: str):
    """What `output_files(name, ...)` wrote, from a loaded `.npz`."""
    if name in z:
        return z[name]
    return tuple(z[f"{name}.{i}"] for i in range(sum(k.startswith(f"{name}.") for k in z)))


def output_gap(a, b) -> float:
    """The largest absolute difference between two predictions (`output_arrays`), over every output."""
    pairs = zip(a, b, strict=True) if isinstance(a, tuple) else [(a, b)]
    return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in pairs)


def keras_inputs(x):
    """Several inputs (or targets) travel here as a tuple of arrays; a Keras model takes them as a list."""
    return list(x) if isinstance(x, tuple) else x


def take(x, idx):
    """Rows `idx` of one array, or of each array of a tuple (several inputs or targets)."""
    return tuple(a[idx] for a in x) if isinstance(x, tuple) else x[idx]
