"""The figures: a compare run's validation curves against the OLS line and its slopes dot plot, and the
walk-forward's forecasts of one asset against realized log RV."""
from __future__ import annotations

from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")  # files only: no display is needed or wanted
import matplotlib.pyplot as plt  # noqa: E402

from compare.io import atomic_file  # noqa: E402


def curves(path: Path, val_curves: dict[str, list[float]], ols_mse: float) -> None:
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, curve in val_curves.items():
        ax.plot(range(1, len(curve) + 1), curve, label=name, lw=1.4)
    ax.axhline(ols_mse, color="black", ls="--", lw=1, label=f"OLS {ols_mse:.4f}")
    ax.set(xlabel="epoch", ylabel="validation MSE (log RV²)", title="Every path converges to the OLS answer")
    top = max(max(c[: max(1, len(c) // 10) + 1]) for c in val_curves.values()) if val_curves else ols_mse
    ax.set_ylim(ols_mse * 0.98, max(top, ols_mse * 1.1))
    ax.legend(fontsize=8)
    _save(fig, path)


def slopes(path: Path, per_path: dict[str, dict[str, float]], ols: dict[str, float]) -> None:
    features = list(ols)
    fig, ax = plt.subplots(figsize=(7, 1.2 + 0.6 * len(features)))
    markers = "osD^v<>p"
    for i, (name, values) in enumerate(per_path.items()):
        ax.scatter([values[f] for f in features], range(len(features)), marker=markers[i % len(markers)],
                   label=name, alpha=0.8, zorder=3)
    ax.scatter([ols[f] for f in features], range(len(features)), marker="|", s=400, color="black", lw=2.5,
               label="OLS", zorder=4)
    ax.set_yticks(range(len(features)), features)
    ax.invert_yaxis()  # d1 on top, as in the table
    ax.set(xlabel="slope (original units)", title="Slopes per path, OLS highlighted")
    ax.legend(fontsize=7, ncol=2, loc="best")
    _save(fig, path)


def forecasts(path: Path, windows, by_method: dict, asset: str) -> None:
    """One asset's one-step-ahead forecasts against realized log RV over the walk-forward."""
    i = list(windows.assets).index(asset)
    live = windows.next_mask[i]
    dates = windows.dates_next[i][live]
    order = np.argsort(dates)
    fig, ax = plt.subplots(figsize=(9, 3.8))
    ax.plot(dates[order], windows.y_next[i][live][order], color="0.6", lw=0.6, label="realized log RV")
    for name, values in by_method.items():
        ax.plot(dates[order], values[i][live][order], lw=1.0, label=name)
    ax.set(ylabel="log RV", title=f"Walk-forward forecasts, {asset} (refit every {windows.every} sessions)")
    ax.legend(fontsize=8)
    _save(fig, path)


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    with atomic_file(path) as tmp:
        fig.savefig(tmp, dpi=120, format="png")
    plt.close(fig)
