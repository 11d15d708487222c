"""What each subcommand does. Only `models` and `train` import Keras in this process, after choosing its backend."""
from __future__ import annotations

import argparse
import contextlib
import math
import os
import shutil
import tempfile
from datetime import datetime
from pathlib import Path

import numpy as np

from compare.speed import bench as bench_paths
from compare import distributed as dist
from compare.referee import checks, figures, report, tolerances
from compare.data import reference, synthetic
from compare.engines import paths, runner
from compare.data import panel as har_data
from compare.speed import sweep as grid
from compare.speed import walk_forward as walk
from compare.referee import zoo as zoo_matrix
from compare.referee import seed_noise
from compare.errors import NativeLoopsError
from compare.io import atomic_folder, check_writable, exists, write_json
from keras_side.arrays import take
from keras_side.backend import ENGINES, keras_defaults, use_backend
from keras_side.data import HarData
from keras_side.results import versions
from keras_side.spec import SEEDS, TrainConfig


def load(args: argparse.Namespace, **seed):
    """The validated panel and its source line, from --data or the embedded synthetic panel."""
    return har_data.load_panel(args.data, **seed)


INTERNAL_OPTIONS = ("asset_default", "asset_given")  # set by the CLI itself, not by the user (cli._command)


def options(args: argparse.Namespace) -> dict:
    """Every option of the run's command, as given or by default: with the seed and the versions beside them in the
    JSON a command writes, what reproduces the run (`--asset`, `--split`, `--end`, `--engines`...)."""
    return {k: v for k, v in sorted(vars(args).items())
            if k not in INTERNAL_OPTIONS and (v is None or isinstance(v, (str, int, float, bool)))}


def check_seed(seed: int, after: int = 0) -> int:
    """--seed, and the `after` seeds a many-seed run trains after it (`seed_noise.seeds_of`): each one of NumPy's and
    JAX's seeds. Past 2**32 - 1 JAX's key wraps, so seed 2**32 + 1 would draw seed 1's batch orders again."""
    if not 0 <= seed < SEEDS:
        raise NativeLoopsError(f"--seed must be an integer from 0 to 2**32 - 1 (NumPy's and JAX's seeds), got {seed}")
    if seed + after >= SEEDS:
        raise NativeLoopsError(f"--seed {seed}: the {after:,} seeds this run trains after it go past 2**32 - 1 "
                               f"(NumPy's and JAX's seeds); give --seed at most {SEEDS - 1 - after:,}")
    return seed


def data(args: argparse.Namespace) -> int:
    if args.asset_given:
        refuse_asset(args, "data summarizes every asset")
    if args.out and args.data:
        raise NativeLoopsError("--out writes the synthetic panel, so it cannot be combined with --data; drop one")
    if args.seed is not None and args.data:  # it drew nothing, without a word
        raise NativeLoopsError("--seed draws the synthetic panel, so it cannot be combined with --data; drop one")
    args.seed = check_seed(har_data.DEFAULT_DATA_SEED if args.seed is None else args.seed)
    if args.out is not None and Path(args.out).suffix.lower() != ".parquet":
        raise NativeLoopsError(f"--out {args.out!r}: the panel is written as parquet; give a file name ending in "
                               ".parquet")
    if args.out and exists(args.out, "--out"):
        raise NativeLoopsError(f"--out {args.out!r} already exists; choose a new file (nothing is overwritten)")
    panel, source = load(args, seed=args.seed)
    fits = {a: har_data.of_asset(a, reference.ols_for, panel, a, args.split, args.end, har_data.HAR, args.validation)
            for a in sorted(panel["activo"].unique())}
    if args.out:
        synthetic.write_parquet(panel, args.out, seed=args.seed)
    report.print_data_summary(panel, source, fits, synthetic.TRUE if args.data is None else None)
    if args.out:
        report.console().print(f"wrote {report.shown(args.out)}")
    return 0


