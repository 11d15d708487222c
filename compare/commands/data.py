"""`native-loops data`: the panel (yours, or the embedded synthetic one) summarized asset by asset, with each asset's
OLS; `--out` writes the synthetic panel as parquet."""
from __future__ import annotations

import argparse
from pathlib import Path

from compare.commands.common import check_seed, load, refuse_asset
from compare.data import panel, reference, synthetic
from compare.errors import HarDataError, NativeLoopsError
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
    fits, unfit = {}, {}
    for asset in sorted(prices["activo"].unique()):
        try:
            fits[asset] = panel.of_asset(asset, reference.ols_for, prices, asset, args.split, args.end, panel.HAR,
                                         args.validation)
        except HarDataError as err:  # an asset the HAR cannot fit: named in the summary of the others
            unfit[asset] = str(err)
    if not fits:  # no asset to summarize: the first one's reason, the one line of any bad input
        raise HarDataError(next(iter(unfit.values())))
    if args.out:
        synthetic.write_parquet(prices, args.out, seed=args.seed)
    report.print_data_summary(prices, source, fits, synthetic.TRUE if args.data is None else None, unfit)
    if args.out:
        report.console().print(f"wrote {report.shown(args.out)}")
    return 0
