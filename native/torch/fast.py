"""The Keras model trained as what it is on the torch backend: a `torch.nn.Module`, with `torch.optim`.

    native-loops train --path torch-native   # or, in your code: from native.torch import fast

Every Keras weight is a `torch.nn.Parameter` registered on the module, so `model.parameters()` is all torch needs.
Do not reach for `torch.func.functional_call`: on a Keras model it silently trains nothing (keras-team/keras#20279).
What `fit` adds, written out: the spec's Keras loss plus `model.losses` (the regularizers), the optimizer of the
spec (`native.torch.optim`: Keras-exact by default), its clip and scheduler, and the short last batch as it comes.

`train(..., compile=True)` (path `torch-native-compile`) runs the same loop through `torch.compile`: for a model
with no non-trainable variables (`stateless`) the objective's gradient in one graph, forward and backward together
(`compiled_gradient`: `torch.func.grad` of the model's call under Keras's `StatelessScope`, the parameters' values
in, their gradients out into each `.grad`); for a model with moving statistics (BatchNorm) the batch loss in one
graph and its backward graph from AOTAutograd, through autograd's engine. A seeded Dropout's masks are drawn before
each step, as Keras draws them, and handed to the graph (`Draws`), so a model whose only state is its Dropouts'
seeds is `stateless` too. A Dropout they cannot be drawn for keeps Keras's own draw: unseeded, torch's own dropout
inside the graph, with the compiled loss; seeded, a graph break at each draw. The Keras-exact update
is compiled too (one kernel), and dynamo's guards are skipped once every batch shape is compiled
(`guards_skipped`). It pays a one-off compile (seconds, reported apart) for a step faster than eager
(docs/speed.md; the eager loop calls each layer's `call` where Keras's wrapper has nothing to do, `_bare`, which is
what the compiled graph leaves out anyway, and a plain LSTM as torch's own LSTM op, `_lstm`).
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import time

import keras
import numpy as np
import torch
from keras.src.backend import get_autocast_scope
from keras.src.backend.torch.core import get_device
from keras.src.backend.torch.random import torch_seed_generator
from keras.src.layers.rnn.lstm import LSTMCell
from keras.src.models import functional
from keras.src.models.functional import Functional
from torch._dynamo.utils import counters

from keras_side.callbacks import EarlyStopping
from keras_side.config import (HarData, Result, as_tuple, batch_slices, compile_apart, keras_inputs, take,
                               verb_arrays)
from keras_side.metrics import EpochMetrics
from keras_side.models import drawing_layers, ensure_built, weight_constraints
from keras_side.spec import (SpecError, TrainConfig, as_fit_shapes, check_data, keras_loss, state_kept, verb_loss,
                              training_loss)
from native.checkpoint import Checkpoints, fresh_curves
from native.torch import checkpoint as torch_checkpoint
from native.torch import optim
from native.torch.loop import batch_orders, tensors, warn_unseeded


def _forward(model, x, training: bool, masks=()):
    """The model's outputs: a Sequential model's layers in order, a Functional model's graph run by Keras's own
    runner, each layer through its `call` where its `Layer.__call__` has nothing to do (`_bare`); any other model
    called whole (so are a Sequential model's inputs whose rank or dtype its graph would first adjust). `masks`:
    the masks of the model's Dropouts, drawn before the call (`Draws`), in their order."""
    x = keras_inputs(x)
    bare = not torch.compiler.is_compiling() and _nothing_around_layers()  # compiled, the wrapper is traced away
    layers = in_order(model)
    masks = list(masks)
    if layers is not None and _as_declared(model, x):
        for layer, takes_training in layers:
            if masks and training and _drops(layer):
                x = _dropped(x, masks.pop(0), layer.rate)  # `Draws` drew one for each such Dropout, in this order
                continue
            direct = bare and _direct(layer, x)
            if direct:
                x = direct(layer, x, training)
            else:
                x = layer(x, training=training) if takes_training else layer(x)
        return _all_taken(x, masks)
    if masks and _own_graph(model):
        return _all_taken(_through_graph(model, x, training, bare=bare, masks=masks), masks)
    if masks:
        raise RuntimeError("internal: Draws drew Dropout masks for a model this call does not run layer by layer (a "
                           "bug in native.torch.fast); train with compile=False meanwhile")
    if bare and _own_graph(model) and _shaped(model, x):
        return _through_graph(model, x, training)
    return model(x, training=training)


def _all_taken(outputs, masks: list):
    """`outputs`, once every mask `Draws` drew has been taken by its Dropout."""
    if masks:
        raise RuntimeError(f"internal: Draws drew {len(masks)} more Dropout mask(s) than the model's layers took (a "
                           "bug in native.torch.fast); train with compile=False meanwhile")
    return outputs


def _own_graph(model) -> bool:
    """A Functional model (`keras.Model(inputs, outputs)`, Keras's own class) whose `Layer.__call__` has nothing to
    do (no hook, activity regularizer or mixed dtype policy of its own) and whose layers all get the training flag
    from the runner (none holds layers but takes no `training`)."""
    return (type(model) is Functional and _call_idle(model) and model.compute_dtype == model.variable_dtype
            and not any(layer._layers and not layer._call_has_training_arg for layer in model.layers))


def _through_graph(model, x, training: bool, bare: bool = True, masks: list | None = None):
    """`Functional.call`: the inputs standardized and the graph run node by node by Keras's own runner
    (`_run_through_graph`), with Keras's `operation_fn` (the training flag to every layer that takes it) but, when
    `bare`, a layer's `call` where its wrapper has nothing to do. two_horizons's eager step, 780 -> 474 µs (bench
    runs). `masks`: the Dropouts' masks `Draws` drew, taken in the runner's order, the order `Draws` found."""
    def operation(op):
        keras_call = functional.operation_fn(op, training=training)

        def call(*args, **kwargs):  # a node's recorded `training` is overridden by the runner's, as Keras does
            if masks and training and _drops(op):
                return _dropped(args[0], masks.pop(0), op.rate)
            direct = (bare and len(args) == 1 and set(kwargs) <= {"training", "mask"} and kwargs.get("mask") is None
                      and _direct(op, args[0]))
            return direct(op, args[0], training) if direct else keras_call(*args, **kwargs)

        return call

    outputs = model._run_through_graph(model._standardize_inputs(x), operation_fn=operation)
    return functional.unpack_singleton(outputs)


def _as_declared(model, x) -> bool:
    """`x` is one tensor of the rank and dtype of the model's declared input, and of its shape."""
    spec = model.inputs[0]
    return (isinstance(x, torch.Tensor) and keras.backend.standardize_dtype(x.dtype) == spec.dtype
            and _fits(spec.shape, x.shape))


def _shaped(model, x) -> bool:
    """Every input's shape is its declared one. The layers' own `call`s skip Keras's check of it, so a model given
    other shapes is called whole, where Keras says what it expected (rather than torch's "mat1 and mat2 shapes
    cannot be multiplied")."""
    if isinstance(x, dict):  # inputs by name: Keras's own call checks them
        return False
    return all(_fits(s.shape, t.shape) for s, t in zip(model.inputs, as_tuple(x)))


def _fits(declared: tuple, shape) -> bool:
    """`shape` is the `declared` one: the same rank, each axis but the batch's of the declared size (None: any). On
    every forward, so the usual case, the exact sizes, is one tuple comparison."""
    shape = tuple(shape)
    return len(shape) == len(declared) and (shape[1:] == declared[1:] or all(
        d is None or d == n for d, n in zip(declared[1:], shape[1:])))


def in_order(model) -> list[tuple[keras.Layer, bool]] | None:
    """`[(layer, takes_training)]` when calling a Sequential model's layers one after another is calling the model,
    else None.

    `Sequential.__call__` runs its layers through the Functional graph runner (inputs standardized, flattened and
    packed through torch's pytree, node by node): on torch that costs 100 to 150 µs a call, more than a `Dense`
    layer's own `__call__` (tested: 194 against 90 µs for the HAR's forward). Keras's own `Sequential.call` falls
    back to the layers in order when it has no graph; so does this, each layer through its own `Layer.__call__`
    (training flag, autocast, masks on the tensors, activity regularizers) or, when that has nothing to do, its
    `call` (`_bare`), bit-identical (tested on the zoo). A layer that holds layers but takes no `training` would lose
    the flag its inner layers read from the model's call, so such a model is called whole, as is a Sequential
    subclass with a `call` of its own, and a model whose own `__call__` has work to do (a torch hook on it, an
    activity regularizer of its own)."""
    if (not isinstance(model, keras.Sequential) or type(model).call is not keras.Sequential.call
            or type(model).__call__ is not keras.Sequential.__call__ or not model._functional):
        return None  # with no graph (no Input) `model(x)` already calls the layers in order
    if not _call_idle(model):  # its hooks were skipped without a word
        return None
    layers = [(layer, layer._call_has_training_arg) for layer in model.layers]
    if any(not takes and layer._layers for layer, takes in layers):
        return None
    return layers


def _direct(layer, x):
    """How the eager loop computes `layer(x)` without Keras's `Layer.__call__`, where that wrapper has nothing to
    do: the layer's `call` (`_bare`), or for an LSTM torch's own LSTM op (`_lstm`); None when Keras must call it."""
    if _bare(layer, x):
        return _call
    if _plain_lstm(layer, x):
        return _lstm
    return None


def _call(layer, x, training: bool):
    return layer.call(x, training=training) if layer._call_has_training_arg else layer.call(x)


def _bare(layer, x) -> bool:
    """Calling `layer.call(x)` is calling `layer(x)`: everything `Layer.__call__` does around `call` has nothing to
    do. That wrapper (with torch's `nn.Module.__call__` and Keras's traceback filter inside it) costs a built
    `Dense` 70-80 µs on torch, where its `call` costs 45 (the HAR's eager step: ~330 -> ~200 µs). It has nothing to
    do for one of Keras's own layers (whose `call` adds no loss) when: the layer is built and holds no layers (none
    reads `training` from a call context); it has no activity regularizer and holds no loss (which the wrapper would
    clear: one left from an earlier call or an `add_loss` outside it), no rematerialization or quantized call,
    no torch hook; its input carries no mask and it makes none (`_makes_no_mask`); its `call` takes only `training`
    and a `mask` that is None by default; and the input already has the dtype the layer computes in, which is the
    dtype of its weights (no cast, no autocast scope). Else the layer is called as Keras calls it."""
    return _bare_class(type(layer)) and not layer._layers and _idle_wrapper(layer, x) and _makes_no_mask(layer, x)


def _makes_no_mask(layer, x) -> bool:
    """For an input without a mask, `Layer.__call__` puts a mask on the output only when the layer supports masking
    and its `compute_mask(x, None)` returns one: `Layer`'s own passes the input's (None) on, a global pooling's
    returns None, an `Embedding(mask_zero=True)` or a `Masking` makes one (and is called through Keras). Asked per
    call: a mask may depend on the input's values (0.1 µs for a pooling's; its wrapper costs 50). A mask that `call`
    puts on its output itself (as `Masking`'s does) stays there either way."""
    return (type(layer).compute_mask is keras.Layer.compute_mask or not layer.supports_masking
            or layer.compute_mask(x, None) is None)


def _idle_wrapper(layer, x) -> bool:
    """What `_bare` and `_plain_lstm` ask of any layer and its input: nothing for `Layer.__call__` to do."""
    return (isinstance(x, torch.Tensor) and layer.built and layer.activity_regularizer is None and not layer._losses
            and getattr(layer, "_remat_mode", None) is None and getattr(layer, "quantization_mode", None) is None
            and not _hooked(layer) and getattr(x, "_keras_mask", None) is None
            and x.dtype == _TORCH_DTYPES.get(layer.compute_dtype) and layer.compute_dtype == layer.variable_dtype)


def _plain_lstm(layer, x) -> bool:
    """Keras's own LSTM whose `call` on `x` is Keras's torch `lstm` on CPU (`keras.src.backend.torch.rnn`: the
    inputs projected in one matmul, then a Python loop over the time steps, sigmoid and tanh gates): a sequence in
    the dtype of the layer and of its cell's weights, with no mask and no initial state, no dropout, not stateful,
    not backwards, no states returned, cuDNN not refused (`use_cudnn=False` takes Keras's cell-by-cell loop), the
    default activations, no torch autocast. And more than one row and one time step: torch projects an input whose
    time-major view is contiguous with the bias inside the matmul (`addmm`), where Keras adds it after, which
    rounds differently (`_lstm` makes every other input's time-major view a strided one, as Keras's is)."""
    cell = getattr(layer, "cell", None)
    return (type(layer) is keras.layers.LSTM and type(cell) is LSTMCell and _idle_wrapper(layer, x) and x.ndim == 3
            and x.shape[0] > 1 and x.shape[1] > 1 and x.device.type == "cpu"
            and not torch.is_autocast_enabled(x.device.type) and x.dtype == _TORCH_DTYPES.get(cell.kernel.dtype)
            and not (layer.stateful or layer.go_backwards or layer.return_state)
            and layer.use_cudnn is not False and cell.dropout == 0 and cell.recurrent_dropout == 0
            and cell.activation is keras.activations.tanh and cell.recurrent_activation is keras.activations.sigmoid)


def _lstm(layer, x, training: bool):
    """An LSTM layer's output from torch's own LSTM op (`torch.lstm`, which `torch.nn.LSTM` calls) on the layer's
    own weights: the kernels transposed (views, so the gradients reach the Keras variables) and the one Keras bias
    as torch's input bias, its recurrent bias zero. With oneDNN off for the call, torch's CPU LSTM is ATen's cell,
    op for op what Keras's loop does (the same matmuls, the gates in the same order), so the outputs and gradients
    are Keras's to the bit (tested), in C++ rather than Keras's Python. The zoo LSTM's forward and backward, 2.4 ->
    1.7 ms (its eager step in the bench, 3.0 -> 2.1 ms, 2.0× `fit`); oneDNN's fused LSTM takes 0.5 ms but rounds
    differently (4e-8 on the first forward), so it is left off."""
    cell = layer.cell
    outputs, last = lstm_op(x, cell.kernel.value, cell.recurrent_kernel.value,
                            cell.bias.value if cell.use_bias else None, training)
    return outputs if layer.return_sequences else last


def lstm_op(x, kernel, recurrent_kernel, bias, training: bool):
    """`(outputs, last output)` of torch's LSTM op on a Keras LSTM's weights (kernel (features, 4·units), recurrent
    kernel (units, 4·units), the one bias or None), batch-major `x`, zero initial states, oneDNN off (`_lstm`; the
    bench's floor calls it on raw tensors)."""
    zeros = torch.zeros((1, x.shape[0], recurrent_kernel.shape[0]), dtype=x.dtype, device=x.device)
    weights = (kernel.t(), recurrent_kernel.t())
    if bias is not None:
        weights += (bias, torch.zeros_like(bias))
    with _without_onednn():
        outputs, last, _ = torch.lstm(x.contiguous(), (zeros, zeros), weights, bias is not None, 1, 0.0, training,
                                      False, True)
    return outputs, last[0]


@contextlib.contextmanager
def _without_onednn():
    """torch's CPU LSTM takes oneDNN's fused kernel when oneDNN is on (`torch.backends.mkldnn.enabled`), ATen's
    own cell when it is off: off for the call, as it was after it."""
    was = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = False
    try:
        yield
    finally:
        torch.backends.mkldnn.enabled = was


_TORCH_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
                 "float64": torch.float64}


