"""`native-loops`: the command line. Run `native-loops --help`; `make compare` runs `native-loops compare`.

Every subcommand takes --data/--asset/--split/--end. Problems the user can fix print one line on stderr and
exit with code 2.
"""
from __future__ import annotations

import argparse
import os
import queue
import signal
import sys
import threading
import time
from contextlib import contextmanager, suppress

from compare import commands
from compare.engines import runner
from compare.data import panel as har_data
from compare.distributed import ZOO_EPOCHS
from compare.errors import NativeLoopsError
from compare.referee.tolerances import SAME_ARITHMETIC_EPOCHS
from keras_side.backend import ENGINES, BackendError
from keras_side.spec import SpecError, TrainConfig
from keras_side.zoo import ZOO
from native.checkpoint import CheckpointError


def _data_options(p: argparse.ArgumentParser, asset_help: str = f"asset to model (default: {har_data.DEFAULT_ASSET})",
                  asset_default: str | None = har_data.DEFAULT_ASSET, validation: bool = True) -> None:
    p.add_argument("--data", type=_path, metavar="FILE", help="your parquet or CSV (fecha, activo, rendimiento, "
                   "rv_5min); default: the embedded synthetic panel")
    # None when left out (main fills in asset_default), so that a command can tell a user's --asset from the default
    p.add_argument("--asset", default=None, help=asset_help)
    p.set_defaults(asset_default=asset_default)
    p.add_argument("--split", default=har_data.DEFAULT_SPLIT, help="first test day (default: %(default)s)")
    p.add_argument("--end", default=None, help="last test day (default: the last day of the data)")
    if validation:
        p.add_argument("--validation", choices=har_data.VALIDATIONS, default=har_data.DEFAULT_VALIDATION,
                       help="the validation split: the year before --split, left out of training (default), or the "
                       "test split itself, training on every day before --split (the lesson's test-set curve)")


def _train_options(p: argparse.ArgumentParser, default: str = str(TrainConfig.epochs)) -> None:
    p.add_argument("--epochs", type=int, default=None, help=f"training epochs (default: {default})")
    p.add_argument("--seed", type=int, default=TrainConfig.seed)


def _path(text: str) -> str:
    """A path option's value; an empty one names nothing (it was read as the default, or as '.')."""
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
                   f"{har_data.DEFAULT_DATA_SEED}; not with --data)")

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
    "data": commands.data,
    "models": commands.models,
    "train": commands.train,
    "compare": commands.compare,
    "bench": commands.bench,
    "walk-forward": commands.walk_forward,
    "zoo": commands.zoo,
    "distributed": commands.distributed,
    "seeds": commands.seeds,
    "sweep": commands.sweep,
}
IN_PROCESS = ("data", "models", "train")  # the commands that start no workers (NATIVE_LOOPS_NICE is theirs)


class Terminated(BaseException):
    """SIGTERM (what `timeout`, `kill` and CI send), raised where the program is, so that every `finally` runs: the
    run folder's temporary twin is removed and the workers are stopped, as for Ctrl-C. A BaseException, as
    KeyboardInterrupt is, so that no `except Exception` on the way swallows it."""


STOPS = (signal.SIGINT, signal.SIGTERM)


def _stop(signum, frame):
    """The first Ctrl-C or SIGTERM stops the run where it is. The next one does not cut that stopping short (workers
    killed and waited for, temporary folders removed: cut short, it would leave a worker or a half-written folder
    behind); it says what is going on. The one after that quits at once, whatever is left."""
    if _inside(_swallowed, frame):  # raised in the hook, Python would drop it for good: sent again, later
        return _swallowed.pending.put(signum)
    for stop in STOPS:
        signal.signal(stop, _stopping)
    raise KeyboardInterrupt if signum == signal.SIGINT else Terminated


def _stopping(signum, frame):
    _stopping.presses = getattr(_stopping, "presses", 0) + 1
    if _stopping.presses == 1:
        print("native-loops: stopping the workers and removing temporary folders; once more to quit at once",
              file=sys.stderr, flush=True)
    else:
        os._exit(130 if signum == signal.SIGINT else 143)


REDELIVER_S = 0.05  # not a limit on anything: a stop sent again lands wherever the main thread is by then


def _swallowed(unraisable) -> None:
    """`sys.unraisablehook` while a command runs. A signal that lands while Python runs a garbage-collection
    callback or a `__del__` (JAX registers a gc callback) raises `_stop`'s exception there, where Python prints it
    and drops it: the stop would be lost, and the run would go on. `_send_again`'s thread sends that signal again,
    so that the main thread takes it where it is next. Should that be another such callback, this hook takes it
    again; should it be this hook itself (a busy machine can keep the main thread here for a while), `_stop` hands
    it back rather than raise it here, where nothing would take it. Neither waits for anything: `SimpleQueue.put`
    is the one call Python makes safe inside a signal handler that interrupts it."""
    if not isinstance(unraisable.exc_value, (KeyboardInterrupt, Terminated)):
        return _swallowed.previous(unraisable)
    for stop in STOPS:  # still the first press: the stop never happened
        signal.signal(stop, _stop)
    _stopping.presses = 0  # one more press taken meanwhile by `_stopping` was not a second one
    _swallowed.pending.put(signal.SIGINT if isinstance(unraisable.exc_value, KeyboardInterrupt) else signal.SIGTERM)


