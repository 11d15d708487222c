"""Inside an engine's worker: train a model step by step on each requested path (or on your own training step) and
record every step's weights; probe one step's stages (each layer's output, the loss, the gradient) at given weights;
describe a model, or take its gradient or its layers' outputs at given weights (`parity`).

The referee side is `compare.parity.training`; this module imports Keras, so only a worker imports it.
"""
from __future__ import annotations

import contextlib
import inspect
import time

import keras
import numpy as np

from compare.engines import paths
from compare.io import named
from compare.parity.common import OWN
from keras_side import fit, models
from keras_side.arrays import first, keras_inputs, take
from keras_side.data import HarData, Scaling, batch_slices, numpy_orders
from keras_side.determinism import seed_everything
from keras_side.losses import training_loss
from keras_side.models import ensure_built
from keras_side.optimizers import keras_optimizer
from keras_side.precision import float64
from keras_side.spec import TrainConfig, resolve

CONTRACTS = {  # each engine's terms for a user's step: its arguments, and what it is
    "torch": (("model", "optimizer", "x", "y"), "step(model, optimizer, x, y) -> loss"),
    "jax": (("model", "optimizer"), "make_step(model, optimizer) -> step(state, x, y) -> (state, loss[, grads])"),
    "tensorflow": (("model", "optimizer"), "make_step(model, optimizer) -> step(x, y) -> loss or (loss, grads)"),
}


def _inputs(path: str):
    with np.load(path) as z:
        xs = tuple(z[f"x{i}"] for i in range(int(z["n_inputs"])))
        ys = tuple(z[f"y{i}"] for i in range(int(z["n_targets"])))
    return (xs[0] if len(xs) == 1 else xs), (ys[0] if len(ys) == 1 else ys)


def _data(x, y) -> HarData:
    """x and y as the training split of a HarData, which every path trains on (nothing is validated or scaled)."""
    identity = Scaling.identity()
    return HarData(x_train=x, y_train=y, x_val=x, y_val=y, x_test=x, y_test=y, scaling=identity, features=(),
                   asset="", source="parity")


def _fresh(build, x, seed: int) -> keras.Model:
    # A long-lived worker: restart Keras's layer names, so weight paths read the same. Without a garbage collection,
    # which is slow in a process that holds an engine (docs/parity.md, "How long a check takes"; Python collects in
    # its own time).
    keras.backend.clear_session(free_memory=False)
    seed_everything(seed)
    return ensure_built(build(), x)


def state(model: keras.Model) -> list[np.ndarray]:
    """Every variable of the model (`model.variables`: the weights, and a random layer's seed state), as NumPy."""
    return [np.array(keras.ops.convert_to_numpy(v.value)) for v in model.variables]


def set_state(model: keras.Model, values) -> None:
    for variable, value in zip(model.variables, values, strict=True):
        variable.assign(value)


def trajectory(request: dict, send) -> dict:
    """Draw the shared start (`draw`), or train each of `paths` from it and write every step's variables (`out`)."""
    build, (x, y) = resolve(request["build"]), _inputs(request["inputs"])
    cfg = TrainConfig(**request["config"])
    if "draw" in request:  # this engine's seeded initializers give every path on every engine its start
        model = _fresh(build, x, cfg.seed)
        np.savez(request["draw"], names=np.array([v.path for v in model.variables]),
                 trainable=np.array([v.trainable for v in model.variables]), **named("w", state(model)),
                 drawing=np.array([layer.name for layer in models.drawing_layers(model)], dtype=str))
        return {}
    with np.load(request["init"]) as z:
        names, init = [str(n) for n in z["names"]], [z[f"w_{i}"] for i in range(len(z["names"]))]
    recorded = {}
    for path in request["paths"]:
        model = _fresh(build, x, cfg.seed)
        here = [v.path for v in model.variables]
        if here != names:
            at = next((i for i, (h, n) in enumerate(zip(here, names)) if h != n), min(len(here), len(names)))
            raise ValueError(f"the model's variables on {keras.config.backend()} are not those of the engine that "
                             f"drew the start ({len(here)} against {len(names)}; the first to differ is number "
                             f"{at + 1}); build the same layers on every engine")
        set_state(model, init)
        send(event="progress", path=path)  # alive: the runner's quiet limit is for hangs, not for long checks
        record = Recorder(model, request["steps"], lambda: send(event="progress", path=path))
        start = time.perf_counter()
        try:
            if path == OWN:
                own_step(request["step"], request.get("optimizer"), model, x, y, cfg, record)
            else:
                train_path(path, model, _data(x, y), cfg, record)
        except Enough:  # every asked-for step is recorded: the rest of the epoch is not trained
            pass
        send(event="timing", part=path, seconds=time.perf_counter() - start)
        recorded |= record.arrays(path)
    np.savez(request["out"], **recorded)
    return {}


