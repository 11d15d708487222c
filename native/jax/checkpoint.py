"""The JAX loop's checkpoint files, with the JAX ecosystem's tool: an orbax pytree checkpoint of the loop's state,
the trainable and non-trainable arrays (a random layer's seed state among them) and the optax state. The folder
around it is `native.checkpoint`'s."""
from __future__ import annotations

from pathlib import Path

import jax
import orbax.checkpoint as ocp


def _tree(state) -> dict:
    trainable, non_trainable, opt_state = state[:3]
    return {"trainable": trainable, "non_trainable": non_trainable, "opt_state": opt_state}


def write(folder: Path, state) -> None:
    """The loop's `state` (trainable, non_trainable, opt_state, metrics: the first three) into the new folder."""
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(folder.absolute(), _tree(state))
        checkpointer.wait_until_finished()


def read(folder: Path, state) -> tuple:
    """`state` (trainable, non_trainable, opt_state, metrics) with its first three read from `folder`: the fresh
    state gives the structure, shapes and dtypes the checkpoint must have."""
    target = jax.tree.map(ocp.utils.to_shape_dtype_struct, _tree(state))
    with ocp.StandardCheckpointer() as checkpointer:
        restored = checkpointer.restore(folder.absolute(), target)
    return restored["trainable"], restored["non_trainable"], restored["opt_state"], *state[3:]
