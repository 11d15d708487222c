"""What a data-parallel launcher checks before it starts a process or trains a step (`native/jax/sharded.py`,
`native/tensorflow/mirrored.py`, each rank of `native/torch/ddp.py`), so that a mistake in what a user gave it is
one line and exit 2, as in `native-loops`, not a traceback from every process:

    cfg, data = preflight.launch_args(args, count=args.processes, what="processes")   # a LaunchError names the fix

Engine-free: nothing here imports Keras or an engine, and the builder's module is found, not imported (a launcher
that has not set its backend yet must not import Keras).
"""
from __future__ import annotations

import importlib.util
import json
import os
import sys
import zipfile
from pathlib import Path

import numpy as np

from keras_side.data import HarData
from keras_side.spec import SpecError, TrainConfig, data_parallel_config

WINDOWS = ("x", "y", "rows", "x_next")  # the walk-forward's model inputs (compare.speed.walk_forward)


class LaunchError(ValueError):
    """A launcher's argument that cannot work; the message names it and the fix."""


def launch_args(args, *, count: int | None = None, what: str = "processes", windows: bool = False,
                fit: bool = False) -> tuple[TrainConfig, HarData | dict]:
    """The spec of --config and what --data holds (a HarData, or with `windows` the walk-forward's windows as a dict
    of arrays), once --config, --data, --build, --out and the `count` of processes (or replicas, `what`) have been
    found usable; else a LaunchError. `fit`: the training is `model.fit`, which takes sample weights and validates
    (no native data-parallel loop does either)."""
    if count is not None and not 1 <= count <= (os.cpu_count() or 1):
        raise LaunchError(f"--{what} must be between 1 and this machine's {os.cpu_count() or 1} cores, got {count}")
    try:
        fields = json.loads(args.config)
    except json.JSONDecodeError as err:
        raise LaunchError(f"--config is not JSON ({err.msg}); give TrainConfig fields as a JSON object, e.g. "
                          "'{\"epochs\": 2}'") from None
    if not isinstance(fields, dict):
        raise LaunchError(f"--config must be a JSON object of TrainConfig fields, got a {type(fields).__name__}")
    try:
        cfg = data_parallel_config(fields)
    except SpecError as err:
        raise LaunchError(f"--config: {err}") from None
    if not fit and (cfg.validate or cfg.patience is not None):  # else trained without either, without a word
        raise LaunchError("--config: the native data-parallel loops do not validate, so they take neither validate nor "
                          "patience; drop them, or train with --fit")
    data = _load_data(Path(args.data), windows, sample_weights=fit)
    module, _, function = args.build.partition(":")
    try:
        found = bool(module and function) and importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package that is missing, an empty or relative name
        found = False
    if not found:
        raise LaunchError(f"--build {args.build!r}: give module:function, the module importable from here "
                          "(on PYTHONPATH)")
    out = Path(args.out)
    if out.is_dir():  # found after the whole training, when the weights are written
        raise LaunchError(f"--out {args.out!r} is a folder; give the file to write the weights to, e.g. "
                          f"{str(out / 'weights.npz')!r}")
    if not out.parent.is_dir():
        raise LaunchError(f"--out {args.out!r}: its folder {out.parent} does not exist; create it, or give another")
    return cfg, data


def _load_data(path: Path, windows: bool, sample_weights: bool) -> HarData | dict:
    wanted = "the walk-forward's windows (x, y, rows, x_next)" if windows else "a HarData file (HarData.save)"
    if not path.is_file():
        raise LaunchError(f"--data {str(path)!r} is not a file; give {wanted}")
    try:
        if windows:
            with np.load(path) as z:
                missing = [k for k in WINDOWS if k not in z.files]
                if missing:
                    raise KeyError(", ".join(missing))
                return dict(z)
        data = HarData.load(path)
    except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile) as err:  # TypeError: a .npy's array
        raise LaunchError(f"--data {str(path)!r} is not {wanted} ({type(err).__name__}: {err})") from None
    if data.w_train is not None and not sample_weights:  # each loop refuses them too, from every process
        raise LaunchError(f"--data {str(path)!r} holds sample weights, which the native data-parallel loops do not "
                          "take; save it without them, or train with --fit")
    return data


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now: for a launch's coordinator (jax.distributed's, torch's rendezvous)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_line(prog: str, err: Exception) -> int:
    """Say what is wrong (a LaunchError, or a SpecError that only training found) in one line, as `native-loops`
    does; the exit status of a usage error."""
    sys.stderr.write(f"{prog}: error: {' '.join(str(err).split())}\n")
    return 2
