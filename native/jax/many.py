"""Many Keras models at once in JAX: `jax.vmap` of a fused trainer over models, one compiled call.

Two trainers. `train_seeds` trains any model (any input rank, BatchNorm, Dropout, the spec's loss and optimizer)
once per seed, each from its own initial weights and with its own batch order: the fused scan of
`native.jax.scan`, vmapped, so seed s ends where `scan.train` with seed s ends (tested).

    start = InitialWeights.of(build, data.x_train).draw(seeds)          # keras_side.initial
    trained = train_seeds(model, data, cfg, start, seed_orders(cfg, seeds, data.n_train))

`train_many`, the walk-forward's, trains the HAR on masked windows (`compile_many`: compiled apart, for timing):

    params = train_many(model, x, y, rows, params, cfg, devices=jax.devices())

The models come in groups that share their data: x (groups, N, features) and y (groups, N, 1), for example one
group per asset. Model (g, m) trains on the first `rows[g, m]` rows of its group (a walk-forward's expanding
window). Each epoch draws one permutation of the N positions, shared by every model, and cuts it into batches;
a model's loss on a batch is the mean over the rows of the batch that lie inside its window, so every model sees
each of its rows once per epoch, in random order, and steps on every batch. A window of n rows therefore meets
about batch_size·n/N of its rows per batch, and every model takes ceil(N / batch_size) steps per epoch.

Why this shape: the data stays shared. The inner `vmap` maps over the models of a group with x unbatched, so a
step is one matmul of the batch against all of the group's weights, never a copy of x per model. The unbatched
trainer `make_fit_one` is the test of the vmapped one. With several devices the model axis is sharded over them
(`jax.sharding`), so the same code scales to more chips or hosts.
"""
from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from keras_side.arrays import keras_inputs, output_arrays
from keras_side.checks import check_data
from keras_side.data import HarData
from keras_side.initial import InitialWeights
from keras_side.losses import training_loss
from keras_side.metrics import keras_metrics
from keras_side.models import inference_drawing_layers
from keras_side.spec import TrainConfig
from native.jax import convolution, loop, optim, scan


def adam(cfg: TrainConfig) -> optax.GradientTransformation:
    """optax's own Adam: each model trains alone here, never against `fit`, so the stock convention is kept."""
    return optax.adam(cfg.learning_rate, b1=cfg.beta_1, b2=cfg.beta_2, eps=cfg.epsilon)


def masked_mse(model):
    """The mean squared error over the rows where mask is 1 (a model's window); zero for a batch with none."""

    def loss_fn(trainable, x, y, mask):
        pred, _ = convolution.stateless_call(model, trainable, [], x, training=True)  # as the loop computes it
        return jnp.sum(mask[:, None] * (pred - y) ** 2) / jnp.maximum(jnp.sum(mask), 1.0)

    return loss_fn


def epoch_batches(key, x, y, batch_size: int):
    """One shuffle of a group's rows, cut into batches: x (batches, batch_size, F), y, and the row index of each
    position (N, one past the last row, for the padding of the short last batch)."""
    n_rows = x.shape[0]
    n_batches = -(-n_rows // batch_size)
    order = jnp.pad(jax.random.permutation(key, n_rows), (0, n_batches * batch_size - n_rows), constant_values=n_rows)
    order = order.reshape(n_batches, batch_size)
    pad = lambda a: jnp.pad(a, ((0, 1), (0, 0)))  # noqa: E731  the padding row, index n_rows
    return pad(x)[order], pad(y)[order], order


def make_fit_one(model, cfg: TrainConfig):
    """`fit_one(params, x, y, rows, key) -> params`: one model trained on the first `rows` rows of x and y.

    `key` draws the epochs' permutations; share it across models (vmap with `in_axes=None`) and every model sees
    the same batches, so a group's x is gathered once per epoch for all of its models.
    """
    optimizer, loss_fn = adam(cfg), masked_mse(model)

    def step(carry, batch, rows):
        params, opt_state = carry
        xb, yb, index = batch
        grads = jax.grad(loss_fn)(params, xb, yb, (index < rows).astype(xb.dtype))
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), None

    def fit_one(params, x, y, rows, key):
        def epoch(carry, epoch_key):
            batches = epoch_batches(epoch_key, x, y, cfg.batch_size)
            return jax.lax.scan(lambda c, b: step(c, b, rows), carry, batches)[0], None

        carry = (params, optimizer.init(params))
        return jax.lax.scan(epoch, carry, jax.random.split(key, cfg.epochs))[0][0]

    return fit_one


def train_many(model, x, y, rows, params, cfg: TrainConfig, *, devices=None) -> list[np.ndarray]:
    """Train every model: x (groups, N, features), y (groups, N, 1), rows (groups, models), params each model's
    initial weights stacked (groups, models, ...) (`InitialWeights.draw_grid`); the epochs' shared permutations
    drawn from `cfg.seed` (`shuffle_key`). With `devices`, the model axis is sharded over them and must divide by
    their number. Returns the trained weights, stacked as `params` are (`compile_many` times compile and run
    apart)."""
    compiled, args = compile_many(model, x, y, rows, params, cfg, devices=devices)
    return [np.asarray(p) for p in compiled(*args)]


