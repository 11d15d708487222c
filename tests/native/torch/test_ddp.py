"""The torch loop data-parallel (`native/torch/ddp.py`): two processes launched by torchrun, DistributedDataParallel
over gloo, end where one process ends on the same global batches; a rank that dies ends the launch with an error and
no weights written."""
import json
import os
import signal
import subprocess

import numpy as np
import pytest
import torch

from compare.distributed import MODELS
from compare.referee.tolerances import DATA_PARALLEL_ATOL, PARITY_ATOL, PARITY_RTOL
from keras_side.arrays import keras_inputs, take
from keras_side.data import shard
from keras_side.determinism import seed_everything
from keras_side.results import load_trained, trained_record, versions
from keras_side.spec import SpecError, TrainConfig, resolve
from native.torch import ddp
from native.torch import compiled as torch_compiled
from native.torch import fast
from native.torch import loop
from native.torch import losses as torch_losses
from native.torch.launch import torchrun_command
from tests.conftest import REPO, users_keras_home, wait_for
from tests.native import faults
from tests.tiers import rows

# 2,263 training days in batches of 100: the short last batch (63 rows) splits 32/31, the uneven case.
SPEC = {"epochs": 2, "batch_size": 100}


def launch(tmp_path, build: str, processes: int = 2, keras_home=None) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": str(REPO)} | ({"KERAS_HOME": str(keras_home)} if keras_home else {})
    return ddp.launch(processes, tmp_path / "data.npz", tmp_path / "weights.npz", SPEC, build, env=env)


# make test: BatchNorm and Dropout; the penalty's average is the ranks' gradient below, in one process (mlp_l2).
@pytest.mark.parametrize("build", rows(["keras_side.models:mlp_l2", "keras_side.models:bn_mlp",
                                        "keras_side.models:dropout_mlp", "tests.native.loops:constrained_mlp"],
                                       fast=["keras_side.models:bn_mlp", "keras_side.models:dropout_mlp"]))
def test_two_processes_end_where_one_ends(har, tmp_path, build):
    """An MLP with L2 regularizers (each process adds the whole penalty: averaged, it counts once), one with
    BatchNorm (its moments all-reduced: `synchronize_batchnorm`; its moving statistics compared too), and one with a
    seeded Dropout (every rank draws the global batch's mask and takes its rows: `compiled.Draws`); in the full tier, one
    whose weight constraints bind (each rank applies them after its step). The HAR's Dense
    layers are in all three; `native-loops distributed` runs the HAR itself
    (tests/compare/test_distributed.py). Under a user's keras.json (floatx float16), which must not reach the ranks:
    they start from Keras's defaults, as compare's workers do, and train in float32."""
    har.save(tmp_path / "data.npz")
    proc = launch(tmp_path, build, keras_home=users_keras_home(tmp_path / "keras"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    parallel, _ = load_trained(tmp_path / "weights.npz")
    assert all(w.dtype == np.float32 for w in parallel)
    assert trained_record(tmp_path / "weights.npz") == {"seed": 0, "versions": versions()}  # rank 0's
    seed_everything(0)
    alone = fast.train(resolve(build)(), har, TrainConfig(batch_order="numpy", validate=False, **SPEC))
    for a, b in zip(alone.weights, parallel, strict=True):
        np.testing.assert_allclose(b, a, atol=DATA_PARALLEL_ATOL, rtol=0)


def test_a_model_whose_random_layer_every_rank_would_draw_alike_is_refused(har):
    """GaussianNoise (or an unseeded Dropout) would draw the same noise on every rank for its own rows: refused, in
    one line naming it (not the seeded Dropout beside it), before the process group is asked for anything."""
    import keras

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dropout(0.2, seed=2),
                              keras.layers.GaussianNoise(0.1, seed=1), keras.layers.Dense(1)])
    with pytest.raises(SpecError, match="'gaussian_noise' draws random numbers, which every rank would draw alike .* "
                                        "or train in one"):
        ddp.train(lambda: model, har, TrainConfig(**SPEC))


@pytest.mark.parametrize("name", MODELS)
def test_no_model_that_distributed_takes_is_refused(panel, name):
    """Every zoo model `native-loops distributed` offers passes the refusal (the zoo's LSTM, whose cell holds a
    SeedGenerator it never draws from, was refused for a stop)."""
    from keras_side.zoo import ZOO
    from tests.native.many_seeds import zoo_data

    model = resolve(ZOO[name].build)()
    ddp.refuse_other_draws(model, draws=torch_compiled.Draws.of(model, zoo_data(panel, name).x_train))


