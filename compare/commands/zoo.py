"""`native-loops zoo`: every zoo model × optimizer, on `fit` and on each native loop from the same weights and
batches (docs/zoo.md). Exit 0 when every judged cell is within tolerance, 1 when one is not, 3 when an engine is
missing or crashed."""
from __future__ import annotations

import argparse

from compare.commands.common import (check_epochs, load, options, out_folder, parse_engines, parse_names, refuse_asset,
                                     run_folder, train_config)
from compare.data import panel
from compare.errors import NativeLoopsError
from compare.io import write_json
from compare.referee import figures, report, zoo


def run(args: argparse.Namespace) -> int:
    """Exit 0 when every judged cell is within tolerance on every engine, 1 when one is not, 3 when an engine is
    missing or crashed."""
    models = parse_names(args.models, zoo.MODELS, "model")
    optimizers = parse_names(args.optimizers, tuple(zoo.OPTIMIZERS), "optimizer")
    engines, cfg = parse_engines(args.engines), train_config(args)
    if args.rows is not None and args.rows < 1:
        raise NativeLoopsError(f"--rows must be at least 1, got {args.rows}")
    prices, source = load(args)
    kinds = {zoo.ZOO[m].data for m in models}
    if args.asset_given and kinds == {"panel"}:
        refuse_asset(args, f"--models {args.models} trains on every asset of the panel")
    for kind in sorted(kinds):  # bad --asset/--split/--end, too many --epochs or --rows stop here, before any worker
        prepared = panel.prepare_kind(prices, kind, asset=args.asset, split=args.split, end=args.end,
                                      validation=args.validation)
        if args.rows is not None and args.rows > prepared.n_train:
            of = ", ".join(m for m in models if zoo.ZOO[m].data == kind)
            raise NativeLoopsError(f"--rows {args.rows:,}: more than the {prepared.n_train:,} training rows of {of}; "
                                   "ask for at most that many, or leave --rows out for all")
        check_epochs(cfg, args.rows or prepared.n_train)
    cells = len(models) * len(optimizers) * sum(len(zoo.paths_on(e, args.fast_paths)) for e in engines)
    with run_folder(out_folder(args), ["zoo.json", "zoo.png"]) as tmp, report.cell_progress(cells) as on_cell:
        found = zoo.run(prices, models=models, engines=engines, optimizers=optimizers, folder=tmp,
                        epochs=cfg.epochs, rows=args.rows, seed=cfg.seed, asset=args.asset, split=args.split,
                        end=args.end, validation=args.validation, fast=args.fast_paths, on_cell=on_cell)
        report.print_zoo(found)
        write_json(tmp / "zoo.json", found | {"source": source, "models": models, "optimizers": optimizers,
                                              "options": options(args)})
        figures.zoo(tmp / "zoo.png", found["cells"], found["tolerance"])
        for scratch in tmp.glob("zoo-*.npz"):
            scratch.unlink()
    if found["incomplete"]:
        return 3
    return 0 if zoo.passed(found) else 1