def models(args: argparse.Namespace) -> int:
    use_backend(args.engine)
    keras_defaults()
    from keras_side import models as builders
    from keras_side.determinism import seed_everything

    for name, build in builders.BUILDERS.items():
        seed_everything(0)
        model = builders.ensure_built(build(), builders.example_inputs(name))
        report.print_layers(name, builders.layer_table(model), args.engine)
    # The zoo's models too (`--model` of compare and distributed, `--models` of zoo and bench), built on two rows of
    # their own kind of data
    zoo = {name: entry for name, entry in zoo_matrix.ZOO.items() if name not in builders.BUILDERS}
    panel = synthetic.simulate(0)
    rows = {kind: take(har_data.prepare_kind(panel, kind).x_train, slice(0, 2))
            for kind in {entry.data for entry in zoo.values()}}
    for name, entry in zoo.items():
        seed_everything(0)
        model = builders.ensure_built(entry.builder()(), rows[entry.data])
        report.print_layers(f"zoo: {name}", builders.layer_table(model), args.engine)
    return 0


def train_config(args: argparse.Namespace, *, epochs: int | None = None, seeds_after: int = 0) -> TrainConfig:
    """The run's one config, from --epochs and --seed (`seeds_after`: how many seeds the run trains after its own);
    values no engine accepts are the user's to fix."""
    epochs = epochs or (TrainConfig.epochs if args.epochs is None else args.epochs)
    if epochs < 1:
        raise NativeLoopsError(f"--epochs must be at least 1, got {epochs}")
    return TrainConfig(epochs=epochs, seed=check_seed(args.seed, seeds_after))


# Every epoch's batch order is drawn up front (so that a resumed run draws the same ones), and the JAX loop gathers
# every epoch's batches once: epochs × training rows must fit in memory. 50 million rows of order is 400 MB of int64,
# and about as much again of gathered float32 HAR batches.
MAX_ORDER_ROWS = 50_000_000
# The walk-forward gathers each epoch's batches inside its loop, and draws only one key per epoch up front (8 bytes
# each on JAX): 80 MB at this many.
MAX_WALK_EPOCHS = 10_000_000


def check_models(cfg: TrainConfig, rows: int, models: int, option: str) -> None:
    """One line, before any training, when many models' batch orders (one per model and epoch, drawn up front)
    would not fit in memory; `option` names what to ask less of."""
    if cfg.epochs * rows * models > MAX_ORDER_ROWS:
        raise NativeLoopsError(f"{models:,} models × {cfg.epochs:,} epochs × {rows:,} training rows of batch order "
                               f"is more than the {MAX_ORDER_ROWS:,} rows held in memory; ask for fewer {option}")


def check_epochs(cfg: TrainConfig, rows: int) -> None:
    """One line, before any training, for an --epochs whose batch orders would not fit in memory."""
    if cfg.epochs * rows > MAX_ORDER_ROWS:
        raise NativeLoopsError(f"--epochs {cfg.epochs:,} over {rows:,} training rows draws {cfg.epochs * rows:,} rows "
                               f"of batch order up front, more than the {MAX_ORDER_ROWS:,} held in memory; ask for at "
                               f"most {MAX_ORDER_ROWS // rows:,} epochs")


# The paths that write checkpoints: the native loops (fit has its own, keras.callbacks.BackupAndRestore).
CHECKPOINTED = ("torch-native", "torch-native-fast", "torch-native-compile", "torch-native-engine",
                "torch-native-compile-engine", "jax-native", "jax-native-fast", "tensorflow-native")


def train(args: argparse.Namespace) -> int:
    path, cfg = paths.get(args.path), train_config(args)
    if args.resume and not args.checkpoint:
        raise NativeLoopsError("--resume goes on from the checkpoints in --checkpoint DIR; give that folder")
    if args.checkpoint and path.name not in CHECKPOINTED:
        why = ("the fused scan runs every epoch in one call, so no epoch ends where a checkpoint could be written; "
               "use --path jax-native" if path.name == "jax-native-scan" else
               "fit has keras.callbacks.BackupAndRestore" if path.name.startswith("keras-") else
               f"it is not one of {', '.join(CHECKPOINTED)}")
        raise NativeLoopsError(f"--checkpoint: {path.name} writes no checkpoints: {why}")
    panel, source = load(args)
    prepared, fit = prepare_har(args, panel, source)
    check_epochs(cfg, prepared.n_train)
    use_backend(path.engine)
    keras_defaults()
    from keras_side import models as builders
    from keras_side.determinism import seed_everything

    seed_everything(cfg.seed)
    saving = {"checkpoint": args.checkpoint, "resume": args.resume} if args.checkpoint else {}
    result = path.train(builders.har(), prepared, cfg, **saving)
    report.print_paths_table(fit, {result.path: result}, prepared)
    return 0


