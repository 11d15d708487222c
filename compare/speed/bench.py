"""`native-loops bench`: every training path on the HAR, timed in one run, with ratios measured in that run.

Engines run one after another (never side by side, so they do not share the two cores); within an engine the
paths alternate repeat by repeat. Compile time is reported apart. Ratios are speed-ups: `ratio_vs_fit` = the
engine's `fit` median / the path's median, `ratio_vs_numpy` = the NumPy floor's median / the path's median.
Timings are never asserted by tests: these machines are shared and noisy.
"""
from __future__ import annotations

import contextlib
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np
from rich.table import Table

from compare.engines import paths, runner
from compare.referee.report import console, shown
from compare.speed import floors
from keras_side import cores
from keras_side.data import HarData, batch_slices, numpy_orders
from keras_side.results import versions
from keras_side.spec import TrainConfig
from keras_side.zoo import ZOO

TARGETS = (  # (path, against, at least): the targets ("Speed, raised"), printed with what this run measured
    ("jax-native-scan", "fit", 150.0),
    ("jax-native-scan", "numpy", 15.0),
    ("torch-native-fast", "fit", 3.5),
    ("torch-native-compile", "fit", 6.0),
)


WALK_FORWARD_TARGETS = (("jax-vmap-1dev", 800.0), ("jax-vmap-2dev", 1200.0), ("torch-vmap", 1000.0))


# Timed beside the referee's paths; the "-engine" ones run torch's stock Adam, the price of the exact one.
VARIANTS = {"jax": ["jax-native-fast", "jax-native-scan"],
            "torch": ["torch-native-fast", "torch-native-compile", "torch-native-engine", "torch-native-compile-engine"]}


def bench_paths(engine: str) -> list[str]:
    """The referee's paths, the variants, and the floors (the same step without Keras: `compare.speed.floors`)."""
    return [p.name for p in paths.for_engine(engine)] + VARIANTS.get(engine, []) + floors.floors(engine)


# Beside each engine's fit and reference loop, the zoo table times its engine's fast paths: torch's call-wrapper
# bypass and compiled step, JAX's convolution as a matmul and fused scan.
ZOO_VARIANTS = {"jax": ["jax-native-fast", "jax-native-scan"], "torch": ["torch-native-fast", "torch-native-compile"]}


def has_floor(model: str, engine: str) -> bool:
    """A zoo model has a floor on `engine` where `floors.RAW` writes it without Keras and its spec is the floors' own
    (MSE and the spec's optimizer, no metrics or sample weights)."""
    return model in floors.RAW.get(engine, ()) and not ZOO[model].spec


def zoo_paths(engine: str, model: str) -> list[str]:
    """What the zoo table times per model: fit, the native loop, the engine's fast path (`ZOO_VARIANTS`), and the
    same step without Keras where the model has one (`has_floor`)."""
    own = [p.name for p in paths.for_engine(engine)] + ZOO_VARIANTS.get(engine, [])
    return own + (floors.floors(engine) if has_floor(model, engine) else [])


def floor_row(timed: dict, row: dict | None) -> dict | None:
    """The timings of `row`'s floor, where it has one and it was timed (a model's `timed["paths"]`)."""
    return timed["paths"].get(row["floor"]) if row and row.get("floor") else None


# The zoo's targets (issue "Speed, raised"): every model's native paths at least 2× its engine's fit, the fused
# JAX scan 20×: what the HAR's paths reach, asked of real models.
ZOO_TARGETS = {"native": 2.0, "jax-native-scan": 20.0}


def numpy_adam(data: HarData, cfg: TrainConfig) -> float:
    """The floor: the same Adam steps on `Dense(1)` written in NumPy, float32. Returns seconds."""
    x, y = data.x_train, data.y_train
    w, b = np.zeros((x.shape[1], 1), np.float32), np.zeros(1, np.float32)
    m, v = [np.zeros_like(w), np.zeros_like(b)], [np.zeros_like(w), np.zeros_like(b)]
    start, t = time.perf_counter(), 0
    for order in numpy_orders(cfg.seed, data.n_train, cfg.epochs):
        xe, ye = x[order], y[order]
        for rows in batch_slices(data.n_train, cfg.batch_size):
            xb, r = xe[rows], xe[rows] @ w + b - ye[rows]
            grads = (2.0 / len(r) * xb.T @ r, 2.0 / len(r) * r.sum(0))
            t += 1
            alpha = cfg.learning_rate * np.sqrt(1 - cfg.beta_2**t) / (1 - cfg.beta_1**t)
            for i, (p, g) in enumerate(zip((w, b), grads)):
                m[i] += (1 - cfg.beta_1) * (g - m[i])
                v[i] += (1 - cfg.beta_2) * (g * g - v[i])
                p -= alpha * m[i] / (np.sqrt(v[i]) + cfg.epsilon)
    return time.perf_counter() - start


