"""The JAX loop data-parallel (`native/jax/sharded.py`): the batch axis sharded over two host devices in one
process, and over two processes joined by jax.distributed (gloo CPU collectives), ends where one device ends on the
same global batches; a process that dies ends the run at once, with no weights written."""
import re
from pathlib import Path

import jax
import numpy as np
import pytest

from compare.referee.tolerances import DATA_PARALLEL_ATOL
from keras_side import fit
from keras_side.data import whole_batches
from keras_side.determinism import seed_everything
from keras_side.results import load_trained, trained_record, versions
from keras_side.spec import SpecError, TrainConfig, resolve
from native.jax import loop, sharded
from tests.conftest import users_keras_home
from tests.native import faults
from tests.native.conftest import SHARDING_DEVICES
from tests.tiers import FULL_ONLY, rows

SPEC = {"epochs": 2, "batch_size": 100}  # the short last batch (63 rows) does not split: it is replicated
CFG = TrainConfig(batch_order="numpy", validate=False, **SPEC)


def alone(har, build, seed=0):
    seed_everything(seed)
    return loop.train(resolve(build)(), har, CFG.replace(seed=seed)).weights


@pytest.mark.parametrize("build", rows(["keras_side.models:har", "keras_side.models:mlp_l2", "keras_side.models:bn_mlp",
                                        "keras_side.models:dropout_mlp"],
                                       fast=["keras_side.models:bn_mlp", "keras_side.models:dropout_mlp"]))
def test_two_devices_in_one_process_end_where_one_ends(har, build):
    """BatchNorm's moments and Dropout's mask are the global batch's: the step computes one global batch whose rows
    lie on two devices, so nothing needs synchronizing by hand."""
    assert len(jax.devices()) == SHARDING_DEVICES
    seed_everything(0)
    parallel = sharded.train(resolve(build), har, CFG)
    for a, b in zip(alone(har, build), parallel, strict=True):
        np.testing.assert_allclose(b, a, atol=DATA_PARALLEL_ATOL, rtol=0)


def test_class_labels_the_loss_cannot_take_are_refused_as_in_one_process(har):
    """The one-process loop refuses them; the sharded step trained on them without a word (JAX's one-hot of a label
    past the last class is zeros)."""
    import dataclasses

    import keras

    y = (har.y_train > 0).astype(np.float32)
    y[5] = 2  # two classes: 0 and 1
    data = dataclasses.replace(har, y_train=y, y_val=(har.y_val > 0).astype(np.float32),
                               y_test=(har.y_test > 0).astype(np.float32))
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    with pytest.raises(SpecError, match="the train targets hold the label 2, .*0 to 1 \\(the model's 2 outputs\\)"):
        sharded.train(lambda: model, data, CFG.replace(loss="sparse_categorical_crossentropy", from_logits=True))


def test_two_outputs_on_two_devices_end_where_one_ends(panel):
    """Several targets (a tuple), each output's loss weighted as `compile` weighs them, on the sharded step
    (TensorFlow's launch with two outputs: tests/native/tensorflow/test_mirrored.py; torch's rank loss:
    tests/native/torch/test_ddp.py)."""
    from compare.data import panel as har_data
    from keras_side.zoo import ZOO

    entry = ZOO["two_horizons"]
    data = har_data.prepare_kind(panel, entry.data)
    cfg = CFG.replace(**{k: v for k, v in entry.spec.items() if k != "metrics"})
    seed_everything(0)
    one = loop.train(resolve(entry.build)(), data, cfg).weights
    seed_everything(0)
    for a, b in zip(one, sharded.train(resolve(entry.build), data, cfg), strict=True):
        np.testing.assert_allclose(b, a, atol=DATA_PARALLEL_ATOL, rtol=0)


def test_two_processes_end_where_one_ends(har, tmp_path):
    """Under a user's keras.json (floatx float16), which must not reach the launched processes: they start from
    Keras's defaults, as compare's workers do, and train in float32."""
    users_keras_home(tmp_path / "keras")
    har.save(tmp_path / "data.npz")
    result = sharded.launch(2, tmp_path / "data.npz", tmp_path / "weights.npz", SPEC | {"seed": 5},
                            env={"KERAS_HOME": str(tmp_path / "keras")})
    assert result.returncode == 0, result.stderr[-3000:]
    parallel, _ = load_trained(tmp_path / "weights.npz")
    assert trained_record(tmp_path / "weights.npz") == {"seed": 5, "versions": versions()}  # what reproduces it
    assert all(w.dtype == np.float32 for w in parallel)
    for a, b in zip(alone(har, "keras_side.models:har", seed=5), parallel, strict=True):
        np.testing.assert_allclose(b, a, atol=DATA_PARALLEL_ATOL, rtol=0)


# make test: mid-run, where process 0 waits for the dead one in a collective; one that dies while building the model
# is `native-loops distributed`'s test of it (tests/compare/test_distributed.py), and make test-full's here.
@pytest.mark.parametrize("build", rows(["dies_in_the_second_process", "dies_mid_run"], fast=["dies_mid_run"]))
def test_a_process_that_dies_ends_the_run_and_writes_nothing(har, tmp_path, build):
    """Process 1 dies while building the model, or at its 5th step while process 0 waits for it in a collective:
    the launcher stops process 0 at once, and no process of the run is left."""
    har.save(tmp_path / "data.npz")
    result = sharded.launch(2, tmp_path / "data.npz", tmp_path / "weights.npz", SPEC, f"tests.native.faults:{build}")
    # process 0 fails too (its collective's peer is gone) or is stopped: which one the launcher sees first varies
    assert result.returncode != 0 and "--- process 1 (exit 3)" in result.stderr, result.stderr[-3000:]
    assert not Path(tmp_path / "weights.npz").exists()
    assert faults.processes_naming(tmp_path) == []


