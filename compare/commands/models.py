"""`native-loops models`: every model builder and zoo model, built on one engine, layer by layer."""
from __future__ import annotations

import argparse

from compare.data import panel, synthetic
from compare.referee import report, zoo
from keras_side.arrays import take
from keras_side.backend import keras_defaults, use_backend


def run(args: argparse.Namespace) -> int:
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
    others = {name: entry for name, entry in zoo.ZOO.items() if name not in builders.BUILDERS}
    prices = synthetic.simulate(0)
    rows = {kind: take(panel.prepare_kind(prices, kind).x_train, slice(0, 2))
            for kind in {entry.data for entry in others.values()}}
    for name, entry in others.items():
        seed_everything(0)
        model = builders.ensure_built(entry.builder()(), rows[entry.data])
        report.print_layers(f"zoo: {name}", builders.layer_table(model), args.engine)
    return 0
