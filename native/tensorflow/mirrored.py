"""The TensorFlow loop data-parallel: `tf.distribute.MirroredStrategy` over replicas in one process, the
`GradientTape` step run on each with `strategy.run`.

    KERAS_BACKEND=tensorflow python -m native.tensorflow.mirrored --replicas 2 --data data.npz --out weights.npz

On CPU the replicas are logical devices, which TensorFlow makes only before its runtime starts (`use_cpus(n)` first
thing in the process: the command does it). The model and the optimizer are built in `strategy.scope()`, so their
variables are mirrored. Each replica takes a contiguous shard of every global batch and scales its loss, as the
TensorFlow guide does, by the global batch size (`sum of its per-sample losses / global batch`); Keras's optimizer
sums the replicas' gradients with an all-reduce before it steps (`_all_reduce_sum_gradients`), so the sum is the
global batch's mean gradient, uneven last batch included. The penalties in `model.losses` are weighted by the
replica's rows / the global batch: an activity regularizer (in Keras a mean over the rows its layer sees) becomes
the global batch's mean, and a weight penalty, the same on every replica, counts once in the sum (exact for those two
kinds; a loss of your own that is neither, `add_loss` of a sum over the rows or a max, is not). The guide's
`tf.nn.scale_regularization_loss` (/ replicas) weighs the activity means of an uneven last batch equally, which
ends measurably further from one process than weighing them by the rows (docs/dev-notes.md, "Measurements once
quoted in the code"). Clipping is not data-parallel-exact here: Keras clips each replica's gradient before that sum.

A BatchNormalization normalizes by its own replica's rows unless built with `synchronized=True`, Keras's switch
(TensorFlow only) for moments from sums all-reduced over the replicas (without it, far from one process).
`synchronize_batchnorm` turns it on in a built model; `train` and `fit_train` apply it.

A Dropout, left to the strategy, draws on every replica the mask of its own shard's shape from the same seed state: one
pattern repeated, not the global batch's, which ends far from one process. Keras
draws it statelessly (`tf.nn.experimental.stateless_dropout`, the seed from the layer's `SeedGenerator`), so the global
batch's mask depends only on the seed and the global shape: under `rows_of_global_batch`, opened at the top of each
replica's step, each replica pads its rows to the global batch (its offset from an all-gather of every replica's rows),
lets Keras draw, and keeps its rows. For a model that draws, that takes an all-gather a step, and a global batch's mask
on every replica for each Dropout call. The all-gather runs at the top of the step, never inside a draw: a collective
there hands control to another replica's thread mid-layer, and an RNN cell, one object for every replica, caches its
mask (measured: replica 1 used replica 0's, of another shape). It assumes what Keras's Dropout, Attention's dropout and
an RNN cell's dropout masks satisfy (tested: a Dropout, Attention, an LSTM's `dropout` and `recurrent_dropout`): axis 0
of what is dropped is the replica's rows of the batch. A layer that draws otherwise (GaussianNoise, GaussianDropout,
AlphaDropout, a SpatialDropout, whose noise shape is its own rows', a model drawing in its own `call`) is refused; a
custom layer of yours that calls Keras's dropout on a tensor whose axis 0 is not the batch (time-major, a weight) is not
detected. `train` and `fit_train` apply it.
"""
from __future__ import annotations

import argparse
import os
import threading
import time
from contextlib import contextmanager, nullcontext

from keras_side.data import HarData
from keras_side.spec import TrainConfig
from native import driver, preflight  # engine-free, as is everything above


PROG = "python -m native.tensorflow.mirrored"


def command_line(argv=None) -> tuple[argparse.Namespace, TrainConfig, HarData]:
    """The launcher's options, and the training spec and the data they give, checked (`SystemExit(2)` after one line
    if not). Engine-free: run by hand, `--help` and a mistake are answered before TensorFlow's import."""
    parser = argparse.ArgumentParser(prog=PROG, description=(
        "Train the model of --build (the HAR by default) on --replicas logical CPUs of this one process; write the "
        "weights (and the training seconds) to --out."))
    parser.add_argument("--replicas", type=int, default=2, help="replicas, one logical CPU each (default: 2)")
    parser.add_argument("--data", required=True, help="a HarData .npz (HarData.save)")
    parser.add_argument("--config", default="{}", help="TrainConfig fields as JSON")
    parser.add_argument("--build", default="keras_side.models:har", help="the model builder, module:function")
    parser.add_argument("--out", required=True, help="where to write the trained weights (.npz)")
    parser.add_argument("--fit", action="store_true", help="train with model.fit under the strategy instead")
    args = parser.parse_args(argv)
    try:  # what the user gave, before TensorFlow's runtime starts
        return args, *preflight.launch_args(args, count=args.replicas, what="replicas", fit=args.fit)
    except preflight.LaunchError as err:
        raise SystemExit(preflight.one_line(parser.prog, err)) from None