def _call_idle(model) -> bool:
    """Whether a model's own `Layer.__call__` has nothing to do around its layers: no torch hook on it, no activity
    regularizer of its own."""
    return model.activity_regularizer is None and not _hooked(model)


def _hooked(module) -> bool:
    return bool(module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
                or module._backward_pre_hooks)


@functools.cache
def _bare_class(cls) -> bool:
    """What `_bare` asks of a layer's class, once per class: one of Keras's own layers, with `Layer`'s `__call__`,
    whose `call` takes nothing but its input, `training` and a `mask=None`. Not a `Lambda`: it runs your function,
    whose layers (untracked, in its closure) read `training` from the call context that only `__call__` opens."""
    parameters = list(inspect.signature(cls.call).parameters.values())[2:]  # after self and the input
    return (cls.__module__.startswith("keras.src.layers.") and cls.__call__ is keras.Layer.__call__
            and not issubclass(cls, keras.layers.Lambda)
            and all(p.name == "training" or (p.name == "mask" and p.default is None) for p in parameters))


def _nothing_around_layers() -> bool:
    """No Keras autocast scope is open and no torch global module hook is set (`_bare` checks the rest)."""
    hooks = torch.nn.modules.module
    return (get_autocast_scope() is None
            and not (hooks._global_forward_hooks or hooks._global_forward_pre_hooks or hooks._global_backward_hooks
                     or hooks._global_backward_pre_hooks))


