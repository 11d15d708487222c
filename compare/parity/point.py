"""Gradient and forward parity for any Keras model, from your own tests.

    from compare.parity import assert_forward_match, assert_gradients_match
    assert_gradients_match("mypkg.models:build", x, y, loss="mse")   # every installed engine
    assert_forward_match("mypkg.models:build", x)                     # every layer's output

`build_model` is an importable zero-argument callable ("module:function", or a function defined at module top
level), because each engine's worker process rebuilds the model. The weights come from one seeded NumPy draw and
are the same on every engine. The reference is float64 autograd (on JAX with x64, else TensorFlow: the engines on
which Keras computes float64 in float64), cheaper and more exact than finite differences.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from compare.referee import tolerances
from compare.engines import runner
from compare.parity.common import (ParityError, ask, callable_spec, check_engines, check_tolerances, examples,
                                   loss_spec, mismatches, reference_engine, require_live, table, Workers)
from keras_side.backend import ENGINES, installed_engines


def _save_inputs(path: Path, xs: list[np.ndarray], y: np.ndarray) -> None:
    np.savez(path, y=y, n_inputs=len(xs), **{f"x{i}": a for i, a in enumerate(xs)})


def assert_gradients_match(build_model, x, y, loss="mse", *, engines=None, rtol: float = tolerances.PARITY_RTOL,
                           atol: float = tolerances.PARITY_ATOL, seed: int = 0, weights=None, training: bool = False,
                           pool: Workers = None) -> dict[str, list[np.ndarray]]:
    """Assert that every engine's gradient of the training objective (the loss plus the model's own losses:
    regularizers, `add_loss`) equals the float64 reference and each other. A NaN or infinite gradient fails.

    Args:
        build_model: importable zero-argument callable returning a `keras.Model`.
        x, y: inputs (an array, or a list of arrays for several inputs) and targets.
        loss: a Keras loss name, or an importable `loss(y_true, y_pred)` written with `keras.ops`.
        engines: engines to compare (default: every installed one).
        seed: the NumPy seed of the weights (normal, scale 0.5) when `weights` is not given.
        weights: your own weights, one array per `model.trainable_weights` entry, in that order.
        training: call the model with `training=True`; by default `training=False`, so what a layer does only while
            training (BatchNorm's batch statistics, a `training` branch) is not compared. Random layers differ
            between engines with `training=True`: compare their training within one engine (`assert_training_matches`).
        pool: live workers to reuse, or a function that returns them, called once the arguments are checked (the
            pytest fixture passes its session's); else a pool is started here.
    Returns:
        The float32 gradients per engine, in `model.trainable_weights` order.
    Raises:
        AssertionError: a table of every weight whose gradient differs beyond `atol + rtol·|reference|`.
        ParityError: the comparison could not run.
    """
    if isinstance(y, (list, tuple)) and y and all(hasattr(a, "shape") for a in y):  # else examples() says why
        raise ParityError("y is a list: the gradient is compared for one target array and one loss; for a model "
                          "with several outputs, compare its training (assert_training_matches, whose spec takes a "
                          "loss per output) or its outputs (assert_forward_match)")
    request = {"build": callable_spec(build_model), "loss": loss_spec(loss), "training": training}
    return _run(request, x, y, engines, seed, weights, pool, "grads", rtol, atol)


def assert_forward_match(build_model, x, *, engines=None, rtol: float = tolerances.PARITY_RTOL,
                         atol: float = tolerances.PARITY_ATOL, seed: int = 0, weights=None, training: bool = False,
                         pool: Workers = None) -> dict[str, dict[str, np.ndarray]]:
    """Assert that every layer's output on every engine equals the float64 reference and each other, from the same
    weights: for "this engine predicts differently" questions. A failure names the first layer where the engines
    part (a Sequential or Functional model; a subclassed one is compared on its output only).

    Args are those of `assert_gradients_match`, without targets or loss.
    Returns:
        Each engine's outputs, {layer name: array}, in the model's layer order (float32; an input keeps its dtype).
    """
    request = {"build": callable_spec(build_model), "training": training}
    first = x[0] if isinstance(x, (list, tuple)) and len(x) else x
    rows = len(first) if np.ndim(first) else 0  # no targets: as many zeros as x has rows (a bad x is refused below)
    return _run(request, x, np.zeros((rows, 1), np.float32), engines, seed, weights, pool, "forward", rtol, atol)


def _run(request, x, y, engines, seed, weights, pool, kind, rtol, atol):
    wanted = check_engines(engines or installed_engines())
    check_tolerances(rtol, atol)
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0:  # not NumPy's TypeError
        raise ParityError(f"seed must be a whole number >= 0, got {seed!r}")
    xs, (y,), _ = examples(x, np.asarray(y))  # bad data is one ParityError before any worker starts
    with tempfile.TemporaryDirectory(prefix="parity-") as tmp:
        tmp = Path(tmp)
        own = pool is None
        pool = pool() if callable(pool) else pool or runner.Pool(
            sorted(set(wanted) | {reference_engine(ENGINES)}, key=ENGINES.index), tmp, compile_cache=True)
        try:
            return _compare(pool, request, xs, y, wanted, seed, weights, kind, rtol, atol, tmp)
        finally:
            if own:
                pool.close()


def _compare(pool, request, xs, y, wanted, seed, weights, kind, rtol, atol, tmp):
    """Set the same weights on every engine, ask each for `kind` ("grads" or "forward") and the reference engine
    for the same in float64; compare."""
    ref = reference_engine(pool.live)
    require_live(pool, wanted)
    _save_inputs(tmp / "inputs.npz", xs, y)
    common = {**request, "inputs": str(tmp / "inputs.npz")}
    ask(pool, [ref], lambda e: {**common, "describe": str(tmp / "shapes.npz")}, request["build"])
    rng = np.random.default_rng(seed)
    with np.load(tmp / "shapes.npz") as z:
        names = [str(n) for n in z["names"]]
        shapes = [tuple(int(k) for k in z[f"shape_{i}"]) for i in range(len(names))]
        frozen = {k: z[k] for k in z.files if k.startswith("frozen")}  # non-trainable values, set on every engine
        drawing = [str(s) for s in z["drawing"]]
    if request["training"] and drawing:
        raise ParityError(f"{request['build']} draws random numbers while training (layer {drawing[0]!r}), and "
                          "each engine (and the float64 reference) draws its own, so with training=True its "
                          f"{'outputs' if kind == 'forward' else 'gradients'} differ by design, not by a fault; "
                          "compare with training=False, or its training within one engine (assert_training_matches, "
                          "engines=[...])")
    if not names and kind == "grads":
        raise ParityError(f"{request['build']} has no trainable weights, so there is no gradient to compare; "
                          "unfreeze a layer (trainable=True), or compare the outputs (assert_forward_match)")
    if weights is None:
        weights = [rng.normal(0.0, 0.5, size=shape).astype(np.float32) for shape in shapes]
    else:
        weights = _own_weights(weights, names, shapes)
    np.savez(tmp / "weights.npz", **{f"w_{i}": w for i, w in enumerate(weights)}, **frozen)
    runs = {e: {**common, "weights": str(tmp / "weights.npz"), kind: str(tmp / f"{kind}-{e}.npz")} for e in wanted}
    runs["float64"] = {**common, "weights": str(tmp / "weights.npz"), kind: str(tmp / f"{kind}-f64.npz"),
                       "float64": True}
    ask(pool, wanted, runs.get, request["build"])
    ask(pool, [ref], lambda e: runs["float64"], request["build"])
    if kind == "grads":
        found, reference = {e: _load(tmp / f"grads-{e}.npz") for e in wanted}, _load(tmp / "grads-f64.npz")
    else:
        names, reference = _load_outputs(tmp / "forward-f64.npz")
        loaded = {e: _load_outputs(tmp / f"forward-{e}.npz") for e in wanted}
        odd = {e: n for e, (n, _) in loaded.items() if n != names}
        if odd:
            raise ParityError(f"the model's layers differ between engines ({', '.join(odd)} against the reference "
                              f"{ref}): compare their outputs only, or build the same layers on every engine")
        found = {e: values for e, (_, values) in loaded.items()}
    rows = mismatches(names, found, reference, rtol, atol)
    if rows:
        raise AssertionError(_table(request, ref, rows, rtol, atol, kind, names))
    return found if kind == "grads" else {e: dict(zip(names, v)) for e, v in found.items()}


def _own_weights(weights, names: list[str], shapes: list[tuple[int, ...]]) -> list[np.ndarray]:
    """The user's weights as float32 arrays, checked against the model's trainable weights."""
    weights = [np.asarray(w, np.float32) for w in weights]
    if len(weights) != len(shapes):
        raise ParityError(f"weights has {len(weights)} arrays but the model has {len(shapes)} trainable weights "
                          f"({', '.join(names)}); give one per weight, in model.trainable_weights order")
    for name, w, shape in zip(names, weights, shapes):
        if w.shape != shape:
            raise ParityError(f"weights for {name} have shape {w.shape}, the model's is {shape}; give them in "
                              "model.trainable_weights order")
        if not np.isfinite(w).all():  # every engine would carry it alike: a table of NaN, no parity judged
            raise ParityError(f"weights for {name} hold NaN or inf; give finite weights")
    return weights


def _load(path: Path) -> list[np.ndarray]:
    with np.load(path) as z:
        return [z[f"g_{i}"] for i in range(len(z.files))]


def _load_outputs(path: Path) -> tuple[list[str], list[np.ndarray]]:
    with np.load(path) as z:
        names = [str(n) for n in z["names"]]
        return names, [z[f"o_{i}"] for i in range(len(names))]


def _table(request, ref, rows, rtol, atol, kind="grads", names=()) -> str:
    allowed = f"allowed |diff| = {atol:g} + {rtol:g}·|expected| against float64, twice that between two engines"
    if kind == "grads":
        head = (f"gradient parity failed for {request['build']} (loss {request['loss']!r}; reference: float64 autograd "
                f"on {ref}; {allowed})")
    else:
        first = min(names.index(r[0]) for r in rows)
        between = any(r[2] != "float64" for r in rows if r[0] == names[first])
        where = "the engines first part" if between else "the engines agree, and first part from float64,"
        head = (f"forward parity failed for {request['build']}: {where} at layer {names[first]!r}, {first + 1} of "
                f"{len(names)} (reference: float64 forward on {ref}; {allowed})")
    cols = ("weight" if kind == "grads" else "layer", "engine", "vs", "worst at", "value", "expected", "|diff|",
            "allowed")
    body = [(n, e, a, i, f"{v:.6e}", f"{w:.6e}", f"{d:.2e}", f"{t:.2e}") for n, e, a, i, v, w, d, t in rows]
    return "\n".join([head, table(cols, body)])
