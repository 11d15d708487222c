"""`native-loops sweep`: learning rates × batch sizes × seeds, every model of a grid trained in one call."""
from __future__ import annotations

import argparse
import shutil

import numpy as np

from compare.commands.common import (check_installed, check_models, load, options, out_folder, parse_names,
                                     parse_numbers, prepare_har, run_folder, train_config)
from compare.errors import NativeLoopsError
from compare.io import write_json
from compare.referee import figures, report, seed_noise
from compare.speed import sweep
from keras_side.results import versions


# Models per vmapped call of the sweep (learning rates × seeds): the HAR's 4 weights and Adam's slots are small,
# but each model gathers its own batches every epoch.
MAX_SWEEP_MODELS = 5000


def run(args: argparse.Namespace) -> int:
    engines = parse_names(args.engines, sweep.ENGINES, "engine")
    check_installed(engines)
    rates = parse_numbers(args.learning_rates, float, "learning-rates")
    sizes = parse_numbers(args.batch_sizes, int, "batch-sizes")
    if args.seeds < 1:
        raise NativeLoopsError(f"--seeds must be at least 1, got {args.seeds}")
    if len(rates) * args.seeds > MAX_SWEEP_MODELS:
        raise NativeLoopsError(f"{len(rates)} learning rates × {args.seeds} seeds is {len(rates) * args.seeds:,} "
                               f"models in one call, more than {MAX_SWEEP_MODELS:,}; ask for fewer")
    cfg = train_config(args, seeds_after=args.seeds)
    prices, source = load(args)
    prepared, ols = prepare_har(args, prices, source)
    check_models(cfg, prepared.n_train, len(rates) * args.seeds, "--learning-rates, --seeds or --epochs")
    too_big = [b for b in sizes if b > prepared.n_train]
    if too_big:
        raise NativeLoopsError(f"--batch-sizes {', '.join(map(str, too_big))}: larger than the {prepared.n_train:,} "
                               "training rows")
    with run_folder(out_folder(args), ["sweep.json", "sweep.png"]) as tmp:
        with report.progress(engines) as on_event:
            found = sweep.run(prepared, cfg, engines, tmp, learning_rates=rates, batch_sizes=sizes, seeds=args.seeds,
                              on_event=on_event)
        best = {e: sweep.best(f["val_mse"], rates, sizes) for e, f in found.items()}
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
    return 0
