"""`native-loops`: the command line. Run `native-loops --help`; `make compare` runs `native-loops compare`.

Every subcommand takes --data/--asset/--split/--end. Problems the user can fix print one line on stderr and
exit with code 2.
"""
from __future__ import annotations

import argparse
import sys
from contextlib import suppress

from compare import process
from compare.commands import bench, compare, data, distributed, models, seeds, sweep, train, walk_forward, zoo
from compare.engines import faults, runner
from compare.data import panel
from compare.distributed import ZOO_EPOCHS
from compare.errors import NativeLoopsError
from compare.referee import checks
from compare.referee.tolerances import SAME_ARITHMETIC_EPOCHS
from keras_side.backend import ENGINES, BackendError
from keras_side.spec import SpecError, TrainConfig
from keras_side.zoo import ZOO
from native.checkpoint import CheckpointError


def _data_options(p: argparse.ArgumentParser, asset_help: str = f"asset to model (default: {panel.DEFAULT_ASSET})",
                  asset_default: str | None = panel.DEFAULT_ASSET, validation: bool = True) -> None:
    p.add_argument("--data", type=_path, metavar="FILE", help="your parquet or CSV (fecha, activo, rendimiento, "
                   "rv_5min); default: the embedded synthetic panel")
    # None when left out (main fills in asset_default), so that a command can tell a user's --asset from the default
    p.add_argument("--asset", default=None, help=asset_help)
    p.set_defaults(asset_default=asset_default)
    p.add_argument("--split", default=panel.DEFAULT_SPLIT, help="first test day (default: %(default)s)")
    p.add_argument("--end", default=None, help="last test day (default: the last day of the data)")
    if validation:
        p.add_argument("--validation", choices=panel.VALIDATIONS, default=panel.DEFAULT_VALIDATION,
                       help="the validation split: the year before --split, left out of training (default), or the "
                       "test split itself, training on every day before --split (a train/test curve)")


def _train_options(p: argparse.ArgumentParser, default: str = str(TrainConfig.epochs)) -> None:
    p.add_argument("--epochs", type=int, default=None, help=f"training epochs (default: {default})")
    p.add_argument("--seed", type=int, default=TrainConfig.seed)


def _path(text: str) -> str:
    """A path option's value; an empty one names nothing (rather than standing for the default, or for '.')."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"{text!r} names no path; give one, or leave the option out")
    return text


class _Parser(argparse.ArgumentParser):
    """argparse's own errors (a missing or mistyped option) in our one-line form: argparse prints its usage first."""

    def error(self, message: str):
        sys.stderr.write(f"native-loops: error: {message}; see `{self.prog} --help`\n")
        sys.exit(2)