def mse(y_true, y_pred):
    return torch.mean((y_pred - y_true) ** 2)


# Keras's per-sample MSE and MAE, the same torch operations Keras dispatches to (tested bit-identical).
TORCH_LOSSES = {
    "mse": lambda y_true, y_pred: torch.mean(torch.square(y_true - y_pred), dim=-1),
    "mae": lambda y_true, y_pred: torch.mean(torch.abs(y_true - y_pred), dim=-1),
}
# The same for the losses that take logits (`from_logits=True`). Keras's own binary cross-entropy asks
# `torch.backends.mps.is_available()` on every call, a graph break under torch.compile (tested bit-identical).
TORCH_LOGIT_LOSSES = {
    "binary_crossentropy": lambda y_true, y_pred: torch.mean(torch.nn.functional.binary_cross_entropy_with_logits(
        y_pred, y_true.to(y_pred.dtype), reduction="none"), dim=-1),
}


def spec_loss(cfg: TrainConfig, same_rank: bool):
    """`loss(y_true, y_pred)`: the spec's loss reduced as `fit` reduces it, sum / count of the per-sample losses.

    Keras's per-sample loss (`Loss.call`) also shapes the targets as `fit` does ((n,) against (n, 1)). When they
    already have the outputs' rank, MSE, MAE and the cross-entropy from logits are written in torch: the same numbers
    without Keras's per-call dispatch, which costs the eager step ~80 µs (a sixth of it) forward and backward.
    Several outputs: each output's loss, times its `loss_weights`, summed as `compile` combines them (Keras's losses
    and `OutputLosses` where one is not written here)."""
    table, losses = TORCH_LOGIT_LOSSES if cfg.from_logits else TORCH_LOSSES, keras_loss(cfg)
    if cfg.outputs == 1:
        return _batch_mean(table[cfg.loss] if same_rank and cfg.loss in table else losses.call, losses)
    if not (same_rank and all(name in table for name in cfg.losses)):
        return training_loss(cfg)
    means, weights = [_batch_mean(table[name], loss) for name, loss in zip(cfg.losses, losses)], cfg.loss_weights

    def combined(y_true, y_pred, sample_weight=None):  # `OutputLosses`, in torch: each in float32, weighed, summed
        values = [mean(y_t, y_p, sample_weight).to(torch.float32)
                  for mean, y_t, y_p in zip(means, y_true, y_pred, strict=True)]
        return sum(values if weights is None else [value * w for value, w in zip(values, weights)])

    return combined


