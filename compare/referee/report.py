"""What the user reads: terminal tables (rich), report.json and the figures."""
from __future__ import annotations

import dataclasses
import functools
import sys
from contextlib import contextmanager

import numpy as np
import pandas as pd
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from compare.data.reference import Ols
from compare.data.synthetic import TrueProcess
from keras_side.data import HarData
from keras_side.results import Result, versions
from keras_side.spec import TrainConfig


def shown(text) -> str:
    """A user's path (or a message holding one) as rich should print it: brackets not read as markup, a byte that is
    not UTF-8 replaced."""
    return escape(str(text).encode("utf-8", "replace").decode())


@functools.cache
def console() -> Console:
    # A pipe or CI log gets a fixed, wide table rather than rich's 80 columns.
    return Console(highlight=False, width=None if sys.stdout.isatty() else 132)


def print_data_summary(panel: pd.DataFrame, source: str, fits: dict[str, Ols], truth: TrueProcess | None,
                       unfit: dict[str, str] | None = None) -> None:
    """Rows and dates per asset, the true process when known, and OLS per asset (original units); an asset in
    `unfit` (asset -> why) has its rows and dates, no OLS, and a line saying why."""
    unfit = unfit or {}
    out = console()
    out.print(f"[bold]data[/bold]: {shown(source)}, {len(panel):,} rows")
    table = Table("asset", "rows", "first", "last", "d1", "s5", "m22", "intercept", "test MSE",
                  title="OLS per asset (HAR on log RV, fitted on the training rows, MSE on the test split)")
    by_asset = panel.groupby("activo")["fecha"].agg(["count", "min", "max"])
    for asset in sorted({*fits, *unfit}):
        row, fit = by_asset.loc[asset], fits.get(asset)
        ols = ([f"{s:.4f}" for s in fit.slopes] + [f"{fit.intercept:.4f}", f"{fit.test_mse:.4f}"] if fit else
               ["-"] * 5)
        table.add_row(asset, f"{row['count']:,}", f"{row['min']:%Y-%m-%d}", f"{row['max']:%Y-%m-%d}", *ols)
    out.print(table)
    for why in unfit.values():
        out.print(f"no OLS: {why}", markup=False, highlight=False)
    if truth is not None:
        t = truth.as_dict()
        slopes = ", ".join(f"{k} {v:.2f}" for k, v in t["slopes"].items())
        out.print(f"true process: slopes {slopes} (persistence {truth.persistence:.2f})")
        out.print("  leverage on min(r_t-1, 0): " + ", ".join(f"{a} {v:+.2f}" for a, v in t["leverage"].items()))
        out.print("  levels: " + ", ".join(f"{a} {v:+.3f}" for a, v in t["level"].items()))
        out.print("  sigma:  " + ", ".join(f"{a} {v:.2f}" for a, v in t["sigma"].items()))


def report_json(data: HarData, ols: Ols | None, cfg: TrainConfig, results: dict[str, Result] | None = None,
                checks=(), incomplete: dict[str, str] | None = None) -> dict:
    """The machine-readable report (shape in docs/compare.md); slopes, intercepts and MSE in original units (the
    HAR's; another model's paths give their curves and metrics, and "ols" is null)."""
    return {
        "config": cfg.to_dict(),
        "seed": cfg.seed,
        "versions": versions(),
        "data": {"source": data.source, "asset": data.asset, "validation": data.validation, "n_train": data.n_train,
                 "n_val": data.n_val, "n_test": data.n_test},
        "ols": ols and {"intercept": ols.intercept, "slopes": ols.slope_dict(), "test_mse": ols.test_mse,
                        "val_mse": ols.val_mse},
        "paths": {name: path_summary(r, data) if ols else model_summary(r) for name, r in (results or {}).items()},
        "checks": [dataclasses.asdict(c) for c in checks],
        "incomplete": [{"engine": e, "reason": why} for e, why in (incomplete or {}).items()],
    }


