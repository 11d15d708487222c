"""The reference loop on torch: what `model.fit` does, written out with torch's own tools, public API only.

    native-loops train --path torch-native      # or, in your code: from native.torch import loop

On the torch backend a Keras model is a `torch.nn.Module` whose weights are `nn.Parameter`s, so the textbook torch
step trains it: `model(x, training=True)`, the loss, `zero_grad`, `backward`, `step`. Each line that `fit` needs
beyond the first loop (`native/torch/first_loop.py`) carries a `# fit:` comment saying what it adds. The same
functions, in the same order, are in `native/jax/loop.py` and `native/tensorflow/loop.py`; docs/lesson.md reads
them side by side. The fast paths (`native.torch.fast`: Keras's call wrapper bypassed, `torch.compile`) are tested
to end on this loop's weights.
"""
from __future__ import annotations

import time

import numpy as np
import torch

from keras_side.arrays import first, keras_inputs, take
from keras_side.callbacks import EarlyStopping
from keras_side.checks import check_data, warn_unseeded
from keras_side.data import Batches, as_data, batch_parts, batch_slices, numpy_orders, verb_inputs
from keras_side.losses import as_fit_shapes, training_loss, verb_loss
from keras_side.metrics import EpochMetrics
from keras_side.models import ensure_built, state_kept
from keras_side.results import Result
from keras_side.spec import TrainConfig
from native.checkpoint import Checkpoints, fresh_curves
from native.torch import checkpoint as torch_checkpoint
from native.torch import optim


def make_step(model, loss_fn, optimizer, metrics: EpochMetrics, scheduler=None, clip=None):
    """`step(x, y, sample_weight) -> loss`: one optimizer step on one batch; the metrics updated on its outputs."""
    params = [p for p in model.parameters() if p.requires_grad]  # not BatchNorm's statistics, not a seed state
    constrained = [(v.value, v.constraint) for v in model.trainable_variables if v.constraint is not None]

    def step(x, y, sample_weight=None):
        outputs = model(keras_inputs(x), training=True)  # fit: the training flag (Dropout, BatchNorm's statistics)
        loss = loss_fn(y, outputs, sample_weight) + sum(model.losses)  # fit: the regularizers, add_loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if clip:
            clip(params)  # fit: clipnorm; Keras clips inside its optimizer, torch between backward and step
        optimizer.step()
        with torch.no_grad():
            for p, constraint in constrained:
                p.copy_(constraint(p))  # fit: kernel_constraint=..., applied after every update
            metrics.update(y, outputs)  # fit: compile(metrics=...), unweighted
        if scheduler:
            scheduler.step()  # fit: the learning-rate schedule counts optimizer steps
        return loss.detach()

    return step


@torch.no_grad()
def evaluate(model, loss_fn, batches, metrics: EpochMetrics) -> float:
    """`fit`'s validation: the loss it minimizes (the regularizers included) and the metrics, in inference mode,
    over the validation batches `(x, y, sample_weight)`: the mean over their rows."""
    total, rows = 0.0, 0
    for x, y, w in batches:
        outputs = model(keras_inputs(x), training=False)
        loss = loss_fn(y, outputs, w) + sum(model.losses)
        metrics.update(y, outputs)
        total, rows = total + float(loss) * len(first(y)), rows + len(first(y))
    metrics.close("val_")
    return total / rows


def batch_orders(cfg: TrainConfig, n: int) -> torch.Tensor:
    """One permutation of the n rows per epoch, from a `torch.Generator` seeded by the spec (or the NumPy ones every
    path can share, `batch_order="numpy"`)."""
    if cfg.batch_order == "numpy":
        return torch.as_tensor(numpy_orders(cfg.seed, n, cfg.epochs))
    generator = torch.Generator().manual_seed(cfg.seed)
    return torch.stack([torch.randperm(n, generator=generator) for _ in range(cfg.epochs)])


def epoch_batches(model, data, cfg: TrainConfig) -> tuple:
    """`(batches(epoch), validation())`, iterables of `(x, y, sample_weight)` batches on the model's device: the
    spec's shuffled mini-batches of the training arrays and the validation split whole, or a loader's batches as it
    gives them (`Batches`), floats cast to the model's dtype as `fit` casts them."""
    device = next(model.parameters()).device
    if isinstance(data, Batches):  # fit: a DataLoader of yours, one pass per epoch
        def on_device(loader):
            for x, y, w in (batch_parts(model, batch) for batch in loader):
                yield tuple(None if a is None else tensors(a, device, model.compute_dtype) for a in (x, y, w))
        return (lambda epoch: on_device(data.train)), (lambda: on_device(data.val))
    x, y = tensors(data.x_train, device), tensors(data.y_train, device)
    w = None if data.w_train is None else tensors(data.w_train, device)  # fit: sample_weight
    orders = batch_orders(cfg, data.n_train)  # every epoch's, drawn before the first: a resumed run draws them too

    def batches(epoch):
        for rows in batch_slices(data.n_train, cfg.batch_size):  # fit: the short last batch as it comes
            batch = orders[epoch][rows].to(device)
            yield take(x, batch), take(y, batch), None if w is None else w[batch]
    return batches, lambda: [(tensors(data.x_val, device), tensors(data.y_val, device), None)]


