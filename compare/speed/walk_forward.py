"""The walk-forward: refit the HAR every 21 sessions on an expanding window across the test period, for every
asset, and forecast the sessions until the next refit. One model per (asset, refit date).

    windows = build_windows(panel, assets, split, end)   # every (asset, refit) on one grid
    ols = ols_forecasts(windows)                          # the known answer, from prefix sums of XᵀX and Xᵀy
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import pandas as pd

from compare.data.panel import HAR, HarDataError, har_features, of_asset, require_spread, split_dates
from compare.engines import runner
from compare.errors import NativeLoopsError
from keras_side import cores
from keras_side.spec import TrainConfig

REFIT_EVERY = 21


@dataclass(frozen=True)
class Windows:
    """Every refit of every asset on one grid (assets, refits).

    Refit r of asset a trains on the first `rows[a, r]` rows of the asset's HAR design (x[a], y[a], in time order)
    and forecasts the following rows, one step ahead, until the next refit. An asset with fewer refits than the
    others is padded with `rows == 0` (see `live`).
    """

    assets: np.ndarray  # (A,) names
    x: np.ndarray  # (A, N, 3) float64 HAR regressors, original units, zero past an asset's last row
    y: np.ndarray  # (A, N) log RV of the day
    dates: np.ndarray  # (A, N) datetime64, NaT past an asset's last row
    length: np.ndarray  # (A,) rows of each asset, up to the end of the test period
    rows: np.ndarray  # (A, R) training rows of each refit
    every: int = REFIT_EVERY

    @property
    def live(self) -> np.ndarray:
        return self.rows > 0

    @property
    def n_models(self) -> int:
        return int(self.live.sum())

    @cached_property
    def next_index(self) -> np.ndarray:
        """(A, R, H) the row each refit forecasts at horizon h (valid where `next_mask`)."""
        return self.rows[..., None] + np.arange(self.every)

    @cached_property
    def next_mask(self) -> np.ndarray:
        return self.live[..., None] & (self.next_index < self.length[:, None, None])

    def _next(self, values: np.ndarray) -> np.ndarray:
        index = np.minimum(self.next_index, self.x.shape[1] - 1)
        return values[np.arange(len(self.assets))[:, None, None], index]

    @cached_property
    def x_next(self) -> np.ndarray:
        return self._next(self.x)

    @cached_property
    def y_next(self) -> np.ndarray:
        return np.where(self.next_mask, self._next(self.y), np.nan)

    @cached_property
    def dates_next(self) -> np.ndarray:
        return np.where(self.next_mask, self._next(self.dates), np.datetime64("NaT", "ns"))

    @property
    def refit_dates(self) -> np.ndarray:
        return self.dates_next[..., 0]

    def model_inputs(self) -> dict[str, np.ndarray]:
        """float32 model inputs, each asset scaled with the statistics of its first training window.

        That window (the training period) is inside every later window, so no model sees its future; one scaling
        per asset keeps x shared by all of an asset's models. OLS, the known answer, does not depend on it.
        """
        first = np.arange(self.x.shape[1])[None] < self.rows[:, :1]  # (A, N)
        w = first[..., None]
        x_mean = (self.x * w).sum(1) / w.sum(1)
        x_std = np.sqrt((((self.x - x_mean[:, None]) ** 2) * w).sum(1) / w.sum(1))
        y_mean = (self.y * first).sum(1) / first.sum(1)
        y_std = np.sqrt((((self.y - y_mean[:, None]) ** 2) * first).sum(1) / first.sum(1))
        inside = (np.arange(self.x.shape[1])[None] < self.length[:, None])[..., None]
        return {
            "x": (((self.x - x_mean[:, None]) / x_std[:, None]) * inside).astype(np.float32),
            "y": (((self.y - y_mean[:, None]) / y_std[:, None])[..., None] * inside).astype(np.float32),
            "rows": self.rows.astype(np.int32),
            "x_next": ((self.x_next - x_mean[:, None, None]) / x_std[:, None, None]).astype(np.float32),
            "y_mean": y_mean,
            "y_std": y_std,
        }


def _design(panel: pd.DataFrame, asset: str, split: str, end: str | None) -> tuple[pd.DataFrame, int]:
    """One asset's HAR rows up to `end` and its first window's length; a data error names the asset."""
    design = har_features(panel, asset)
    train, test = of_asset(asset, split_dates, design, split, end)
    of_asset(asset, require_spread, train, (*HAR, "y"))  # its first window's scaling
    return design.iloc[: len(train) + len(test)], len(train)


def refittable(panel: pd.DataFrame, assets, split: str, end: str | None) -> tuple[list[str], dict[str, str]]:
    """The assets of `assets` whose walk-forward can be built, and why each other one cannot (too few days on a
    side of the split, inputs that do not vary over its first window): a command given one --asset judges the
    others only where it refits them."""
    ready, unready = [], {}
    for asset in assets:
        try:
            _design(panel, asset, split, end)
        except HarDataError as err:
            unready[asset] = str(err)
        else:
            ready.append(asset)
    return ready, unready


def build_windows(panel: pd.DataFrame, assets, split: str, end: str | None, every: int = REFIT_EVERY) -> Windows:
    designs = [_design(panel, asset, split, end) for asset in assets]
    n = max(len(d) for d, _ in designs)
    refits = [range(first, len(d), every) for d, first in designs]
    a, r = len(designs), max(len(t) for t in refits)
    x, y = np.zeros((a, n, 3)), np.zeros((a, n))
    dates, rows = np.full((a, n), np.datetime64("NaT", "ns"), "datetime64[ns]"), np.zeros((a, r), np.int64)
    for i, ((design, _), starts) in enumerate(zip(designs, refits)):
        k = len(design)
        x[i, :k], y[i, :k] = design[list(HAR)].to_numpy(), design["y"].to_numpy()
        dates[i, :k], rows[i, : len(starts)] = design.index.values, list(starts)
    return Windows(np.array(list(assets)), x, y, dates, np.array([len(d) for d, _ in designs]), rows, every)


def ols_forecasts(w: Windows) -> np.ndarray:
    """OLS forecasts (A, R, H) in original units. The normal equations of every expanding window are prefix sums
    of one pass over each asset's rows, so all refits cost one cumulative sum (regressors centered first, for a
    better-conditioned XᵀX)."""
    center = w.x[:, :1].copy()  # each asset's first row: any constant shift works, the intercept absorbs it
    design = np.concatenate([np.ones(w.y.shape + (1,)), w.x - center], axis=2)
    xtx = np.cumsum(np.einsum("ani,anj->anij", design, design), axis=1)
    xty = np.cumsum(design * w.y[..., None], axis=1)
    a, r = np.nonzero(w.live)
    last = w.rows[a, r] - 1
    coef = np.zeros(w.rows.shape + (4,))
    coef[a, r] = np.linalg.solve(xtx[a, last], xty[a, last][..., None])[..., 0]
    return coef[..., :1] + np.einsum("arhi,ari->arh", w.x_next - center[:, None], coef[..., 1:])


def oos_mse(w: Windows, forecasts: np.ndarray) -> dict[str, float]:
    """Out-of-sample MSE per asset (original units) over every forecast day."""
    err = (forecasts - w.y_next) ** 2
    return {asset: float(err[i][w.next_mask[i]].mean()) for i, asset in enumerate(w.assets)}


def host_devices_flag(count: int) -> str:
    """XLA's flag that splits the CPU into `count` devices (GPUs and TPUs are counted as they are)."""
    return f"--xla_force_host_platform_device_count={count}"