def _send_again(pending: queue.SimpleQueue) -> None:
    """The thread behind `_swallowed`: each signal put in `pending` is sent to this process again, REDELIVER_S later,
    until None."""
    while (signum := pending.get()) is not None:
        time.sleep(REDELIVER_S)
        os.kill(os.getpid(), signum)


def _inside(function, frame) -> bool:
    """Whether `frame` runs in a call of `function`, however deep."""
    while frame is not None and frame.f_code is not function.__code__:
        frame = frame.f_back
    return frame is not None


@contextmanager
def stop_handlers():
    """The handlers of Ctrl-C and SIGTERM (`_stop`, `_stopping`, `_swallowed`) for the block; the caller's after it.
    Signals reach the main thread only: elsewhere, or inside such a block already, this does nothing. A stop that
    `_send_again` still holds when the block ends is raised here, as the block's own."""
    if threading.current_thread() is not threading.main_thread() or sys.unraisablehook is _swallowed:
        yield
        return
    pending, previous_hook, previous = queue.SimpleQueue(), sys.unraisablehook, {}
    again = threading.Thread(target=_send_again, args=(pending,), name="native-loops-stops", daemon=True)
    try:
        _swallowed.pending, _swallowed.previous, _stopping.presses = pending, previous_hook, 0
        sys.unraisablehook = _swallowed
        again.start()
        for stop in STOPS:
            previous[stop] = signal.signal(stop, _stop)
        yield
    finally:
        left = []
        try:
            pending.put(None)
            if again.ident is not None:
                again.join()
            while not pending.empty():  # put back after the thread's last read: never sent
                left.append(pending.get())
        finally:
            for stop, handler in previous.items():  # called from Python (a test, a script): the caller's own handlers
                signal.signal(stop, handler)
            sys.unraisablehook = previous_hook
        if left:
            raise KeyboardInterrupt if left[0] == signal.SIGINT else Terminated


def _closed_streams_to_devnull() -> None:
    """A closed stdout or stderr (`native-loops data >&-`) is None in Python, and the first print a traceback. Its
    descriptor is pointed at os.devnull, so no file this run opens lands on 1 or 2, where a print would write into it,
    and the stream is that descriptor."""
    for fd, name in ((1, "stdout"), (2, "stderr")):
        if getattr(sys, name) is not None:
            continue
        try:
            os.fstat(fd)
        except OSError:  # closed: os.devnull there (not at the lowest free descriptor: stdin may be closed too)
            _devnull_onto(fd)
        setattr(sys, name, open(fd, "w", closefd=False))


def _devnull_onto(fd: int) -> None:
    """Descriptor `fd` made os.devnull, open or closed before."""
    null = os.open(os.devnull, os.O_WRONLY)
    if null == fd:  # fd was closed and the lowest free descriptor
        return
    try:
        os.dup2(null, fd)
    finally:
        os.close(null)


class StdoutFailed(Exception):
    """Standard output refused a write: a full disk (`> /dev/full`), a pipe whose reader has gone (`| head -1`).
    Not an OSError, so that no handler of a file's errors takes it for its own."""


class _Stdout:
    """sys.stdout during a command: the same stream, its write errors raised as `StdoutFailed`."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError as err:
            raise StdoutFailed(err.strerror or str(err)) from None

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as err:
            raise StdoutFailed(err.strerror or str(err)) from None

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name):
        return getattr(self._stream, name)


def main(argv: list[str] | None = None) -> int:
    _closed_streams_to_devnull()
    stdout, sys.stdout = sys.stdout, _Stdout(sys.stdout)
    try:
        code = _command(argv)
        sys.stdout.flush()  # here, not at exit: what is buffered (`--help`) fails inside the handler below
        return code
    except StdoutFailed as err:
        _discard(stdout)
        with suppress(OSError):  # stderr may be the same broken pipe (`2>&1 | head`)
            print(f"native-loops: error: standard output cannot be written ({err}), so the run stopped there; send it "
                  "to a file or a terminal", file=sys.stderr)
        return 2
    finally:
        sys.stdout = stdout


def _discard(stream) -> None:
    """What `stream` still buffers goes to os.devnull, so that exiting does not fail on it again; its descriptor
    refuses every write anyway. Nothing for a stream without one (pytest's capture)."""
    try:
        fd = stream.fileno()
    except (OSError, ValueError):
        return
    _devnull_onto(fd)


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
        with stop_handlers():
            return COMMANDS[args.command](args)
    except (NativeLoopsError, BackendError, SpecError, CheckpointError) as err:
        print(f"native-loops: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("native-loops: interrupted", file=sys.stderr)
        return 130
    except Terminated:
        print("native-loops: terminated", file=sys.stderr)
        return 143


if __name__ == "__main__":
    sys.exit(main())