def refuse_asset(args: argparse.Namespace, why: str):
    """A user's --asset that the command would ignore is an error, not ignored."""
    raise NativeLoopsError(f"{why}, so --asset {args.asset!r} would be ignored; leave --asset out")


def model_data(args: argparse.Namespace, panel, source: str, entry) -> HarData:
    """The data set --model trains on: --asset's, split by --split/--end/--validation, or every asset's for the panel
    model, which has no use for --asset."""
    if entry.data == "panel" and args.asset_given:
        refuse_asset(args, f"--model {args.model} trains on every asset of the panel")
    return har_data.prepare_kind(panel, entry.data, asset=args.asset, split=args.split, end=args.end,
                                 validation=args.validation, source=source)


def prepare_har(args: argparse.Namespace, panel, source: str):
    """The HAR data set of --asset, split by --split/--end/--validation, and its OLS on the same training rows."""
    prepared = har_data.prepare(panel, asset=args.asset, split=args.split, end=args.end, validation=args.validation,
                                source=source)
    return prepared, reference.ols_for(panel, args.asset, args.split, args.end, validation=args.validation)


def default_out() -> Path:
    return Path("runs") / datetime.now().strftime("%Y%m%d-%H%M%S-%f")


# A smoke run: too short for Adam(0.01) to reach OLS within 0.5% (that takes ~25 epochs from Keras's init), so
# --quick reports ols_reached as not judged; gradients, portability, determinism and arithmetic are still checked.
QUICK_EPOCHS = 5


def parse_names(text: str | None, known, what: str) -> list[str]:
    """A comma-separated option (`--engines`, `--models`...) as a list of known names; None means all of them."""
    if text is None:
        return list(known)
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise NativeLoopsError(f"unknown {what}(s) {', '.join(unknown) or '(none)'}; --{what}s takes a "
                               f"comma-separated list of {', '.join(known)}")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise NativeLoopsError(f"--{what}s names {', '.join(repeated)} more than once; give each once")
    return names


def check_installed(engines: list[str]) -> None:
    """One line for an engine of --engines that is not installed (commands that cannot go on without it)."""
    missing = [e for e in engines if not runner.engine_installed(e)]
    if missing:
        raise NativeLoopsError(f"{', '.join(missing)} not installed; `make setup` installs every engine, or drop it "
                               "from --engines")


def parse_engines(text: str) -> list[str]:
    return parse_names(text, ENGINES, "engine")