@pytest.mark.parametrize("name", ["mlp_l2", "two_horizons"])
def test_the_ranks_average_gradient_is_the_global_batchs_penalties_included(panel, name):
    """What DDP computes, in one process: each rank's `shard_loss` on an uneven split (3 rows over 2 ranks: 2 and 1),
    its gradient, averaged over the ranks. It equals the gradient of the whole batch's loss on `mlp_l2`: the kernel
    penalty counted once, the activity penalty (in Keras a mean over the rows its layer sees) the batch's mean. A
    penalty left out of the share would weigh the two ranks' activity means equally (fails: checked). And on a model
    with two outputs, each output's loss weighted as `compile` weighs them (its two targets a tuple)."""
    from compare.data import panel as har_data
    from keras_side.zoo import ZOO

    entry = ZOO[name]
    data = har_data.prepare_kind(panel, entry.data)
    seed_everything(0)
    model = resolve(entry.build)()
    loss_fn = torch_losses.spec_loss(TrainConfig(**{k: v for k, v in entry.spec.items() if k != "metrics"}),
                                   same_rank=True)
    params = [p for p in model.parameters() if p.requires_grad]
    rows, world = np.array([10, 500, 1200]), 2
    x, y = (loop.tensors(take(a, rows), None) for a in (data.x_train, data.y_train))
    averaged = [torch.zeros_like(p) for p in params]
    for rank in range(world):
        mine = shard(slice(0, len(rows)), rank, world)
        loss = ddp.shard_loss(model, loss_fn, take(x, mine), take(y, mine), len(rows), world=world)
        averaged = [a + g / world for a, g in zip(averaged, torch.autograd.grad(loss, params), strict=True)]
    whole, _ = fast.total_loss(model, loss_fn, keras_inputs(x), keras_inputs(y), training=True)
    for a, w in zip(averaged, torch.autograd.grad(whole, params), strict=True):
        np.testing.assert_allclose(a.numpy(), w.numpy(), rtol=PARITY_RTOL, atol=PARITY_ATOL)


# make test: mid-run, where rank 0 waits for the dead rank in an all-reduce; one that dies while building the model:
# make test-full, here and through `native-loops distributed` (tests/compare/test_distributed.py).
@pytest.mark.parametrize("build", rows(["dies_in_the_second_process", "dies_mid_run"], fast=["dies_mid_run"]))
def test_a_rank_that_dies_ends_the_launch_and_writes_nothing(har, tmp_path, build):
    """Rank 1 dies while building the model, or at its 5th step while rank 0 waits for it in an all-reduce:
    torchrun stops rank 0, names the failed rank, and no process of the launch is left."""
    har.save(tmp_path / "data.npz")
    proc = launch(tmp_path, f"tests.native.faults:{build}")
    assert proc.returncode != 0
    assert "exitcode  : 3" in proc.stderr and "rank      : 1" in proc.stderr, proc.stderr[-3000:]
    assert not (tmp_path / "weights.npz").exists()
    assert faults.processes_naming(tmp_path) == []


def test_ranks_that_draw_other_masks_end_the_launch_and_write_nothing(har, tmp_path):
    """Rank 1's `torch.bernoulli` draws otherwise (a GPU of another model could): the first step's digests differ,
    the launch stops with one line naming the rank, and no weights are written."""
    har.save(tmp_path / "data.npz")
    proc = launch(tmp_path, "tests.native.faults:draws_otherwise_in_the_second_process")
    assert proc.returncode != 0
    assert "rank 1 drew other Dropout masks than rank 0 from the same seed state" in proc.stderr, proc.stderr[-3000:]
    assert not (tmp_path / "weights.npz").exists()


@pytest.mark.parametrize("size, world, shards", [(63, 2, [32, 31]), (100, 2, [50, 50]), (5, 3, [2, 2, 1])])
def test_a_global_batch_is_cut_into_contiguous_shards(size, world, shards):
    cut = [shard(slice(0, size), r, world) for r in range(world)]
    assert [s.stop - s.start for s in cut] == shards and cut[0].start == 0 and cut[-1].stop == size
    assert all(a.stop == b.start for a, b in zip(cut, cut[1:]))


def test_a_rank_that_hangs_ends_the_launch_at_the_collective_timeout(har, tmp_path):
    """Rank 1 hangs at its 5th step: rank 0's all-reduce gives up at the process group's timeout (10 s here, 60 s by
    default), its error ends the launch, and torchrun stops the hung rank. The test waits for the launch to end,
    however long that takes: the timeout bounds it, the test asserts no time."""
    har.save(tmp_path / "data.npz")
    proc = ddp.launch(2, tmp_path / "data.npz", tmp_path / "weights.npz", SPEC, "tests.native.faults:hangs_mid_run",
                      env={"PYTHONPATH": str(REPO), "NATIVE_LOOPS_COLLECTIVE_TIMEOUT_S": "10"})
    assert proc.returncode != 0 and "Timed out waiting 10000ms" in proc.stderr, proc.stderr[-3000:]
    assert not (tmp_path / "weights.npz").exists()
    assert faults.processes_naming(tmp_path) == []


