"""What every parity check shares: naming the user's callables for the workers, the engines, asking the workers,
and the elementwise comparison with its table."""
from __future__ import annotations

import contextlib
import importlib.util
import math
import numbers
import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Union

import numpy as np

from compare.errors import NativeLoopsError
from keras_side.arrays import first_nonfinite_row, verb_arrays
from keras_side.backend import ENGINES
from keras_side.precision import TRUE_FLOAT64

if TYPE_CHECKING:
    from compare.engines.runner import Pool

OWN = "own"  # the path name of a user's own training step (`assert_loop_matches_fit`)
# What the checks' `pool` takes: live workers, or a function that returns them, called once the arguments are checked
Workers = Union["Pool", Callable[[], "Pool"], None]
SPEC = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


class ParityError(NativeLoopsError):
    """The check could not run (the model cannot be built, no float64 engine...); not a parity failure."""


def callable_spec(fn, what: str = "build_model") -> str:
    """'module:function' for a top-level function or such a string; a clear error for anything else."""
    if isinstance(fn, str):
        spec = fn
    elif callable(fn) and getattr(fn, "__qualname__", "") == getattr(fn, "__name__", None) != "<lambda>":
        spec = f"{fn.__module__}:{fn.__qualname__}"
    else:
        raise ParityError(f"{what} {fn!r} must be a function defined at module top level or a 'module:function' "
                          "string, so that each engine's process can import it")
    if not SPEC.match(spec):
        raise ParityError(f"{what} {spec!r} is not of the form 'module:function'")
    module = spec.split(":")[0]
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        found = None
    if found is None:
        raise ParityError(f"{what} {spec!r}: module {module!r} cannot be imported; check the name and sys.path")
    return spec


def loss_spec(loss) -> str:
    """A Keras loss name ('mse', 'huber'...) stays as is; a function of keras.ops becomes 'module:function'."""
    if isinstance(loss, str) and ":" not in loss:
        return loss
    return callable_spec(loss, "loss")


def reference_engine(installed: list[str]) -> str:
    for engine in TRUE_FLOAT64:
        if engine in installed:
            return engine
    raise ParityError(f"a float64 reference needs one of {', '.join(TRUE_FLOAT64)} installed")


_phases: list | None = None  # where `recording()` collects each request's wall time


@contextlib.contextmanager
def recording():
    """Collect (request, engines, seconds) for every request the checks send inside the block (the timing
    benchmark, `compare.parity.timing`)."""
    global _phases
    _phases, outer = [], _phases
    try:
        yield _phases
    finally:
        _phases = outer


def ask(pool, engines, request_for, build, cmd: str = "compare.parity.steps:parity", what: str = "the model, the loss or the data"):
    """Send `cmd` to `engines`; any engine's error (the user's code raised, its worker died or hung) is one
    ParityError naming the engines and why."""
    start, inside = time.perf_counter(), []

    def on_event(engine, event):  # a worker's own timing of a part of the request (a path it trained)
        if event.get("event") == "timing":
            inside.append((f"{engine}/{event['part']}", event["seconds"]))

    errors = pool.each(cmd, request_for, on_event, only=engines, fail_engines=False)
    if _phases is not None:
        _phases.append((_phase(cmd, request_for(engines[0])), list(engines), time.perf_counter() - start, inside))
    if errors:
        raise ParityError(f"the check of {build!r} could not run ({what}): "
                          + "; ".join(f"{e}: {why}" for e, why in errors.items()))


def _phase(cmd: str, request: dict) -> str:
    """What a request does, in a word: describe, grads, forward, float64, draw, train, probe."""
    task = cmd.rsplit(":", 1)[-1]  # a worker's task: "compare.parity.steps:trajectory"
    if task != "parity":
        return {"trajectory": "draw" if "draw" in request else "train"}.get(task, task)
    kind = next((k for k in ("describe", "grads", "forward") if k in request), "parity")
    return f"{kind} float64" if request.get("float64") else kind


def require_live(pool, engines) -> None:
    """One ParityError naming every engine of `engines` the pool cannot serve, and why."""
    missing = [e for e in engines if e not in pool.live]
    if missing:
        raise ParityError(f"engine(s) {', '.join(missing)} unavailable: "
                          + "; ".join(f"{e}: {pool.failed.get(e, 'not in the worker pool')}" for e in missing))