def compare(args: argparse.Namespace) -> int:
    """Exit 0 when every check passed on every engine, 1 when a check failed, 3 when an engine is missing."""
    engines = parse_engines(args.engines)
    if args.quick and args.epochs is not None:
        raise NativeLoopsError(f"--quick runs {QUICK_EPOCHS} epochs, so it cannot take --epochs; drop one of them")
    if args.model not in zoo_matrix.ZOO:
        raise NativeLoopsError(f"unknown model {args.model!r}; --model takes one of {', '.join(zoo_matrix.MODELS)}")
    entry, har = zoo_matrix.ZOO[args.model], args.model == "har"
    if args.float64 and not har:
        raise NativeLoopsError(f"--float64 checks the HAR's gradient formula, which --model {args.model} does not "
                               "have; drop one of them")
    # The HAR trains with the referee's plain spec (MSE, Adam); another model with what its zoo entry needs.
    cfg = train_config(args, epochs=QUICK_EPOCHS if args.quick else None,
                       seeds_after=seed_noise.COMPARE_SEEDS if har else 0).replace(**({} if har else entry.spec))
    # The HAR's same-arithmetic run lasts the whole run; another model's its first few epochs (see the constant).
    same_epochs = args.same_epochs
    if same_epochs is None:
        same_epochs = cfg.epochs if har else min(cfg.epochs, tolerances.SAME_ARITHMETIC_EPOCHS)
    if not 1 <= same_epochs <= cfg.epochs:
        raise NativeLoopsError(f"--same-epochs must be between 1 and the run's {cfg.epochs} epochs, got {same_epochs}")
    panel, source = load(args)
    if har:
        prepared, ols = prepare_har(args, panel, source)
    else:  # the OLS checks are the HAR's: another model has no known answer
        prepared = model_data(args, panel, source, entry)
        ols = None
    check_epochs(cfg, prepared.n_train)
    out = Path(args.out) if args.out else default_out()
    # seed_noise sets one engine's fit against another's: with one engine, its 100 seeds would judge nothing.
    noise = har and len(engines) > 1
    with atomic_folder(out) as tmp:
        with report.progress(engines) as on_event:
            outcome = runner.run(prepared, cfg, engines, tmp, build=entry.build, har=har, same_epochs=same_epochs,
                                 float64=args.float64, on_event=on_event,
                                 seeds=seed_noise.seeds_of(cfg.seed, seed_noise.COMPARE_SEEDS) if noise else ())
        results, found = checks.run_all(outcome, prepared, ols, judge_ols=not args.quick,
                                        draws_randomness=entry.draws,
                                        same_epochs=same_epochs if same_epochs < cfg.epochs else None)
        spreads = {e: seed_noise.Spread.of_compare(outcome.engine_folder(e), results[f"keras-{e}"], prepared)
                   for e in outcome.complete} if har else {}
        if any(s.seeds is not None for s in spreads.values()):  # the HAR's: is an engine's run beyond seed noise?
            found += seed_noise.seed_noise(spreads)
        if ols:
            report.print_paths_table(ols, results, prepared)
        else:
            report.print_model_table(args.model, results, prepared)
        report.print_curves(results, prepared, ols)
        report.print_checks(found, outcome.failed)
        if args.quick:
            report.console().print(f"--quick: {cfg.epochs} epochs" + (", so ols_reached is not judged" if har else ""))
        if har and not noise:
            report.console().print("seed_noise sets one engine's fit against another's: give --engines two or more")
        summary = report.report_json(prepared, ols, cfg, results, found, outcome.failed) | {
            "quick": args.quick, "model": args.model,
            "seed_noise": seed_noise.summary(spreads, prepared.features) if spreads else None}
        write_json(tmp / "report.json", summary | {"options": options(args)})
        figures.curves(tmp / "curves.png", {n: r.val_loss for n, r in results.items()}, ols.val_mse if ols else None)
        if ols:
            figures.slopes(tmp / "slopes.png", {n: report.path_summary(r, prepared)["slopes"]
                                                for n, r in results.items()}, ols.slope_dict())
    report.console().print(f"report: {report.shown(out)}/report.json, curves.png" + (", slopes.png" if ols else ""))
    for engine in outcome.failed:  # the one line says what; the worker's log has the traceback, if there was one
        if (out / "engines" / engine / "worker.log").exists():
            report.console().print(f"{engine}: the worker's output (a traceback, if it raised): "
                                   f"{report.shown(out)}/engines/{engine}/worker.log")
    if outcome.failed:
        return 3
    return 0 if all(c.passed for c in found) else 1