def print_layers(name: str, rows: list[tuple[str, str, str, int]], engine: str) -> None:
    table = Table("layer", "type", "output shape", "params", title=f"{name} ({engine})", title_justify="left")
    for layer, kind, shape, count in rows:
        table.add_row(layer, kind, shape, f"{count:,}")
    table.add_row("", "", "total", f"{sum(r[3] for r in rows):,}", style="bold")
    console().print(table)


def path_summary(result: Result, data: HarData) -> dict:
    """Slopes and intercept in original units, test MSE, time: what the table and report.json show."""
    kernel, bias = result.weights[:2]
    intercept, slopes = data.scaling.to_original(kernel, bias)
    test_mse = float(np.mean((result.test_pred.reshape(-1) - data.y_test.reshape(-1)) ** 2)) * data.scaling.y_std**2
    return {
        "engine": result.engine,
        "intercept": intercept,
        "slopes": dict(zip(data.features, map(float, slopes))),
        "test_mse": test_mse,
        "val_curve": result.val_loss,
        "train_curve": result.train_loss,
        "train_seconds": result.train_seconds,
        "compile_seconds": result.compile_seconds,
    }


def model_summary(result: Result) -> dict:
    """What report.json keeps of a path of a model other than the HAR: its curves, test loss, metrics and time."""
    return {"engine": result.engine, "units": result.units, "val_curve": result.val_loss,
            "train_curve": result.train_loss, "test_loss": result.test_loss, "metrics": result.metrics,
            "train_seconds": result.train_seconds, "compile_seconds": result.compile_seconds}


def print_model_table(model: str, results: dict[str, Result], data: HarData) -> None:
    """A zoo model's paths: the last epoch's training and validation loss (and metrics), the loss on the test
    split, the train time."""
    metrics = sorted({k for r in results.values() for k in r.metrics if k.startswith("val_")})
    units = ", ".join(sorted({r.units for r in results.values()}))
    table = Table("path", "train loss", "val loss", "test loss", *metrics, "train s",
                  title=f"{model} on {data.asset!r} (losses {units})", title_justify="left")
    for name, r in results.items():
        last = [f"{r.metrics[m][-1]:.4f}" if r.metrics.get(m) else "" for m in metrics]
        table.add_row(name, f"{r.train_loss[-1]:.4f}", f"{r.val_loss[-1]:.4f}" if r.val_loss else "",
                      "" if r.test_loss is None else f"{r.test_loss:.4f}", *last, train_seconds(r))
    console().print(table)


def train_seconds(result: Result) -> str:
    """A path's training seconds, and apart, the time its first epoch spent tracing and compiling the step (where the
    path compiles, `fit`'s on JAX and TensorFlow too, and ran epochs to tell it by)."""
    return with_compile(f"{result.train_seconds:.3f}", result.compile_seconds)


def with_compile(seconds: str, compile_seconds: float | None) -> str:
    return seconds + ("" if compile_seconds is None else f" (+{compile_seconds:.2f} compile)")


def print_paths_table(ols: Ols, results: dict[str, Result], data: HarData) -> None:
    """The paths' table: OLS and each path; slopes in original units, test MSE, train time (`train_seconds`)."""
    table = Table("path", *data.features, "test MSE", "vs OLS", "train s", title=f"HAR on {data.asset!r}",
                  title_justify="left")
    table.add_row("OLS", *(f"{s:.4f}" for s in ols.slopes), f"{ols.test_mse:.4f}", "", "", style="bold")
    for name, result in results.items():
        row = path_summary(result, data)
        table.add_row(name, *(f"{s:.4f}" for s in row["slopes"].values()), f"{row['test_mse']:.4f}",
                      f"{row['test_mse'] / ols.test_mse - 1:+.3%}", train_seconds(result))
    console().print(table)

CURVE_EPOCHS = (1, 2, 3, 5, 10, 20, 40)