def check_engines(wanted) -> list[str]:
    """The engines asked for: a list of names, or one string ("torch", or "torch,jax")."""
    if isinstance(wanted, str):
        wanted = [e.strip() for e in wanted.split(",")]
    unknown = [e for e in wanted if e not in ENGINES]
    if unknown:
        raise ParityError(f"unknown engine(s) {', '.join(map(str, unknown))}; choose from {', '.join(ENGINES)}")
    return list(wanted)


def check_tolerances(rtol, atol) -> None:
    """A tolerance is a finite number >= 0: a NaN one would let every difference through (a comparison with NaN is
    false), a negative one fail equal values."""
    for name, value in (("rtol", rtol), ("atol", atol)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value < 0:
            raise ParityError(f"{name} must be a finite number >= 0, got {value!r}")


def examples(x, y) -> tuple[list[np.ndarray], list[np.ndarray], int]:
    """x and y as lists of arrays (a list or tuple is several inputs, or outputs), each with one row per example:
    as many rows in each, at least one, every float finite. Returns (xs, ys, rows)."""
    xs, ys = _arrays(x, "x"), _arrays(y, "y")
    lengths = {len(a) for a in (*xs, *ys)}
    if len(lengths) != 1:
        hint = "; a list is several inputs: give one array for one input" if isinstance(x, list) else ""
        raise ParityError(f"x and y must have the same number of rows; got {sorted(lengths)}{hint}")
    rows = lengths.pop()
    if rows == 0:
        raise ParityError("x and y have no rows; give at least one example")
    for what, arrays in (("x", xs), ("y", ys)):
        for a in arrays:
            if (row := first_nonfinite_row(a)) is not None:
                raise ParityError(f"{what} holds NaN or inf (first in row {row}), which every engine would carry "
                                  "alike, so no parity can be judged: drop or fill those rows")
    return xs, ys, rows


def _arrays(a, what: str) -> list[np.ndarray]:
    try:  # a list of numbers, or of lists (x.tolist()): one array, or one input per item? (the verbs' rule)
        verb_arrays(a, what)
    except ValueError as err:
        raise ParityError(str(err)) from None
    arrays = [np.asarray(p) for p in (a if isinstance(a, (list, tuple)) else [a])]
    if not arrays or any(p.ndim == 0 or p.dtype == object for p in arrays):
        raise ParityError(f"{what} must be an array with one row per example, or a list of such arrays")
    return arrays


def worst(got, want, rtol: float, atol: float):
    """Where `got` is furthest beyond `atol + rtol·|want|` of `want`: (index, value, expected, |diff|, allowed), or
    None when every element is within. A NaN or an infinity is never within (NaN compares false, so it must be
    said); nor is a shape that differs."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape:
        return (f"shape {got.shape} vs {want.shape}", np.nan, np.nan, np.inf, 0.0)
    allowed = atol + rtol * np.abs(want)
    with np.errstate(invalid="ignore", over="ignore"):
        excess = np.where(np.isfinite(got) & np.isfinite(want), np.abs(got - want) - allowed, np.inf)
    if not excess.size or excess.max() <= 0:
        return None
    i = np.unravel_index(np.argmax(excess), excess.shape)
    return tuple(int(k) for k in i), float(got[i]), float(want[i]), float(abs(got[i] - want[i])), float(allowed[i])


def mismatches(names, grads, reference, rtol, atol):
    """(weight, engine, against, index, value, expected, |diff|, allowed) for each failing weight and pair. Each
    engine is judged against the float64 reference; two engines against each other within the sum of their two
    allowances (each may be its allowance from float64, on either side of it: a correct pair of engines can be
    twice it apart, as MultiHeadAttention's were, 1.19e-6 against 1.17e-6, each within tolerance of float64)."""
    rows = []
    pairs = [(e, "float64", g, reference, 1) for e, g in grads.items()]
    engines = list(grads)
    pairs += [(a, b, grads[a], grads[b], 2) for i, a in enumerate(engines) for b in engines[i + 1:]]
    for engine, against, got, want, allowances in pairs:
        for name, g, w in zip(names, got, want, strict=True):
            found = worst(g, w, allowances * rtol, allowances * atol)
            if found:
                rows.append((name, engine, against, *found))
    return rows


def table(cols, rows) -> str:
    """Rows under their column names, each column as wide as its widest cell."""
    widths = [max(len(str(r[k])) for r in (cols, *rows)) for k in range(len(cols))]
    line = lambda r: "  ".join(str(c).ljust(wd) for c, wd in zip(r, widths)).rstrip()  # noqa: E731
    return "\n".join(map(line, (cols, *rows)))