def _batch_mean(per_sample, loss):
    """The batch's mean of `per_sample` as Keras's `Loss.__call__` takes it: half-precision predictions in float32
    first (a mixed-precision model's loss is float32), and a prediction that carries a mask (a sequence's padded
    steps) to the Keras `loss` itself, which weighs the masked steps out."""
    def mean(y_true, y_pred, sample_weight=None):
        if getattr(y_pred, "_keras_mask", None) is not None:
            return loss(y_true, y_pred, sample_weight)
        if y_pred.dtype in (torch.float16, torch.bfloat16):
            y_pred = y_pred.float()
        values = per_sample(y_true, y_pred)
        if sample_weight is not None:  # weighted, then still divided by the count (Keras's sum_over_batch_size)
            values = values * sample_weight.reshape(values.shape)
        return torch.sum(values) / values.numel()

    return mean


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
            outputs = _forward(model, x, training=False)
            if model.losses:
                return outputs, True
        with moving_nothing():
            _forward(model, x, training=True)
            return outputs, bool(model.losses)


def total_loss(model, loss_fn, x, y, training: bool, regularized: bool = True, sample_weight=None, masks=()):
    """`(loss, outputs)`: the objective `fit` minimizes, the spec's loss on the batch plus every loss the model adds
    (kernel, bias and activity regularizers, `add_loss`), which Keras collects in `model.losses` during the call.
    `regularized=False` says the model has none, and skips asking (a few µs a step)."""
    outputs = _forward(model, x, training=training, masks=masks)
    loss = loss_fn(y, outputs, sample_weight)
    extra = model.losses if regularized else ()
    return (loss + sum(extra) if extra else loss), outputs


