"""The fast paths on torch, opt-in: the reference loop's training (`native.torch.loop`) with the step made fast,
tested to end on the reference loop's weights (bit-identical eager, within compile's tolerance compiled).

    native-loops train --path torch-native-fast      # or, in your code: from native.torch import fast
    native-loops train --path torch-native-compile   # fast.train(..., compile=True)

What it does that the reference loop does not: the forward goes around Keras's `Layer.__call__` where that wrapper
has nothing to do, and runs a plain LSTM as torch's own LSTM op (`native.torch.bypass`); the spec's Keras loss is
written in torch (`native.torch.losses`); each batch's loss stays on the device (no `.item()` a step); with
`compile=True` the step runs through `torch.compile` (`native.torch.compiled`), the Keras-exact update compiled too
(one kernel), its one-off compile reported apart. Do not reach for `torch.func.functional_call`: on a Keras model it
silently trains nothing (keras-team/keras#20279).
"""
from __future__ import annotations

import contextlib

import keras
import numpy as np
import torch
from torch._dynamo.utils import counters  # dynamo's tally, which `compiled.one_graph` reads: no public one

from keras_side.arrays import as_tuple, keras_inputs, take
from keras_side.checks import check_data, warn_unseeded
from keras_side.data import as_whole_arrays, batch_slices, verb_inputs
from keras_side.losses import as_fit_shapes, verb_loss
from keras_side.metrics import EpochMetrics
from keras_side.models import ensure_built, state_kept
from keras_side.results import Result, compile_apart
from keras_side.spec import TrainConfig
from native import driver
from native.checkpoint import Checkpoints
from native.torch import checkpoint as torch_checkpoint
from native.torch import compiled
from native.torch.bypass import forward
from native.torch.loop import batch_orders, tensors
from native.torch.losses import mse, spec_loss
from native.torch.step import Updates, through_autograd


def _probe(model, x, device) -> tuple:
    """`(outputs, regularized)` from calls on a row `x` (on the model's `device`) that move no state: the outputs of
    an inference call (their rank), and whether the model adds losses to the objective (its regularizers, an
    `add_loss`), asked after that call and, when it made none, after a training call, since a layer may add a loss
    only while training, and `fit` counts it. Both calls run in Keras's `StatelessScope`, which keeps what the call
    would update (BatchNorm's statistics, a seed's state: an RNN's dropout draws its masks in inference too) to
    itself, with torch's generators forked: an unseeded Dropout draws from the global one, which the run's masks
    then come from, as `fit`'s do."""
    @contextlib.contextmanager
    def moving_nothing():  # a call in which what would change stays in the scope, the generators as they were
        devices = [] if device.type == "cpu" else [device]
        # every variable's value given, so a weight regularizer's penalty reads it inside the scope
        with torch.random.fork_rng(devices=devices, device_type=device.type), \
                keras.StatelessScope(state_mapping=[(v, v.value) for v in model.variables], collect_losses=True):
            yield

    with torch.no_grad():
        with moving_nothing():
            outputs = forward(model, x, training=False)
            if model.losses:
                return outputs, True
        with moving_nothing():
            forward(model, x, training=True)
            return outputs, bool(model.losses)


def total_loss(model, loss_fn, x, y, training: bool, regularized: bool = True, sample_weight=None, masks=()):
    """`(loss, outputs)`: the objective `fit` minimizes, the spec's loss on the batch plus every loss the model adds
    (kernel, bias and activity regularizers, `add_loss`), which Keras collects in `model.losses` during the call.
    `regularized=False` says the model has none, and skips asking, which every step would pay for."""
    outputs = forward(model, x, training=training, masks=masks)
    loss = loss_fn(y, outputs, sample_weight)
    extra = model.losses if regularized else ()
    return (loss + sum(extra) if extra else loss), outputs