def print_curves(results: dict[str, Result], data: HarData, ols: Ols | None) -> None:
    """Validation loss (MSE in original units for the HAR) at `CURVE_EPOCHS`, and OLS's on the same rows."""
    epochs = [e for e in CURVE_EPOCHS if any(len(r.val_loss) >= e for r in results.values())]
    where = "the year before the split" if data.validation == "last-year" else "the test split"
    title = (f"validation {'MSE' if ols else 'loss'} by epoch, on {where} ({data.n_val:,} rows"
             + (f"; OLS {ols.val_mse:.4f})" if ols else ")"))
    table = Table("path", *(f"ep {e}" for e in epochs), title=title, title_justify="left")
    for name, r in results.items():
        table.add_row(name, *(f"{r.val_loss[e - 1]:.4f}" if len(r.val_loss) >= e else "" for e in epochs))
    console().print(table)


def print_checks(checks, failed_engines: dict[str, str]) -> None:
    table = Table("", "check", "value", "tolerance", "note", title="parity checks", title_justify="left")
    for c in checks:
        mark = "[green]✓[/green]" if c.passed else "[red]✗[/red]"
        table.add_row(mark, c.name, f"{c.value:.3g}", f"{c.tolerance:.3g}", c.note)
    console().print(table)
    for engine, why in failed_engines.items():
        console().print(f"[red]incomplete[/red]: {engine}: {shown(why)}")
    passed = sum(c.passed for c in checks)
    console().print(f"{passed} of {len(checks)} checks passed" + (", run incomplete" if failed_engines else ""))


@contextmanager
def progress(engines: list[str]):
    """A live line per engine (path, stage, epoch) while the workers train; yields the event handler."""
    stages = {"train": "training", "repeat": "repeating (determinism)", "same": "same-arithmetic run",
              "seeds": "trained at once"}
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console(), transient=False) as bar:
        tasks = {e: bar.add_task(f"{e}: starting", total=None) for e in engines}

        def on_event(engine: str, event: dict) -> None:
            if event.get("event") == "progress":
                bar.update(tasks[engine], description=f"{engine}: {event['path']} {stages[event['stage']]}",
                           completed=event["epoch"], total=event["epochs"])

        yield on_event


@contextmanager
def bench_progress(totals: dict[str, int]):
    """A bar per engine (and the NumPy floor, the walk-forward) over its timed runs, naming the one last done;
    yields `tick(row, what, done=True)`: `done=False` only renames the bar (a stage that has started)."""
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console(), transient=False) as bar:
        tasks = {row: bar.add_task(f"{row}: waiting", total=total) for row, total in totals.items()}

        def tick(row: str, what: str, done: bool = True) -> None:
            bar.update(tasks[row], advance=1 if done else 0, description=f"{row}: {what}")

        yield tick


@contextmanager
def cell_progress(total: int):
    """One bar over the zoo's cells, naming the last one done; yields the handler for each finished cell."""
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console(), transient=False) as bar:
        task = bar.add_task("zoo: starting", total=total)

        def on_cell(cell: dict) -> None:
            bar.update(task, advance=1, description=f"zoo: {cell['engine']} {cell['model']} {cell['optimizer']}")

        yield on_cell


def print_walk_forward(mse: dict[str, dict[str, float]], timing: dict, windows) -> None:
    """Out-of-sample MSE per asset and method (original units), then training time per method."""
    methods = [m for m in mse if m != "ols"]
    table = Table("asset", "models", "OLS", *methods, title="walk-forward out-of-sample MSE (vs OLS), refit every "
                  f"{windows.every} sessions, expanding window", title_justify="left")
    for asset, refits in zip(windows.assets, windows.live.sum(axis=1)):
        ols = mse["ols"][asset]
        cells = [f"{mse[m][asset]:.4f} ({mse[m][asset] / ols - 1:+.2%})" for m in methods]
        table.add_row(asset, str(int(refits)), f"{ols:.4f}", *cells)
    console().print(table)
    speed = Table("method", "devices", "seconds", "compile s", "models/s", "note", title="training time",
                  title_justify="left")
    for name, t in timing.items():
        compile_s = t.get("compile_seconds")
        speed.add_row(name, str(t["devices"]), f"{t['seconds']:.2f}", "" if compile_s is None else f"{compile_s:.2f}",
                      f"{t['models_per_s']:,.1f}", t.get("note", ""))
    console().print(speed)