class Draws:
    """The masks of a model's Dropouts, drawn outside the compiled step and handed to it as inputs. Drawn inside, by
    Keras's torch seed generator (a `torch.Generator`, which Keras marks `torch.compiler.disable`), they break the
    graph at every draw (5 breaks a step on dropout_mlp).

    Each mask is drawn as Keras's seeded Dropout draws it, by Keras's own `torch_seed_generator` (which advances the
    layer's seed state as its call would) and `torch.bernoulli`, and applied as Keras applies it (`_dropped`): the
    same masks, the same outputs, the same seed states, to the bit (tested). `Draws.of(model, x)` is None unless
    `_forward` calls the model layer by layer on inputs like `x` (a Sequential model's layers in order, or a
    Functional model's graph by Keras's runner: `_dropout_inputs`) and its only layers that draw are Keras's own
    seeded Dropouts (a rate between 0 and 1, no noise shape) around which `Layer.__call__` has nothing to do (no
    mask on the input, no cast, no activity regularizer, no hook: `_idle_wrapper`, asked of each Dropout's input in
    an inference call of one row, which also gives its shape). A Dropout called twice draws twice, in call order."""

    def __init__(self, layers: list, shapes: list[tuple[int, ...]]):
        """`layers`: the Dropouts in the order the model calls them; `shapes`: each one's input, but for the rows."""
        self.layers, self.shapes = layers, shapes

    @classmethod
    def of(cls, model, x) -> Draws | None:
        """The model's Draws for inputs like `x` (arrays or tensors), or None."""
        device = torch.device(get_device())
        if not all(p.device.type == device.type for p in model.parameters()):  # where Keras draws its masks
            return None
        sample = keras_inputs(tensors(take(x, slice(0, 1)), device))
        with torch.no_grad(), keras.StatelessScope():  # an inference call of one row: no state moves
            found = _dropout_inputs(model, sample)
        dropouts = [layer for layer, _ in found or ()]
        if not dropouts or any(layer not in dropouts for layer in drawing_layers(model)) or not all(
                drawable(layer) and _idle_wrapper(layer, inputs) for layer, inputs in found):
            return None
        return cls(dropouts, [tuple(inputs.shape[1:]) for _, inputs in found])

    def __call__(self, rows: int) -> tuple[torch.Tensor, ...]:
        """One mask per Dropout for a batch of `rows`, each layer's seed state advanced by one draw."""
        return tuple(torch.bernoulli(torch.full((rows, *shape), 1.0 - layer.rate, device=get_device()),
                                     generator=torch_seed_generator(layer.seed_generator)).bool()
                     for layer, shape in zip(self.layers, self.shapes))


def _dropout_inputs(model, x) -> list | None:
    """`[(dropout, its input)]` in the order `_forward` calls the model's Dropouts (rate above 0) on `x`: a
    Sequential model's layers one after another, or a Functional model's graph by Keras's runner (as `Layer.__call__`
    gives them their inputs, in inference mode); None for a model `_forward` does not call layer by layer."""
    found, layers = [], in_order(model)
    if layers is not None and _as_declared(model, x):
        for layer, takes_training in layers:
            if _drops(layer):
                found.append((layer, x))
            x = layer(x, training=False) if takes_training else layer(x)
        return found
    if not _own_graph(model):
        return None

    def operation(op):
        keras_call = functional.operation_fn(op, training=False)

        def call(*args, **kwargs):
            if _drops(op):
                found.append((op, args[0]))
            return keras_call(*args, **kwargs)

        return call

    model._run_through_graph(model._standardize_inputs(x), operation_fn=operation)
    return found


def drawable(layer) -> bool:
    """A layer whose masks `Draws` can draw: Keras's own seeded Dropout, no noise shape, a rate below 1."""
    return (type(layer) is keras.layers.Dropout and layer.rate < 1 and layer.noise_shape is None
            and layer.seed_generator._initial_seed is not None)


def _drops(layer) -> bool:
    """A Keras Dropout that drops something when it trains (a rate above 0): the layers whose masks `Draws` draws."""
    return isinstance(layer, keras.layers.Dropout) and layer.rate > 0


def _dropped(x, mask, rate: float):
    """Keras's seeded dropout on torch, given its mask (`keras.src.backend.torch.random.dropout`)."""
    keep = 1.0 - rate
    return torch.where(torch.broadcast_to(mask, x.shape), x / keep, torch.zeros_like(x, dtype=x.dtype))