def run(data: HarData, cfg: TrainConfig, engines: list[str], folder: Path, repeats: int,
        on_timing=lambda row, path: None, model: str | None = None, pool: runner.Pool | None = None) -> dict:
    """Time every path `repeats` times; the JSON of `native-loops bench --json`. `on_timing(engine, path)` after
    each timed run (row "numpy" for the floor). With `model` (a zoo model's name), time `zoo_paths` of that model
    instead, without the NumPy floor (it is the HAR's). Each path runs alone on one core, where the system can pin
    (`cores.on_cpus`); `cpus` in the result: the cores each engine's worker, and the floor, ran on. `pool`: workers
    to reuse (the HAR and each zoo model of one bench: an engine's start is seconds); by default, a pool of its own.
    An engine that failed in it, here or before, is in the result's `incomplete`."""
    cfg = cfg.replace(validate=False)
    timings: dict[str, dict[str, list]] = {}
    stages, cpus = {}, {}
    data_file = folder / "data.npz"
    data.save(data_file)

    def on_event(engine: str, event: dict) -> None:
        if event.get("event") == "stages":
            stages.update(event["stages"])
        if event.get("event") == "timing":
            entry = timings.setdefault(event["path"], {"seconds": [], "compile": [], "first_run": []})
            entry["seconds"].append(event["seconds"])
            if event.get("compile_seconds") is not None:
                entry["compile"].append(event["compile_seconds"])
            if event.get("first_run_seconds") is not None:
                entry["first_run"].append(event["first_run_seconds"])
            on_timing(engine, event["path"])
        if event.get("event") == "done":  # the cores its threads ran on
            cpus[engine] = event["cpus"]

    usable = cores.timing_cpus()  # every path on one core, one worker at a time (cores.on_cpus)
    cpu = usable[-1:] if usable else None
    with contextlib.ExitStack() as own:
        pool = pool or own.enter_context(runner.Pool(engines, folder, jobs=1))
        pool.started()  # no worker's start-up shares a timed core
        request = {"data": str(data_file), "config": cfg.to_dict(), "repeats": repeats, "stages": not model,
                   "cpus": cpu}
        if model:
            request |= {"model": model, "build": ZOO[model].build}
        pool.each("compare.speed.tasks:bench", lambda e: {**request, "paths": zoo_paths(e, model) if model else bench_paths(e)}, on_event)
        failed = {e: pool.failed[e] for e in engines if e in pool.failed}
    steps = cfg.epochs * len(batch_slices(data.n_train, cfg.batch_size))
    if model:
        return {"paths": _summary(timings, steps), "steps": steps, "repeats": repeats, "incomplete": failed,
                "cpus": cpus}
    floor = []
    with cores.on_cpus(cpu):
        for _ in range(repeats):
            floor.append(numpy_adam(data, cfg))
            on_timing("numpy", "numpy-floor")
    timings["numpy-floor"] = {"seconds": floor, "compile": [], "first_run": []}
    return {"paths": _summary(timings, steps), "steps": steps, "repeats": repeats, "incomplete": failed,
            "torch_stages_us": stages or None, "machine": machine(), "cpus": cpus | {"numpy": cpu}}


def _summary(timings: dict, steps: int) -> dict:
    medians = {p: statistics.median(t["seconds"]) for p, t in timings.items()}
    out = {}
    for name, t in timings.items():
        engine = paths.PATHS[name].engine if name in paths.PATHS else floors.FLOORS.get(name, (None,))[0]
        fit, floor = f"keras-{engine}", floors.FLOOR_OF.get(name)
        out[name] = {
            "median_ms": medians[name] * 1e3,
            "min_ms": min(t["seconds"]) * 1e3,
            "compile_ms": statistics.median(t["compile"]) * 1e3 if t["compile"] else None,
            "first_run_ms": statistics.median(t["first_run"]) * 1e3 if t["first_run"] else None,  # in compile_ms
            "us_per_step": medians[name] * 1e6 / steps,
            "ratio_vs_fit": medians[fit] / medians[name] if fit in medians else None,
            "ratio_vs_numpy": medians["numpy-floor"] / medians[name] if "numpy-floor" in medians else None,
            "floor": floor if floor in medians else None,  # what this path costs over its floor: × floor
            "times_floor": medians[name] / medians[floor] if floor in medians else None,
        }
    return out


def machine() -> dict:
    return {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
            "versions": versions()}


def targets(report: dict) -> list[tuple[str, float | None, float, bool]]:
    """(description, measured, target, met) for each target whose path ran."""
    rows = []
    for path, against, goal in TARGETS:
        row = report["paths"].get(path)
        if row is None:
            continue
        value = row["ratio_vs_fit" if against == "fit" else "ratio_vs_numpy"]
        said = ""
        if value is not None and row["first_run_ms"]:  # what it would be with the program's first run counted
            said = f" ({value * row['median_ms'] / (row['median_ms'] + row['first_run_ms']):.1f}× with its first run)"
        rows.append((f"{path} vs {against}{said}", value, goal, value is not None and value >= goal))
    for name, goal in WALK_FORWARD_TARGETS:
        row = report.get("walk_forward", {}).get(name)
        if row is not None:
            rows.append((f"walk-forward {name} models/s", row["models_per_s"], goal, row["models_per_s"] >= goal))
    for model, timed in report.get("zoo", {}).items():
        for path, row in timed["paths"].items():
            goal = ZOO_TARGETS.get(path, ZOO_TARGETS["native"] if "-native" in path else None)
            if goal is not None and row["ratio_vs_fit"] is not None:
                floor = floor_row(timed, row)  # what no Keras would reach
                said = f" (its floor, {row['floor']}: {floor['ratio_vs_fit']:.1f}×)" if floor else ""
                rows.append((f"{model}: {path} vs fit{said}", row["ratio_vs_fit"], goal, row["ratio_vs_fit"] >= goal))
    return rows


