"""The walk-forward: refit the HAR every 21 sessions on an expanding window across the test period, for every
asset, and forecast the sessions until the next refit. One model per (asset, refit date).

    windows = build_windows(panel, assets, split, end)   # padded, per-model standardized arrays
    ols = ols_forecasts(windows)                          # the known answer, by accumulated normal equations
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from compare import data as har_data
from compare import runner
from compare.errors import NativeLoopsError
from keras_side.config import TrainConfig

REFIT_EVERY = 21


@dataclass(frozen=True)
class Windows:
    """Model m trains on rows where mask[m] is 1 and forecasts the rows where next_mask[m] is 1.

    Inputs are standardized with model m's own training window (no look-ahead); raw_* keep original units.
    """

    assets: np.ndarray  # (M,) asset of each model
    refit_dates: np.ndarray  # (M,) first forecast day
    raw_x: np.ndarray  # (M, N, 3) float64, zero-padded
    raw_y: np.ndarray  # (M, N)
    mask: np.ndarray  # (M, N) float32
    raw_x_next: np.ndarray  # (M, H, 3)
    raw_y_next: np.ndarray  # (M, H)
    next_mask: np.ndarray  # (M, H) bool
    dates_next: np.ndarray  # (M, H) datetime64, NaT where masked

    @property
    def n_models(self) -> int:
        return len(self.assets)

    def standardized(self) -> dict[str, np.ndarray]:
        """float32 model inputs scaled with each window's own training statistics, plus those statistics."""
        w = self.mask[..., None].astype(np.float64)
        n = w.sum(axis=1)
        x_mean = (self.raw_x * w).sum(axis=1) / n
        x_std = np.sqrt((((self.raw_x - x_mean[:, None]) ** 2) * w).sum(axis=1) / n)
        y_mean = (self.raw_y * self.mask).sum(axis=1) / n[:, 0]
        y_std = np.sqrt((((self.raw_y - y_mean[:, None]) ** 2) * self.mask).sum(axis=1) / n[:, 0])
        scale_x = lambda a: ((a - x_mean[:, None]) / x_std[:, None]).astype(np.float32)  # noqa: E731
        return {
            "x": scale_x(self.raw_x) * self.mask[..., None],
            "y": (((self.raw_y - y_mean[:, None]) / y_std[:, None]) * self.mask)[..., None].astype(np.float32),
            "mask": self.mask.astype(np.float32),
            "x_next": scale_x(self.raw_x_next),
            "y_mean": y_mean,
            "y_std": y_std,
        }


def build_windows(panel: pd.DataFrame, assets, split: str, end: str | None, every: int = REFIT_EVERY) -> Windows:
    rows = []
    for asset in assets:
        design = har_data.har_features(panel, asset)
        train, test = har_data.split_dates(design, split, end)
        x, y = design[list(har_data.HAR)].to_numpy(), design["y"].to_numpy()
        first, last = len(train), len(train) + len(test)
        for t in range(first, last, every):
            stop = min(t + every, last)
            rows.append((asset, design.index[t], x[:t], y[:t], x[t:stop], y[t:stop], design.index[t:stop]))
    n, h = max(len(r[3]) for r in rows), every
    m = len(rows)
    out = {"raw_x": np.zeros((m, n, 3)), "raw_y": np.zeros((m, n)), "mask": np.zeros((m, n), np.float32),
           "raw_x_next": np.zeros((m, h, 3)), "raw_y_next": np.zeros((m, h)), "next_mask": np.zeros((m, h), bool),
           "dates_next": np.full((m, h), np.datetime64("NaT"), "datetime64[ns]")}
    for i, (_, _, x, y, xn, yn, dates) in enumerate(rows):
        out["raw_x"][i, : len(y)], out["raw_y"][i, : len(y)], out["mask"][i, : len(y)] = x, y, 1.0
        k = len(yn)
        out["raw_x_next"][i, :k], out["raw_y_next"][i, :k], out["next_mask"][i, :k] = xn, yn, True
        out["dates_next"][i, :k] = dates.values
    return Windows(np.array([r[0] for r in rows]), np.array([r[1] for r in rows], "datetime64[ns]"), **out)


def ols_forecasts(w: Windows) -> np.ndarray:
    """OLS forecasts (M, H) in original units, from the normal equations accumulated over each window."""
    design = np.concatenate([np.ones(w.raw_x.shape[:2] + (1,)), w.raw_x], axis=2) * w.mask[..., None]
    xtx = np.einsum("mni,mnj->mij", design, design)
    xty = np.einsum("mni,mn->mi", design, w.raw_y * w.mask)
    coef = np.linalg.solve(xtx, xty[..., None])[..., 0]
    return coef[:, :1] + np.einsum("mhi,mi->mh", w.raw_x_next, coef[:, 1:])


def oos_mse(w: Windows, forecasts: np.ndarray) -> dict[str, float]:
    """Out-of-sample MSE per asset (original units) over every forecast day."""
    err = (forecasts - w.raw_y_next) ** 2
    return {a: float(err[w.assets == a][w.next_mask[w.assets == a]].mean()) for a in dict.fromkeys(w.assets)}


def run(w: Windows, cfg: TrainConfig, folder: Path, *, engines=("jax", "torch"), devices: int = 2,
        fit_refits: int = 3) -> dict:
    """Train every model at once on each engine (JAX: vmap on 1 and `devices` host devices; torch: vmap over
    stateless_call), time a few `fit` refits per engine, and return forecasts (original units) and timings.
    Engines run one after another so their timings do not share the cores."""
    s = w.standardized()
    np.savez(folder / "windows.npz", **{k: s[k] for k in ("x", "y", "mask", "x_next")})
    counts = sorted({1, devices})
    picks = np.linspace(0, w.n_models - 1, fit_refits).round().astype(int).tolist() if fit_refits else []
    answers = {}
    env = {"XLA_FLAGS": f"--xla_force_host_platform_device_count={max(counts)}"}
    with runner.Pool(list(engines), folder, jobs=1, env=env) as pool:
        request = {"windows": str(folder / "windows.npz"), "config": cfg.__dict__, "devices": counts,
                   "fit_models": picks}
        pool.each("walk_forward", lambda e: request,
                  lambda e, event: answers.__setitem__(e, event) if event["event"] == "done" else None)
    if pool.failed:
        raise NativeLoopsError("walk-forward worker failed: " + "; ".join(f"{e}: {m}" for e, m in pool.failed.items()))
    forecasts, timing = {}, {}
    for engine, answer in answers.items():
        for name, t in answer["timings"].items():
            pred = np.load(pool.engine_folder(engine) / f"walk-forward-{name}.npy")
            forecasts[name] = pred * s["y_std"][:, None] + s["y_mean"][:, None]
            timing[name] = {"models": w.n_models, "seconds": t["seconds"], "compile_seconds": t["compile_seconds"],
                            "models_per_s": w.n_models / t["seconds"],
                            "devices": int(name.split("-")[-1][:-3]) if name.endswith("dev") else 1}
        if answer["fit_seconds"]:
            per_model = float(np.mean(answer["fit_seconds"]))
            timing[f"keras-{engine}-fit-extrapolated"] = {
                "models": w.n_models, "seconds": per_model * w.n_models, "models_per_s": 1 / per_model,
                "devices": 1, "measured_refits": len(answer["fit_seconds"]),
                "note": f"timed on {len(answer['fit_seconds'])} refits, extrapolated"}
    return {"forecasts": forecasts, "timing": timing}
