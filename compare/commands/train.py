"""`native-loops train --path P`: one path trained on the HAR in this process, its checkpoints kept with
`--checkpoint DIR`."""
from __future__ import annotations

import argparse

from compare.commands.common import check_epochs, load, prepare_har, train_config
from compare.engines import paths
from compare.errors import NativeLoopsError
from compare.referee import report
from keras_side.backend import keras_defaults, use_backend


# The paths that write checkpoints: the native loops (fit has its own, keras.callbacks.BackupAndRestore).
CHECKPOINTED = ("torch-native", "torch-native-fast", "torch-native-compile", "torch-native-engine",
                "torch-native-compile-engine", "jax-native", "jax-native-fast", "tensorflow-native")


def run(args: argparse.Namespace) -> int:
    path, cfg = paths.get(args.path), train_config(args)
    if args.resume and not args.checkpoint:
        raise NativeLoopsError("--resume goes on from the checkpoints in --checkpoint DIR; give that folder")
    if args.checkpoint and path.name not in CHECKPOINTED:
        why = ("the fused scan runs every epoch in one call, so no epoch ends where a checkpoint could be written; "
               "use --path jax-native" if path.name == "jax-native-scan" else
               "fit has keras.callbacks.BackupAndRestore" if path.name.startswith("keras-") else
               f"it is not one of {', '.join(CHECKPOINTED)}")
        raise NativeLoopsError(f"--checkpoint: {path.name} writes no checkpoints: {why}")
    prices, source = load(args)
    prepared, fit = prepare_har(args, prices, source)
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
