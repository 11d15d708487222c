"""The parity checks: each a function of what the workers wrote, returning `Check`s (name, value, tolerance).

    ols_reached/<path>          test MSE as close to OLS's as a change of seed leaves it (and /slopes), the `Band`
    gradient_formula/<engine>   autograd gradient = 2/n·Xᵀ(Xw+b−y) on the fixed batch (and /float64)
    portable_weights/<a>-><b>   weights saved on engine a predict the test set on engine b as on a
    deterministic/<path>        the same seed twice: bit-identical weights
    same_arithmetic/<path>      same init, batches and Adam: every path ends at the same weights (their median)

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


# `compare --converge`: where the question is convergence, not this seed's run. The HAR is convex, and a learning
# rate decayed to 0 (cosine, over every step) carries every seed to the training rows' least squares, up to the last
# steps' mini-batch noise (tolerances.CONVERGED_*). Counted in steps, so that a short history trains as long.
CONVERGE_STEPS, CONVERGE_LEARNING_RATE = 2000, 0.05


def converge_spec(rows: int, batch_size: int) -> dict:
    """The `TrainConfig` fields of a converged run on `rows` training rows: at least CONVERGE_STEPS steps of Adam,
    its rate decayed over every one of them."""
    steps = -(-rows // batch_size)
    epochs = -(-CONVERGE_STEPS // steps)
    return {"epochs": epochs, "learning_rate": CONVERGE_LEARNING_RATE, "schedule": "cosine",
            "decay_steps": epochs * steps}


@dataclass(frozen=True)
class Band:
    """How far from OLS a correct path may end (`ols_reached`), and how that was found: printed beside each check.
    `mse` bounds |test MSE / OLS's − 1|, `slopes` the largest |slope − OLS's slope| in original units. `reached`:
    in a converged run, how far this data's converged seeds end (the same percentile), which must lie within the
    band for it to judge."""

    mse: float
    slopes: float
    how: str
    reached: tuple[float, float] | None = None

    @classmethod
    def of_seeds(cls, test_mse: np.ndarray, slopes: np.ndarray, ols: Ols, engines: list[str]) -> Band:
        """The band on this run's data: `test_mse` (models,) and `slopes` (models, 3) of the HAR trained once per
        seed, each seed's distance to OLS, their `tolerances.OLS_BAND_PERCENTILE`th percentile."""
        q = tolerances.OLS_BAND_PERCENTILE
        return cls(float(np.percentile(mse_distance(test_mse, ols), q)),
                   float(np.percentile(slope_distance(slopes, ols), q)),
                   f"band: {q:g}th percentile of {len(test_mse):,} seeds' distances ({', '.join(engines)})")

    @classmethod
    def hard(cls) -> Band:
        """No seeds measured (no engine of the run has a many-model trainer): the hard bounds alone."""
        return cls(tolerances.OLS_MSE_HARD, tolerances.SLOPE_HARD,
                   "hard bound only: no engine of this run trains seeds (torch and jax do)")

    @classmethod
    def converged(cls, seeds: Band | None = None) -> Band:
        """`--converge`: the constants (the least squares up to the last steps' mini-batch noise), confirmed on this
        data by `seeds`, the band of the run's seeds trained the same converged way, where it has one."""
        how = "converged run (--converge): the least squares up to mini-batch noise"
        if seeds is None:
            return cls(tolerances.CONVERGED_MSE_RTOL, tolerances.CONVERGED_SLOPE_ATOL,
                       f"{how}; not confirmed on this data (no engine of this run trains seeds: torch and jax do)")
        return cls(tolerances.CONVERGED_MSE_RTOL, tolerances.CONVERGED_SLOPE_ATOL,
                   f"{how}; on this data the {seeds.how.removeprefix('band: ')} end within {seeds.mse:.2g} "
                   f"(test MSE) and {seeds.slopes:.2g} (slopes)", reached=(seeds.mse, seeds.slopes))

    def measures(self) -> list[tuple[str, float, str]]:
        """Each measure: (check name suffix, the band's limit, why the band cannot judge it on this data: "" when
        it can). A seeds' band past its hard bound cannot (the seeds themselves end far from OLS), nor a converged
        one that the converged seeds do not reach (this data needs more steps)."""
        found = []
        for i, (suffix, what, limit, hard) in enumerate((("", "test MSE", self.mse, tolerances.OLS_MSE_HARD),
                                                          ("/slopes", "slopes", self.slopes, tolerances.SLOPE_HARD))):
            why = ""
            if self.reached is not None and self.reached[i] > limit:
                why = (f"ols_reached ({what}) not judged: the converged seeds end up to {self.reached[i]:.3g} from "
                       f"OLS on this data, beyond --converge's tolerance {limit:g}: {CONVERGE_STEPS:,} steps do not "
                       "reach the least squares here, so a path that misses it could not be told from one that "
                       "converges slowly")
            elif limit > hard:
                why = (f"ols_reached ({what}) not judged: the seeds end up to {limit:.3g} from OLS on this data, "
                       f"beyond the hard bound {hard:g}, so a broken path could not be told from seed noise; run "
                       "with --converge")
            found.append((suffix, limit, why))
        return found

    def undecided(self) -> list[str]:
        """Why this band cannot judge a measure on this data, one line per measure; none when it can judge both."""
        return [why for _, _, why in self.measures() if why]


