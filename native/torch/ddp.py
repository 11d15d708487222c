"""The torch native loop, data-parallel: the Keras model (a `torch.nn.Module`) inside `DistributedDataParallel`.

    torchrun --standalone --nproc-per-node 2 -m native.torch.ddp --data data.npz --config '{"epochs": 5}' \\
        --out weights.npz                                   # one machine, 2 processes (gloo on CPU, nccl with CUDA)
    torchrun --nnodes 2 --node-rank R --rdzv-backend c10d --rdzv-endpoint HOST:29500 --nproc-per-node 2 \\
        -m native.torch.ddp ...                             # several hosts: the same command on each

Every process holds the whole model; each takes its shard of every global batch (the batch `fit` would take, cut
into `world` contiguous parts) and DDP averages the gradients in backward with an all-reduce, so every process
applies the same update. Each shard's loss is weighted by its share of the global batch times `world`, so the
average of the processes' gradients is the gradient of the global batch's mean loss even when the short last batch
does not split evenly: the same step as one process, up to float32 rounding (`tests/native/torch/test_ddp.py`).

The penalties in `model.losses` are weighted the same way. An activity regularizer is, in Keras, a mean over the
rows its layer sees: each rank's shard, weighted by its share, becomes the global batch's mean. A weight penalty
(kernel, bias) is the same on every rank, and the shares add up to `world`, so the average counts it once. That is
exact for those two kinds; a loss of your own that is neither (`add_loss` of a sum over the rows, a max) is not.
Adding the penalties unweighted, each rank's activity mean as if its shard were half the batch, ends measurably
further from one process (docs/dev-notes.md, "Measurements once quoted in the code").

BatchNorm: Keras on torch holds a BatchNormalization's moving statistics as Parameters without gradients, which DDP
neither averages nor broadcasts, so left alone each rank would normalize by its own shard's moments and move its own
averages, far from one process. `synchronize_batchnorm` does for Keras's layer what
`torch.nn.SyncBatchNorm` does for torch's: the batch moments from sums all-reduced over the ranks, with autograd
through the all-reduce (`AllReduceSum`), so every rank normalizes by the global batch's moments and moves the same
averages, and the gradients are the global batch's. `train` applies it.

Dropout: left to itself, each rank would draw a mask for its own shard from the same seed state, so every rank's
rows would get the same pattern, and none the rows of the mask one process draws for the global batch. For seeded
Dropouts that the torch loop can draw before the step (`compiled.Draws`), every rank draws the global batch's masks, as
one process would, and takes its own rows of them (`train`); so dropout_mlp ends where one process ends. The ranks
compare a digest of their first step's masks (`check_same_draws`): ranks on GPUs of different models could draw
otherwise from one seed. A model with any other layer that draws (an unseeded Dropout, GaussianNoise) is refused:
every rank would draw alike.
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import math
import os
import subprocess
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from keras_side import cores, internals
from keras_side.arrays import as_tuple, first, keras_inputs, take
from keras_side.backend import keras_defaults
from keras_side.checks import check_data
from keras_side.data import HarData, batch_slices, numpy_orders, shard
from keras_side.models import batchnorm_layers, drawing_layers, ensure_built
from keras_side.process import die_with_parent, with_parent
from keras_side.results import save_trained
from keras_side.spec import SpecError, TrainConfig
from native import driver, preflight
from native.torch.launch import torchrun_command
from native.torch.bypass import forward
from native.torch.compiled import Draws, drawable
from native.torch.step import Updates, through_autograd
from native.torch.loop import tensors
from native.torch.losses import spec_loss

# A collective that waits longer than this for a rank ends the run with an error on every other rank, instead of a
# hang: a rank that died or hangs is reported within it. NATIVE_LOOPS_COLLECTIVE_TIMEOUT_S sets it (the hang test).
COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=float(os.environ.get("NATIVE_LOOPS_COLLECTIVE_TIMEOUT_S", 60)))


def synchronize_batchnorm(model) -> int:
    """Every Keras BatchNormalization in `model` takes its batch moments over every rank's rows; returns how many.
    It replaces the layer's `_moments`, which Keras 3.15.1's `call` asks for the batch moments (a test pins that)."""
    layers = batchnorm_layers(model)
    for layer in layers:
        internals.replace_moments(layer, _global_moments)
    return len(layers)


class AllReduceSum(torch.autograd.Function):
    """The sum over the ranks, differentiable: every rank's loss depends on every rank's rows through it, so its
    gradient is the sum over the ranks of the incoming gradients (torch's SyncBatchNorm does the same)."""

    @staticmethod
    def forward(ctx, x):
        x = x.clone()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


def _global_moments(layer, inputs, mask):
    """Keras's torch moments (mean, mean of squares minus the squared mean) of the global batch: each rank's sums
    and row count, all-reduced; the all-reduce of the sums carries the gradient back to every rank's rows."""
    if mask is not None:
        raise SpecError("a masked BatchNormalization is not synchronized across ranks here; drop the mask")
    axes = internals.reduction_axes(layer)
    rows = torch.tensor(float(math.prod(inputs.shape[a] for a in axes)), device=inputs.device)
    dist.all_reduce(rows)
    sums = AllReduceSum.apply(torch.stack([torch.sum(inputs, dim=axes), torch.sum(torch.square(inputs), dim=axes)]))
    mean = sums[0] / rows
    return mean, sums[1] / rows - torch.square(mean)


def train(build, data: HarData, cfg: TrainConfig) -> list[np.ndarray]:
    """Train the model `build()` makes on this process's shard of every global batch; the process group must be
    initialized. Returns the trained weights (the same on every rank). The batch order is the shared NumPy one, so
    every rank cuts the same global batches. The epochs are the driver's (`native.driver.run`), the step the fast
    path's (`step.through_autograd`, `step.Updates`) on this rank's shard of the loss (`RankSteps`)."""
    if data.w_train is not None:
        raise SpecError("the data-parallel loop takes no sample weights; train without them")
    model = ensure_built(build(), data.x_train)
    draws = Draws.of(model, data.x_train)  # every rank draws the global batch's Dropout masks and takes its rows
    refuse_other_draws(model, draws=draws)
    check_data(cfg, data, model)  # as the one-process loop: every rank would raise deep in its loss
    synchronize_batchnorm(model)
    driver.run(RankSteps(model, data, cfg, draws), cfg)
    return model.get_weights()


class RankSteps(driver.Engine):
    """This rank's part of every global batch, for `driver.run`: its rows (and its rows of the global batch's
    Dropout masks), the loss of its shard (`shard_loss`) through DDP, whose backward averages the gradients over the
    ranks, then the fast path's update."""

    def __init__(self, model, data: HarData, cfg: TrainConfig, draws: Draws | None):
        self.model, self.data, self.cfg, self.draws = model, data, cfg, draws
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.device = torch.cuda.current_device() if torch.cuda.is_available() else None  # main set it, from LOCAL_RANK
        module = WithMasks(model) if draws else model
        ddp = DistributedDataParallel(module, device_ids=None if self.device is None else [self.device])  # rank 0's
        self.update = Updates(model, cfg)  # weights, broadcast: the optimizer is built on them
        # every target (n, 1), as the outputs
        loss_fn, world = spec_loss(cfg, same_rank=all(t.ndim == 2 for t in as_tuple(data.y_train))), self.world
        # the closure holds what it needs, not `self`: a cycle would keep DDP's reducer alive past the run, until a
        # garbage collection, or the interpreter's teardown, where gloo aborts the process
        self.backward = through_autograd(lambda xb, yb, size, masks: (shard_loss(
            model, loss_fn, xb, yb, size, world=world, forward=ddp, masks=masks), None), self.update.optimizer)
        self.orders = numpy_orders(cfg.seed, data.n_train, cfg.epochs)
        self.checked = False  # that every rank drew the first step's masks alike

    def batches(self, epoch: int):
        """`(x, y, the global batch's rows, masks)`: this rank's rows of each global batch."""
        for rows in batch_slices(self.data.n_train, self.cfg.batch_size):
            size = rows.stop - rows.start  # the global batch's rows
            positions = shard(slice(0, size), self.rank, self.world)  # this rank's rows of the batch
            mine = self.orders[epoch][rows][positions]
            xb, yb = (tensors(take(a, mine), self.device) for a in (self.data.x_train, self.data.y_train))
            masks = ()
            if self.draws:
                drawn = self.draws(size)
                if not self.checked:
                    check_same_draws(drawn)
                    self.checked = True
                masks = tuple(m[positions] for m in drawn)
            yield xb, yb, size, masks

    def step(self, batch):
        loss, _ = self.backward(*batch)  # DDP averages the gradients over the ranks in backward
        self.update()
        return loss.detach()

    def rows(self, batch) -> int:
        return batch[2]

    def epoch_loss(self, losses: list, rows: list[int]) -> float:
        """The global batches' mean loss: the ranks' shard losses add up to `world` times their batch's loss
        (`shard_loss`), so one all-reduce of the sums, once an epoch."""
        total = torch.stack(losses).double() @ torch.tensor(rows, dtype=torch.float64, device=losses[0].device)
        dist.all_reduce(total)
        return float(total) / self.world / sum(rows)


def refuse_other_draws(model, *, draws: Draws | None) -> None:
    """A SpecError for a layer that draws random numbers where `draws` (`Draws.of` the model) does not draw them."""
    random = drawing_layers(model)
    if random and not draws:
        layer = next((layer for layer in random if not drawable(layer)), random[0])  # else the model's way of calling
        raise SpecError(f"layer {layer.name!r} draws random numbers, which every rank would draw alike for its "
                        "own rows under DDP, not its rows of the global batch's; make it a seeded keras.layers.Dropout "
                        "in a Sequential or Functional model (native.torch.compiled.Draws), or train in one process")


def check_same_draws(masks) -> None:
    """Every rank drew the same global masks, compared once by a digest: ranks on devices of different models can
    draw different numbers from one seed state (torch's CUDA sampling kernels map elements to random streams by a grid
    capped by the device's SM count: pytorch/pytorch#196613), and each would then take its rows of another mask."""
    digest = hashlib.sha256(b"".join(m.cpu().numpy().tobytes() for m in masks)).hexdigest()
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, digest)
    differ = [rank for rank, d in enumerate(every) if d != every[0]]
    if differ:
        raise RuntimeError(f"rank {', '.join(map(str, differ))} drew other Dropout masks than rank 0 from the same seed "
                           "state (devices of different models can); train on devices of one model, or in one process")


