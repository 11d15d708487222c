"""The figures: a compare run's validation curves against the OLS line and its slopes dot plot, and the
walk-forward's forecasts of one asset against realized log RV."""
from __future__ import annotations

from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")  # files only: no display is needed or wanted
import matplotlib.pyplot as plt  # noqa: E402

from compare.io import atomic_file  # noqa: E402


def curves(path: Path, val_curves: dict[str, list[float]], ols_mse: float | None) -> None:
    """Validation loss per path over the epochs, and OLS's validation MSE as a dashed line (the HAR's)."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, curve in val_curves.items():
        ax.plot(range(1, len(curve) + 1), curve, label=name, lw=1.4)
    if ols_mse is not None:
        ax.axhline(ols_mse, color="black", ls="--", lw=1, label=f"OLS {ols_mse:.4f}")
        ax.set(ylabel="validation MSE (log RV²)", title="Every path converges to the OLS answer")
        top = max(max(c[: max(1, len(c) // 10) + 1]) for c in val_curves.values()) if val_curves else ols_mse
        ax.set_ylim(ols_mse * 0.98, max(top, ols_mse * 1.1))
    else:
        ax.set(ylabel="validation loss", title="Validation loss per path")
    ax.set(xlabel="epoch")
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


def zoo(path: Path, cells: list[dict], tolerance: float) -> None:
    """One panel per engine: models × optimizers, colour = log10 of the largest gap to `fit` of the judged paths
    (train-step, the native loop, the engine's fast path); ✗ where one is over the tolerance, failed or missing."""
    judged = [c for c in cells if c["judged"]]
    engines = list(dict.fromkeys(c["engine"] for c in judged))
    models = list(dict.fromkeys(c["model"] for c in judged))
    optimizers = list(dict.fromkeys(c["optimizer"] for c in judged))
    fig, axes = plt.subplots(1, max(1, len(engines)), figsize=(2.2 + 1.0 * len(optimizers) * len(engines),
                                                               1.2 + 0.45 * len(models)), squeeze=False)
    floor = np.log10(tolerance) - 4  # bit-identical cells (gap 0) show at the bottom of the scale
    for ax, engine in zip(axes[0], engines):
        grid = zoo_grid([c for c in judged if c["engine"] == engine], models, optimizers, floor)
        image = ax.imshow(grid, vmin=floor, vmax=np.log10(tolerance) + 2, cmap="viridis", aspect="auto")
        for (i, j), v in np.ndenumerate(grid):
            if np.isnan(v) or v > np.log10(tolerance):
                ax.text(j, i, "✗", ha="center", va="center", color="red", fontsize=12)
        ax.set_xticks(range(len(optimizers)), optimizers, rotation=45, ha="right", fontsize=8)
        ax.set_yticks(range(len(models)), models, fontsize=8)
        ax.set_title(engine, fontsize=10)
    fig.colorbar(image, ax=axes[0, -1], label=f"log10 gap to fit (tolerance {tolerance:g})")
    fig.suptitle("every judged path vs fit, same weights and batches (the largest gap per cell)", fontsize=10)
    _save(fig, path)


def zoo_grid(cells: list[dict], models: list[str], optimizers: list[str], floor: float) -> np.ndarray:
    """models × optimizers: log10 of the largest gap of the cells in each (at least `floor`; inf where a cell failed,
    by an error or by its reported history, NaN where there is none)."""
    grid = np.full((len(models), len(optimizers)), np.nan)
    for c in cells:
        at = models.index(c["model"]), optimizers.index(c["optimizer"])
        failed = c["gap"] != c["gap"] or not c.get("passed", True)  # a NaN gap is an error
        value = np.inf if failed else max(np.log10(max(c["gap"], 1e-30)), floor)
        grid[at] = value if np.isnan(grid[at]) else max(grid[at], value)
    return grid


def seeds(path: Path, spreads: dict, features: tuple[str, ...], model: str, ols=None) -> None:
    """One panel per measure (the test loss, each HAR slope): each engine's values over seeds as a histogram, each
    engine's default run (fit at the run's seed) as a vertical line, and OLS's value (`ols`, the HAR's least squares
    on the same rows) as a dashed black one: every seed reaches its loss, while the slopes spread around its own."""
    measures = ["test_loss", *features]
    fig, axes = plt.subplots(1, len(measures), figsize=(3.6 * len(measures), 3.4), squeeze=False)
    colors = {e: f"C{i}" for i, e in enumerate(spreads)}
    for ax, measure in zip(axes[0], measures):
        for engine, spread in spreads.items():
            if spread.seeds is not None:
                ax.hist(_measure(spread.seeds, measure, features), bins=30, alpha=0.45, color=colors[engine],
                        label=f"{engine}, {len(spread.seeds.test_loss)} seeds")
            ax.axvline(_measure(spread.default, measure, features)[0], color=colors[engine], lw=1.8, label=f"{engine} fit")
        if ols is not None:
            at = ols.test_mse if measure == "test_loss" else ols.slopes[features.index(measure)]
            ax.axvline(at, color="black", ls="--", lw=1.2, label="OLS")
        ax.set(xlabel="test loss" if measure == "test_loss" else f"slope of {measure}", yticks=[])
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"{model}: seeds against each engine's default run", fontsize=10)
    _save(fig, path)


def _measure(runs, measure: str, features: tuple[str, ...]) -> np.ndarray:
    return runs.test_loss if measure == "test_loss" else runs.slopes[:, features.index(measure)]


def sweep(path: Path, val_mse: dict[str, np.ndarray], rates: list[float], sizes: list[int], ols: float,
          best: dict[str, dict | None]) -> None:
    """One heatmap per engine: validation MSE relative to OLS per (batch size, learning rate), its `best` cell
    (`compare.speed.sweep.best`; None where every cell diverged) boxed."""
    fig, axes = plt.subplots(1, len(val_mse), figsize=(1.2 + 1.1 * len(rates) * len(val_mse), 1.4 + 0.5 * len(sizes)),
                             squeeze=False)
    for ax, (engine, grid) in zip(axes[0], val_mse.items()):
        excess = grid / ols - 1
        finite = np.isfinite(excess)  # a cell that diverged is left blank
        top = max(excess[finite].max(initial=0.0), 1e-6)  # a power scale, so the cells near OLS are told apart too
        image = ax.imshow(np.where(finite, np.maximum(excess, 0), np.nan), cmap="viridis_r", aspect="auto",
                          norm=matplotlib.colors.PowerNorm(0.3, vmin=0, vmax=top))
        for (i, j), v in np.ndenumerate(excess):
            ax.text(j, i, f"{v:+.1%}" if finite[i, j] else "diverged", ha="center", va="center", fontsize=7,
                    color="white" if v > 0.1 * top else "black")
        if best[engine] is not None:
            i, j = sizes.index(best[engine]["batch_size"]), rates.index(best[engine]["learning_rate"])
            ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, ec="red", lw=2))
        ax.set_xticks(range(len(rates)), [f"{r:g}" for r in rates])
        ax.set_yticks(range(len(sizes)), [str(s) for s in sizes])
        ax.set(xlabel="learning rate", ylabel="batch size", title=f"{engine}: validation MSE vs OLS")
        fig.colorbar(image, ax=ax, format=matplotlib.ticker.PercentFormatter(1.0))
    _save(fig, path)
