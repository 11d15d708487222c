"""The float64 NumPy oracles every path is judged against: OLS (the known answer) and the analytic gradient."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from compare.data.panel import DEFAULT_VALIDATION, HAR, har_features, require_spread, split_three


@dataclass(frozen=True)
class Ols:
    """Least squares in original units (log RV): y = intercept + X·slopes."""

    intercept: float
    slopes: np.ndarray
    std_errors: np.ndarray  # of the slopes, homoskedastic
    features: tuple[str, ...]
    train_mse: float
    test_mse: float
    val_mse: float = float("nan")  # on the validation rows (what the validation curves approach)

    def slope_dict(self) -> dict[str, float]:
        return dict(zip(self.features, map(float, self.slopes)))


def ols(train: pd.DataFrame, test: pd.DataFrame | None, features: tuple[str, ...] = HAR,
        val: pd.DataFrame | None = None) -> Ols:
    """Float64 `lstsq` on the training rows of a HAR design; MSE on the test and validation rows (NaN without
    them)."""
    design = _with_intercept(train[list(features)].to_numpy(np.float64))
    y = train["y"].to_numpy(np.float64)
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    resid = y - design @ coef
    sigma2 = resid @ resid / (len(y) - design.shape[1])
    cov = sigma2 * np.linalg.inv(design.T @ design)
    def mse_on(rows: pd.DataFrame | None) -> float:
        if rows is None:
            return float("nan")
        pred = _with_intercept(rows[list(features)].to_numpy(np.float64)) @ coef
        return float(np.mean((rows["y"].to_numpy() - pred) ** 2))
    return Ols(
        intercept=float(coef[0]),
        slopes=coef[1:],
        std_errors=np.sqrt(np.diag(cov))[1:],
        features=tuple(features),
        train_mse=float(np.mean(resid**2)),
        test_mse=mse_on(test),
        val_mse=mse_on(val),
    )


def ols_for(panel: pd.DataFrame, asset: str, split: str, end: str | None = None, features=HAR,
            validation: str = DEFAULT_VALIDATION) -> Ols:
    """OLS on the rows the models train on (`compare.data.panel.split_three`: the validation year left out, unless
    `validation="test"`)."""
    train, val, test = split_three(har_features(panel, asset), split, end, validation)
    require_spread(train, (*features, "y"))
    return ols(train, test, features, val)


def _with_intercept(x: np.ndarray) -> np.ndarray:
    return np.column_stack([np.ones(len(x)), x])


def mse_gradient(x: np.ndarray, y: np.ndarray, kernel: np.ndarray, bias: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Gradient of mean((Xw + b - y)^2) for a `Dense(1)`: (2/n·Xᵀr, 2/n·Σr) with r = Xw + b - y, in float64.

    Shapes follow the Keras weights: kernel (k, 1), bias (1,).
    """
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64).reshape(-1, 1)
    kernel, bias = np.asarray(kernel, np.float64), np.asarray(bias, np.float64)
    r = x @ kernel + bias - y
    n = len(x)
    return 2.0 / n * x.T @ r, 2.0 / n * r.sum(axis=0)


def mse(x: np.ndarray, y: np.ndarray, kernel: np.ndarray, bias: np.ndarray) -> float:
    r = np.asarray(x, np.float64) @ np.asarray(kernel, np.float64) + np.asarray(bias, np.float64)
    return float(np.mean((r - np.asarray(y, np.float64).reshape(-1, 1)) ** 2))


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    """max |got - want| / max |want|: one figure per gradient, scale-free."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), np.finfo(np.float64).tiny))


def fixed_batch(x: np.ndarray, y: np.ndarray, *, seed: int, rows: int = 256):
    """The fixed batch and weights the gradient check uses: the same rows and weights on every engine."""
    rng = np.random.default_rng(seed)
    idx = np.sort(rng.choice(len(x), size=min(rows, len(x)), replace=False))
    kernel = rng.normal(0.0, 0.5, size=(x.shape[1], 1)).astype(np.float32)
    bias = rng.normal(0.0, 0.5, size=(1,)).astype(np.float32)
    return x[idx], y[idx], [kernel, bias]
