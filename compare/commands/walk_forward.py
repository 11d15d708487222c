"""`native-loops walk-forward`: every refit of every asset at once, against OLS's forecasts."""
from __future__ import annotations

import argparse
import os
import shutil

from compare.commands.common import load, options, out_folder, parse_names, run_folder, train_config
from compare.engines import runner
from compare.errors import HarDataError, NativeLoopsError
from compare.io import write_json
from compare.referee import figures, report
from compare.speed import walk_forward
from keras_side.results import versions


# The walk-forward gathers each epoch's batches inside its loop, and draws only one key per epoch up front (8 bytes
# each on JAX): 80 MB at this many.
MAX_WALK_EPOCHS = 10_000_000


def run(args: argparse.Namespace) -> int:
    cfg = train_config(args)
    prices, source = load(args)
    known = sorted(prices["activo"].unique())
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
    ready, unready = walk_forward.refittable(prices, assets, args.split, args.end)
    if unready:
        asset, why = next(iter(unready.items()))
        hint = f", so leave {', '.join(map(repr, unready))} out: --assets {','.join(ready)}" if ready else ""
        raise HarDataError(f"{why}; the walk-forward refits every asset it is given (--assets, default all){hint}")
    windows = walk_forward.build_windows(prices, assets, args.split, args.end)
    if args.fit_refits > windows.n_models:
        raise NativeLoopsError(f"--fit-refits {args.fit_refits:,}: there are {windows.n_models:,} refits to time; ask "
                               "for at most that many")
    with run_folder(out_folder(args), ["walk_forward.json", "forecasts.png"]) as tmp:
        engines = [e for e in ("jax", "torch") if runner.engine_installed(e)]
        result = walk_forward.run(windows, cfg, tmp, engines=engines, devices=args.devices, fit_refits=args.fit_refits)
        sharded = [name for name in result["forecasts"] if name.startswith("jax-vmap-") and name != "jax-vmap-1dev"]
        forecasts = {"ols": walk_forward.ols_forecasts(windows)} | {
            name: f for name, f in result["forecasts"].items() if name not in sharded}  # sharded = 1 device
        mse = {name: walk_forward.oos_mse(windows, f) for name, f in forecasts.items()}
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
    return 0