def compile_many(model, x, y, rows, params, cfg: TrainConfig, *, devices=None):
    """`train_many`'s program, compiled, and its arguments: `compiled(*args)` trains and returns the params stacked
    as (groups, models, ...), so that a caller times the compile and the run apart."""
    fit_one = make_fit_one(model, cfg)
    fit_group = jax.vmap(fit_one, in_axes=(0, None, None, 0, None))  # the group's models; x and y shared
    fit_many = jax.vmap(fit_group, in_axes=(0, 0, 0, 0, None))  # the groups
    args = ([jnp.asarray(p) for p in params], jnp.asarray(x), jnp.asarray(y), jnp.asarray(rows), shuffle_key(cfg))
    if devices is not None and len(devices) > 1:
        mesh = Mesh(np.asarray(devices), ("models",))
        per_model, shared = NamedSharding(mesh, PartitionSpec(None, "models")), NamedSharding(mesh, PartitionSpec())
        # Global arrays, each process filling the shards of its own devices: the same code on one process's
        # devices and across jax.distributed processes (each holds every input whole; they are small).
        args = (jax.tree.map(lambda a: _place(a, per_model), args[0]), _place(args[1], shared),
                _place(args[2], shared), _place(args[3], per_model), _place(args[4], shared))
    return jax.jit(fit_many).lower(*args).compile(), args


def _place(array, sharding: NamedSharding) -> jax.Array:
    if jnp.issubdtype(array.dtype, jax.dtypes.prng_key):  # a typed key: place its raw data, wrap it again
        return jax.random.wrap_key_data(_place(jax.random.key_data(array), sharding))
    host = np.asarray(array)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def forecasts(build, w: dict, cfg: TrainConfig, *, devices=None, repeats: int = 1) -> tuple[np.ndarray, float, float]:
    """Every walk-forward model of the windows `w` (x, y, rows, x_next), trained at once with the model axis sharded
    over `devices` (default: every device JAX sees: one process's, or every process's after
    jax.distributed.initialize): (forecasts, seconds (the median of `repeats` runs of the compiled trainer), compile
    seconds). Each model's initial weights come from the model's own initializers (`build`) and the seed alone, so
    the forecasts do not depend on the devices."""
    import time

    devices = list(devices or jax.devices())
    groups, refits = w["rows"].shape
    init = InitialWeights.of(build, w["x"][0])
    params = init.draw_grid((groups, refits), cfg.seed)[0]
    pad = (-refits) % len(devices)  # the model axis must split evenly: add empty windows (rows 0), drop them after
    grow = lambda a: np.concatenate([a, a[:, :1].repeat(pad, axis=1)], axis=1)  # noqa: E731
    rows = np.concatenate([w["rows"], np.zeros((groups, pad), w["rows"].dtype)], axis=1)
    start = time.perf_counter()
    compiled, args = compile_many(init.model, w["x"], w["y"], rows, [grow(p) for p in params], cfg, devices=devices)
    compile_seconds = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        params = jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - start)
    seconds = float(np.median(times))
    if jax.process_count() > 1:  # each process holds its devices' models: gather them all
        from jax.experimental import multihost_utils

        params = multihost_utils.process_allgather(params, tiled=True)
    params = [np.asarray(p)[:, :refits] for p in params]
    return predict_many(init.model, params, w["x_next"])[..., 0], seconds, compile_seconds


def shuffle_key(cfg: TrainConfig) -> jax.Array:
    """The key of the walk-forward's shared permutations, from the run's seed."""
    return jax.random.fold_in(jax.random.key(cfg.seed), 1)


def predict_many(model, params, x) -> np.ndarray:
    """Each model's predictions on its own inputs: params stacked (groups, models, ...), x (groups, models, H, F)."""
    one = lambda p, xm: convolution.stateless_call(model, p, [], xm)[0]  # noqa: E731
    return np.asarray(jax.jit(jax.vmap(jax.vmap(one)))(params, jnp.asarray(x)))


