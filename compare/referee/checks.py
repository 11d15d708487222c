"""The parity checks: each a function of what the workers wrote, returning `Check`s (name, value, tolerance).

    ols_reached/<path>          test MSE within 0.5% of OLS (and /slopes: each slope within 0.05)
    gradient_formula/<engine>   autograd gradient = 2/n·Xᵀ(Xw+b−y) on the fixed batch (and /float64)
    portable_weights/<a>-><b>   weights saved on engine a predict the test set on engine b as on a
    deterministic/<path>        the same seed twice: bit-identical weights
    same_arithmetic/<path>      same init, batches and Adam: every path ends at the same weights

The first two are the HAR's (`compare --model` of another zoo model has no OLS and no gradient formula).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from compare.referee import tolerances
from compare.data import reference
from compare.engines import paths
from compare.engines.runner import Outcome
from compare.data.reference import Ols
from keras_side.arrays import output_gap, output_read
from keras_side.data import HarData
from keras_side.precision import FLOAT64_UPSTREAM_CAUSE, TRUE_FLOAT64
from keras_side.results import Result


@dataclass(frozen=True)
class Check:
    name: str
    value: float
    tolerance: float
    passed: bool
    note: str = ""


def within(name: str, value: float, tolerance: float, note: str = "") -> Check:
    return Check(name, float(value), float(tolerance), bool(value <= tolerance), note)


def ols_reached(result: Result, data: HarData, ols: Ols) -> list[Check]:
    intercept, slopes = data.scaling.to_original(*result.weights[:2])
    mse = float(np.mean((result.test_pred - data.y_test) ** 2)) * data.scaling.y_std**2
    return [
        within(f"ols_reached/{result.path}", abs(mse / ols.test_mse - 1), tolerances.OLS_MSE_RTOL),
        within(f"ols_reached/{result.path}/slopes", np.max(np.abs(slopes - ols.slopes)), tolerances.SLOPE_ATOL),
    ]


def gradient_formula(engine: str, folder: Path) -> list[Check]:
    with np.load(folder.parent.parent / "batch.npz") as z:
        want = np.concatenate([g.ravel() for g in reference.mse_gradient(z["x"], z["y"], z["kernel"], z["bias"])])
    with np.load(folder / "gradients.npz") as g:
        got = {kind: np.concatenate([g[f"{kind}_{i}"].ravel() for i in range(2)]) for kind in ("f32", "f64")
               if f"{kind}_0" in g.files}
    checks = [within(f"gradient_formula/{engine}", reference.relative_error(got["f32"], want),
                     tolerances.GRAD_RTOL_F32)]
    if "f64" in got:
        exact = engine in TRUE_FLOAT64
        checks.append(within(f"gradient_formula/{engine}/float64", reference.relative_error(got["f64"], want),
                             tolerances.GRAD_RTOL_F64 if exact else tolerances.GRAD_RTOL_F64_UPSTREAM,
                             "" if exact else FLOAT64_UPSTREAM_CAUSE))
    return checks


def portable_weights(source: str, target: str, results: dict[str, Result], cross: dict[str, np.ndarray]) -> Check:
    """Worst gap, over both of `source`'s paths, between its own predictions and `target`'s from its weights."""
    gaps = [output_gap(output_read(cross, p.name), results[p.name].test_pred) for p in paths.for_engine(source)]
    return within(f"portable_weights/{source}->{target}", max(gaps), tolerances.PORTABLE_ATOL)


def deterministic(result: Result, again: list[np.ndarray]) -> Check:
    gap = max(float(np.max(np.abs(a - b))) for a, b in zip(result.weights, again, strict=True))
    identical = all(np.array_equal(a, b) for a, b in zip(result.weights, again, strict=True))
    return Check(f"deterministic/{result.path}", gap, 0.0, identical)


def same_arithmetic(weights: dict[str, list[np.ndarray]], engine_of: dict[str, str] | None = None,
                    note: str = "") -> list[Check]:
    """For each path, its largest distance to any other path's weights after the same-arithmetic run. With
    `engine_of` (path -> engine), only paths on the same engine are compared: for a model that draws random numbers
    while training (Dropout), whose engines' generators differ."""
    flat = {name: np.concatenate([w.ravel() for w in ws]) for name, ws in weights.items()}
    note = "; ".join(n for n in (note, "" if engine_of is None else RANDOM_NOTE) if n)
    checks = []
    for name, w in flat.items():
        others = [v for o, v in flat.items() if o != name and (engine_of is None or engine_of[o] == engine_of[name])]
        gap = max((float(np.max(np.abs(w - other))) for other in others), default=0.0)
        checks.append(within(f"same_arithmetic/{name}", gap, tolerances.SAME_ARITHMETIC_ATOL, note))
    return checks


RANDOM_NOTE = "its engine's paths only: each engine draws its own random numbers"


def load_results(outcome: Outcome) -> dict[str, Result]:
    return {p.name: Result.load(outcome.engine_folder(e), p.name)
            for e in outcome.complete for p in paths.for_engine(e)}


def run_all(outcome: Outcome, data: HarData, ols: Ols | None, *, judge_ols: bool = True,
            draws_randomness: bool = False, same_epochs: int | None = None) -> tuple[dict[str, Result], list[Check]]:
    """Every check on every engine that finished; the results they were computed from. `judge_ols=False` leaves
    out `ols_reached` (a --quick run is too short to reach OLS; the other checks hold after any number of epochs).
    `ols=None`: a model other than the HAR, with neither OLS nor the gradient formula. `draws_randomness`: the
    model draws random numbers while training, so same_arithmetic compares the paths of one engine only.
    `same_epochs`: the same-arithmetic run's length when shorter than the run's (noted on the check)."""
    results = load_results(outcome)
    checks = [c for r in results.values() for c in ols_reached(r, data, ols)] if judge_ols and ols else []
    for engine in outcome.complete if ols else []:
        checks += gradient_formula(engine, outcome.engine_folder(engine))
    for target in outcome.complete:
        with np.load(outcome.engine_folder(target) / "cross_predictions.npz") as z:
            cross = dict(z)
        checks += [portable_weights(s, target, results, cross) for s in outcome.complete if s != target]
    extras = {}
    for name, result in results.items():
        with np.load(outcome.engine_folder(result.engine) / f"{name}.extra.npz") as z:
            extras[name] = {k: [z[f"{k}_{i}"] for i in range(len(result.weights))] for k in ("again", "same")}
        checks.append(deterministic(result, extras[name]["again"]))
    engine_of = {name: r.engine for name, r in results.items()} if draws_randomness else None
    note = f"after {same_epochs} epochs" if same_epochs else ""
    checks += same_arithmetic({name: e["same"] for name, e in extras.items()}, engine_of, note)
    return results, checks