def parser() -> argparse.ArgumentParser:
    top = _Parser(prog="native-loops", description=__doc__.splitlines()[0])
    sub = top.add_subparsers(dest="command", required=True)
    top.subcommands = sub.choices  # name -> its parser

    p = sub.add_parser("data", help="write the synthetic panel and summarize a data set")
    _data_options(p)
    p.add_argument("--out", type=_path, metavar="FILE", help="write the synthetic panel (parquet) here")
    p.add_argument("--seed", type=int, help=f"the synthetic panel's generator seed (default: "
                   f"{panel.DEFAULT_DATA_SEED}; not with --data)")

    p = sub.add_parser("models", help="list the layers of every model: the package's builders, then the zoo's")
    p.add_argument("--engine", choices=ENGINES, default="jax")

    p = sub.add_parser("train", help="train one path in this process and print its slopes, test MSE and time")
    _data_options(p)
    _train_options(p)
    p.add_argument("--path", required=True, help="keras-<engine>, keras-<engine>-train-step, <engine>-native, "
                   "jax-native-scan, torch-native-compile, or torch-native[-compile]-engine (torch's stock Adam), "
                   "e.g. jax-native")
    p.add_argument("--checkpoint", type=_path, metavar="DIR", default=None, help="a native loop writes a checkpoint "
                   "to DIR at the end of every epoch (the Keras weights, the optimizer's state with the engine's own "
                   "tool)")
    p.add_argument("--resume", action="store_true", help="go on from the last checkpoint in --checkpoint DIR")

    p = sub.add_parser("compare", help="every path on every engine, the parity checks and the report")
    _data_options(p)
    _train_options(p)
    p.add_argument("--engines", default=",".join(ENGINES), help="comma-separated (default: %(default)s)")
    p.add_argument("--model", default="har", help="the zoo model every path trains (default: %(default)s; the OLS "
                   f"and gradient-formula checks are the HAR's): {', '.join(ZOO)}")
    p.add_argument("--same-epochs", type=int, default=None, help="epochs of the same-arithmetic run (default: "
                   f"every epoch for the HAR, the first {SAME_ARITHMETIC_EPOCHS} for another model)")
    p.add_argument("--float64", action="store_true", help="also check gradients under a float64 dtype policy")
    p.add_argument("--quick", action="store_true", help="a few epochs, for smoke tests")
    p.add_argument("--converge", action="store_true", help=f"train until every path reaches OLS (Adam decayed to 0 "
                   f"over {checks.CONVERGE_STEPS} steps) and judge ols_reached tightly, without seed noise")
    p.add_argument("--plant", choices=list(faults.FAULTS), default=None, help="train the first engine's native "
                   "path with a fault, to see the referee fail it: " + "; ".join(f"{k}: {v}"
                                                                                for k, v in faults.FAULTS.items()))
    p.add_argument("--out", type=_path, metavar="DIR", help="report folder (default: a fresh folder under runs/)")

    p = sub.add_parser("bench", help="time every training path in one run; ratios to fit and to a NumPy floor")
    _data_options(p)
    _train_options(p)
    p.add_argument("--engines", default=",".join(ENGINES), help="comma-separated (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=5, help="timed runs per path (default: %(default)s)")
    p.add_argument("--models", default=None, help="comma-separated zoo models to time too (fit, the native loop, "
                   "JAX's fused scan), or 'all'; `native-loops models` lists them")
    p.add_argument("--json", type=_path, metavar="FILE", help="also write the timings as JSON, to a new file")

    p = sub.add_parser("walk-forward", help="refit the HAR every 21 sessions for every asset: JAX vmap vs OLS")
    _data_options(p, asset_help="asset whose forecasts forecasts.png shows (default: the first of --assets)",
                  asset_default=None, validation=False)
    _train_options(p)
    p.add_argument("--assets", default=None, help="comma-separated assets (default: all)")
    p.add_argument("--devices", type=int, default=2, help="also shard the models over this many devices (on CPU: "
                   "host devices made by XLA; default: %(default)s)")
    p.add_argument("--fit-refits", type=int, default=3, help="refits timed with model.fit, then extrapolated")
    p.add_argument("--out", type=_path, metavar="DIR", help="report folder (default: a fresh folder under runs/)")

    p = sub.add_parser("distributed", help="each engine's data-parallel native loop in N processes against one "
                       "process: the weights they end at (exit 0 only when equal) and the throughput")
    _data_options(p)
    _train_options(p, f"{TrainConfig.epochs} for the HAR, {ZOO_EPOCHS} for another zoo model")
    p.add_argument("--processes", type=int, default=2, help="processes of the data-parallel run, replicas on "
                   "TensorFlow (default: %(default)s; at most one per core)")
    p.add_argument("--engines", default=",".join(ENGINES), help="comma-separated (default: %(default)s)")
    p.add_argument("--fit", action=argparse.BooleanOptionalAction, default=True, help="also check fit under "
                   "Keras's own distribution, JAX and TensorFlow (default: yes; --no-fit: the native loops only)")
    p.add_argument("--model", default="har", help="a zoo model (default: %(default)s): har, mlp_l2, bn_mlp, lstm, "
                   "conv1d, two_horizons, classifier, panel, dropout_mlp")
    p.add_argument("--out", type=_path, metavar="DIR", help="report folder (default: a fresh folder under runs/)")

    p = sub.add_parser("seeds", help="the model trained with many seeds at once on each engine: is the gap between "
                       "engines' default runs bigger than a change of seed? (exit 0 only when it is not)")
    _data_options(p)
    _train_options(p)
    p.add_argument("--seeds", type=int, default=200, help="seeds per engine (default: %(default)s)")
    p.add_argument("--engines", default=",".join(ENGINES), help="comma-separated (default: %(default)s)")
    p.add_argument("--model", default="har", help="a zoo model (default: %(default)s; slopes are the HAR's): "
                   f"{', '.join(ZOO)}")
    p.add_argument("--out", type=_path, metavar="DIR", help="report folder (default: a fresh folder under runs/)")

    p = sub.add_parser("sweep", help="a grid of learning rates × batch sizes of the HAR, every seed of a batch size "
                       "in one vmapped call: validation MSE per cell against OLS")
    _data_options(p)
    _train_options(p)
    p.add_argument("--learning-rates", default="0.001,0.003,0.01,0.03,0.1", help="comma-separated (default: "
                   "%(default)s)")
    p.add_argument("--batch-sizes", default="32,128,512", help="comma-separated (default: %(default)s)")
    p.add_argument("--seeds", type=int, default=8, help="seeds per cell, averaged (default: %(default)s)")
    p.add_argument("--engines", default="jax,torch", help="comma-separated, of jax and torch (default: %(default)s)")
    p.add_argument("--out", type=_path, metavar="DIR", help="report folder (default: a fresh folder under runs/)")

    p = sub.add_parser("zoo", help="every zoo model × optimizer: fit against each native loop, same weights and "
                       "batches; exit 0 only when every cell is within tolerance")
    _data_options(p)
    p.add_argument("--models", default=None, help="comma-separated zoo models (default: all)")
    p.add_argument("--optimizers", default=None, help="comma-separated optimizer settings (default: all)")
    p.add_argument("--engines", default=",".join(ENGINES), help="comma-separated (default: %(default)s)")
    p.add_argument("--epochs", type=int, default=3, help="epochs per training (default: %(default)s)")
    p.add_argument("--rows", type=int, default=None, help="train on the first ROWS training rows (default: all)")
    p.add_argument("--seed", type=int, default=TrainConfig.seed)
    p.add_argument("--fast-paths", action=argparse.BooleanOptionalAction, default=True,
                   help="also judge each engine's fast paths: torch's fast and compiled loops, JAX's convolution as a "
                   "matmul and fused scan (default: on; "
                   "--no-fast-paths skips their compiles)")
    p.add_argument("--out", type=_path, metavar="DIR", help="report folder (default: a fresh folder under runs/)")
    return top


COMMANDS = {
    "data": data.run,
    "models": models.run,
    "train": train.run,
    "compare": compare.run,
    "bench": bench.run,
    "walk-forward": walk_forward.run,
    "zoo": zoo.run,
    "distributed": distributed.run,
    "seeds": seeds.run,
    "sweep": sweep.run,
}
IN_PROCESS = ("data", "models", "train")  # the commands that start no workers (NATIVE_LOOPS_NICE is theirs)


def main(argv: list[str] | None = None) -> int:
    process.closed_streams_to_devnull()
    stdout, sys.stdout = sys.stdout, process.Stdout(sys.stdout)
    try:
        code = _command(argv)
        sys.stdout.flush()  # here, not at exit: what is buffered (`--help`) fails inside the handler below
        return code
    except process.StdoutFailed as err:
        process.discard(stdout)
        with suppress(OSError):  # stderr may be the same broken pipe (`2>&1 | head`)
            print(f"native-loops: error: standard output cannot be written ({err}), so the run stopped there; send it "
                  "to a file or a terminal", file=sys.stderr)
        return 2
    finally:
        sys.stdout = stdout


def _command(argv: list[str] | None) -> int:
    top = parser()
    try:
        args, unknown = top.parse_known_args(argv)
        if unknown:  # the subcommand's error, so that its line points at that subcommand's --help
            top.subcommands[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    except SystemExit as stop:  # --help (0), or argparse's one-line error (2): returned, as every other outcome
        return stop.code
    if hasattr(args, "asset_default"):
        args.asset_given = args.asset is not None
        args.asset = args.asset if args.asset_given else args.asset_default
    try:
        if args.command not in IN_PROCESS:  # a bad NATIVE_LOOPS_NICE stops here, before any output
            runner.behind_nice()
        with process.stop_handlers():
            return COMMANDS[args.command](args)
    except (NativeLoopsError, BackendError, SpecError, CheckpointError) as err:
        print(f"native-loops: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("native-loops: interrupted", file=sys.stderr)
        return 130
    except process.Terminated:
        print("native-loops: terminated", file=sys.stderr)
        return 143


if __name__ == "__main__":
    sys.exit(main())
