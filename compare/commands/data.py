"""`native-loops data`: the panel (yours, or the embedded synthetic one) summarized asset by asset, with each asset's
OLS; `--out` writes the synthetic panel as parquet."""
from __future__ import annotations

import argparse
from pathlib import Path

from compare.commands.common import check_seed, load, refuse_asset
from compare.data import panel, reference, synthetic
from compare.errors import NativeLoopsError
from compare.io import exists
from compare.referee import report


def run(args: argparse.Namespace) -> int:
    if args.asset_given:
        refuse_asset(args, "data summarizes every asset")
    if args.out and args.data:
        raise NativeLoopsError("--out writes the synthetic panel, so it cannot be combined with --data; drop one")
    if args.seed is not None and args.data:  # it drew nothing, without a word
        raise NativeLoopsError("--seed draws the synthetic panel, so it cannot be combined with --data; drop one")
    args.seed = check_seed(panel.DEFAULT_DATA_SEED if args.seed is None else args.seed)
    if args.out is not None and Path(args.out).suffix.lower() != ".parquet":
        raise NativeLoopsError(f"--out {args.out!r}: the panel is written as parquet; give a file name ending in "
                               ".parquet")
    if args.out and exists(args.out, "--out"):
        raise NativeLoopsError(f"--out {args.out!r} already exists; choose a new file (nothing is overwritten)")
    prices, source = load(args, seed=args.seed)
    fits = {a: panel.of_asset(a, reference.ols_for, prices, a, args.split, args.end, panel.HAR, args.validation)
            for a in sorted(prices["activo"].unique())}
    if args.out:
        synthetic.write_parquet(prices, args.out, seed=args.seed)
    report.print_data_summary(prices, source, fits, synthetic.TRUE if args.data is None else None)
    if args.out:
        report.console().print(f"wrote {report.shown(args.out)}")
    return 0