def print_distributed(found: dict) -> None:
    """Per engine: the N-process run's largest weight gap to one process (✓ within the tolerance; over it, what a run
    from one ulp away drifts), and the throughput of each (training samples per second; walk-forward models per
    second)."""
    n = str(found["processes"])
    table = Table("check", "max |Δ|", "tolerance", "1 process", f"{n} processes", "unit", "ratio", "runtime",
                  title=f"data parallel: {n} processes against 1, the same global batches ({found['samples']:,} "
                  "training samples)", title_justify="left")
    for engine, row in found["engines"].items():
        mark = "[green]✓[/green]" if row["passed"] else "[red]✗[/red]"
        one, many = row["samples_per_s"]["one"], row["samples_per_s"]["many"]
        unit = row.get("unit", "samples/s")
        table.add_row(row["check"], f"{mark} {row['gap']:.1e}", f"{row['tolerance']:g}", f"{one:,.0f}",
                      f"{many:,.0f}", unit, f"{many / one:.2f}×", row["runtime"].replace("N ", f"{n} "))
    console().print(table)
    if found.get("cpus"):
        console().print(f"pinned: a launch's process i on the i-th of CPUs {', '.join(map(str, found['cpus']))} (a "
                        f"process of every device or replica on them all); every one-process run on CPU "
                        f"{found['cpus'][-1]}")
    cut = {row["training_rows"] for row in found["engines"].values() if "training_rows" in row}
    if cut:
        console().print(f"fit's rows: the first {min(cut):,} training rows (whole batches), as Keras shards a batch "
                        "evenly; against plain fit on the same rows")
    for note in found.get("notes", []):
        console().print(note)
    epochs = found["config"]["epochs"]
    for row in (r for r in found["engines"].values() if r.get("drift") is not None):
        if row["drift"] > row["tolerance"]:
            console().print(f"{row['check']}: the one-process run from one ulp away ends {row['drift']:.1e} from it "
                            f"after {epochs} epochs: the model amplifies float rounding, so this horizon cannot tell "
                            "a bug from rounding; fewer --epochs can")
        else:
            console().print(f"{row['check']}: the one-process run from one ulp away ends {row['drift']:.1e} from it, "
                            "within the tolerance: one ulp of rounding does not explain the gap")
    for engine, why in found["incomplete"].items():
        console().print(f"[red]incomplete[/red]: {engine}: {shown(why)}")


def print_zoo(zoo: dict) -> None:
    """The zoo matrix: per model and path, the worst gap to `fit` over the optimizers on each engine (✓ within the
    tolerance; the engine-optimizer path is measured, not judged), then the worst gap per optimizer."""
    cells, tolerance = zoo["cells"], zoo["tolerance"]
    console().print(_gap_table(cells, "model", f"largest weight gap to fit after {zoo['epochs']} epoch(s), same "
                               f"weights and batches (tolerance {tolerance:g} for the Keras-exact optimizer)"))
    console().print(_gap_table(cells, "optimizer", "largest gap per optimizer setting, over the models"))
    for cell in (c for c in cells if c.get("error")):
        console().print(f"[red]✗[/red] {cell['model']} {cell['engine']} {cell['path']} {cell['optimizer']}: "
                        f"{cell['error']}")
    for engine, why in zoo["incomplete"].items():
        console().print(f"[red]incomplete[/red]: {engine}: {shown(why)}")
    judged = [c for c in cells if c["judged"]]
    console().print(f"{sum(c['passed'] for c in judged)} of {len(judged)} judged cells within {tolerance:g} (weights) "
                    f"and {zoo['history_tolerance']:g} (the loss and metrics reported per epoch)")