def bench(args: argparse.Namespace) -> int:
    engines = parse_engines(args.engines)
    if args.repeats < 1:
        raise NativeLoopsError(f"--repeats must be at least 1, got {args.repeats}")
    if args.json:  # before the benchmark, not after it
        check_writable(args.json)  # a folder, a missing folder, no permission
        if Path(args.json).suffix.lower() != ".json":
            raise NativeLoopsError(f"--json {args.json!r}: the timings are written as JSON; give a file name ending "
                                   "in .json")
        if exists(args.json, "--json"):
            raise NativeLoopsError(f"--json {args.json!r} already exists; choose a new file (nothing is overwritten)")
    models = [] if args.models is None else list(zoo_matrix.MODELS) if args.models == "all" else parse_names(
        args.models, zoo_matrix.MODELS + ("all",), "model")
    if "all" in models:
        raise NativeLoopsError("--models all names every model already; give it alone, or list the models")
    cfg = train_config(args)
    panel, source = load(args)
    prepared, _ = prepare_har(args, panel, source)
    check_epochs(cfg, prepared.n_train)
    zoo_data = {}
    for name in models:  # every model's data (and a bad --asset/--split for it) before anything trains
        entry = zoo_matrix.ZOO[name]
        zoo_data[name] = (har_data.prepare_kind(panel, entry.data, asset=args.asset, split=args.split, end=args.end,
                                                validation=args.validation, source=source), cfg.replace(**entry.spec))
        check_epochs(zoo_data[name][1], zoo_data[name][0].n_train)
    totals = {e: len(bench_paths.bench_paths(e)) * args.repeats for e in engines} | {"numpy": args.repeats} | (
        {"walk-forward": 1} if "jax" in engines else {}) | {
        f"zoo {m}": sum(len(bench_paths.zoo_paths(e, m)) for e in engines) * args.repeats for m in models}
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="native-loops-bench-"))
        tick = stack.enter_context(report.bench_progress(totals))
        # one worker per engine for the HAR and every zoo model: an engine starts in seconds, once
        pool = stack.enter_context(runner.Pool(engines, Path(tmp), jobs=1))
        timings = bench_paths.run(prepared, cfg, engines, Path(tmp), args.repeats, on_timing=tick, pool=pool)
        if "jax" in engines:  # the many-models claim: every walk-forward refit of every asset at once
            windows = walk.build_windows(panel, sorted(panel["activo"].unique()), args.split, args.end)
            (Path(tmp) / "walk").mkdir()
            wf_engines = [e for e in ("jax", "torch") if e in engines]
            tick("walk-forward", f"every refit at once on {' and '.join(wf_engines)}", done=False)
            timings["walk_forward"] = walk.run(windows, cfg, Path(tmp) / "walk", engines=wf_engines,
                                               fit_refits=2)["timing"]
            tick("walk-forward", f"{windows.n_models} models on {' and '.join(wf_engines)}")
        for name, (data, model_cfg) in zoo_data.items():  # each model of the zoo: fit against the native loops
            (Path(tmp) / name).mkdir()
            timed = bench_paths.run(data, model_cfg, engines, Path(tmp) / name, args.repeats,
                                    on_timing=lambda engine, path, row=f"zoo {name}": tick(row, f"{engine} {path}"),
                                    model=name, pool=pool)
            timings.setdefault("zoo", {})[name] = timed
            timings["incomplete"] |= {f"{name}/{e}": why for e, why in timed.pop("incomplete").items()}
    report.print_bench(timings, bench_paths.targets(timings))
    if args.json:
        write_json(args.json, timings | {"config": cfg.to_dict(), "seed": cfg.seed, "options": options(args)})
        report.console().print(f"wrote {report.shown(args.json)}")
    return 3 if timings["incomplete"] else 0


def walk_forward(args: argparse.Namespace) -> int:
    cfg = train_config(args)
    panel, source = load(args)
    known = sorted(panel["activo"].unique())
    assets = parse_names(args.assets, known, "asset")  # unknown or repeated assets stop here
    cores = os.cpu_count() or 1
    most = max(2, cores)  # the default, 2, even on one core
    if not 1 <= args.devices <= most:
        raise NativeLoopsError(f"--devices must be between 1 and {most} (on CPU, XLA makes that many devices of this "
                               f"machine's {cores} cores), got {args.devices}")
    if args.fit_refits < 0:
        raise NativeLoopsError(f"--fit-refits must be 0 or more, got {args.fit_refits}")
    if args.asset is not None and args.asset not in assets:
        raise NativeLoopsError(f"--asset {args.asset!r} is not among the walk-forward's assets "
                               f"({', '.join(assets)}); pick one of them, or add it to --assets")
    shown = args.asset or assets[0]
    if cfg.epochs > MAX_WALK_EPOCHS:
        raise NativeLoopsError(f"--epochs {cfg.epochs:,}: the walk-forward draws every epoch's key up front; ask for "
                               f"at most {MAX_WALK_EPOCHS:,} epochs")
    windows = walk.build_windows(panel, assets, args.split, args.end)
    if args.fit_refits > windows.n_models:
        raise NativeLoopsError(f"--fit-refits {args.fit_refits:,}: there are {windows.n_models:,} refits to time; ask "
                               "for at most that many")
    out = Path(args.out) if args.out else default_out()
    with atomic_folder(out) as tmp:
        engines = [e for e in ("jax", "torch") if runner.engine_installed(e)]
        result = walk.run(windows, cfg, tmp, engines=engines, devices=args.devices, fit_refits=args.fit_refits)
        sharded = [name for name in result["forecasts"] if name.startswith("jax-vmap-") and name != "jax-vmap-1dev"]
        forecasts = {"ols": walk.ols_forecasts(windows)} | {
            name: f for name, f in result["forecasts"].items() if name not in sharded}  # sharded = 1 device
        mse = {name: walk.oos_mse(windows, f) for name, f in forecasts.items()}
        report.print_walk_forward(mse, result["timing"], windows)
        for note in result["notes"]:
            report.console().print(note)
        summary = {"config": cfg.to_dict(), "seed": cfg.seed, "versions": versions(), "source": source,
                   "models": windows.n_models, "oos_mse": mse, "walk_forward": result["timing"],
                   "notes": result["notes"]}
        write_json(tmp / "walk_forward.json", summary | {"options": options(args)})
        figures.forecasts(tmp / "forecasts.png", windows, forecasts, shown)
        shutil.rmtree(tmp / "engines")  # the workers' scratch, as sweep and seeds leave none
        (tmp / "windows.npz").unlink()
    report.console().print(f"report: {report.shown(out)}/walk_forward.json, forecasts.png")
    return 0


