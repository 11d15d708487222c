"""One call that makes a training run repeat bit for bit: `seed_everything(seed)` right before a model is built."""
from __future__ import annotations

import random
import sys

import keras
import numpy as np

from keras_side import internals

# The HAR is 4 weights and 128-row batches: thread pools cost more than they give, and one thread makes every
# float reduction run in one order whatever the machine's core count.
THREADS = 1


def seed_everything(seed: int, threads: int = THREADS) -> None:
    """Seed Python, NumPy and the backend (Keras's `set_random_seed`), and turn on the engine's determinism.

    On torch: deterministic algorithms and a fixed intra-op thread count. On TensorFlow: op determinism and
    fixed thread pools (only possible before TensorFlow starts its runtime; later calls keep what it has).
    JAX on CPU is deterministic already; its thread count is set by XLA_FLAGS before the process starts.
    """
    backend = keras.config.backend()
    if backend == "tensorflow" or "tensorflow" in sys.modules:
        keras.utils.set_random_seed(seed)
    else:
        _keras_seed_without_tensorflow(seed, backend)
    if backend == "torch":
        import torch

        torch.use_deterministic_algorithms(True)
        torch.set_num_threads(threads)
    elif backend == "tensorflow":
        import tensorflow as tf

        tf.config.experimental.enable_op_determinism()
        try:
            tf.config.threading.set_intra_op_parallelism_threads(threads)
            tf.config.threading.set_inter_op_parallelism_threads(threads)
        except RuntimeError:  # the runtime is already running: its pools are fixed for the process
            pass


def _keras_seed_without_tensorflow(seed: int, backend: str) -> None:
    """`keras.utils.set_random_seed` (Keras 3.15.1's, step for step: tested) but for its `tf.random.set_seed`, for
    which it imports TensorFlow whenever TensorFlow is installed, whatever the backend (for tf.data pipelines, it
    says). A torch or JAX process of ours has no TensorFlow in it, whose import would cost each one several seconds of
    CPU and hundreds of MB (docs/dev-notes.md, "`make compare`: where a run's time went"); a process that has imported
    TensorFlow gets Keras's own call."""
    if not isinstance(seed, int):
        raise ValueError(f"Expected `seed` argument to be an integer. Received: seed={seed} (of type {type(seed)})")
    internals.reset_global_seed(seed)  # keras.random's unseeded draws start afresh
    random.seed(seed)
    np.random.seed(seed)
    if backend == "torch":
        import torch

        torch.manual_seed(seed)
