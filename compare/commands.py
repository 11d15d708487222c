"""What each subcommand does. Only `models` and `train` import Keras in this process, after choosing its backend."""
from __future__ import annotations

import argparse
from datetime import datetime
from pathlib import Path

from compare import data as har_data
from compare import paths, reference, report, synthetic
from compare.errors import NativeLoopsError
from compare.io import atomic_folder, write_json
from keras_side.backend import use_backend
from keras_side.config import TrainConfig


def load(args: argparse.Namespace, **seed):
    """The validated panel and its source line, from --data or the embedded synthetic panel."""
    return har_data.load_panel(args.data, **seed)


def data(args: argparse.Namespace) -> int:
    if args.out and args.data:
        raise NativeLoopsError("--out writes the synthetic panel, so it cannot be combined with --data; drop one")
    panel, source = load(args, seed=args.seed)
    fits = {a: reference.ols_for(panel, a, args.split, args.end) for a in sorted(panel["activo"].unique())}
    if args.out:
        synthetic.write_parquet(panel, args.out, seed=args.seed)
    report.print_data_summary(panel, source, fits, synthetic.TRUE if args.data is None else None)
    if args.out:
        report.console().print(f"wrote {args.out}")
    return 0


def models(args: argparse.Namespace) -> int:
    use_backend(args.engine)
    from keras_side import models as builders
    from keras_side.determinism import seed_everything

    for name, build in builders.BUILDERS.items():
        seed_everything(0)
        model = builders.ensure_built(build(), builders.example_inputs(name))
        report.print_layers(name, builders.layer_table(model), args.engine)
    return 0


def train(args: argparse.Namespace) -> int:
    path = paths.get(args.path)
    panel, source = load(args)
    prepared = har_data.prepare(panel, asset=args.asset, split=args.split, end=args.end, source=source)
    fit = reference.ols_for(panel, args.asset, args.split, args.end)
    use_backend(path.engine)
    from keras_side import models as builders
    from keras_side.determinism import seed_everything

    cfg = TrainConfig(epochs=args.epochs, seed=args.seed)
    seed_everything(cfg.seed)
    result = path.train(builders.har(), prepared, cfg)
    report.print_paths_table(fit, {result.path: result}, prepared)
    return 0


def default_out() -> Path:
    return Path("runs") / datetime.now().strftime("%Y%m%d-%H%M%S-%f")


def compare(args: argparse.Namespace) -> int:
    panel, source = load(args)
    prepared = har_data.prepare(panel, asset=args.asset, split=args.split, end=args.end, source=source)
    fit = reference.ols_for(panel, args.asset, args.split, args.end)
    out = Path(args.out) if args.out else default_out()
    with atomic_folder(out) as tmp:
        report.print_data_summary(panel, source, {args.asset: fit}, None)
        report.console().print(f"{prepared.n_train} training and {prepared.n_test} test rows for {args.asset!r}")
        write_json(tmp / "report.json", report.report_json(prepared, fit, TrainConfig(seed=args.seed)))
    report.console().print(f"report: {out}")
    return 0
