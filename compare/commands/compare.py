"""`native-loops compare`: every path on every engine, from the same weights, judged by the referee (docs/compare.md).
Exit 0 when every check passed on every engine, 1 when a check failed, 3 when an engine is missing."""
from __future__ import annotations

import argparse

import numpy as np

from compare.commands.common import (check_epochs, load, model_data, options, out_folder, parse_engines, prepare_har,
                                     run_folder, train_config)
from compare.engines import faults, runner
from compare.errors import NativeLoopsError
from compare.io import write_json
from compare.referee import checks, figures, report, seed_noise, tolerances, zoo


# A smoke run: too short for Adam(0.01) to come near OLS (every seed ends beyond ols_reached's hard bounds), so
# --quick reports ols_reached as not judged; gradients, portability, determinism and arithmetic are still checked.
QUICK_EPOCHS = 5


def run(args: argparse.Namespace) -> int:
    """Exit 0 when every check passed on every engine, 1 when a check failed, 3 when an engine is missing."""
    engines = parse_engines(args.engines)
    if args.quick and args.epochs is not None:
        raise NativeLoopsError(f"--quick runs {QUICK_EPOCHS} epochs, so it cannot take --epochs; drop one of them")
    if args.model not in zoo.ZOO:
        raise NativeLoopsError(f"unknown model {args.model!r}; --model takes one of {', '.join(zoo.MODELS)}")
    entry, har = zoo.ZOO[args.model], args.model == "har"
    if args.float64 and not har:
        raise NativeLoopsError(f"--float64 checks the HAR's gradient formula, which --model {args.model} does not "
                               "have; drop one of them")
    check_ols_options(args, har)
    # The HAR trains with the referee's plain spec (MSE, Adam); another model with what its zoo entry needs.
    cfg = train_config(args, epochs=QUICK_EPOCHS if args.quick else None,
                       seeds_after=seed_noise.COMPARE_SEEDS if har else 0).replace(**({} if har else entry.spec))
    prices, source = load(args)
    if har:
        prepared, ols = prepare_har(args, prices, source)
    else:  # the OLS checks are the HAR's: another model has no known answer
        prepared = model_data(args, prices, source, entry)
        ols = None
    if args.converge:
        cfg = cfg.replace(**checks.converge_spec(prepared.n_train, cfg.batch_size))
    # The HAR's same-arithmetic run lasts the whole run; another model's its first few epochs (see the constant).
    same_epochs = args.same_epochs
    if same_epochs is None:
        same_epochs = cfg.epochs if har else min(cfg.epochs, tolerances.SAME_ARITHMETIC_EPOCHS)
    if not 1 <= same_epochs <= cfg.epochs:
        raise NativeLoopsError(f"--same-epochs must be between 1 and the run's {cfg.epochs} epochs, got {same_epochs}")
    check_epochs(cfg, prepared.n_train)
    out = out_folder(args)
    # The HAR once per seed, by each engine with a many-model trainer: ols_reached's band, and seed_noise's
    # yardstick (which sets one engine's fit against another's, so it needs two engines).
    # A --quick run on one engine has neither (no band, no pair of engines): it trains no seeds.
    wanted = har and (not args.quick or len(engines) > 1)
    seeds = seed_noise.seeds_of(cfg.seed, seed_noise.COMPARE_SEEDS) if wanted else ()
    plant = {"path": f"{engines[0]}-native", "fault": args.plant} if args.plant else None
    with run_folder(out, ["report.json", "curves.png"] + (["slopes.png"] if ols else [])) as tmp:
        with report.progress(engines) as on_event:
            outcome = runner.run(prepared, cfg, engines, tmp, build=entry.build, har=har, same_epochs=same_epochs,
                                 float64=args.float64, on_event=on_event, seeds=seeds, plant=plant)
        results = checks.load_results(outcome)
        spreads = {e: seed_noise.Spread.of_compare(outcome.engine_folder(e), results[f"keras-{e}"], prepared)
                   for e in outcome.complete} if har else {}
        band = ols_band(args, ols, spreads)
        found = checks.run_all(outcome, results, prepared, ols, band=band, draws_randomness=entry.draws,
                               same_epochs=same_epochs if same_epochs < cfg.epochs else None)
        found += seed_noise.seed_noise(spreads, seed_noise.COMPARE_PERCENTILE)
        if ols:
            report.print_paths_table(ols, results, prepared)
        else:
            report.print_model_table(args.model, results, prepared)
        report.print_curves(results, prepared, ols)
        report.print_checks(found, outcome.failed)
        undecided = band.undecided() if band else []
        for line in undecided:
            report.console().print(line)
        if args.quick:
            report.console().print(f"--quick: {cfg.epochs} epochs" + (", so ols_reached is not judged" if har else ""))
        if har and len(engines) == 1:
            report.console().print("seed_noise sets one engine's fit against another's: give --engines two or more")
        if plant:
            report.console().print(f"planted in {plant['path']}: {faults.FAULTS[args.plant]} (--plant {args.plant})")
        summary = report.report_json(prepared, ols, cfg, results, found, outcome.failed) | {
            "quick": args.quick, "converge": args.converge, "model": args.model, "plant": plant,
            "ols_band": band.__dict__ | {"undecided": undecided} if band else None,
            "seed_noise": seed_noise.summary(spreads, prepared.features) if spreads else None}
        write_json(tmp / "report.json", summary | {"options": options(args)})
        figures.curves(tmp / "curves.png", {n: r.val_loss for n, r in results.items()}, ols.val_mse if ols else None)
        if ols:
            figures.slopes(tmp / "slopes.png", {n: report.path_summary(r, prepared)["slopes"]
                                                for n, r in results.items()}, ols.slope_dict())
    for engine in outcome.failed:  # the one line says what; the worker's log has the traceback, if there was one
        if (out / "engines" / engine / "worker.log").exists():
            report.console().print(f"{engine}: the worker's output (a traceback, if it raised): "
                                   f"{report.shown(out)}/engines/{engine}/worker.log")
    if outcome.failed:
        return 3
    return 0 if all(c.passed for c in found) else 1


def check_ols_options(args: argparse.Namespace, har: bool) -> None:
    """--converge and --plant are questions about OLS: the HAR's, in a run long enough to reach it."""
    for flag, given in (("--converge", args.converge), ("--plant", args.plant)):
        if given and not har:
            raise NativeLoopsError(f"{flag} is judged by ols_reached, which only the HAR has; drop --model "
                                   f"{args.model} or {flag}")
        if given and args.quick:
            raise NativeLoopsError(f"--quick leaves ols_reached unjudged, which {flag} is about; drop one of them")
    if args.converge and args.epochs is not None:
        raise NativeLoopsError(f"--converge trains {checks.CONVERGE_STEPS} steps on its own schedule, so it cannot "
                               "take --epochs; drop one of them")


def ols_band(args: argparse.Namespace, ols, spreads: dict) -> checks.Band | None:
    """What ols_reached judges against: nothing in a --quick run; else the seeds' spread on this data (the hard
    bounds alone where no engine of the run trained seeds), or in a converged run the constants, confirmed by the
    seeds (trained the converged way too)."""
    if args.quick or ols is None:
        return None
    measured = [s for s in spreads.values() if s.seeds is not None]
    seeds = checks.Band.of_seeds(np.concatenate([s.seeds.test_loss for s in measured]),
                                 np.concatenate([s.seeds.slopes for s in measured]), ols,
                                 [s.engine for s in measured]) if measured else None
    if args.converge:
        return checks.Band.converged(seeds)
    return seeds or checks.Band.hard()
