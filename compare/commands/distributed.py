"""`native-loops distributed`: each engine's N-process data-parallel run against its one-process run
(docs/distributed.md)."""
from __future__ import annotations

import argparse
import os
import shutil

from compare import distributed
from compare.commands.common import (check_epochs, check_installed, load, model_data, options, out_folder, parse_names,
                                     run_folder, train_config)
from compare.errors import NativeLoopsError
from compare.io import write_json
from compare.referee import report, zoo
from compare.speed import walk_forward
from keras_side.backend import ENGINES


def run(args: argparse.Namespace) -> int:
    """Exit 0 when every engine's N-process run ends at its one-process weights, 1 when one does not, 3 when an
    engine is missing or its run failed."""
    engines = parse_names(args.engines, ENGINES, "engine")  # every engine has a launcher
    cores = os.cpu_count() or 1
    if not 1 <= args.processes <= cores:
        raise NativeLoopsError(f"--processes must be between 1 and this machine's {cores} cores (one process "
                               f"each, one CPU device each), got {args.processes}")
    check_installed(engines)
    entry = zoo.ZOO.get(args.model)
    if args.model not in distributed.MODELS:
        why = (": its sample weights are not taken by the data-parallel loops" if args.model in zoo.ZOO
               else "")
        raise NativeLoopsError(f"--model must be one of {', '.join(distributed.MODELS)}, got {args.model!r}{why}")
    epochs = distributed.ZOO_EPOCHS if args.epochs is None and args.model != "har" else None
    cfg = train_config(args, epochs=epochs).replace(**{k: v for k, v in entry.spec.items() if k != "metrics"})
    prices, source = load(args)
    prepared = model_data(args, prices, source, entry)
    check_epochs(cfg, prepared.n_train)
    # With the HAR, JAX's walk-forward across processes too: every refit of every asset (of those that can be
    # refit: the check is the launch's, and --asset's run does not need the others), the model axis over them
    windows, left_out = None, {}
    if "jax" in engines and args.model == "har":
        assets, left_out = walk_forward.refittable(prices, sorted(prices["activo"].unique()), args.split, args.end)
        windows = walk_forward.build_windows(prices, assets, args.split, args.end).model_inputs()
    for why in left_out.values():
        report.console().print(f"the walk-forward check leaves out {why}")
    with run_folder(out_folder(args), ["distributed.json"]) as tmp:
        with report.progress(engines) as on_event:
            found = distributed.run(prepared, cfg, engines, processes=args.processes, folder=tmp, build=entry.build,
                                    windows=windows, fit=args.fit, on_event=on_event)
        report.print_distributed(found)
        write_json(tmp / "distributed.json", found | {"source": source, "model": args.model, "options": options(args)}
                   | ({"walk_forward_left_out": left_out} if left_out else {}))
        # a failed launch's output stays, named in its line, and so do the workers' logs (engines/<engine>)
        kept = [] if found["incomplete"] else [*tmp.glob("*.log"), *tmp.glob("engines")]
        for scratch in [*tmp.glob("*.npz"), *kept]:
            shutil.rmtree(scratch) if scratch.is_dir() else scratch.unlink()
    if found["incomplete"]:
        return 3
    return 0 if distributed.passed(found) else 1