def test_a_process_that_hangs_is_stopped_when_no_step_finishes(har, tmp_path):
    """Process 1 hangs at its 5th step; process 0 waits for it in the step's all-reduce, which in jax 0.10.2 has no
    timeout. The launcher sees no step finish for NATIVE_LOOPS_COLLECTIVE_TIMEOUT_S (10 s here, 60 by default) and
    stops both. The test waits for the launch to end, however long that takes: the limit bounds it, the test asserts
    no time, and a healthy process slower than the limit would end the same way."""
    har.save(tmp_path / "data.npz")
    result = sharded.launch(2, tmp_path / "data.npz", tmp_path / "weights.npz", SPEC,
                            "tests.native.faults:hangs_mid_run", env={"NATIVE_LOOPS_COLLECTIVE_TIMEOUT_S": "10"})
    last = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 124 and "no process finished a step for 10 s" in last, result.stderr[-3000:]
    # both processes stand at the same step, before the 5th: a finished step is counted once the next one is on its
    # way (one step in flight), so the count is 3 or 4 as dispatch runs ahead
    counts = [int(n) for n in re.findall(r"process \d: (\d+)", last)]
    assert len(counts) == 2 and counts[0] == counts[1] and 3 <= counts[0] <= 4, last
    assert not Path(tmp_path / "weights.npz").exists()
    assert faults.processes_naming(tmp_path) == []


@FULL_ONLY  # make test has the hang above, which ends the run; this one's line names the stopped process
def test_a_stopped_process_is_named(har, tmp_path):
    """Process 1 stops itself (SIGSTOP) at its 5th step: the launcher's line names it, where a hang in code (the
    test above) looks to the system as the processes that wait for it do."""
    har.save(tmp_path / "data.npz")
    result = sharded.launch(2, tmp_path / "data.npz", tmp_path / "weights.npz", SPEC,
                            "tests.native.faults:stops_mid_run", env={"NATIVE_LOOPS_COLLECTIVE_TIMEOUT_S": "10"})
    last = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 124 and "process 1 is stopped (SIGSTOP), and the others wait for it" in last, \
        result.stderr[-3000:]
    assert faults.processes_naming(tmp_path) == []


def test_fit_under_keras_data_parallel_ends_where_one_device_ends(har):
    data = whole_batches(har, SPEC["batch_size"], 2)  # 2,200 training rows: every batch splits over two devices
    seed_everything(0)
    one = fit.train(resolve("keras_side.models:har")(), data, CFG).weights
    seed_everything(0)
    parallel = sharded.fit_train(resolve("keras_side.models:har"), data, CFG)
    for a, b in zip(one, parallel, strict=True):
        np.testing.assert_allclose(b, a, atol=DATA_PARALLEL_ATOL, rtol=0)


def test_fit_under_keras_data_parallel_needs_batches_that_split(har):
    """Keras 3.15.1 shards each batch evenly or fails inside jax (IndivisibleError); the check says so first."""
    with pytest.raises(SpecError, match="a training batch of 63 rows does not split"):
        sharded.fit_train(resolve("keras_side.models:har"), har, CFG)


def test_fits_option_mistakes_are_one_line(har, tmp_path, capsys):
    """--fit with --walk-forward was a traceback (the windows taken for a HarData)."""
    har.save(tmp_path / "data.npz")
    assert sharded.main(["--fit", "--walk-forward", "--data", str(tmp_path / "data.npz"), "--out",
                         str(tmp_path / "w.npz")]) == 2
    assert capsys.readouterr().err == ("python -m native.jax.sharded: error: --fit trains one model with model.fit, "
                                       "and the walk-forward's models train with --processes; drop --fit or "
                                       "--walk-forward\n")
    # --fit runs in this process, a --process-id or not: its options are checked (it was an UnboundLocalError)
    assert sharded.main(["--fit", "--process-id", "0", "--data", str(tmp_path / "missing.npz"), "--out",
                         str(tmp_path / "w.npz")]) == 2
    assert "--data" in capsys.readouterr().err and not (tmp_path / "w.npz").exists()


def test_the_walk_forward_across_two_processes_gives_one_processs_forecasts(panel, tmp_path):
    """Every walk-forward refit of two assets, the model axis split over two jax.distributed processes (one device
    each): the forecasts one device gives, model for model (each model's start comes from the seed alone)."""
    from compare.speed import walk_forward
    from compare.referee.tolerances import SHARDED_ATOL
    from keras_side import models
    from native.jax import many

    windows = walk_forward.build_windows(panel, ["bono", "indice"], "2018-01-01", None).model_inputs()
    np.savez(tmp_path / "windows.npz", **{k: windows[k] for k in ("x", "y", "rows", "x_next")})
    spec = {"epochs": 2}
    result = sharded.launch(2, tmp_path / "windows.npz", tmp_path / "out.npz", spec, walk_forward=True)
    assert result.returncode == 0, result.stderr[-3000:]
    with np.load(tmp_path / "out.npz") as z:
        across = z["forecasts"]
    alone, _, _ = many.forecasts(models.har, windows, TrainConfig(**spec), devices=jax.devices()[:1])
    assert across.shape == alone.shape
    np.testing.assert_allclose(across, alone, atol=SHARDED_ATOL, rtol=0)