if __name__ == "__main__":  # the command line first: TensorFlow's import prints lines no setting silences everywhere
    COMMAND_LINE = command_line()  # (on a CPU where oneDNN's custom ops are on, absl logs one before it reads any)

# Before TensorFlow's import, as in every process of ours (keras_side.backend): its start-up chatter buried this
# launcher's own lines when run by hand.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# The imports that start TensorFlow, after the command line.
import keras
import numpy as np
import tensorflow as tf
from keras_side.internals import backend_random as keras_tf_random  # Keras's TensorFlow random ops (its dropout)

from keras_side import cores, swap
from keras_side.backend import keras_defaults
from keras_side.arrays import keras_inputs, take
from keras_side.checks import check_data
from keras_side.data import batch_slices, numpy_orders, shard
from keras_side.losses import keras_loss
from keras_side.models import batchnorm_layers, drawing_layers, ensure_built
from keras_side.optimizers import keras_optimizer
from keras_side.results import save_trained
from keras_side.spec import SpecError


def use_cpus(replicas: int) -> list[str]:
    """Split the CPU into `replicas` logical devices (before TensorFlow's runtime starts); their names. Each op
    computes on one thread (`THREADS`, as every worker does) and as many ops as replicas run at once, one per
    replica: set here, since listing the devices starts the runtime, after which `seed_everything` can no longer."""
    from keras_side.determinism import THREADS

    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * replicas)
        tf.config.threading.set_intra_op_parallelism_threads(THREADS)
        tf.config.threading.set_inter_op_parallelism_threads(replicas)
    except RuntimeError:
        raise SpecError("TensorFlow's runtime has started, so the CPU can no longer be split into replicas; call "
                        "use_cpus first thing in the process") from None
    return [d.name for d in tf.config.list_logical_devices("CPU")]


def synchronize_batchnorm(model) -> int:
    """Every BatchNormalization in `model` takes the global batch's moments under a strategy; returns how many."""
    layers = batchnorm_layers(model)
    for layer in layers:
        layer.synchronized = True
    return len(layers)


def refuse_other_draws(model) -> None:
    """A SpecError for a layer that draws random numbers other than through Keras's dropout over the replica's rows
    of the batch (what `rows_of_global_batch` makes the global batch's): anything but a Dropout with no spatial noise
    shape, Attention's dropout (its weights' axis 0 is the batch) or an RNN cell's dropout."""
    from keras_side.internals import BaseSpatialDropout, DropoutRNNCell

    takes = (keras.layers.Dropout, keras.layers.Attention, DropoutRNNCell)
    for layer in drawing_layers(model):
        if isinstance(layer, BaseSpatialDropout) or not isinstance(layer, takes):
            raise SpecError(f"layer {layer.name!r} ({type(layer).__name__}) draws random numbers that every replica "
                            "would draw for its own rows, not its rows of the global batch's; use "
                            "keras.layers.Dropout, or train in one process")


_replica = threading.local()  # `.window`: (this replica's first row, the global batch's rows) while a block is open


def _global_dropout(inputs, rate, noise_shape=None, seed=None):
    """Keras's `dropout` signature: inside a replica's `rows_of_global_batch`, the global batch's mask drawn and this
    replica's rows of it applied to `inputs` (its rows); elsewhere, what was in place. It never synchronizes the
    replicas (see the module docstring)."""
    window = getattr(_replica, "window", None)
    if window is None or rate in (0.0, 1.0):  # outside a replica's block, or nothing drawn
        return swap.before(keras_tf_random, "dropout")(inputs, rate, noise_shape=noise_shape, seed=seed)
    start, total = window
    inputs = tf.convert_to_tensor(inputs)
    rows = tf.shape(inputs)[0]
    padding = [[start, total - start - rows]] + [[0, 0]] * (inputs.shape.rank - 1)
    dropped = swap.before(keras_tf_random, "dropout")(tf.pad(inputs, padding), rate, noise_shape=noise_shape, seed=seed)
    return dropped[start:start + rows]