def zoo(args: argparse.Namespace) -> int:
    """Exit 0 when every judged cell is within tolerance on every engine, 1 when one is not, 3 when an engine is
    missing or crashed."""
    models = parse_names(args.models, zoo_matrix.MODELS, "model")
    optimizers = parse_names(args.optimizers, tuple(zoo_matrix.OPTIMIZERS), "optimizer")
    engines, cfg = parse_engines(args.engines), train_config(args)
    if args.rows is not None and args.rows < 1:
        raise NativeLoopsError(f"--rows must be at least 1, got {args.rows}")
    panel, source = load(args)
    kinds = {zoo_matrix.ZOO[m].data for m in models}
    if args.asset_given and kinds == {"panel"}:
        refuse_asset(args, f"--models {args.models} trains on every asset of the panel")
    for kind in sorted(kinds):  # bad --asset/--split/--end, too many --epochs or --rows stop here, before any worker
        prepared = har_data.prepare_kind(panel, kind, asset=args.asset, split=args.split, end=args.end,
                                         validation=args.validation)
        if args.rows is not None and args.rows > prepared.n_train:
            of = ", ".join(m for m in models if zoo_matrix.ZOO[m].data == kind)
            raise NativeLoopsError(f"--rows {args.rows:,}: more than the {prepared.n_train:,} training rows of {of}; "
                                   "ask for at most that many, or leave --rows out for all")
        check_epochs(cfg, args.rows or prepared.n_train)
    out = Path(args.out) if args.out else default_out()
    cells = len(models) * len(optimizers) * sum(len(zoo_matrix.paths_on(e, args.fast_paths)) for e in engines)
    with atomic_folder(out) as tmp, report.cell_progress(cells) as on_cell:
        found = zoo_matrix.run(panel, models=models, engines=engines, optimizers=optimizers, folder=tmp,
                               epochs=cfg.epochs, rows=args.rows, seed=cfg.seed, asset=args.asset, split=args.split,
                               end=args.end, validation=args.validation, fast=args.fast_paths, on_cell=on_cell)
        report.print_zoo(found)
        write_json(tmp / "zoo.json", found | {"source": source, "models": models, "optimizers": optimizers,
                                             "options": options(args)})
        figures.zoo(tmp / "zoo.png", found["cells"], found["tolerance"])
        for scratch in tmp.glob("zoo-*.npz"):
            scratch.unlink()
    report.console().print(f"report: {report.shown(out)}/zoo.json, zoo.png")
    if found["incomplete"]:
        return 3
    return 0 if zoo_matrix.passed(found) else 1