class WithMasks(torch.nn.Module):
    """The Keras model's training call with its Dropouts' masks given (`bypass.forward`), as the module DDP wraps:
    its parameters are the model's."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x, masks):
        return forward(self.model, x, training=True, masks=masks)


def shard_loss(model, loss_fn, xb, yb, global_rows: int, *, world: int, forward=None, masks=()):
    """A rank's part of the global batch's loss, as DDP combines the ranks' gradients (their average): the mean loss
    of its rows plus the model's penalties, times its share of the global batch's `global_rows` rows times `world`
    (see above). `forward` is DDP around the model (default: the model itself), around `WithMasks` when `masks`,
    this rank's rows of the global batch's Dropout masks, are given. `native.tensorflow.mirrored.shard_loss` is the
    same for a strategy, which sums its replicas' gradients."""
    forward = model if forward is None else forward
    outputs = forward(keras_inputs(xb), masks) if masks else forward(keras_inputs(xb), training=True)
    loss = loss_fn(keras_inputs(yb), outputs)
    share = len(first(as_tuple(yb))) * world / global_rows
    return (loss + sum(model.losses) if model.losses else loss) * share


def launch(processes: int, data: Path, out: Path, config: dict, build: str = "keras_side.models:har", *,
           env: dict | None = None) -> subprocess.CompletedProcess:
    """Run `processes` ranks on this host with torchrun (a free port: `--standalone`) and wait for them; torchrun
    stops every rank when one fails."""
    env = {**os.environ, "KERAS_BACKEND": "torch", **(env or {})}
    return subprocess.run(with_parent(torchrun_command(processes, "--data", str(data), "--config", json.dumps(config),
                                                       "--build", build, "--out", str(out))),
                          env=env, capture_output=True, text=True)


