"""The TensorFlow loop data-parallel (`native/tensorflow/mirrored.py`): MirroredStrategy over two logical CPUs ends
where the one-process loop ends on the same global batches. Its own process: TensorFlow splits the CPU into logical
devices only before its runtime starts, which this test process has long started."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from compare.tolerances import DATA_PARALLEL_ATOL
from keras_side.determinism import seed_everything
from keras_side.spec import SpecError, TrainConfig, resolve
from native.tensorflow import loop, mirrored
from tests.conftest import REPO

SPEC = {"epochs": 2, "batch_size": 100}  # the short last batch (63 rows) splits 32/31


@pytest.mark.parametrize("build", ["keras_side.models:har", "keras_side.models:mlp_l2"])
def test_two_replicas_end_where_one_process_ends(har, tmp_path, build):
    har.save(tmp_path / "data.npz")
    env = {**os.environ, "KERAS_BACKEND": "tensorflow", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "native.tensorflow.mirrored", "--replicas", "2", "--data",
                           str(tmp_path / "data.npz"), "--config", json.dumps(SPEC), "--build", build, "--out",
                           str(tmp_path / "weights.npz")], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with np.load(tmp_path / "weights.npz") as z:
        parallel = [z[f"w_{i}"] for i in range(len(z.files) - 1)]  # and the training seconds
    seed_everything(0)
    alone = loop.train(resolve(build)(), har, TrainConfig(batch_order="numpy", validate=False, **SPEC))
    for a, b in zip(alone.weights, parallel, strict=True):
        np.testing.assert_allclose(b, a, atol=DATA_PARALLEL_ATOL, rtol=0)


def test_the_cpu_cannot_be_split_once_tensorflow_runs():
    import tensorflow as tf

    tf.constant(1.0) + 1.0  # the runtime is up
    with pytest.raises(SpecError, match="runtime has started"):
        mirrored.use_cpus(2)


def test_clipping_is_refused(har):
    with pytest.raises(SpecError, match="clips each replica's gradient"):
        mirrored.train(resolve("keras_side.models:har"), har, TrainConfig(clipnorm=1.0), ["/cpu:0"])