def run(w: Windows, cfg: TrainConfig, folder: Path, *, engines=("jax", "torch"), devices: int = 2,
        fit_refits: int = 3) -> dict:
    """Train every model at once on each engine (JAX: vmap on 1 and `devices` host devices; torch: vmap over
    stateless_call), time a few `fit` refits per engine, and return forecasts (A, R, H) in original units and
    timings. Engines run one after another so their timings do not share the cores."""
    inputs = w.model_inputs()
    np.savez(folder / "windows.npz", **{k: inputs[k] for k in ("x", "y", "rows", "x_next")})
    counts = sorted({1, devices})
    live = np.argwhere(w.live)
    picks = live[np.linspace(0, len(live) - 1, fit_refits).round().astype(int)].tolist() if fit_refits else []
    answers = {}
    # each run on one core, and JAX's sharded run on a core a device, where the system can pin (cores.on_cpus)
    usable = cores.timing_cpus()
    env = {"XLA_FLAGS": host_devices_flag(max(counts))}
    with runner.Pool(list(engines), folder, jobs=1, env=env) as pool:
        pool.started()  # no worker's start-up shares a timed core
        request = {"windows": str(folder / "windows.npz"), "config": cfg.to_dict(), "devices": counts,
                   "fit_models": picks, "cpus": usable}
        pool.each("compare.speed.tasks:walk_forward", lambda e: request,
                  lambda e, event: answers.__setitem__(e, event) if event["event"] == "done" else None)
    if pool.failed:
        raise NativeLoopsError("walk-forward worker failed: " + "; ".join(f"{e}: {m}" for e, m in pool.failed.items()))
    scale, shift = inputs["y_std"][:, None, None], inputs["y_mean"][:, None, None]
    forecasts, timing = {}, {}
    for engine, answer in answers.items():
        for name, t in answer["timings"].items():
            forecasts[name] = np.load(pool.engine_folder(engine) / f"walk-forward-{name}.npy") * scale + shift
            timing[name] = {"models": w.n_models, "seconds": t["seconds"], "compile_seconds": t["compile_seconds"],
                            "models_per_s": w.n_models / t["seconds"], "devices": t["devices"], "cpus": t["cpus"]}
        if answer["fit_seconds"]:
            per_model, refits = float(np.mean(answer["fit_seconds"])), len(answer["fit_seconds"])
            timing[f"keras-{engine}-fit-extrapolated"] = {
                "models": w.n_models, "seconds": per_model * w.n_models, "models_per_s": 1 / per_model,
                "devices": 1, "measured_refits": refits,
                "note": f"timed on {refits} refit{'s' * (refits != 1)}, extrapolated"}
    notes = [f"fewer than {c} JAX devices here: the run sharded over {c} was skipped"
             for c in counts if "jax" in answers and f"jax-vmap-{c}dev" not in timing]
    notes += [f"{c} JAX devices on {len(usable)} core{'s' * (len(usable) != 1)}: the sharded run shares them"
              for c in counts if usable is not None and len(usable) < c and f"jax-vmap-{c}dev" in timing]
    return {"forecasts": forecasts, "timing": timing, "notes": notes}
