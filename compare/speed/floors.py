"""The floors of `native-loops bench`: the HAR's training step written without Keras, in raw torch and raw JAX, on
the same shapes, batches and Keras-exact Adam, so every path's time has a physical reference.

    torch-raw      `x @ w + b`, the MSE, autograd, `native.torch.optim`'s Adam, the loop of `native/torch/loop.py`
    jax-raw        the same step in `jax.numpy`, jitted, driven by `native/jax/loop.py`'s Python loop
    jax-raw-scan   the same step under `native/jax/loop.py`'s fused `lax.scan` driver

`torch_stages` times the torch loop's step stage by stage (the batch's rows, the forward, the loss, the backward,
the optimizer), with the Keras model and with raw tensors: where the eager step's time goes. Measured only by the
bench (this module imports its engine when called), never asserted by a test.
"""
from __future__ import annotations

import time

import numpy as np

from keras_side.config import HarData, batch_slices, take
from keras_side.spec import TrainConfig

STAGES = ("rows", "forward", "loss", "backward", "optimizer")


def _torch_raw(data: HarData, cfg: TrainConfig):
    import torch

    from native.torch import optim

    w = torch.zeros((data.x_train.shape[1], 1), requires_grad=True)
    b = torch.zeros(1, requires_grad=True)
    optimizer = optim.build([w, b], cfg)[0]
    return (w, b), optimizer, lambda x: x @ w + b


def torch_raw(data: HarData, cfg: TrainConfig, trained: list | None = None) -> tuple[float, None]:
    """Seconds of the HAR's training without Keras on torch (no compile); `trained` receives the weights."""
    import torch

    from native.torch import loop

    params, optimizer, forward = _torch_raw(data, cfg)
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
    """µs per step of each stage of the torch loop's eager step, with the Keras model ("keras") and with raw tensors
    ("raw"): each stage timed on its own (`time.perf_counter` around it; torch's CPU ops are synchronous)."""
    import torch

    from native.torch import loop, optim

    found = {}
    params = [p for p in model.parameters() if p.requires_grad]
    keras_step = (optim.build(params, cfg)[0], lambda xb: loop._forward(model, xb, training=True))
    for name, (optimizer, forward) in {"keras": keras_step, "raw": _torch_raw(data, cfg)[1:]}.items():
        loss_fn = loop.spec_loss(cfg, same_rank=True)
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


def _jax_raw(data: HarData, cfg: TrainConfig):
    """The raw step in the loop drivers' form: `step(state, (x, y)) -> (state, loss)` over state `(trainable,
    non_trainable, opt_state, metrics)`, no Keras in it."""
    import jax
    import jax.numpy as jnp
    import optax

    from native.jax import optim

    optimizer = optim.build(cfg)

    def mse(trainable, x, y):
        w, b = trainable
        return jnp.mean((x @ w + b - y) ** 2)

    @jax.jit
    def step(state, batch):
        trainable, non_trainable, opt_state, metrics = state
        loss, grads = jax.value_and_grad(mse)(trainable, *batch)
        updates, opt_state = optimizer.update(grads, opt_state, trainable)
        return (optax.apply_updates(trainable, updates), non_trainable, opt_state, metrics), loss

    trainable = [jnp.zeros((data.x_train.shape[1], 1)), jnp.zeros(1)]
    return step, (trainable, [], optimizer.init(trainable), [])


def jax_raw(data: HarData, cfg: TrainConfig, driver: str = "loop", trained: list | None = None) -> tuple[float, float]:
    """(seconds, compile seconds) of the HAR's training without Keras on JAX, under the native loop's own driver;
    `trained` receives the weights."""
    from native.jax import loop

    step, state = _jax_raw(data, cfg)
    train_xy, val = loop.arrays(data)
    orders = np.asarray(loop.batch_orders(cfg, data.n_train))
    run = loop._scan_driver if driver == "scan" else loop._loop_driver
    state, _, compile_seconds, seconds = run(step, None, [], state, train_xy, orders, val,
                                             cfg.replace(validate=False), None)
    if trained is not None:
        trained.extend(np.asarray(p) for p in state[0])
    return seconds, compile_seconds


FLOORS = {"torch-raw": ("torch", torch_raw), "jax-raw": ("jax", jax_raw),
          "jax-raw-scan": ("jax", lambda data, cfg: jax_raw(data, cfg, driver="scan"))}
# Each path's floor: the same step without Keras, under the same driver.
FLOOR_OF = {"keras-torch": "torch-raw", "torch-native": "torch-raw", "torch-native-compile": "torch-raw",
            "torch-native-engine": "torch-raw", "torch-native-compile-engine": "torch-raw",
            "keras-jax": "jax-raw", "jax-native": "jax-raw", "jax-native-scan": "jax-raw-scan"}


def floors(engine: str) -> list[str]:
    return [name for name, (e, _) in FLOORS.items() if e == engine]
