"""The TensorFlow loop's checkpoint files, with TensorFlow's own tool: one `tf.train.Checkpoint` of the optimizer's
variables (its step count, rate and slots) and of every model variable. The folder around it is
`native.checkpoint`'s."""
from __future__ import annotations

from pathlib import Path

import tensorflow as tf


def _checkpoint(model, optimizer) -> tf.train.Checkpoint:
    return tf.train.Checkpoint(optimizer=[v.value for v in optimizer.variables],
                               model=[v.value for v in model.variables])


def write(folder: Path, state) -> None:
    """`state` (model, optimizer) into the new folder `folder`."""
    folder.mkdir()
    _checkpoint(*state).write(str(folder / "state"))


def read(folder: Path, state):
    """`state` (model, optimizer) as `write` left them in `folder`, in place; returns `state`."""
    _checkpoint(*state).read(str(folder / "state")).assert_consumed()
    return state
