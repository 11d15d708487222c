"""What the commands share: the data they load, the run's config and seed, the checks of their options, and the
run folder each writes whole."""
from __future__ import annotations

import argparse
import contextlib
import math
from datetime import datetime
from pathlib import Path

from compare.data import panel, reference
from compare.engines import runner
from compare.errors import NativeLoopsError
from compare.io import atomic_folder
from compare.referee import report
from keras_side.backend import ENGINES
from keras_side.data import HarData
from keras_side.spec import SEEDS, TrainConfig


def load(args: argparse.Namespace, **seed):
    """The validated panel and its source line, from --data or the embedded synthetic panel."""
    return panel.load_panel(args.data, **seed)


INTERNAL_OPTIONS = ("asset_default", "asset_given")  # set by the CLI itself, not by the user (cli._command)


def options(args: argparse.Namespace) -> dict:
    """Every option of the run's command, as given or by default: with the seed and the versions beside them in the
    JSON a command writes, what reproduces the run (`--asset`, `--split`, `--end`, `--engines`...)."""
    return {k: v for k, v in sorted(vars(args).items())
            if k not in INTERNAL_OPTIONS and (v is None or isinstance(v, (str, int, float, bool)))}


def check_seed(seed: int, after: int = 0) -> int:
    """--seed, and the `after` seeds a many-seed run trains after it (`seed_noise.seeds_of`): each one of NumPy's and
    JAX's seeds. Past 2**32 - 1 JAX's key wraps, so seed 2**32 + 1 would draw seed 1's batch orders again."""
    if not 0 <= seed < SEEDS:
        raise NativeLoopsError(f"--seed must be an integer from 0 to 2**32 - 1 (NumPy's and JAX's seeds), got {seed}")
    if seed + after >= SEEDS:
        raise NativeLoopsError(f"--seed {seed}: the {after:,} seeds this run trains after it go past 2**32 - 1 "
                               f"(NumPy's and JAX's seeds); give --seed at most {SEEDS - 1 - after:,}")
    return seed


def train_config(args: argparse.Namespace, *, epochs: int | None = None, seeds_after: int = 0) -> TrainConfig:
    """The run's one config, from --epochs and --seed (`seeds_after`: how many seeds the run trains after its own);
    values no engine accepts are the user's to fix."""
    epochs = epochs or (TrainConfig.epochs if args.epochs is None else args.epochs)
    if epochs < 1:
        raise NativeLoopsError(f"--epochs must be at least 1, got {epochs}")
    return TrainConfig(epochs=epochs, seed=check_seed(args.seed, seeds_after))


# Every epoch's batch order is drawn up front (so that a resumed run draws the same ones), and the JAX loop gathers
# every epoch's batches once: epochs × training rows must fit in memory. 50 million rows of order is 400 MB of int64,
# and about as much again of gathered float32 HAR batches.
MAX_ORDER_ROWS = 50_000_000


def check_models(cfg: TrainConfig, rows: int, models: int, option: str) -> None:
    """One line, before any training, when many models' batch orders (one per model and epoch, drawn up front)
    would not fit in memory; `option` names what to ask less of."""
    if cfg.epochs * rows * models > MAX_ORDER_ROWS:
        raise NativeLoopsError(f"{models:,} models × {cfg.epochs:,} epochs × {rows:,} training rows of batch order "
                               f"is more than the {MAX_ORDER_ROWS:,} rows held in memory; ask for fewer {option}")


def check_epochs(cfg: TrainConfig, rows: int) -> None:
    """One line, before any training, for an --epochs whose batch orders would not fit in memory."""
    if cfg.epochs * rows > MAX_ORDER_ROWS:
        raise NativeLoopsError(f"--epochs {cfg.epochs:,} over {rows:,} training rows draws {cfg.epochs * rows:,} rows "
                               f"of batch order up front, more than the {MAX_ORDER_ROWS:,} held in memory; ask for at "
                               f"most {MAX_ORDER_ROWS // rows:,} epochs")


def refuse_asset(args: argparse.Namespace, why: str):
    """A user's --asset that the command would ignore is an error, not ignored."""
    raise NativeLoopsError(f"{why}, so --asset {args.asset!r} would be ignored; leave --asset out")


def model_data(args: argparse.Namespace, prices, source: str, entry) -> HarData:
    """The data set --model trains on: --asset's, split by --split/--end/--validation, or every asset's for the panel
    model, which has no use for --asset."""
    if entry.data == "panel" and args.asset_given:
        refuse_asset(args, f"--model {args.model} trains on every asset of the panel")
    return panel.prepare_kind(prices, entry.data, asset=args.asset, split=args.split, end=args.end,
                              validation=args.validation, source=source)


def prepare_har(args: argparse.Namespace, prices, source: str):
    """The HAR data set of --asset, split by --split/--end/--validation, and its OLS on the same training rows."""
    prepared = panel.prepare(prices, asset=args.asset, split=args.split, end=args.end, validation=args.validation,
                             source=source)
    return prepared, reference.ols_for(prices, args.asset, args.split, args.end, validation=args.validation)


def parse_names(text: str | None, known, what: str) -> list[str]:
    """A comma-separated option (`--engines`, `--models`...) as a list of known names; None means all of them."""
    if text is None:
        return list(known)
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise NativeLoopsError(f"unknown {what}(s) {', '.join(unknown) or '(none)'}; --{what}s takes a "
                               f"comma-separated list of {', '.join(known)}")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise NativeLoopsError(f"--{what}s names {', '.join(repeated)} more than once; give each once")
    return names


def check_installed(engines: list[str]) -> None:
    """One line for an engine of --engines that is not installed (commands that cannot go on without it)."""
    missing = [e for e in engines if not runner.engine_installed(e)]
    if missing:
        raise NativeLoopsError(f"{', '.join(missing)} not installed; `make setup` installs every engine, or drop it "
                               "from --engines")


def parse_engines(text: str) -> list[str]:
    return parse_names(text, ENGINES, "engine")


def parse_numbers(text: str, kind, what: str) -> list:
    """A comma-separated list of positive numbers (`--learning-rates`, `--batch-sizes`), each once."""
    try:
        values = [kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or not all(math.isfinite(v) and v > 0 for v in values):  # math: a Python int of any size
        raise NativeLoopsError(f"--{what} takes a comma-separated list of positive {kind.__name__}s, got {text!r}")
    if len(set(values)) < len(values):
        raise NativeLoopsError(f"--{what} names a value more than once, got {text!r}; give each once")
    return values


def out_folder(args: argparse.Namespace) -> Path:
    """--out, or a fresh folder under runs/ named for the time."""
    return Path(args.out) if args.out else Path("runs") / datetime.now().strftime("%Y%m%d-%H%M%S-%f")


@contextlib.contextmanager
def run_folder(out: Path, reports: list[str]):
    """The run's folder, written whole: the block writes into the temporary folder this yields, which becomes `out`
    only when the block succeeds (`compare.io.atomic_folder`: a lock, nothing half-written, no earlier run
    overwritten). Then one line names the reports in it: `reports`, which the block may add to."""
    with atomic_folder(out) as tmp:
        yield tmp
    report.console().print(f"report: {report.shown(out)}/{', '.join(reports)}")
