"""The floors of `native-loops bench`: a model's training step written without Keras, in raw torch and raw JAX, on
the same shapes, weights, batches and Keras-exact optimizer, so every path's time has a physical reference.

    torch-raw      the forward in torch ops, the MSE, autograd, `native.torch.optim`'s optimizer, the torch loop's
                   batches
    jax-raw        the same step in `jax.numpy`, jitted, driven as `native/jax/loop.py`'s Python loop drives its step
    jax-raw-scan   the same step under `native/jax/scan.py`'s fused `lax.scan` driver

Written for the HAR and the two sequence models of the zoo on both engines, and for dropout_mlp on JAX (`RAW`):
`Dense(1)` is `x @ w + b`; the LSTM is torch's own LSTM op (ATen's cell, as the torch loop runs it) and a `lax.scan`
over the days in JAX; the Conv1D is torch's own convolution and, in JAX, the matmul over the input's patches that the
JAX loop runs in place of XLA's CPU convolution; dropout_mlp's mask is `jax.random.bernoulli` on the Dropout's seed
state, threaded through the step as Keras's JAX backend draws and advances it. Each starts from the Keras model's own
weights (and seed state) and ends where the native loop ends (tested). `torch_stages` times the torch loop's step
stage by stage (the batch's rows, the forward, the loss, the backward, the optimizer), with the Keras model and with
raw tensors: where the eager step's time goes. Measured only by the bench (this module imports its engine when
called), never asserted by a test.
"""
from __future__ import annotations

import time

import numpy as np

from keras_side.arrays import take
from keras_side.data import HarData, batch_slices
from keras_side.spec import TrainConfig

STAGES = ("rows", "forward", "loss", "backward", "optimizer")
# The models with a floor, per engine: their builders in keras_side.models, MSE, no metrics. dropout_mlp's on torch
# would have to draw Keras's torch masks by hand as the loop does (native.torch.compiled.Draws): not written.
RAW = {"torch": ("har", "lstm", "conv1d"), "jax": ("har", "lstm", "conv1d", "dropout_mlp")}
DROPOUT_MLP_RATE = 0.2  # keras_side.models.dropout_mlp's Dropout


def _dense(p, x):
    """The HAR's `Dense(1)` in either engine: `x @ w + b`."""
    w, b = p
    return x @ w + b


def _torch_forward(model: str):
    """`forward(params, x)` of a `RAW` model in torch ops, its params in the Keras model's weight order."""
    import torch

    from native.torch import bypass

    def lstm(p, x):  # what the fast torch loop runs for a plain LSTM: torch.lstm, ATen's cell (bypass._lstm)
        kernel, recurrent, bias, w, b = p
        return bypass.lstm_op(x, kernel, recurrent, bias, training=True)[1] @ w + b

    def conv1d(p, x):  # Conv1D(relu) → the mean over the days → Dense(1); its bias added after, as Keras adds it
        kernel, bias, w, b = p
        h = torch.nn.functional.conv1d(x.transpose(1, 2).contiguous(), kernel.permute(2, 1, 0)).transpose(1, 2)
        return torch.relu(h + bias).mean(dim=1) @ w + b

    return {"har": _dense, "lstm": lstm, "conv1d": conv1d}[model]


