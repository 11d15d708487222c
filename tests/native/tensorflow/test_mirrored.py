"""The TensorFlow loop data-parallel (`native/tensorflow/mirrored.py`): MirroredStrategy over two logical CPUs ends
where the one-process loop ends on the same global batches. Its own process: TensorFlow splits the CPU into logical
devices only before its runtime starts, which this test process has long started."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from compare.distributed import MODELS
from compare.referee.tolerances import DATA_PARALLEL_ATOL, PARITY_ATOL, PARITY_RTOL
from keras_side.arrays import take
from keras_side.data import shard, whole_batches
from keras_side.determinism import seed_everything
from keras_side.results import load_trained, trained_record, versions
from keras_side.spec import SpecError, TrainConfig, resolve
from native.tensorflow import loop, mirrored
from tests.conftest import REPO, users_keras_home
from tests.tiers import rows

SPEC = {"epochs": 2, "batch_size": 100}  # the short last batch (63 rows) splits 32/31


CFG = TrainConfig(batch_order="numpy", validate=False, **SPEC)


def mirrored_run(data, tmp_path, build, *extra, config: dict = SPEC, keras_home=None) -> list[np.ndarray]:
    data.save(tmp_path / "data.npz")
    env = {**os.environ, "KERAS_BACKEND": "tensorflow", "PYTHONPATH": str(REPO)}
    env |= {"KERAS_HOME": str(keras_home)} if keras_home else {}
    proc = subprocess.run([sys.executable, "-m", "native.tensorflow.mirrored", "--replicas", "2", "--data",
                           str(tmp_path / "data.npz"), "--config", json.dumps(config), "--build", build, "--out",
                           str(tmp_path / "weights.npz"), *extra], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert trained_record(tmp_path / "weights.npz") == {"seed": config.get("seed", 0), "versions": versions()}
    return load_trained(tmp_path / "weights.npz")[0]


def gap(a, b) -> float:
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b, strict=True))


# make test: the penalties each replica adds, BatchNorm synchronized (the HAR's Dense layers are in both).
@pytest.mark.parametrize("build", rows(["keras_side.models:har", "keras_side.models:mlp_l2", "keras_side.models:bn_mlp"],
                                       fast=["keras_side.models:mlp_l2", "keras_side.models:bn_mlp"]))
def test_two_replicas_end_where_one_process_ends(har, tmp_path, build):
    """bn_mlp: its BatchNormalization made `synchronized`, so each replica normalizes by the global batch. A
    Dropout: below (the LSTM's test, whose model ends in one, and `fit`'s). Under a user's keras.json (floatx
    float16), which must not reach the launched process: it starts from Keras's defaults, as compare's workers do
    (the loop once failed on float16 weights against float32 batches)."""
    parallel = mirrored_run(har, tmp_path, build, keras_home=users_keras_home(tmp_path / "keras"))
    seed_everything(0)
    assert all(w.dtype == np.float32 for w in parallel)
    assert gap(loop.train(resolve(build)(), har, CFG).weights, parallel) <= DATA_PARALLEL_ATOL


def test_two_outputs_on_two_replicas_end_where_one_process_ends(panel, tmp_path):
    """Several targets (each output's per-sample loss, weighted as `compile` weighs them) through the launched
    process: the data file's two targets, the spec's two losses."""
    from compare.data import panel as har_data
    from keras_side.zoo import ZOO

    entry = ZOO["two_horizons"]
    data = har_data.prepare_kind(panel, entry.data)
    spec = {k: v for k, v in entry.spec.items() if k != "metrics"}
    parallel = mirrored_run(data, tmp_path, entry.build, config=SPEC | spec)
    seed_everything(0)
    assert gap(loop.train(resolve(entry.build)(), data, CFG.replace(**spec)).weights, parallel) <= DATA_PARALLEL_ATOL


def lstm_with_dropouts():
    """An LSTM cell's input and recurrent dropouts and a Dropout after it: three draws through Keras's dropout a step,
    two of them inside the recurrence's layer. Built by the launched process too (`--build`)."""
    import keras

    from keras_side.models import SEQUENCE_DAYS

    return keras.Sequential([keras.Input((SEQUENCE_DAYS, 1)),
                             keras.layers.LSTM(4, dropout=0.3, recurrent_dropout=0.2, seed=3),
                             keras.layers.Dropout(0.2, seed=5), keras.layers.Dense(1)])


def test_an_rnn_cells_dropouts_on_two_replicas_end_where_one_process_ends(panel, tmp_path):
    from compare.data import panel as har_data

    data = har_data.prepare_kind(panel, "sequence")
    build = "tests.native.tensorflow.test_mirrored:lstm_with_dropouts"
    parallel = mirrored_run(data, tmp_path, build)
    seed_everything(0)
    assert gap(loop.train(lstm_with_dropouts(), data, CFG).weights, parallel) <= DATA_PARALLEL_ATOL


# Draws on 2 replicas (`two_replicas`): (case, the layer: a Dropout's arguments or Attention, `rows_of_global_batch`
# blocks around the call). A rate of 1 and a noise shape of (1, 1, 4) draw the same without the block: they check
# that it does no harm; every other case fails without it.
MASK_CASES = [("a Dropout", {}, 1), ("nested blocks", {}, 2), ("noise shape (None, 1, None)",
              {"noise_shape": (None, 1, None)}, 1), ("noise shape (1, 1, 4)", {"noise_shape": (1, 1, 4)}, 1),
              ("rate 1", {"rate": 1.0}, 1), ("Attention's dropout", "attention", 1)]


def two_replicas(data_path: str) -> None:
    """Run in a process of its own (TensorFlow splits the CPU only before its runtime starts). Prints, as JSON, for
    each of MASK_CASES whether 2 replicas' outputs (Attention's: where its weights were dropped), put together, are
    to the bit what one process's layer gives on the whole batch, at two steps; and what `train` and `fit_train` say
    of a model that draws otherwise."""
    import contextlib

    devices = mirrored.use_cpus(2)
    import keras
    import tensorflow as tf

    from keras_side.data import HarData

    def make(kwargs):
        if kwargs == "attention":
            # its mask, the zeros of its dropped weights: its matmuls over 4 rows and over 7 may sum otherwise (they
            # do on an AMD EPYC), so its outputs are not compared to the bit
            attention = keras.layers.Attention(dropout=0.5, seed=3)
            return lambda x: keras.ops.equal(attention([x, x], training=True, return_attention_scores=True)[1], 0)
        kwargs = dict(kwargs)
        dropout = keras.layers.Dropout(kwargs.pop("rate", 0.5), seed=3, **kwargs)
        return lambda x: dropout(x, training=True)

    strategy = tf.distribute.MirroredStrategy(devices)
    x = np.random.default_rng(0).uniform(1, 2, size=(7, 3, 4)).astype(np.float32)  # 7 rows: 4 and 3
    parts = [x[shard(slice(0, 7), r, 2)] for r in range(2)]
    found = {}
    for name, kwargs, blocks in MASK_CASES:
        alone = make(kwargs)
        with strategy.scope():
            layer = make(kwargs)

        def replica(xb, layer=layer, blocks=blocks):
            with contextlib.ExitStack() as stack:
                for _ in range(blocks):
                    stack.enter_context(mirrored.rows_of_global_batch(xb))
                return layer(xb)

        xs = strategy.experimental_distribute_values_from_function(
            lambda ctx: tf.constant(parts[ctx.replica_id_in_sync_group]))
        step = tf.function(lambda xs, replica=replica: strategy.run(replica, args=(xs,)))
        equal = []
        for _ in range(2):  # the seed state moves alike
            got = np.concatenate([t.numpy() for t in strategy.experimental_local_results(step(xs))])
            equal.append(bool(np.array_equal(got, alone(x).numpy())))
        found[name] = all(equal)

    def noisy():
        return keras.Sequential([keras.Input((3,)), keras.layers.GaussianNoise(0.1, seed=1), keras.layers.Dense(1)])

    def spatial():
        return keras.Sequential([keras.Input((3,)), keras.layers.Reshape((3, 1)),
                                 keras.layers.SpatialDropout1D(0.2, seed=1), keras.layers.Flatten(),
                                 keras.layers.Dense(1)])

    data = HarData.load(data_path)
    for build in (noisy, spatial):
        for train in (mirrored.train, mirrored.fit_train):
            try:
                train(build, data, CFG, devices=devices)
                found[f"{build.__name__} {train.__name__}"] = None
            except SpecError as error:
                found[f"{build.__name__} {train.__name__}"] = str(error)
    print(json.dumps(found))


def test_on_two_replicas_each_applies_its_rows_of_one_processs_mask_and_other_draws_are_refused(har, tmp_path):
    """Each replica's rows of the global batch's mask (7 rows over 2 replicas: 4 and 3), with blocks nested, noise
    shapes, a rate of 1, Attention's dropout; GaussianNoise and SpatialDropout1D (whose noise shape is its own rows')
    refused by the loop and by fit under the strategy, in one line."""
    har.save(tmp_path / "data.npz")
    code = f"from tests.native.tensorflow.test_mirrored import two_replicas; two_replicas({str(tmp_path / 'data.npz')!r})"
    env = {**os.environ, "KERAS_BACKEND": "tensorflow", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {name: found.pop(name) for name, _, _ in MASK_CASES} == {name: True for name, _, _ in MASK_CASES}
    assert found.keys() == {f"{b} {t}" for b in ("noisy", "spatial") for t in ("train", "fit_train")}
    for key, message in found.items():
        layer = "GaussianNoise" if key.startswith("noisy") else "SpatialDropout1D"
        assert f"({layer}) draws random numbers that every replica would draw" in message and "\n" not in message


@pytest.mark.parametrize("name", MODELS)
def test_no_model_that_distributed_takes_is_refused(name):
    from keras_side.zoo import ZOO

    mirrored.refuse_other_draws(resolve(ZOO[name].build)())


def test_a_model_drawing_in_its_own_call_is_refused():
    from tests.keras_side.test_models import DrawsInItsCall

    with pytest.raises(SpecError, match=r"\(DrawsInItsCall\) draws random numbers that every replica would draw"):
        mirrored.refuse_other_draws(DrawsInItsCall())


def test_outside_a_strategy_of_several_replicas_nothing_changes():
    """One replica (no strategy): Keras's dropout stays in place and draws its own mask, to the bit."""
    import keras
    from keras.src.backend.tensorflow import random

    keras_dropout, x = random.dropout, np.ones((6, 5), np.float32)
    layer = keras.layers.Dropout(0.5, seed=1)
    outside = layer(x, training=True)
    layer.seed_generator.state.assign([1, 0])
    with mirrored.rows_of_global_batch(x):
        assert random.dropout is keras_dropout
        np.testing.assert_array_equal(layer(x, training=True), outside)


def test_the_replicas_summed_gradient_is_the_global_batchs_penalties_included(har):
    """What the strategy computes, in one process: each replica's `shard_loss` on an uneven split (3 rows over 2
    replicas: 2 and 1), its gradient, summed over the replicas as Keras's optimizer sums them. It equals the gradient
    of the whole batch's loss on `mlp_l2`: the kernel penalty counted once, the activity penalty (in Keras a mean over
    the rows its layer sees) the batch's mean. `tf.nn.scale_regularization_loss`'s / replicas in place of the rows
    would weigh the two replicas' activity means equally (fails: checked)."""
    import tensorflow as tf

    seed_everything(0)
    model = resolve("keras_side.models:mlp_l2")()
    summed = mirrored.summed_loss(TrainConfig())
    rows, replicas = np.array([10, 500, 1200]), 2
    x, y = (tf.constant(take(a, rows)) for a in (har.x_train, har.y_train))
    total = [tf.zeros_like(v) for v in model.trainable_variables]
    for replica in range(replicas):
        mine = shard(slice(0, len(rows)), replica, replicas)
        with tf.GradientTape() as tape:
            loss = mirrored.shard_loss(model, summed, x[mine], y[mine], tf.constant(3.0))
        total = [t + g for t, g in zip(total, tape.gradient(loss, model.trainable_variables), strict=True)]
    with tf.GradientTape() as tape:
        whole = summed(y, model(x, training=True)) / 3.0 + tf.add_n(model.losses)
    for t, w in zip(total, tape.gradient(whole, model.trainable_variables), strict=True):
        np.testing.assert_allclose(t.numpy(), w.numpy(), rtol=PARITY_RTOL, atol=PARITY_ATOL)


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


@pytest.mark.parametrize("build", ["keras_side.models:bn_mlp", "keras_side.models:dropout_mlp"])
def test_fit_under_the_strategy_with_batchnorm_synchronized_and_dropout(har, tmp_path, build):
    """`fit` under the strategy (`fit_train` sets Keras's `synchronized=True`, and its step opens
    `rows_of_global_batch`): the global batch's moments and Dropout mask on every replica, so equal to one process's
    plain `fit` when every batch splits evenly. Under a user's keras.json (floatx float16), as above: `fit` under
    the strategy once trained in float16."""
    from keras_side import fit

    even = whole_batches(har, SPEC["batch_size"], 2)
    parallel = mirrored_run(even, tmp_path, build, "--fit", keras_home=users_keras_home(tmp_path / "keras"))
    seed_everything(0)
    assert all(w.dtype == np.float32 for w in parallel)
    assert gap(fit.train(resolve(build)(), even, CFG).weights, parallel) <= DATA_PARALLEL_ATOL


def test_each_replica_computes_on_one_thread():
    """The launch's threads, as the one-process worker's (one thread an op) with one op a replica at a time: the
    throughput ratio is devices against one. `seed_everything` came after the runtime had started, too late."""
    code = ("from native.tensorflow import mirrored; import tensorflow as tf; mirrored.use_cpus(2); "
            "print(tf.config.threading.get_intra_op_parallelism_threads(), "
            "tf.config.threading.get_inter_op_parallelism_threads())")
    env = {**os.environ, "KERAS_BACKEND": "tensorflow", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.split() == ["1", "2"], proc.stderr[-2000:]


def test_the_cpu_cannot_be_split_once_tensorflow_runs():
    import tensorflow as tf

    tf.constant(1.0) + 1.0  # the runtime is up
    with pytest.raises(SpecError, match="runtime has started"):
        mirrored.use_cpus(2)


def test_clipping_is_refused(har):
    with pytest.raises(SpecError, match="clips each replica's gradient"):
        mirrored.train(resolve("keras_side.models:har"), har, TrainConfig(clipnorm=1.0), devices=["/cpu:0"])


def test_the_launchers_help_is_its_own_lines_alone():
    """Run by hand, with no TF_CPP_MIN_LOG_LEVEL of ours: `--help` prints the usage and nothing of TensorFlow's
    start-up (its CPU-feature and absl lines came first on stderr; on a CPU where oneDNN's custom ops are on, absl
    logs one at import that no variable silences, so the command line is read before TensorFlow is imported)."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    proc = subprocess.run([sys.executable, "-m", "native.tensorflow.mirrored", "--help"], capture_output=True,
                          text=True, env=env | {"KERAS_BACKEND": "tensorflow", "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0 and proc.stdout.startswith("usage: python -m native.tensorflow.mirrored")
    assert proc.stderr == ""