def train(model, data, cfg: TrainConfig, *, validation_data=None, progress=None, on_step=None, checkpoint=None,
          resume: bool = False) -> Result:
    """Train `model` on `data` as `fit` would with the spec `cfg`: the spec's loss and optimizer over shuffled
    mini-batches, the validation loss after every epoch.

    Args:
        data: a `HarData`; `(x, y)` or `(x, y, sample_weight)` arrays as `fit` takes them (`as_data`); or a
            `DataLoader` of such batches (`Batches`), trained on as it gives them.
        validation_data: `(x_val, y_val)` arrays with arrays for `data`, a `DataLoader` with a `DataLoader`; without
            it the loop does not validate.
        progress: `progress(epoch, epochs)` after every epoch.
        on_step: `on_step(loss)` after every optimizer step (the training-parity check reads the weights there).
        checkpoint: a folder to write a checkpoint to after every epoch (`native.checkpoint`).
        resume: go on from the last checkpoint in `checkpoint`.
    """
    data, cfg = as_data(model, data, cfg, validation_data)  # fit: your arrays or DataLoader, as given
    check_data(cfg, data, ensure_built(model, data.x_train))
    warn_unseeded(model)  # fit: an unseeded Dropout on torch draws from the generator fit's loader draws from
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer, scheduler, clip = optim.build(params, cfg)  # fit: Keras's own update rule, as a torch.optim.Optimizer
    loss_fn, metrics = training_loss(cfg), EpochMetrics(cfg)
    step = make_step(model, loss_fn, optimizer, metrics, scheduler, clip)
    saved = Checkpoints(checkpoint, model, data, cfg, "torch", "torch-native", resume=resume) if checkpoint else None
    if saved and saved.saved:
        saved.restore(lambda folder: torch_checkpoint.read(folder, (model, optimizer, scheduler)))
    curves = saved.curves if saved else fresh_curves()  # a resumed run's epochs so far
    metrics.history = curves["metrics"]
    stop = EarlyStopping(cfg.patience) if cfg.patience else None  # fit: callbacks=[EarlyStopping(...)]
    batches, validation = epoch_batches(model, data, cfg)
    epoch_seconds = []
    for epoch in range(saved.start if saved else 0, cfg.epochs):  # a resumed run goes on after its checkpoint
        start, total, rows = time.perf_counter(), 0.0, 0
        for x, y, w in batches(epoch):
            loss = step(x, y, w)
            total, rows = total + loss.item() * len(first(y)), rows + len(first(y))  # `.item()` waits for the device
            if on_step:
                on_step(loss)
        curves["loss"].append(total / rows)  # fit: the epoch's loss is the mean over its rows
        metrics.close()
        if cfg.validate:
            curves["val_loss"].append(evaluate(model, loss_fn, validation(), metrics))
        epoch_seconds.append(time.perf_counter() - start)
        if saved:
            saved.save(epoch + 1, model, curves,
                       lambda folder: torch_checkpoint.write(folder, (model, optimizer, scheduler)))
        if progress:
            progress(epoch + 1, cfg.epochs)
        if stop and stop.update(epoch, curves["val_loss"][-1], model.get_weights):
            break
    if stop:
        model.set_weights(stop.best_weights)  # fit: restore_best_weights
    test_pred = None if data.x_test is None else predict(model, data.x_test)  # a loader's batches: no test rows
    return Result.from_training("torch-native", "torch", model.get_weights(), data, cfg, curves["loss"],
                                curves["val_loss"], test_pred, sum(epoch_seconds), metrics=metrics.history)


def tensors(x, device, dtype: str | None = None):
    """Arrays (NumPy, or torch's) as torch tensors on the model's device, floats cast to `dtype` when given (several
    inputs or targets stay a tuple)."""
    if isinstance(x, tuple):
        return tuple(tensors(a, device, dtype) for a in x)
    x = torch.as_tensor(x, device=device)
    return x.to(getattr(torch, dtype)) if dtype and x.is_floating_point() else x


def grad_at(model, x, y, *, loss=None, training: bool = False) -> list[np.ndarray]:
    """Autograd's gradient of the training objective at the current weights, in `model.trainable_weights` order:
    the batch loss plus the model's own losses (regularizers). The loss is MSE (each output's, summed, for several
    outputs) unless `loss` says otherwise: a spec's loss by name ("mae"), or `loss(y_true, y_pred)` of yours,
    which gets the targets and predictions as they are."""
    x, y = verb_inputs(model, x), verb_inputs(model, y, "y")
    ensure_built(model, x)
    device = next(model.parameters()).device
    with state_kept(model):  # the gradient at the current state: training=True would move BatchNorm's statistics
        y, pred = as_fit_shapes(keras_inputs(tensors(y, device)), model(keras_inputs(tensors(x, device)),
                                                                         training=training))
        value = verb_loss(loss, lambda t, p: (p - t) ** 2, y, pred, torch.mean) + sum(model.losses)
        grads = torch.autograd.grad(value, [w.value for w in model.trainable_weights], allow_unused=True,
                                    materialize_grads=True)  # a weight the loss does not reach: zero, as on JAX
    return [g.detach().cpu().numpy() for g in grads]


@torch.no_grad()
def predict(model, x):
    """Inference-mode predictions as NumPy (several outputs: a tuple of arrays, one each; a half-precision model's
    as float32, since NumPy has no bfloat16)."""
    x = verb_inputs(model, x)
    ensure_built(model, x)
    outputs = model(keras_inputs(tensors(x, next(model.parameters()).device)), training=False)
    numpy = lambda t: (t.float() if t.dtype in (torch.bfloat16, torch.float16) else t).cpu().numpy()  # noqa: E731
    return tuple(numpy(o) for o in outputs) if isinstance(outputs, (list, tuple)) else numpy(outputs)