def print_bench(timings: dict, targets) -> None:
    table = Table("path", "median ms", "min ms", "compile ms", "µs/step", "× vs fit", "× vs NumPy",
                  "÷ its floor", title=f"training time, {timings['steps']} Adam steps, median of "
                  f"{timings['repeats']} (floors: the same step without Keras)", title_justify="left")
    fmt = lambda v, spec: "" if v is None else format(v, spec)  # noqa: E731
    for name, row in timings["paths"].items():
        table.add_row(name, fmt(row["median_ms"], ",.1f"), fmt(row["min_ms"], ",.1f"), fmt(row["compile_ms"], ",.0f"),
                      fmt(row["us_per_step"], ",.1f"), fmt(row["ratio_vs_fit"], ".1f"),
                      fmt(row["ratio_vs_numpy"], ".2f"),
                      "" if row.get("times_floor") is None else f"{row['times_floor']:.1f} ({row['floor']})")
    console().print(table)
    pinned = timings.get("cpus", {}).get("numpy")
    console().print(f"each path alone on CPU {pinned[0]} (every thread of its worker, or the floor's, pinned there)"
                    if pinned is not None else
                    "each path alone, not pinned to a core (this system cannot): JAX's runtime may use several")
    for name, row in timings["paths"].items():
        if row.get("first_run_ms"):
            console().print(f"{name}: its program's first run, with no epoch in it, took {row['first_run_ms']:.2f} ms, "
                            "counted in its compile time (XLA's CPU runtime pays about a millisecond the first time it "
                            "runs a program)")
    if timings.get("torch_stages_us"):
        stages = timings["torch_stages_us"]
        parts = Table("torch eager step", *stages["keras"], "total µs", title="where the torch step's time goes, µs "
                      "per step (each stage timed alone)", title_justify="left")
        for name, row in stages.items():
            parts.add_row("Keras model" if name == "keras" else "raw tensors", *[f"{v:.1f}" for v in row.values()],
                          f"{sum(row.values()):.1f}")
        console().print(parts)
    if timings.get("zoo"):
        console().print(_bench_zoo_table(timings["zoo"]))
    for what, value, goal, met in targets:
        mark = "[green]✓[/green]" if met else "[red]✗[/red]"
        unit = "" if "models/s" in what else "×"
        console().print(f"{mark} {what}: {fmt(value, ',.1f')}{unit} (target ≥ {goal:,g}{unit})")
    for engine, why in timings["incomplete"].items():
        console().print(f"[red]incomplete[/red]: {engine}: {shown(why)}")


def _bench_zoo_table(zoo: dict) -> Table:
    """Per zoo model and engine: fit's median, the reference loop's and, a row each, its engine's fast paths'
    (`ZOO_VARIANTS`), each × fit, and a fast path's floor where the model has one (the same step without
    Keras: `compare.speed.floors`)."""
    table = Table("model", "engine", "fit ms", "native ms", "× fit", "fast path", "ms", "× fit", "compile s",
                  "floor ms", "floor × fit", title="the zoo: the same model through fit and by hand, median of the "
                  "repeats (floor: the same step without Keras, eager on torch, the fused scan on JAX)",
                  title_justify="left")
    fmt = lambda row, key, spec: "" if row is None or row[key] is None else format(row[key], spec)  # noqa: E731
    for model, timed in zoo.items():
        for engine in dict.fromkeys(name.split("-")[1] for name in timed["paths"] if name.startswith("keras-")):
            fit, native = timed["paths"].get(f"keras-{engine}"), timed["paths"].get(f"{engine}-native")
            fast = [p for p in ZOO_VARIANTS.get(engine, []) if p in timed["paths"]] or [None]
            for i, path in enumerate(fast):  # the model's fit and reference loop on its first row only
                row = timed["paths"].get(path)
                floor = floor_row(timed, row)
                compile_s = "" if row is None or row["compile_ms"] is None else f"{row['compile_ms'] / 1e3:.1f}"
                table.add_row(*(("", "", "", "", "") if i else (
                    model, engine, fmt(fit, "median_ms", ",.1f"), fmt(native, "median_ms", ",.1f"),
                    fmt(native, "ratio_vs_fit", ".1f"))), path or "", fmt(row, "median_ms", ",.1f"),
                    fmt(row, "ratio_vs_fit", ".1f"), compile_s, fmt(floor, "median_ms", ",.1f"),
                    fmt(floor, "ratio_vs_fit", ".1f"))
    return table