def train(model, data, cfg: TrainConfig, *, validation_data=None, compile: bool = False, progress=None,
          on_step=None, checkpoint=None, resume: bool = False) -> Result:
    """The spec's loss and optimizer over shuffled mini-batches; the validation loss after every epoch. `data` and
    `validation_data` as `loop.train` takes arrays (a loader of batches is the reference loop's alone).
    `compile=True` runs the step through `torch.compile` (`native.torch.compiled`). `on_step(loss)` is called after
    every optimizer step with the step's batch loss (the training-parity check reads the weights there).
    `checkpoint=DIR` writes a checkpoint at the end of every epoch (`native.checkpoint`: the optimizer and scheduler
    with `torch.save`); `resume=True` goes on from the last one there. The epochs are the driver's
    (`native.driver.run`); the step is `FastSteps`."""
    assert isinstance(model, torch.nn.Module), "the torch loop needs a Keras model built with KERAS_BACKEND=torch"
    # the path's name, as `compare.engines.paths` names it: with torch's stock optimizer (flavour "engine") its own
    name = {("exact", False): "torch-native-fast", ("exact", True): "torch-native-compile",
            ("engine", False): "torch-native-engine", ("engine", True): "torch-native-compile-engine"}[
        cfg.flavour, compile]
    data, cfg = as_whole_arrays(model, data, cfg, validation_data, path=name, reference="torch-native")  # as the loop
    check_data(cfg, data, ensure_built(model, data.x_train))
    warn_unseeded(model)
    engine = FastSteps(model, data, cfg, compile=compile, looked_in=on_step is not None)
    saved = Checkpoints(checkpoint, model, data, cfg, "torch", name, resume=resume) if checkpoint else None
    # A compiled run of one epoch (or one left to resume) times each step: it has no other epoch to set its compile
    # apart against, and a step that compiles stands out (`compile_apart`).
    one_epoch = compile and cfg.epochs - (saved.start if saved else 0) == 1
    curves, epoch_seconds, steps = driver.run(engine, cfg, saved=saved, progress=progress, on_step=on_step,
                                              time_steps=one_epoch)
    seconds, compile_seconds = compile_apart(epoch_seconds, steps) if compile else (sum(epoch_seconds), None)
    return Result.from_training(name, "torch", model.get_weights(), data, cfg, curves["loss"], curves["val_loss"],
                                predict(model, data.x_test), seconds, compile_seconds, metrics=curves["metrics"])


class FastSteps(driver.Engine):
    """The fast step on whole training arrays, for `driver.run`: each epoch's rows gathered once, each batch a view
    of them; each batch's loss left on the device (`.item()` every step would wait for it), summed once an epoch."""

    validates = True

    def __init__(self, model, data, cfg: TrainConfig, *, compile: bool, looked_in: bool):
        """`looked_in`: an `on_step` of yours runs between steps (it may change what compiled graphs read)."""
        self.model, self.data, self.cfg, self.compile, self.looked_in = model, data, cfg, compile, looked_in
        self.device = device = next(model.parameters()).device
        self.update = Updates(model, cfg, compile=compile)
        self.x, self.y = tensors(data.x_train, device), tensors(data.y_train, device)
        outputs, self.regularized = _probe(model, take(self.x, slice(0, 1)), device)
        self.loss_fn = spec_loss(cfg, same_rank=all(t.ndim == o.ndim for t, o in zip(as_tuple(self.y),
                                                                                      as_tuple(outputs))))
        self.x_val, self.y_val = tensors(data.x_val, device), tensors(data.y_val, device)
        self.weights = None if data.w_train is None else torch.as_tensor(data.w_train, device=device)
        self.orders = batch_orders(cfg, data.n_train)  # every epoch's, drawn before the first: a resumed run too
        self.slices = batch_slices(data.n_train, cfg.batch_size)
        self.sizes = torch.tensor([rows.stop - rows.start for rows in self.slices], dtype=torch.float64)
        self.metrics = EpochMetrics(cfg)
        self.backward = self._backward()
        self.warm = False  # compiled in one graph, for every batch shape of the run (after an epoch): guards skipped

    def _backward(self):
        """`backward(x, y, w) -> (loss, outputs)`, the gradients left in each `.grad`: eager, or compiled."""
        model, loss_fn, optimizer, regularized = self.model, self.loss_fn, self.update.optimizer, self.regularized

        def batch_loss(xb, yb, wb, masks=()):  # not `self`: no cycle keeps the engine alive past its run
            return total_loss(model, loss_fn, xb, yb, training=True, regularized=regularized, sample_weight=wb,
                              masks=masks)

        if not self.compile:
            return through_autograd(batch_loss, optimizer)
        # Compiled code is cached per model; start clean so that many trainings in one process never reach torch's
        # recompile limit (where it would fall back to eager without a word). It compiles at the first batch and
        # once more for a short last batch; the optimizer's update once, at the first step.
        torch.compiler.reset()
        counters.clear()  # dynamo's tally, to tell after the first epoch whether the step broke its graph
        compiled.traceable(model)
        draws = compiled.Draws.of(model, self.x)
        if compiled.stateless(model, draws):
            return compiled.compiled_gradient(model, loss_fn, draws)
        # with Draws, the Dropouts' masks drawn before the compiled step, which takes them as inputs
        compiled_loss = torch.compile(batch_loss)
        step = (lambda xb, yb, wb: compiled_loss(xb, yb, wb, draws(len(xb)))) if draws else compiled_loss
        return through_autograd(compiled.fresh_losses(model, step), optimizer)

    def batches(self, epoch: int):
        order = self.orders[epoch].to(self.device)
        x, y = take(self.x, order), take(self.y, order)  # one gather per epoch; each batch is then a view
        w = None if self.weights is None else self.weights[order]
        for rows in self.slices:  # the short last batch as it comes
            yield take(x, rows), take(y, rows), None if w is None else w[rows]

    def step(self, batch):
        loss, outputs = self.backward(*batch)
        self.update()
        if self.metrics:
            self.metrics.update(batch[1], outputs.detach())
        return loss.detach()

    def epoch_loss(self, losses: list, rows: list[int]) -> float:
        return float(torch.stack(losses).cpu().double() @ self.sizes) / self.data.n_train  # the mean over the rows

    def epoch_scope(self, epoch: int):
        return compiled.guards_skipped() if self.warm else contextlib.nullcontext()

    def end_epoch(self) -> None:
        self.warm = self.compile and not self.looked_in and compiled.one_graph()

    def validate(self) -> float:
        return _evaluate(self.model, self.loss_fn, self.x_val, self.y_val, self.regularized, self.metrics)

    def synchronize(self) -> None:
        if self.device.type != "cpu":
            torch.accelerator.synchronize(self.device)

    def write(self, folder) -> None:
        torch_checkpoint.write(folder, (self.model, self.update.optimizer, self.update.scheduler))

    def read(self, folder) -> None:
        torch_checkpoint.read(folder, (self.model, self.update.optimizer, self.update.scheduler))