def train(model, data: HarData, cfg: TrainConfig, *, compile: bool = False, progress=None, on_step=None,
          checkpoint=None, resume: bool = False) -> Result:
    """The spec's loss and optimizer over shuffled mini-batches; the validation loss after every epoch.
    `compile=True` runs the step through `torch.compile` (the module's docstring). `on_step(loss)` is called after
    every optimizer step with the step's batch loss (the training-parity check reads the weights there).
    `checkpoint=DIR` writes a checkpoint at the end of every epoch (`native.checkpoint`: the optimizer and scheduler
    with `torch.save`); `resume=True` goes on from the last one there."""
    assert isinstance(model, torch.nn.Module), "the torch loop needs a Keras model built with KERAS_BACKEND=torch"
    check_data(cfg, data, ensure_built(model, data.x_train))
    warn_unseeded(model)
    device = next(model.parameters()).device
    # A layer's seed and BatchNorm's moving statistics are frozen Parameters, which the layers update themselves.
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer, scheduler, clip = optim.build(params, cfg, compile=compile)
    constrained = constraints_of(model)
    name = "torch-native-compile" if compile else "torch-native-fast"
    saved = Checkpoints(checkpoint, model, data, cfg, "torch", name, resume=resume) if checkpoint else None
    if saved and saved.saved:
        saved.restore(lambda folder: torch_checkpoint.read(folder, model, optimizer, scheduler))
    x, y = tensors(data.x_train, device), tensors(data.y_train, device)
    outputs, regularized = _probe(model, take(x, slice(0, 1)), device)
    loss_fn = spec_loss(cfg, same_rank=all(t.ndim == o.ndim for t, o in zip(as_tuple(y), as_tuple(outputs))))
    x_val, y_val = tensors(data.x_val, device), tensors(data.y_val, device)
    weights = None if data.w_train is None else torch.as_tensor(data.w_train, device=device)

    def batch_loss(xb, yb, wb, masks=()):
        return total_loss(model, loss_fn, xb, yb, training=True, regularized=regularized, sample_weight=wb,
                          masks=masks)

    backward = _through_autograd(batch_loss, optimizer)
    if compile:
        # Compiled code is cached per model; start clean so that many trainings in one process never reach torch's
        # recompile limit (where it would fall back to eager without a word). It compiles at the first batch and
        # once more for a short last batch; the optimizer's update once, at the first step.
        torch.compiler.reset()
        counters.clear()  # dynamo's tally, to tell after the first epoch whether the step broke its graph
        traceable(model)
        draws = Draws.of(model, x)
        if stateless(model, draws):
            backward = compiled_gradient(model, loss_fn, draws)
        else:  # with Draws, the Dropouts' masks drawn before the compiled step, which takes them as inputs
            compiled = torch.compile(batch_loss)
            step = (lambda xb, yb, wb: compiled(xb, yb, wb, draws(len(xb)))) if draws else compiled
            backward = _through_autograd(fresh_losses(model, step), optimizer)
    sizes = torch.tensor([rows.stop - rows.start for rows in batch_slices(data.n_train, cfg.batch_size)],
                         dtype=torch.float64)
    warm = False  # compiled in one graph, for every batch shape of the run (after the first epoch): guards skipped
    metrics, stop = EpochMetrics(cfg), EarlyStopping(cfg.patience) if cfg.patience else None
    curves = saved.curves if saved else fresh_curves()  # a resumed run's epochs so far
    train_loss, val_loss, epoch_seconds, metrics.history = curves["loss"], curves["val_loss"], [], curves["metrics"]
    # A compiled run of one epoch (or one left to resume) times each step, (batch rows, seconds): it has no other
    # epoch to set its compile apart against, and a step that compiles stands out (`compile_apart`).
    steps = [] if compile and cfg.epochs - (saved.start if saved else 0) == 1 else None
    for epoch, order in enumerate(batch_orders(cfg, data.n_train)):
        if saved and epoch < saved.start:
            continue  # done before the checkpoint: every epoch's order is drawn all the same, so the rest match
        start = time.perf_counter()
        order = order.to(device)
        x_epoch, y_epoch = take(x, order), take(y, order)  # one gather per epoch; each batch is then a view
        w_epoch = None if weights is None else weights[order]
        losses = []  # each batch's mean loss, on the device: `.item()` every step would sync
        if steps is not None:
            mark = _clock(device)
        with guards_skipped() if warm else contextlib.nullcontext():
            for rows in batch_slices(data.n_train, cfg.batch_size):
                y_batch, w_batch = take(y_epoch, rows), None if weights is None else w_epoch[rows]
                loss, outputs = backward(take(x_epoch, rows), y_batch, w_batch)
                if clip:
                    clip(params)  # Keras clips inside its optimizer; torch between backward and step
                optimizer.step()
                if constrained:
                    constrain(constrained)
                if scheduler:
                    scheduler.step()  # once a batch: Keras's schedules count optimizer steps
                losses.append(loss.detach())
                if metrics:
                    metrics.update(y_batch, outputs.detach())
                if on_step:
                    on_step(loss.detach())
                if steps is not None:
                    now = _clock(device)
                    steps.append((rows.stop - rows.start, now - mark))
                    mark = now
        warm = compile and on_step is None and one_graph()  # your `on_step` may change what the graphs read
        train_loss.append(float(torch.stack(losses).cpu().double() @ sizes) / data.n_train)  # the mean over the rows
        metrics.close()
        if cfg.validate:
            val_loss.append(_evaluate(model, loss_fn, x_val, y_val, regularized, metrics))
        epoch_seconds.append(time.perf_counter() - start)
        if saved:
            saved.save(epoch + 1, model, curves, lambda folder: torch_checkpoint.write(folder, model, optimizer,
                                                                                      scheduler))
        if progress:
            progress(epoch + 1, cfg.epochs)
        if stop and stop.update(epoch, val_loss[-1], model.get_weights):
            break
    if stop:
        model.set_weights(stop.best_weights)  # restore_best_weights
    seconds, compile_seconds = compile_apart(epoch_seconds, steps) if compile else (sum(epoch_seconds), None)
    return Result.from_training(name, "torch", model.get_weights(),
                                data, cfg, train_loss, val_loss, predict(model, data.x_test), seconds, compile_seconds,
                                metrics=metrics.history)