def main(argv=None) -> int:
    """One rank of a torchrun launch: train the model of --build (the HAR by default) on --data and, on rank 0,
    write the weights to --out."""
    die_with_parent()  # torchrun's agent is the parent: killed (by SIGKILL too), it cannot stop its ranks itself
    parser = argparse.ArgumentParser(prog="torchrun ... -m native.torch.ddp", description=main.__doc__)
    parser.add_argument("--data", required=True, help="a HarData .npz (HarData.save)")
    parser.add_argument("--config", default="{}", help="TrainConfig fields as JSON")
    parser.add_argument("--build", default="keras_side.models:har", help="the model builder, module:function")
    parser.add_argument("--out", required=True, help="where rank 0 writes the trained weights (.npz)")
    args = parser.parse_args(argv)
    try:  # what the user gave, before this rank joins the others (torchrun then reports the rank's exit)
        cfg, data = preflight.launch_args(args)
    except preflight.LaunchError as err:
        return preflight.one_line(parser.prog, err)
    cores.pin_launched(int(os.environ.get("LOCAL_RANK", 0)))  # its own core, where the launcher names them
    keras_defaults()  # from Keras's defaults, whatever a user's keras.json sets (floatx...), as compare's workers
    from keras_side.determinism import seed_everything
    from keras_side.spec import resolve

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if torch.cuda.is_available():  # before the model: Keras puts its variables on the current device
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(backend, timeout=COLLECTIVE_TIMEOUT)
    try:
        seed_everything(cfg.seed)
        try:
            model = ensure_built(resolve(args.build)(), data.x_train)  # built before the clock, as it was
            start = time.perf_counter()
            weights = train(lambda: model, data, cfg)
        except SpecError as err:  # what only training finds (a layer no rank can draw for): one line from the rank
            return preflight.one_line(parser.prog, err)
        seconds = time.perf_counter() - start  # training only: not the launch, the imports or the join
        cpus = [None] * dist.get_world_size()
        dist.all_gather_object(cpus, cores.cores_in_use())  # the cores each rank could compute on
        if dist.get_rank() == 0:
            save_trained(args.out, weights, seconds, cpus, seed=cfg.seed)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