class Enough(Exception):
    """Raised by the recorder after the last step it was asked for, to end the training there."""


class Recorder:
    """Every step's variables (all of `model.variables`), and the loss and gradients a user's step gives, for the
    first `steps` steps; then it ends the training (`Enough`)."""

    PROGRESS_EVERY_S = 1.0  # a long, healthy run tells the runner it is alive (its quiet limit is for hangs)

    def __init__(self, model: keras.Model, steps: int, alive=lambda: None):
        self.model, self.steps, self.alive, self.said = model, steps, alive, time.monotonic()
        self.values = [[w] for w in state(model)]  # step 0: the start
        self.losses, self.grads = [], []

    def __call__(self, loss=None, grads=None) -> None:
        for kept, w in zip(self.values, state(self.model), strict=True):
            kept.append(w)
        self.losses.append(np.nan if loss is None else float(keras.ops.convert_to_numpy(loss)))
        self.grads.append(grads)
        if time.monotonic() - self.said > self.PROGRESS_EVERY_S:
            self.alive()
            self.said = time.monotonic()
        if len(self.losses) == self.steps:
            raise Enough

    def arrays(self, path: str) -> dict[str, np.ndarray]:
        if len(self.losses) < self.steps:
            raise RuntimeError(f"path {path} took {len(self.losses)} steps, {self.steps} were asked for")
        found = {f"{path}/w_{i}": np.stack(w) for i, w in enumerate(self.values)}
        found[f"{path}/loss"] = np.array(self.losses)
        if all(g is not None for g in self.grads):  # the gradient each step applied, where it can be seen
            found |= {f"{path}/g_{i}": np.stack([np.asarray(g[i]) for g in self.grads])
                      for i in range(len(self.grads[0]))}
        return found


def train_path(path: str, model, data: HarData, cfg: TrainConfig, record) -> None:
    """One of the package's paths: fit, fit with our train_step, the native loop (Keras-exact or stock optimizer)."""
    engine = keras.config.backend()
    if path == "fit":
        fit.train(model, data, cfg, on_step=record)
    elif path == "train-step":
        paths.get(f"keras-{engine}-train-step").load().train(model, data, cfg, on_step=record)
    else:
        flavour = "engine" if path == "native-engine" else "exact"
        paths.loop(engine).train(model, data, cfg.replace(flavour=flavour), on_step=record)


def batches(x, y, cfg: TrainConfig):
    """Every step's (x, y) in the shared NumPy order, cut as `fit` cuts it, one at a time."""
    n = len(first(y))
    for order in numpy_orders(cfg.seed, n, cfg.epochs):
        for rows in batch_slices(n, cfg.batch_size):
            yield take(x, order[rows]), take(y, order[rows])


def own_step(spec: str, optimizer: str | None, model, x, y, cfg: TrainConfig, record) -> None:
    """Train with the user's step ("module:function"), on this engine's terms (see `compare.parity.training`), with
    the spec's Keras-exact optimizer or the user's own (`optimizer`, "module:function")."""
    own, engine, step = resolve(optimizer) if optimizer else None, keras.config.backend(), resolve(spec)
    arguments, contract = CONTRACTS[engine]
    try:
        inspect.signature(step).bind(*arguments)
    except TypeError:
        raise TypeError(f"{spec} cannot be called as {engine} calls a step: {contract}") from None

    def checked(loss, grads=None):
        if grads is not None and len(grads) != len(model.trainable_variables):
            raise TypeError(f"{spec} gave {len(grads)} gradients for {len(model.trainable_variables)} trainable "
                            "variables; give one per variable, in model.trainable_variables order")
        record(loss, grads)

    {"torch": _own_torch, "jax": _own_jax, "tensorflow": _own_tensorflow}[engine](
        step, spec, own, model, batches(x, y, cfg), cfg, checked)