def distributed(args: argparse.Namespace) -> int:
    """Exit 0 when every engine's N-process run ends at its one-process weights, 1 when one does not, 3 when an
    engine is missing or its run failed."""
    engines = parse_names(args.engines, dist.ENGINES, "engine")
    cores = os.cpu_count() or 1
    if not 1 <= args.processes <= cores:
        raise NativeLoopsError(f"--processes must be between 1 and this machine's {cores} cores (one process "
                               f"each, one CPU device each), got {args.processes}")
    check_installed(engines)
    entry = zoo_matrix.ZOO.get(args.model)
    if args.model not in dist.MODELS:
        why = (": its sample weights are not taken by the data-parallel loops" if args.model in zoo_matrix.ZOO
               else "")
        raise NativeLoopsError(f"--model must be one of {', '.join(dist.MODELS)}, got {args.model!r}{why}")
    epochs = dist.ZOO_EPOCHS if args.epochs is None and args.model != "har" else None
    cfg = train_config(args, epochs=epochs).replace(**{k: v for k, v in entry.spec.items() if k != "metrics"})
    panel, source = load(args)
    prepared = model_data(args, panel, source, entry)
    check_epochs(cfg, prepared.n_train)
    # With the HAR, JAX's walk-forward across processes too: every refit of every asset, the model axis over them
    windows = walk.build_windows(panel, sorted(panel["activo"].unique()), args.split, args.end).model_inputs() \
        if "jax" in engines and args.model == "har" else None
    out = Path(args.out) if args.out else default_out()
    with atomic_folder(out) as tmp:
        with report.progress(engines) as on_event:
            found = dist.run(prepared, cfg, engines, processes=args.processes, folder=tmp, build=entry.build,
                             windows=windows, fit=args.fit, on_event=on_event)
        report.print_distributed(found)
        write_json(tmp / "distributed.json", found | {"source": source, "model": args.model, "options": options(args)})
        # a failed launch's output stays, named in its line, and so do the workers' logs (engines/<engine>)
        kept = [] if found["incomplete"] else [*tmp.glob("*.log"), *tmp.glob("engines")]
        for scratch in [*tmp.glob("*.npz"), *kept]:
            shutil.rmtree(scratch) if scratch.is_dir() else scratch.unlink()
    report.console().print(f"report: {report.shown(out)}/distributed.json")
    if found["incomplete"]:
        return 3
    return 0 if dist.passed(found) else 1


# --seeds: pairs of seeds are the yardstick and the tolerance their 99th percentile, which takes 100 pairs at least
# to be more than the largest gap of a handful (15 seeds: 105 pairs); every pair's gap is held (n²/2 of them).
MIN_SEEDS, MAX_SEEDS = 15, 5000


def seeds(args: argparse.Namespace) -> int:
    """Exit 0 when every engine pair's default runs are within the seeds' spread, 1 when one is not, 3 when an
    engine is missing or failed."""
    engines = parse_engines(args.engines)
    if not MIN_SEEDS <= args.seeds <= MAX_SEEDS:
        raise NativeLoopsError(f"--seeds must be between {MIN_SEEDS} and {MAX_SEEDS:,} (the tolerance is the 99th "
                               f"percentile of the gaps between pairs of seeds, which {MIN_SEEDS} seeds' "
                               f"{MIN_SEEDS * (MIN_SEEDS - 1) // 2} pairs are the fewest to measure), got {args.seeds}")
    if args.model not in zoo_matrix.ZOO:
        raise NativeLoopsError(f"unknown model {args.model!r}; --model takes one of {', '.join(zoo_matrix.MODELS)}")
    entry, har = zoo_matrix.ZOO[args.model], args.model == "har"
    cfg = train_config(args, seeds_after=args.seeds).replace(**({} if har else entry.spec))
    panel, source = load(args)
    prepared = model_data(args, panel, source, entry)
    check_models(cfg, prepared.n_train, args.seeds, "--seeds or --epochs")
    plan, notes = seed_plan(engines, entry.draws, args.seeds, cfg.seed)
    out = Path(args.out) if args.out else default_out()
    with atomic_folder(out) as tmp:
        with report.progress(engines) as on_event:
            failed, timings = seed_noise.run(prepared, cfg, plan, tmp, build=entry.build, on_event=on_event)
        spreads = {e: seed_noise.Spread.load(tmp / "engines" / e, e, prepared, har) for e in engines
                   if e not in failed}
        found = seed_noise.seed_noise(spreads)
        summary = seed_noise.summary(spreads, prepared.features if har else ())
        report.print_seeds(summary, timings, args.model)
        report.print_checks(found, failed)
        for note in notes:
            report.console().print(note)
        write_json(tmp / "seeds.json", {
            "config": cfg.to_dict(), "seed": cfg.seed, "seeds": seed_noise.seeds_of(cfg.seed, args.seeds),
            "versions": versions(), "source": source, "model": args.model, "engines": summary, "timings": timings,
            "checks": [c.__dict__ for c in found], "failed": failed, "notes": notes, "options": options(args)})
        ols = reference.ols_for(panel, args.asset, args.split, args.end, validation=args.validation) if har else None
        figures.seeds(tmp / "seeds.png", spreads, prepared.features if har else (), args.model, ols)
        shutil.rmtree(tmp / "engines")
        (tmp / "data.npz").unlink()
    report.console().print(f"report: {report.shown(out)}/seeds.json, seeds.png")
    if failed:
        return 3
    return 0 if all(c.passed for c in found) else 1