def _jax_forward(model: str):
    """`forward(params, seeds, x) -> (prediction, seeds)` of a `RAW` model in `jax.numpy`: its params in the Keras
    model's weight order, `seeds` its random layers' seed states (Keras's `SeedGenerator.state`, in
    `model.non_trainable_variables` order) after the step's draws."""
    import jax
    import jax.numpy as jnp

    from native.jax import convolution

    def lstm(p, x):  # Keras's LSTMCell, one day a step of a lax.scan: the gates in Keras's order (i, f, c, o)
        kernel, recurrent, bias, w, b = p

        def day(carry, x_t):
            h, c = carry
            i, f, g, o = jnp.split(x_t @ kernel + h @ recurrent + bias, 4, axis=-1)
            c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
            return (jax.nn.sigmoid(o) * jnp.tanh(c), c), None

        zeros = jnp.zeros((x.shape[0], recurrent.shape[0]), x.dtype)
        (h, _), _ = jax.lax.scan(day, (zeros, zeros), jnp.swapaxes(x, 0, 1))
        return h @ w + b

    def conv1d(p, x):  # as the JAX loop computes it: a matmul over the patches (native.jax.convolution)
        kernel, bias, w, b = p
        h = convolution.conv1d_as_matmul(x, kernel, 1, "valid", 1)
        return jnp.mean(jax.nn.relu(h + bias), axis=1) @ w + b

    def dropout_mlp(p, seeds, x):  # Dense(16, relu) → Dropout → Dense(1), the mask as keras.random.dropout draws it
        w1, b1, w2, b2 = p
        (seed,), keep = seeds, 1.0 - DROPOUT_MLP_RATE
        h = jax.nn.relu(x @ w1 + b1)
        h = jax.lax.select(jax.random.bernoulli(seed, p=keep, shape=h.shape), h / keep, jnp.zeros_like(h))
        return h @ w2 + b2, [seed + jnp.array([0, 1], seed.dtype)]  # SeedGenerator.next: the state, then + [0, 1]

    if model == "dropout_mlp":
        return dropout_mlp
    forward = {"har": _dense, "lstm": lstm, "conv1d": conv1d}[model]
    return lambda p, seeds, x: (forward(p, x), seeds)  # seeds: a random layer's that draws nothing (the LSTM's)


def _torch_raw(weights: list[np.ndarray], model: str, cfg: TrainConfig):
    import torch

    from native.torch import optim

    params = [torch.tensor(w, requires_grad=True) for w in weights]
    forward = _torch_forward(model)
    return params, optim.build(params, cfg)[0], lambda x: forward(params, x)


def torch_raw(data: HarData, cfg: TrainConfig, weights: list[np.ndarray], model: str = "har",
              trained: list | None = None, seeds=()) -> tuple[float, None]:
    """Seconds of `model`'s training from `weights` without Keras on torch (no compile); `trained` receives the
    weights. `seeds`: the model's seed states, which no torch floor draws from."""
    import torch

    from native.torch import loop

    params, optimizer, forward = _torch_raw(weights, model, cfg)
    x, y = torch.as_tensor(data.x_train), torch.as_tensor(data.y_train)
    start = time.perf_counter()
    for order in loop.batch_orders(cfg, data.n_train):
        x_epoch, y_epoch = x[order], y[order]
        for rows in batch_slices(data.n_train, cfg.batch_size):
            loss = torch.mean((forward(x_epoch[rows]) - y_epoch[rows]) ** 2)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    seconds = time.perf_counter() - start
    if trained is not None:
        trained.extend(p.detach().numpy() for p in params)
    return seconds, None


def torch_stages(model, data: HarData, cfg: TrainConfig) -> dict[str, dict[str, float]]:
    """µs per step of each stage of the torch loop's eager step on the HAR, with the Keras model ("keras") and with
    raw tensors ("raw"): each stage timed on its own (`time.perf_counter` around it; torch's CPU ops are
    synchronous)."""
    import torch

    from native.torch import bypass, loop, losses, optim

    found = {}
    params = [p for p in model.parameters() if p.requires_grad]
    keras_step = (optim.build(params, cfg)[0], lambda xb: bypass.forward(model, xb, training=True))
    raw_step = _torch_raw(model.get_weights(), "har", cfg)[1:]
    for name, (optimizer, forward) in {"keras": keras_step, "raw": raw_step}.items():
        loss_fn = losses.spec_loss(cfg, same_rank=True)
        x, y = torch.as_tensor(data.x_train), torch.as_tensor(data.y_train)
        spent, steps = dict.fromkeys(STAGES, 0.0), 0
        for order in loop.batch_orders(cfg, data.n_train):
            x_epoch, y_epoch = take(x, order), take(y, order)
            for rows in batch_slices(data.n_train, cfg.batch_size):
                marks = [time.perf_counter()]
                xb, yb = take(x_epoch, rows), take(y_epoch, rows)
                marks.append(time.perf_counter())
                pred = forward(xb)
                marks.append(time.perf_counter())
                loss = loss_fn(yb, pred)
                marks.append(time.perf_counter())
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                marks.append(time.perf_counter())
                optimizer.step()
                marks.append(time.perf_counter())
                for stage, (a, b) in zip(STAGES, zip(marks, marks[1:])):
                    spent[stage] += b - a
                steps += 1
        found[name] = {stage: seconds * 1e6 / steps for stage, seconds in spent.items()}
    return found