def _own_torch(step, spec, own, model, steps, cfg, record) -> None:
    """`step(model, optimizer, x, y) -> loss`, the optimizer Keras-exact for the spec (`native.torch.optim`); it
    clips inside `optimizer.step()` where the spec clips, as Keras's optimizers do, and its schedule is stepped after
    each call (the step is given no scheduler). `own(params)`: the user's optimizer instead, with no schedule or
    clip of ours. Nothing else is done for the step: a step that leaves out `optimizer.zero_grad()` accumulates its
    gradients, as it would in the user's codebase."""
    import torch

    from native.torch import optim

    params = [p for p in model.parameters() if p.requires_grad]
    optimizer, scheduler, clip = (own(params), None, None) if own else optim.build(params, cfg.replace(
        flavour="exact"))
    variables = [v.value for v in model.trainable_weights]
    seen = {}  # the gradients the step computed, read before anything changes them

    def before_step():
        seen["stepped"] = True
        seen["grads"] = None if any(v.grad is None for v in variables) else [
            v.grad.detach().cpu().numpy().copy() for v in variables]
        if clip:
            clip(params)  # where Keras clips: inside the optimizer, after the gradients are taken

    optimizer.register_step_pre_hook(lambda opt, args, kwargs: before_step())
    device = variables[0].device

    def tensors(a):  # one tensor, or a list for several inputs (as the model takes them)
        if isinstance(a, tuple):
            return [torch.as_tensor(p, device=device) for p in a]
        return torch.as_tensor(a, device=device)

    for k, (xb, yb) in enumerate(steps, 1):
        seen.update(grads=None, stepped=False)
        loss = step(model, optimizer, tensors(xb), tensors(yb))
        if scheduler:
            scheduler.step()
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise TypeError(f"{spec} returned {type(loss).__name__}; a torch step returns the batch loss (a scalar "
                            "tensor)")
        if not seen["stepped"]:  # or the report would blame an unobservable gradient and an optimizer convention
            raise TypeError(f"{spec} did not call optimizer.step() in step {k}: a torch step applies its gradient "
                            "with the optimizer it is given, step(model, optimizer, x, y)")
        record(loss.detach(), seen["grads"])


def _own_jax(make_step, spec, own, model, steps, cfg, record) -> None:
    """`make_step(model, optimizer) -> step(state, x, y) -> (state, loss)` or `(state, loss, grads)`, state
    `(trainable, non_trainable, opt_state)` and the optimizer the spec's Keras-exact optax transform (or `own()`,
    the user's); jitted here."""
    import jax

    from native.jax import loop, optim

    optimizer = own() if own else optim.build(cfg.replace(flavour="exact"))
    step = jax.jit(make_step(model, optimizer))
    trainable = [v.value for v in model.trainable_variables]
    state = (trainable, [v.value for v in model.non_trainable_variables], optimizer.init(trainable))
    for xb, yb in steps:
        out = step(state, keras_inputs(xb), yb)
        if not isinstance(out, tuple) or len(out) not in (2, 3):
            raise TypeError(f"{spec}'s step returned {type(out).__name__}; a JAX step returns (state, loss) or "
                            "(state, loss, grads), state being (trainable, non_trainable, opt_state)")
        state = out[0]
        try:
            loop.write_back(model, state)
        except (TypeError, ValueError) as err:
            raise TypeError(f"{spec}'s step returned a state that is not (trainable, non_trainable, opt_state) with "
                            f"one array per variable: {err}") from None
        record(out[1], [np.asarray(g) for g in out[2]] if len(out) == 3 else None)


def _own_tensorflow(make_step, spec, own, model, steps, cfg, record) -> None:
    """`make_step(model, optimizer) -> step(x, y) -> loss` or `(loss, grads)`, the optimizer the spec's Keras
    optimizer (or `own()`, the user's), built; a plain Python step is wrapped in `tf.function` here."""
    import tensorflow as tf

    optimizer = own() if own else keras_optimizer(cfg)
    optimizer.build(model.trainable_variables)
    step = make_step(model, optimizer)
    step = step if hasattr(step, "get_concrete_function") else tf.function(step)
    for xb, yb in steps:
        out = step(tf.nest.map_structure(tf.constant, keras_inputs(xb)), tf.nest.map_structure(tf.constant,
                                                                                               keras_inputs(yb)))
        if isinstance(out, (tuple, list)) and len(out) != 2:  # rather than "too many values to unpack (expected 2)"
            raise TypeError(f"{spec}'s step returned {len(out)} values; a TensorFlow step returns the loss, or "
                            "(loss, grads)")
        loss, grads = out if isinstance(out, (tuple, list)) else (out, None)
        record(loss, None if grads is None else [tf.convert_to_tensor(g).numpy() for g in grads])