def constraints_of(model) -> list[tuple[torch.Tensor, object]]:
    """`(parameter, constraint)` for each trainable variable with a constraint (`weight_constraints`)."""
    return [(v.value, c) for v, c in zip(model.trainable_variables, weight_constraints(model)) if c is not None]


def constrain(constrained: list[tuple[torch.Tensor, object]]) -> None:
    """Each constraint on its parameter, in place, after the optimizer's step: Keras's optimizer assigns
    `constraint(variable)` to the variable (`BaseOptimizer.apply`), the same ops on the same values."""
    with torch.no_grad():
        for p, constraint in constrained:
            p.copy_(constraint(p))


def _clock(device) -> float:
    """`time.perf_counter()` once the device has run what it was given (torch's CPU ops run as they are called)."""
    if device.type != "cpu":
        torch.accelerator.synchronize(device)
    return time.perf_counter()


def guards_skipped():
    """torch's stance that checks only the guards that tell its compiled graphs apart (`skip_guard_eval_unsafe`).

    Before running a compiled graph dynamo checks every assumption it traced under, here every Keras attribute the
    forward read (the layers' flags, dtype policies, Keras's global state): 30 µs of the HAR's 200 µs compiled step
    (entering the stance around each call would cost as much again, so the loop enters it once an epoch). "Unsafe"
    means two things. A change that would need a new graph (a shape, a dtype) is an error, not a recompile. And a
    Python value a graph read (a layer's attribute, a float) is no longer checked: changed, the old graph runs on.
    The loop enters it after the first epoch has compiled every batch shape of the run, only when that epoch traced
    one graph each (`one_graph`) and there is no `on_step` of yours, which could change what the graphs read. In the
    loop's own code nothing changes a shape, a dtype or the model, and the rate and step reach the optimizer as
    tensors: the same graphs run, and the weights end where they end with every guard checked, to the bit (tested).
    A step with graph breaks (a Dropout that `Draws` cannot draw: Keras's seed generator runs outside the graph)
    resumes through pieces that dynamo re-specializes as it goes, so it keeps every guard."""
    return torch.compiler.set_stance(skip_guard_eval_unsafe=True)


def _through_autograd(batch_loss, optimizer):
    """`backward(x, y, w) -> (loss, outputs)`: the batch's loss through the model, then autograd, the gradients left
    in each `.grad` for the optimizer."""
    def backward(xb, yb, wb):
        loss, outputs = batch_loss(xb, yb, wb)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        return loss, outputs

    return backward


def stateless(model, draws: Draws | None = None) -> bool:
    """The compiled loop may take the model's gradient in one graph (`compiled_gradient`): the model has no
    non-trainable variables (no moving statistics, no seed, no frozen weights) but the seed states of Dropouts whose
    masks are drawn outside the graph (`draws`), and wraps no torch module of its own (`TorchModuleWrapper`, whose
    call runs the module's own parameters, which no mapping of Keras's variables reaches)."""
    drawn = {id(layer.seed_generator.state) for layer in draws.layers} if draws else set()
    return all(id(v) in drawn for v in model.non_trainable_variables) and not any(
        isinstance(layer, keras.layers.TorchModuleWrapper) for layer in model._flatten_layers())


def compiled_gradient(model, loss_fn, draws: Draws | None = None):
    """`backward(x, y, w) -> (loss, outputs)` for a `stateless` model, the gradients left in its variables' `.grad`
    for the optimizer: the objective's gradient with respect to the trainable variables' values, the forward and the
    backward compiled in one graph (`compiled_grad` of a call under Keras's `StatelessScope`, which maps each
    variable to the value given and collects the regularizers' losses; the model called as `fit` calls it, through
    its `__call__`). Compiling the loss alone and calling `backward` on it runs the compiled backward through
    autograd's engine, between two compiled-autograd wrappers, about twice the time (docs/speed.md). Tested equal to
    the eager loop. The variables stay the `nn.Module`'s parameters that the optimizer steps. A step that cannot be
    one graph (a custom layer drawing unseeded random numbers, whose state the scope would not keep) is refused at
    its first batch (`SpecError`): train it with `compile=False`. A variable the objective never reaches gets no
    gradient (None, found by autograd at the first batch), as in `fit`, whose optimizer skips it: `torch.func.grad`
    would give it zeros, which a weight decay would then shrink. With `draws`, the Dropouts' masks are drawn before
    each step and the graph takes them as inputs, the model called layer by layer (`_forward`)."""
    variables = model.trainable_variables

    def objective(values, xb, yb, wb, masks):
        with keras.StatelessScope(list(zip(variables, values)), collect_losses=True):
            if masks:  # layer by layer, each Dropout given its mask (Draws)
                outputs = _forward(model, xb, training=True, masks=masks)
            else:
                outputs = model(keras_inputs(xb), training=True)
            losses = model.losses
        loss = loss_fn(yb, outputs, wb)
        total = loss + sum(losses) if losses else loss
        return total, (total, outputs)

    gradient = fresh_losses(model, compiled_grad(objective, [v.value for v in variables]))
    unreached = None  # the variables autograd gives no gradient

    def backward(xb, yb, wb):
        nonlocal unreached
        masks = draws(len(xb)) if draws else ()
        if unreached is None:
            unreached = _unreached(model, objective, variables, xb, yb, wb, masks)
        try:
            aux = gradient(xb, yb, wb, masks)
        except torch._dynamo.exc.Unsupported as err:
            reason = str(err).strip().splitlines()[0]
            raise SpecError(f"train(compile=True) takes this model's gradient in one graph, which its step breaks "
                            f"({reason}); train it with compile=False") from None
        for param in unreached:
            param.grad = None
        return aux

    return backward