def test_the_ranks_end_when_torchrun_is_killed(har, tmp_path):
    """torchrun killed by SIGKILL (its own parent's death sends it one) cannot stop its ranks: each rank asks the
    kernel to end it with torchrun (`ddp.main`). Rank 1 waits forever at its 5th step, rank 0 for it in a collective
    whose timeout is far away: only torchrun's death can end them."""
    har.save(tmp_path / "data.npz")
    marks = tmp_path / "marks"
    marks.mkdir()
    env = {**os.environ, "KERAS_BACKEND": "torch", "PYTHONPATH": str(REPO), "NATIVE_LOOPS_TEST_MARKS": str(marks),
           "NATIVE_LOOPS_COLLECTIVE_TIMEOUT_S": "3600"}
    torchrun = subprocess.Popen(torchrun_command(2, "--data", str(tmp_path / "data.npz"), "--config", json.dumps(SPEC),
                                                 "--build", "tests.native.faults:waits_mid_run", "--out",
                                                 str(tmp_path / "weights.npz")),
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        assert wait_for(lambda: any(marks.iterdir()) or torchrun.poll() is not None), "rank 1 never reached step 5"
        assert torchrun.poll() is None, "the launch ended on its own"
        ranks = [pid for pid in faults.processes_naming(tmp_path) if pid != str(torchrun.pid)]
        assert len(ranks) == 2, ranks
    finally:
        torchrun.kill()
        torchrun.wait()
    try:
        assert wait_for(lambda: faults.processes_naming(tmp_path) == []), "a rank outlived torchrun"
    finally:
        for pid in faults.processes_naming(tmp_path):
            os.kill(int(pid), signal.SIGKILL)


# float32 sums in another order than torch.mean's: a few ulps of the moments' size.
MOMENTS_RTOL = 1e-6


def test_synchronized_moments_are_kerass_on_inputs_of_any_rank(tmp_path):
    """The moments `synchronize_batchnorm` puts in a BatchNormalization, on a (rows, steps, features) input whose
    reduction axes are (0, 1), in a gloo group of one process (the all-reduce is then the identity; two processes
    are the launch tests above): Keras's own moments and their gradients, per feature."""
    import keras
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        model = keras.Sequential([keras.Input((5, 4)), keras.layers.BatchNormalization(name="bn")])
        assert ddp.synchronize_batchnorm(model) == 1
        layer = model.get_layer("bn")
        x = torch.randn(6, 5, 4, generator=torch.Generator().manual_seed(0), requires_grad=True)
        mean, variance = layer._moments(x, None)
        want_mean, want_variance = keras.ops.moments(x, axes=[0, 1])
        assert mean.shape == variance.shape == (4,)
        for got, want in ((mean, want_mean), (variance, want_variance)):
            np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=MOMENTS_RTOL, atol=0)
        got_grad = torch.autograd.grad((mean * 2 + variance * 3).sum(), x)[0]
        want_grad = torch.autograd.grad((want_mean * 2 + want_variance * 3).sum(), x)[0]
        np.testing.assert_allclose(got_grad.numpy(), want_grad.numpy(), rtol=MOMENTS_RTOL, atol=1e-7)
    finally:
        dist.destroy_process_group()


def test_a_ranks_engine_and_its_reducer_are_freed_when_its_run_ends(har, tmp_path):
    """No reference cycle keeps a rank's engine, and DDP's reducer in it, alive after its run: it goes with its last
    reference, before `destroy_process_group`. Through a cycle it lived until a garbage collection, or until the
    interpreter's teardown, where gloo aborted the rank ("terminate called without an active exception", about one
    launch in ten on a loaded machine, after the weights were written). Checked in one process, a group of one, the
    garbage collector off."""
    import gc
    import weakref

    import torch.distributed as dist

    from keras_side import models
    from native import driver

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    gc.disable()
    try:
        model = models.ensure_built(models.har(), har.x_train)
        engine = ddp.RankSteps(model, har, TrainConfig(epochs=1, validate=False), None)
        driver.run(engine, TrainConfig(epochs=1, validate=False))
        freed = [weakref.ref(engine), weakref.ref(engine.backward)]
        del engine
        assert [ref() for ref in freed] == [None, None]
    finally:
        gc.enable()
        dist.destroy_process_group()