@torch.no_grad()
def _evaluate(model, loss_fn, x, y, regularized: bool, metrics: EpochMetrics) -> float:
    """The validation loss and metrics as `fit` reports them: the spec's loss plus the model's own losses, in
    inference mode."""
    loss, outputs = total_loss(model, loss_fn, x, y, training=False, regularized=regularized)
    metrics.update(y, outputs)
    metrics.close("val_")
    return loss.item()


def grad_at(model, x, y, *, loss=None, training: bool = False) -> list[np.ndarray]:
    """Autograd gradient of the training objective at the current weights, in `model.trainable_weights` order: the
    batch loss plus the model's own losses (regularizers). The loss is MSE (each output's, summed, for several
    outputs) unless `loss` says otherwise: a spec's loss by name ("mae"), or `loss(y_true, y_pred)` of yours,
    which gets the targets and predictions as they are."""
    x, y = verb_inputs(model, x), verb_inputs(model, y, "y")
    ensure_built(model, x)
    device = next(model.parameters()).device
    y = keras_inputs(tensors(y, device))  # several targets: a tuple of arrays, one per output
    with state_kept(model):  # the gradient at the current state: training=True would move BatchNorm's statistics
        y, pred = as_fit_shapes(y, forward(model, tensors(x, device), training=training))
        value = verb_loss(loss, mse, y, pred, torch.mean)
        value = value + sum(model.losses) if model.losses else value
        grads = torch.autograd.grad(value, [w.value for w in model.trainable_weights], allow_unused=True,
                                    materialize_grads=True)  # a weight the loss does not reach: zero, as on JAX
    return [g.detach().cpu().numpy() for g in grads]


@torch.no_grad()
def predict(model, x):
    """Inference-mode predictions as NumPy (float32 from a bfloat16 or float16 model: NumPy has no bfloat16);
    several outputs: a tuple of arrays, one each."""
    x = verb_inputs(model, x)
    ensure_built(model, x)
    device = next(model.parameters()).device
    outputs = forward(model, tensors(x, device), training=False)
    if isinstance(outputs, (list, tuple)):
        return tuple(_numpy(o) for o in outputs)
    return _numpy(outputs)


def _numpy(t: torch.Tensor) -> np.ndarray:
    return (t.float() if t.dtype in (torch.bfloat16, torch.float16) else t).cpu().numpy()