@contextmanager
def rows_of_global_batch(x):
    """Open at the top of a replica's step, around its forward, with `x` its inputs (its rows of the global batch):
    while open, Keras's dropout in this replica's thread draws the global batch's mask (the one a process training
    on the whole batch draws, from the same seed state) and applies this replica's rows of it. One all-gather of
    every replica's rows gives its place: the replicas hold contiguous shards of the global batch in replica order
    (`keras_side.data.shard`; Keras's distributed dataset cuts a batch so too). Outside a strategy of several
    replicas, nothing changes. The swap is process-wide while any block is open (`keras_side.swap`), the window this
    thread's; what a `tf.function` traced inside a block computes stays in its graph."""
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        yield
        return
    every = context.all_gather(tf.shape(tf.nest.flatten(x)[0])[:1], axis=0)  # each replica's rows, in replica order
    outer = getattr(_replica, "window", None)
    with swap.swapped(keras_tf_random, "dropout", _global_dropout):
        _replica.window = tf.reduce_sum(every[:context.replica_id_in_sync_group]), tf.reduce_sum(every)
        try:
            yield
        finally:
            _replica.window = outer


def train(build, data: HarData, cfg: TrainConfig, *, devices: list[str] | None = None) -> list[np.ndarray]:
    """The native loop's step on every replica of a MirroredStrategy over `devices`, from the model's seeded
    initializers; returns the trained weights. The batch order is the shared NumPy one. The epochs are the driver's
    (`native.driver.run`), the step `ReplicaSteps`'."""
    if data.w_train is not None:
        raise SpecError("the mirrored loop takes no sample weights; train without them")
    if cfg.clipnorm or cfg.global_clipnorm or cfg.clipvalue:
        raise SpecError("Keras clips each replica's gradient before the all-reduce sums them, which is not the "
                        "one-process clip; drop clipping for the mirrored loop")
    strategy = tf.distribute.MirroredStrategy(devices)
    replicas = strategy.num_replicas_in_sync
    with strategy.scope():
        model = ensure_built(build(), data.x_train)
        check_data(cfg, data, model)  # as the one-process loop
        synchronize_batchnorm(model)
        if replicas > 1:
            refuse_other_draws(model)
        draws = bool(drawing_layers(model))  # else no all-gather a step
        optimizer = keras_optimizer(cfg)
        optimizer.build(model.trainable_variables)

    driver.run(ReplicaSteps(model, data, cfg, strategy, optimizer, draws=draws), cfg)
    return model.get_weights()


class ReplicaSteps(driver.Engine):
    """Every replica's rows of each global batch, for `driver.run`: TensorFlow's step (`tf.GradientTape`, Keras's
    `optimizer.apply`, as the reference loop's) on each replica's part of the global batch's loss (`shard_loss`),
    the strategy summing the replicas' gradients."""

    def __init__(self, model, data: HarData, cfg: TrainConfig, strategy, optimizer, *, draws: bool):
        """`draws`: the model has a layer that draws random numbers (each replica then takes its rows of the global
        batch's draws: `rows_of_global_batch`)."""
        self.model, self.data, self.cfg, self.strategy = model, data, cfg, strategy
        self.replicas = strategy.num_replicas_in_sync
        self.orders = numpy_orders(cfg.seed, data.n_train, cfg.epochs)
        summed = summed_loss(cfg)

        @tf.function
        def step(x, y, global_size):
            def replica(xb, yb):
                with rows_of_global_batch(xb) if draws else nullcontext(), tf.GradientTape() as tape:
                    loss = shard_loss(model, summed, xb, yb, global_size)
                optimizer.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
                return loss

            return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(replica, args=(x, y)), axis=None)

        self.distributed = step

    def batches(self, epoch: int):
        """`(x, y, the global batch's rows)`: x and y distributed, each replica holding its rows."""
        for rows in batch_slices(self.data.n_train, self.cfg.batch_size):
            idx, size = self.orders[epoch][rows], rows.stop - rows.start
            parts = [idx[shard(slice(0, size), r, self.replicas)] for r in range(self.replicas)]
            x, y = (self.strategy.experimental_distribute_values_from_function(
                lambda ctx, a=a: tf.nest.map_structure(tf.constant, keras_inputs(take(
                    a, parts[ctx.replica_id_in_sync_group])))) for a in (self.data.x_train, self.data.y_train))
            yield x, y, size

    def step(self, batch):
        x, y, size = batch
        return self.distributed(x, y, tf.constant(size, tf.float32))  # the global batch's loss: the replicas' sum

    def rows(self, batch) -> int:
        return batch[2]