def mse_distance(test_mse, ols: Ols) -> np.ndarray:
    return np.abs(np.asarray(test_mse, np.float64) / ols.test_mse - 1)


def slope_distance(slopes, ols: Ols) -> np.ndarray:
    """The largest |slope − OLS's| of each row of (models, 3), or of one (3,)."""
    return np.max(np.abs(np.asarray(slopes, np.float64) - ols.slopes), axis=-1)


def ols_reached(result: Result, data: HarData, ols: Ols, band: Band) -> list[Check]:
    """The path's test MSE and slopes against OLS's, each within `band` (a measure the band cannot decide is left
    out: `Band.undecided` says why)."""
    slopes = data.scaling.to_original(*result.weights[:2])[1]
    mse = float(np.mean((result.test_pred - data.y_test) ** 2)) * data.scaling.y_std**2
    value = {"": mse_distance(mse, ols), "/slopes": slope_distance(slopes, ols)}
    return [within(f"ols_reached/{result.path}{suffix}", value[suffix], limit, band.how)
            for suffix, limit, why in band.measures() if not why]


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
    """For each path, its largest distance to the paths' elementwise median after the same-arithmetic run, within
    half the tolerance: then every two paths are within the tolerance of each other, and one odd path among three
    or more does not move the median, so it alone fails (with two, both do: nothing says which). With `engine_of`
    (path -> engine), the median is over the paths of the path's own engine: for a model that draws random numbers
    while training (Dropout), whose engines' generators differ."""
    flat = {name: np.concatenate([w.ravel() for w in ws]) for name, ws in weights.items()}
    note = "; ".join(n for n in (note, "" if engine_of is None else RANDOM_NOTE) if n)
    checks = []
    for name, w in flat.items():
        group = [v for o, v in flat.items() if engine_of is None or engine_of[o] == engine_of[name]]
        gap = float(np.max(np.abs(w - np.median(group, axis=0))))
        checks.append(within(f"same_arithmetic/{name}", gap, tolerances.SAME_ARITHMETIC_ATOL / 2, note))
    return checks


RANDOM_NOTE = "its engine's paths only: each engine draws its own random numbers"


def load_results(outcome: Outcome) -> dict[str, Result]:
    return {p.name: Result.load(outcome.engine_folder(e), p.name)
            for e in outcome.complete for p in paths.for_engine(e)}


def run_all(outcome: Outcome, results: dict[str, Result], data: HarData, ols: Ols | None, *,
            band: Band | None = None, draws_randomness: bool = False, same_epochs: int | None = None) -> list[Check]:
    """Every check on every engine that finished, from its `results` (`load_results(outcome)`). `band=None` leaves out
    `ols_reached` (a --quick run is too short to reach OLS; the other checks hold after any number of epochs).
    `ols=None`: a model other than the HAR, with neither OLS nor the gradient formula. `draws_randomness`: the
    model draws random numbers while training, so same_arithmetic compares the paths of one engine only.
    `same_epochs`: the same-arithmetic run's length when shorter than the run's (noted on the check)."""
    checks = [c for r in results.values() for c in ols_reached(r, data, ols, band)] if band and ols else []
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
    return checks