def _unreached(model, objective, variables, xb, yb, wb, masks) -> list[torch.Tensor]:
    """The parameters of the variables the objective does not reach: autograd's None, on one eager call."""
    values = [v.value.detach().requires_grad_() for v in variables]
    model._clear_losses()
    total, _ = objective(values, xb, yb, wb, masks)
    grads = torch.autograd.grad(total, values, allow_unused=True)
    return [v.value for v, g in zip(variables, grads) if g is None]


def compiled_grad(fn, params: list[torch.Tensor]):
    """`backward(*batch) -> aux` for `fn(values, *batch) -> (loss, aux)`: the loss's gradient with respect to the
    values of `params`, forward and backward compiled in one graph (`torch.func.grad` under `torch.compile`, no graph
    break allowed), put into each parameter's `.grad` for its optimizer (`compiled_gradient`'s)."""
    gradient = torch.compile(torch.func.grad(fn, has_aux=True), fullgraph=True)

    def backward(*batch):
        grads, aux = gradient([p.detach() for p in params], *batch)
        for param, grad in zip(params, grads):
            param.grad = grad
        return aux

    return backward


def one_graph() -> bool:
    """Dynamo's tally since the loop's `counters.clear()`: graphs were compiled (not a caller's `force_eager`), none
    broken or given up on, and the caller left torch's stance at its default."""
    stance = torch._dynamo.eval_frame._stance
    return (counters["stats"]["unique_graphs"] > 0 and not counters["graph_break"] and not counters["unimplemented"]
            and stance.stance == "default" and not stance.skip_guard_eval_unsafe)


def fresh_losses(model, compiled):
    """`compiled`, called after the model's losses of the last call are cleared, outside the graph.

    A layer's activity regularizer leaves its loss in the layer (`_losses`), and the next call clears it. Traced,
    that clearing reads the last step's loss tensor, and dynamo guards on it: a new tensor each step, so a recompile
    each step, until torch's recompile limit and its silent fall-back to eager (found on mlp_l2 by `guards_skipped`,
    under which a recompile is an error). Cleared here, the graph meets empty lists, every step alike."""
    def call(*args):
        model._clear_losses()
        return compiled(*args)

    return call


def traceable(model) -> None:
    """What torch.compile needs of a Keras model to trace its step in one graph. BatchNormalization keeps its reduction
    axes in a list Keras tracks (a `TrackedList`), which dynamo cannot hand to `torch.mean`: a graph break at each
    moment (8 a step on bn_mlp, and torch's recompile limit). A tuple is the same axes. Every zoo model then traces
    in one graph, dropout_mlp with its masks drawn before the step (`Draws`; Keras's torch seed generator is
    `torch.compiler.disable`d, 5 breaks a step without them; tested)."""
    for layer in model._flatten_layers():
        if isinstance(layer, keras.layers.BatchNormalization) and isinstance(layer._reduction_axes, list):
            object.__setattr__(layer, "_reduction_axes", tuple(layer._reduction_axes))  # past Keras's tracking


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
    x, y = verb_arrays(x), verb_arrays(y, "y")
    ensure_built(model, x)
    device = next(model.parameters()).device
    y = keras_inputs(tensors(y, device))  # several targets: a tuple of arrays, one per output
    with state_kept(model):  # the gradient at the current state: training=True would move BatchNorm's statistics
        y, pred = as_fit_shapes(y, _forward(model, tensors(x, device), training=training))
        value = verb_loss(loss, mse, y, pred, torch.mean)
        value = value + sum(model.losses) if model.losses else value
        grads = torch.autograd.grad(value, [w.value for w in model.trainable_weights], allow_unused=True,
                                    materialize_grads=True)  # a weight the loss does not reach: zero, as on JAX
    return [g.detach().cpu().numpy() for g in grads]


@torch.no_grad()
def predict(model, x):
    """Inference-mode predictions as NumPy (float32 from a bfloat16 or float16 model: NumPy has no bfloat16);
    several outputs: a tuple of arrays, one each."""
    x = verb_arrays(x)
    ensure_built(model, x)
    device = next(model.parameters()).device
    outputs = _forward(model, tensors(x, device), training=False)
    if isinstance(outputs, (list, tuple)):
        return tuple(_numpy(o) for o in outputs)
    return _numpy(outputs)


def _numpy(t: torch.Tensor) -> np.ndarray:
    return (t.float() if t.dtype in (torch.bfloat16, torch.float16) else t).cpu().numpy()
