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
from keras_side.config import load_trained, whole_batches
from keras_side.determinism import seed_everything
from keras_side.spec import SpecError, TrainConfig, resolve
from native.tensorflow import loop, mirrored
from tests.conftest import REPO

SPEC = {"epochs": 2, "batch_size": 100}  # the short last batch (63 rows) splits 32/31


CFG = TrainConfig(batch_order="numpy", validate=False, **SPEC)


def mirrored_run(data, tmp_path, build, *extra) -> list[np.ndarray]:
    data.save(tmp_path / "data.npz")
    env = {**os.environ, "KERAS_BACKEND": "tensorflow", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "native.tensorflow.mirrored", "--replicas", "2", "--data",
                           str(tmp_path / "data.npz"), "--config", json.dumps(SPEC), "--build", build, "--out",
                           str(tmp_path / "weights.npz"), *extra], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return load_trained(tmp_path / "weights.npz")[0]


def gap(a, b) -> float:
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("build", ["keras_side.models:har", "keras_side.models:mlp_l2", "keras_side.models:bn_mlp"])
def test_two_replicas_end_where_one_process_ends(har, tmp_path, build):
    """bn_mlp: its BatchNormalization made `synchronized`, so each replica normalizes by the global batch."""
    parallel = mirrored_run(har, tmp_path, build)
    seed_everything(0)
    assert gap(loop.train(resolve(build)(), har, CFG).weights, parallel) <= DATA_PARALLEL_ATOL


def test_fit_under_the_strategy_weighs_an_uneven_last_batch_otherwise(har, tmp_path):
    """`fit` under MirroredStrategy: equal to one process when every batch splits evenly; with the short last batch
    (63 rows over 2 replicas) it averages the replicas' own means with equal weights, where the global batch's mean
    weighs each replica by its rows: measured 2.3e-5 after 2 epochs. The loop above weighs them by rows."""
    from keras_side import fit

    even = whole_batches(har, SPEC["batch_size"], 2)  # 2,200 training rows: every batch splits over two replicas
    for data, within in ((even, True), (har, False)):
        parallel = mirrored_run(data, tmp_path, "keras_side.models:har", "--fit")
        seed_everything(0)
        one = fit.train(resolve("keras_side.models:har")(), data, CFG).weights
        assert (gap(one, parallel) <= DATA_PARALLEL_ATOL) is within, gap(one, parallel)


def test_fit_under_the_strategy_with_batchnorm_synchronized(har, tmp_path):
    """`fit` under the strategy on a BatchNorm model (`fit_train` sets Keras's `synchronized=True`): the global
    batch's moments on every replica, so equal to one process's plain `fit` when every batch splits evenly."""
    from keras_side import fit

    even = whole_batches(har, SPEC["batch_size"], 2)
    parallel = mirrored_run(even, tmp_path, "keras_side.models:bn_mlp", "--fit")
    seed_everything(0)
    assert gap(fit.train(resolve("keras_side.models:bn_mlp")(), even, CFG).weights, parallel) <= DATA_PARALLEL_ATOL


def test_the_cpu_cannot_be_split_once_tensorflow_runs():
    import tensorflow as tf

    tf.constant(1.0) + 1.0  # the runtime is up
    with pytest.raises(SpecError, match="runtime has started"):
        mirrored.use_cpus(2)


def test_clipping_is_refused(har):
    with pytest.raises(SpecError, match="clips each replica's gradient"):
        mirrored.train(resolve("keras_side.models:har"), har, TrainConfig(clipnorm=1.0), ["/cpu:0"])