def summed_loss(cfg: TrainConfig):
    """`summed(yb, pred)`: the rows' per-sample losses, summed, each output's times its weight (as compile weighs
    them)."""
    losses = keras_loss(cfg)
    losses = losses if isinstance(losses, list) else [losses]  # one per output
    weights = cfg.loss_weights or (1.0,) * len(losses)

    def summed(yb, pred):
        ys, preds = (yb, pred) if len(losses) > 1 else ([yb], [pred])
        return tf.add_n([w * tf.reduce_sum(loss.call(t, p)) for loss, w, t, p in zip(losses, weights, ys, preds)])

    return summed


def shard_loss(model, loss_fn, xb, yb, global_rows):
    """A replica's part of the global batch's loss, as the strategy combines the replicas' gradients (their sum):
    its rows' losses summed (`loss_fn`: `summed_loss`) and the model's penalties times its rows, both over the global
    batch's `global_rows` rows (see above). Summed over the replicas, it is the global batch's loss, penalties
    included. `native.torch.ddp.shard_loss` is the same for DDP, which averages."""
    loss = loss_fn(yb, model(xb, training=True)) / global_rows
    if model.losses:
        rows = tf.cast(tf.shape(tf.nest.flatten(yb)[0])[0], tf.float32)
        loss += tf.add_n(model.losses) * rows / global_rows
    return loss


def fit_train(build, data: HarData, cfg: TrainConfig, *, devices: list[str] | None = None) -> list[np.ndarray]:
    """`fit` itself under the strategy: the model built and compiled in its scope, Keras distributing each batch.
    Equal to one process up to float32 rounding when every batch splits evenly over the replicas; with an uneven
    last batch, measurably further apart (docs/dev-notes.md, "Measurements once quoted in the code"), because Keras
    averages the replicas' own mean losses with equal weights, where the global batch's mean weighs each replica by
    its rows (`train` above does). With one device, plain `fit`."""
    from keras_side import fit

    with tf.distribute.MirroredStrategy(devices).scope() if len(devices) > 1 else nullcontext():
        model = ensure_built(build(), data.x_train)
        if len(devices) > 1:
            synchronize_batchnorm(model)
            refuse_other_draws(model)
            if drawing_layers(model):
                keras_step = model.train_step

                def train_step(data):  # Keras's step on each replica, its Dropouts drawing the global batch's masks
                    with rows_of_global_batch(data):
                        return keras_step(data)

                model.train_step = train_step
        fit.train(model, data, cfg)
    return model.get_weights()


def main(argv=None, *, command=None) -> int:
    """The command: train as `command_line(argv)` says (or `command`, its result when already read); a mistake there
    exits 2 after one line."""
    args, cfg, data = command or command_line(argv)
    cores.pin_launched()  # every core the launcher names: its replicas' threads share them
    devices = use_cpus(args.replicas)  # before anything starts TensorFlow's runtime
    keras_defaults()  # from Keras's defaults, whatever a user's keras.json sets (floatx...), as compare's workers
    from keras_side.determinism import seed_everything
    from keras_side.spec import resolve

    seed_everything(cfg.seed)
    start = time.perf_counter()
    try:
        weights = (fit_train if args.fit else train)(resolve(args.build), data, cfg, devices=devices)
    except SpecError as err:  # what only training finds (a clip Keras would apply per replica...): one line
        return preflight.one_line(PROG, err)
    seconds = time.perf_counter() - start  # training, its trace included: not the start-up
    save_trained(args.out, weights, seconds, [cores.cores_in_use()], seed=cfg.seed)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(command=COMMAND_LINE))