def probe(request: dict, send) -> dict:
    """At the given weights, on one batch: every layer's output, the training objective (the spec's loss plus
    `model.losses`) and its gradient, all with `training=True`, as the step computes them; and the objective in
    inference mode, with the first layer whose output the training flag changes."""
    build, (x, y) = resolve(request["build"]), _inputs(request["inputs"])
    cfg = TrainConfig(**request["config"])
    rows = np.asarray(request["rows"])
    xb, yb = take(x, rows), take(y, rows)
    model = _fresh(build, xb, cfg.seed)
    with np.load(request["weights"]) as z:
        values = [z[f"w_{i}"] for i in range(len(z.files))]
    set_state(model, values)  # before each stage: a random layer's seed state starts where the step's did
    outputs = models.layer_outputs(model, xb, training=True)
    loss_fn = training_loss(cfg)

    def objective(training: bool) -> float:
        set_state(model, values)
        value = loss_fn(keras_inputs(yb), model(keras_inputs(xb), training=training))
        return float(keras.ops.convert_to_numpy(value + sum(model.losses) if model.losses else value))

    value, inference = objective(True), objective(False)
    set_state(model, values)
    # The first layer whose output the training flag changes (a Dropout, a BatchNorm): what a step that calls the
    # model in inference mode gets wrong first.
    flagged = next((name for (name, a), b in zip(outputs.items(), models.layer_outputs(model, xb, training=False)
                                                  .values()) if not np.array_equal(a, b)), "")
    set_state(model, values)
    grads = paths.loop(keras.config.backend()).grad_at(model, xb, yb, loss=loss_fn, training=True)
    np.savez(request["out"], names=np.array(list(outputs)), loss=value, loss_inference=inference,
             flagged=np.array(flagged), **named("o", outputs.values()), **named("g", grads))
    return {}


def parity(request: dict, send) -> dict:
    """Build the user's model here; describe its trainable weights, or, at given weights, take the gradient of its
    training objective (`grads`) or every layer's output (`forward`)."""
    build, loss = resolve(request["build"]), _loss(request.get("loss", "mse"))
    exact = bool(request.get("float64"))
    with np.load(request["inputs"]) as z:
        xs = [z[f"x{i}"] for i in range(int(z["n_inputs"]))]
        y = z["y"]
    if exact:
        xs = [a.astype(np.float64) if np.issubdtype(a.dtype, np.floating) else a for a in xs]
        y = y.astype(np.float64)
    x = xs[0] if len(xs) == 1 else tuple(xs)
    keras.backend.clear_session(free_memory=False)  # fresh layer names, so weights read the same; no gc (slow here)
    with float64() if exact else contextlib.nullcontext():
        model = models.ensure_built(build(), x)
        variables = model.trainable_weights
        frozen = model.non_trainable_weights  # BatchNorm's statistics, a frozen layer's weights, seed states
        if "describe" in request:  # the trainable weights' names and shapes, and this engine's non-trainable values
            np.savez(request["describe"], names=np.array([v.path for v in variables]),
                     drawing=np.array([layer.name for layer in models.drawing_layers(model)], dtype=str),
                     **{f"shape_{i}": np.array(v.shape, dtype=np.int64) for i, v in enumerate(variables)},
                     **{f"frozen_{i}": keras.ops.convert_to_numpy(v.value) for i, v in enumerate(frozen)})
            return {}
        with np.load(request["weights"]) as z:
            for i, v in enumerate(variables):
                v.assign(z[f"w_{i}"].astype(v.dtype))
            for i, v in enumerate(frozen):  # the reference engine's, so that no engine keeps its own draw
                v.assign(z[f"frozen_{i}"].astype(v.dtype))
        if "forward" in request:
            outputs = models.layer_outputs(model, x, training=request["training"])
            np.savez(request["forward"], names=np.array(list(outputs)), **named("o", outputs.values()))
            return {}
        grads = paths.loop(keras.config.backend()).grad_at(model, x, y, loss=loss, training=request["training"])
    np.savez(request["grads"], **named("g", grads))
    return {}


def _loss(spec: str):
    return resolve(spec) if ":" in spec else keras.losses.get(spec)