def seed_orders(cfg: TrainConfig, seeds, n: int) -> np.ndarray:
    """(seeds, epochs, n): the batch orders `loop.train` draws with each seed, bit for bit.

    `loop.batch_orders` draws an epoch's order with `jax.random.permutation`, which sorts the rows by fresh 32-bit
    random keys, stably, in a few rounds. Here the same keys come from `jax.random` and NumPy does the sorts: XLA's
    CPU sort of keys with their rows is slow, a large share of JAX's part of `make compare` for its 100 seeds
    (docs/dev-notes.md, "`make compare`: where a run's time went"). Tested equal to `loop.batch_orders`."""
    configs = [cfg.replace(seed=int(s)) for s in seeds]  # each seed checked as the loop's spec checks it
    if cfg.batch_order == "numpy":  # the orders NumPy draws for every engine
        return np.stack([np.asarray(loop.batch_orders(c, n)) for c in configs])
    # jax.random.permutation's rounds (jax._src.random._shuffle): enough that two rows share every key rarely.
    rounds = int(np.ceil(3 * np.log(max(1, n)) / np.log(np.iinfo(np.uint32).max)))
    orders = np.empty((len(seeds), cfg.epochs, n), np.int32)
    for i, c in enumerate(configs):
        order = np.broadcast_to(np.arange(n, dtype=np.int32), (cfg.epochs, n))
        for keys in np.asarray(_sort_keys(jax.random.key(c.seed), cfg.epochs, n, rounds)):
            order = np.take_along_axis(order, np.argsort(keys, axis=-1, kind="stable"), axis=-1)
        orders[i] = order
    return orders


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _sort_keys(key, epochs: int, n: int, rounds: int) -> jax.Array:
    """(rounds, epochs, n): the keys `jax.random.permutation(k, n)` sorts by in each round, for every epoch's key
    k of `loop.batch_orders` with this seed's `key`."""
    def of_epoch(key):
        keys = []
        for _ in range(rounds):
            key, subkey = jax.random.split(key)
            keys.append(jax.random.bits(subkey, (n,), jnp.uint32))
        return jnp.stack(keys) if keys else jnp.zeros((0, n), jnp.uint32)

    return jnp.moveaxis(jax.vmap(of_epoch)(jax.random.split(key, epochs)), 1, 0)


def train_seeds(model, data: HarData, cfg: TrainConfig, start, orders, learning_rates=None) -> dict:
    """Train one model per row of `start` at once; model i from `start[i]` with the batch orders `orders[i]`.

    `start` is (trainable, non_trainable), each array stacked (models, ...); `orders` (models, epochs, n);
    `learning_rates` (models,), each model's constant rate instead of the spec's (`optax.inject_hyperparams`
    keeps it in the model's optimizer state). Returns the trained `trainable` and `non_trainable` (stacked), each
    model's validation loss after the last epoch `val_loss` (models,), `seconds` and `compile_seconds`.
    """
    check_data(cfg, data, model)
    if learning_rates is None:
        optimizer = optim.build(cfg)
    else:
        optimizer = optax.inject_hyperparams(lambda learning_rate: optim.build(cfg, learning_rate))(
            learning_rate=cfg.learning_rate)
    loss_fn, metrics = training_loss(cfg), keras_metrics(cfg)
    train_xy, val = scan.arrays(data)
    evaluate = scan.make_evaluate(model, loss_fn, metrics)
    # The validation loss once, at the end; every epoch where a validation moves a recurrent dropout's seed state
    # (`inference_drawing_layers`), as it moves in the loop and in fit.
    each_epoch = cfg.validate and bool(inference_drawing_layers(model))
    run = scan.make_fused(loop.make_step(model, loss_fn, optimizer, metrics), evaluate, metrics, train_xy, val,
                          cfg.replace(validate=each_epoch))

    def one(trainable, non_trainable, order, learning_rate):
        opt_state = optimizer.init(trainable)
        if learning_rate is not None:
            opt_state.hyperparams["learning_rate"] = learning_rate
        state, _ = run((trainable, non_trainable, opt_state, loop.fresh(metrics)), order)
        return state[0], state[1], evaluate(state, *val)[1]

    lrs = None if learning_rates is None else jnp.asarray(learning_rates, jnp.float32)
    args = (*jax.tree.map(jnp.asarray, tuple(start)), jnp.asarray(orders), lrs)
    begin = time.perf_counter()
    with convolution.as_matmuls():  # traced inside: the program computes a 1-D convolution as the scan path does
        trainer = jax.jit(jax.vmap(one, in_axes=(0, 0, 0, None if lrs is None else 0))).lower(*args).compile()
    compile_seconds = time.perf_counter() - begin
    begin = time.perf_counter()
    trainable, non_trainable, val_loss = jax.block_until_ready(trainer(*args))
    return {"trainable": trainable, "non_trainable": non_trainable, "val_loss": np.asarray(val_loss),
            "seconds": time.perf_counter() - begin,
            "compile_seconds": compile_seconds}


def predict_seeds(model, trainable, non_trainable, x):
    """Every model's inference-mode predictions on the same x: (models, n, ...); several outputs a tuple of such
    arrays, one each (`output_arrays`: heads of different widths cannot be stacked)."""
    def one(trainable, non_trainable):
        pred, _ = convolution.stateless_call(model, trainable, non_trainable, keras_inputs(x), training=False)
        return tuple(pred) if isinstance(pred, (list, tuple)) else pred

    x = jax.tree.map(jnp.asarray, x)
    return output_arrays(jax.jit(jax.vmap(one))(trainable, non_trainable))