def _gap_table(cells: list[dict], by: str, title: str) -> Table:
    """One row per (`by`, path), one column per engine: the worst cell of each; rows in the order keys and paths
    first come (each engine's fast path beside the others, though its engine's cells come later)."""
    engines = list(dict.fromkeys(c["engine"] for c in cells))
    keys, paths = (list(dict.fromkeys(c[field] for c in cells)) for field in (by, "path"))
    table = Table(by, "path", *engines, title=title, title_justify="left")
    rows = dict.fromkeys((c[by], c["path"]) for c in cells)
    for key, path in sorted(rows, key=lambda row: (keys.index(row[0]), paths.index(row[1]))):
        table.add_row(key, path, *(_worst([c for c in cells if (c[by], c["path"], c["engine"]) == (key, path, e)])
                                   for e in engines))
    return table


def _worst(cells: list[dict]) -> str:
    if not cells:
        return ""
    worst = max(cells, key=lambda c: -1.0 if c["gap"] != c["gap"] else c["gap"])  # NaN (an error) sorts first
    if any(c["gap"] != c["gap"] for c in cells):
        return "[red]✗ error[/red]"
    mark = ("[green]✓[/green] " if all(c["passed"] for c in cells) else "[red]✗[/red] ") if worst["judged"] else ""
    return f"{mark}{worst['gap']:.1e}"


def print_seeds(summary: dict, timings: dict, model: str) -> None:
    """Per engine and measure: the seeds' median and 1st-99th percentiles, and the default run (fit at the run's
    seed) with its percentile among the seeds."""
    table = Table("engine", "measure", "seeds", "median", "1st-99th percentile", "fit, default seed", "percentile",
                  title=f"{model}: the spread over seeds, and each engine's default run in it", title_justify="left")
    for engine, entry in summary.items():
        for measure, value in entry["default"].items():
            q = entry.get("quantiles", {}).get(measure)
            spread = ("", "", "") if q is None else (str(entry["seeds"]), f"{q[50]:.5g}", f"{q[1]:.5g} to {q[99]:.5g}")
            rank = entry.get("default_percentile", {}).get(measure)
            table.add_row(engine, measure, *spread, f"{value:.5g}", "" if rank is None else f"{rank:.0f}")
    console().print(table)
    speed = Table("engine", "seeds s", "compile s", "fit s (one run)", title="training time", title_justify="left")
    for engine, t in timings.items():
        cell = lambda k: "" if t.get(k) is None else f"{t[k]:.2f}"  # noqa: E731
        speed.add_row(engine, cell("seconds"), cell("compile_seconds"),
                      with_compile(cell("fit_seconds"), t.get("fit_compile_seconds")))
    console().print(speed)


def print_sweep(found: dict, best: dict, rates: list[float], sizes: list[int], ols_val_mse: float, seeds: int) -> None:
    """Per engine, the grid of mean validation MSE (batch sizes × learning rates), the best cell against OLS."""
    for engine, f in found.items():
        table = Table("batch size", *[f"lr {r:g}" for r in rates], title=f"{engine}: validation MSE (log RV²), "
                      f"{'one seed' if seeds == 1 else f'mean of {seeds} seeds'}; OLS {ols_val_mse:.5f}",
                      title_justify="left")
        for i, size in enumerate(sizes):
            table.add_row(str(size), *[f"{v:.5f}" for v in f["val_mse"][i]])
        console().print(table)
        b = best[engine]
        if b is None:
            console().print(f"{engine}: every cell diverged (no finite validation MSE); try smaller learning rates")
            continue
        console().print(f"{engine}: best lr {b['learning_rate']:g}, batch size {b['batch_size']}: "
                        f"{b['val_mse']:.5f} ({b['val_mse'] / ols_val_mse - 1:+.2%} against OLS); "
                        f"{f['seconds']:.2f} s training" + ("" if f["compile_seconds"] is None else
                                                            f", {f['compile_seconds']:.2f} s compiling"))