def _jax_raw(weights: list[np.ndarray], seeds, model: str, cfg: TrainConfig):
    """The raw step in the loop drivers' form: `step(state, (x, y)) -> (state, loss)` over state `(trainable,
    seeds, opt_state, metrics)`, no Keras in it."""
    import jax
    import jax.numpy as jnp
    import optax

    from native.jax import optim

    optimizer, forward = optim.build(cfg), _jax_forward(model)

    def mse(trainable, seeds, x, y, sample_weight=None):  # the floors train unweighted: the loop gives None
        pred, seeds = forward(trainable, seeds, x)
        return jnp.mean((pred - y) ** 2), seeds

    @jax.jit
    def step(state, batch):
        trainable, seeds, opt_state, metrics = state
        (loss, seeds), grads = jax.value_and_grad(mse, has_aux=True)(trainable, seeds, *batch)
        updates, opt_state = optimizer.update(grads, opt_state, trainable)
        return (optax.apply_updates(trainable, updates), seeds, opt_state, metrics), loss

    trainable = [jnp.asarray(w) for w in weights]
    return step, (trainable, [jnp.asarray(s) for s in seeds], optimizer.init(trainable), [])


def jax_raw(data: HarData, cfg: TrainConfig, weights: list[np.ndarray], model: str = "har", driver: str = "loop",
            trained: list | None = None, seeds=()) -> tuple[float, float]:
    """(seconds, compile seconds) of `model`'s training from `weights` (and its random layers' seed states `seeds`)
    without Keras on JAX, driven as the native loop drives its step (`driver="loop"`: the reference loop's Python
    epochs; `"scan"`: `native.jax.scan`'s fused program); `trained` receives the weights."""
    from native.jax import loop, scan

    step, state = _jax_raw(weights, seeds, model, cfg)
    orders = np.asarray(loop.batch_orders(cfg, data.n_train))
    if driver == "scan":
        train_xy, val = scan.arrays(data)
        state, _, compile_seconds, seconds = scan._scan_driver(step, None, [], state, train_xy, orders, val,
                                                               cfg.replace(validate=False), None)
    else:
        state, compile_seconds, seconds = _jax_loop(step, state, data, orders, cfg)
    if trained is not None:
        trained.extend(np.asarray(p) for p in state[0])
    return seconds, compile_seconds


def _jax_loop(step, state, data: HarData, orders: np.ndarray, cfg: TrainConfig):
    """`(state, compile seconds, seconds)`: the step driven as `native.jax.loop.train` drives it, each batch's rows
    gathered from NumPy, each batch shape compiled before the epochs, one wait for the device per epoch."""
    import jax

    from native.jax import loop

    slices = batch_slices(data.n_train, cfg.batch_size)
    first = [loop.rows_of(data, orders[0][s]) for s in (slices[0], slices[-1])]  # a full batch, the short last one
    compile_seconds = loop.compile_step(step, state, first)
    start = time.perf_counter()
    for order in orders:
        losses = []
        for rows in slices:
            state, loss = step(state, loop.rows_of(data, order[rows]))
            losses.append(loss)
        jax.device_get(losses)
    return state, compile_seconds, time.perf_counter() - start


FLOORS = {"torch-raw": ("torch", torch_raw), "jax-raw": ("jax", jax_raw),
          "jax-raw-scan": ("jax", lambda *args, **kwargs: jax_raw(*args, driver="scan", **kwargs))}
# Each path's floor: the same step without Keras, under the same driver.
FLOOR_OF = {"keras-torch": "torch-raw", "torch-native": "torch-raw", "torch-native-fast": "torch-raw",
            "torch-native-compile": "torch-raw", "torch-native-engine": "torch-raw", "torch-native-compile-engine": "torch-raw",
            "keras-jax": "jax-raw", "jax-native": "jax-raw", "jax-native-fast": "jax-raw",
            "jax-native-scan": "jax-raw-scan"}


def seed_states(model) -> list[np.ndarray]:
    """A Keras model's seed states, what a floor's `seeds` starts from: its non-trainable variables (the floors' models
    have no other)."""
    return [np.asarray(v.value) for v in model.non_trainable_variables]


def floors(engine: str) -> list[str]:
    return [name for name, (e, _) in FLOORS.items() if e == engine]