def seed_plan(engines: list[str], draws: bool, count: int, seed: int) -> tuple[dict[str, list[int]], list[str]]:
    """Which engines train the model once per seed (engine -> seeds; none: `fit` at the run's seed only), and
    notes on the others."""
    plan, notes = {}, []
    for engine in engines:
        many = engine in runner.MANY_ENGINES and not (draws and engine == "torch")
        plan[engine] = seed_noise.seeds_of(seed, count) if many else []
        if engine == "tensorflow":
            notes.append("tensorflow: no many-model trainer (tf.vectorized_map over a GradientTape step is not "
                         "built); its default run is judged against the other engines' seeds")
        elif not many:
            notes.append(f"{engine}: the model draws random numbers while training, and torch.func.vmap cannot "
                         "give each model its own; its default run is judged against the other engines' seeds")
    if not any(plan.values()):
        raise NativeLoopsError("no engine of --engines can train many seeds at once (jax and torch can; torch not "
                               "for a model that draws random numbers): add jax")
    return plan, notes


# Models per vmapped call of the sweep (learning rates × seeds): the HAR's 4 weights and Adam's slots are small,
# but each model gathers its own batches every epoch.
MAX_SWEEP_MODELS = 5000


def parse_numbers(text: str, kind, what: str) -> list:
    """A comma-separated list of positive numbers (`--learning-rates`, `--batch-sizes`), each once."""
    try:
        values = [kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or not all(math.isfinite(v) and v > 0 for v in values):  # math: a Python int of any size
        raise NativeLoopsError(f"--{what} takes a comma-separated list of positive {kind.__name__}s, got {text!r}")
    if len(set(values)) < len(values):
        raise NativeLoopsError(f"--{what} names a value more than once, got {text!r}; give each once")
    return values


def sweep(args: argparse.Namespace) -> int:
    engines = parse_names(args.engines, grid.ENGINES, "engine")
    check_installed(engines)
    rates = parse_numbers(args.learning_rates, float, "learning-rates")
    sizes = parse_numbers(args.batch_sizes, int, "batch-sizes")
    if args.seeds < 1:
        raise NativeLoopsError(f"--seeds must be at least 1, got {args.seeds}")
    if len(rates) * args.seeds > MAX_SWEEP_MODELS:
        raise NativeLoopsError(f"{len(rates)} learning rates × {args.seeds} seeds is {len(rates) * args.seeds:,} "
                               f"models in one call, more than {MAX_SWEEP_MODELS:,}; ask for fewer")
    cfg = train_config(args, seeds_after=args.seeds)
    panel, source = load(args)
    prepared, ols = prepare_har(args, panel, source)
    check_models(cfg, prepared.n_train, len(rates) * args.seeds, "--learning-rates, --seeds or --epochs")
    too_big = [b for b in sizes if b > prepared.n_train]
    if too_big:
        raise NativeLoopsError(f"--batch-sizes {', '.join(map(str, too_big))}: larger than the {prepared.n_train:,} "
                               "training rows")
    out = Path(args.out) if args.out else default_out()
    with atomic_folder(out) as tmp:
        with report.progress(engines) as on_event:
            found = grid.run(prepared, cfg, engines, tmp, learning_rates=rates, batch_sizes=sizes, seeds=args.seeds,
                             on_event=on_event)
        best = {e: grid.best(f["val_mse"], rates, sizes) for e, f in found.items()}
        report.print_sweep(found, best, rates, sizes, ols.val_mse, args.seeds)
        write_json(tmp / "sweep.json", {
            "config": cfg.to_dict(), "seed": cfg.seed, "seeds": seed_noise.seeds_of(cfg.seed, args.seeds),
            "versions": versions(), "source": source, "learning_rates": rates, "batch_sizes": sizes,
            "ols_val_mse": ols.val_mse, "best": best,
            "engines": {e: {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in f.items()}
                        for e, f in found.items()}, "options": options(args)})
        figures.sweep(tmp / "sweep.png", {e: f["val_mse"] for e, f in found.items()}, rates, sizes, ols.val_mse,
                      best)
        shutil.rmtree(tmp / "engines")
        (tmp / "data.npz").unlink()
    report.console().print(f"report: {report.shown(out)}/sweep.json, sweep.png")
    return 0
