"""The eager fast path's forward on torch: a Keras model's layers called around Keras's `Layer.__call__` where that
wrapper has nothing to do, and a plain LSTM as torch's own LSTM op. Bit-identical to `model(x)` (tested on the zoo).

    from native.torch import bypass; outputs = bypass.forward(model, x, training=True)

`forward` runs a Sequential model's layers in order (`in_order`), or a Functional model's graph by Keras's own runner
(`_through_graph`), each layer through its `call` where its wrapper has nothing to do (`_bare`) or as `torch.lstm`
(`_lstm`); any other model is called whole. The fast loop (`native.torch.fast`) steps through it; the compiled one
(`native.torch.compiled`) hands it the Dropouts' masks it drew. The Keras internals it reads are
`keras_side.internals`'s; torch's own hook dicts, which torch offers no public question for, are read here.
"""
from __future__ import annotations

import contextlib
import functools
import inspect

import keras
import torch

from keras_side import internals
from keras_side.arrays import as_tuple, keras_inputs


def forward(model, x, training: bool, masks=()):
    """The model's outputs: a Sequential model's layers in order, a Functional model's graph run by Keras's own
    runner, each layer through its `call` where its `Layer.__call__` has nothing to do (`_bare`); any other model
    called whole (so are a Sequential model's inputs whose rank or dtype its graph would first adjust). `masks`:
    the masks of the model's Dropouts, drawn before the call (`Draws`), in their order."""
    x = keras_inputs(x)
    bare = not torch.compiler.is_compiling() and _nothing_around_layers()  # compiled, the wrapper is traced away
    layers = in_order(model)
    masks = list(masks)
    if layers is not None and as_declared(model, x):
        for layer, takes_training in layers:
            if masks and training and drops(layer):
                x = _dropped(x, masks.pop(0), layer.rate)  # `Draws` drew one for each such Dropout, in this order
                continue
            direct = bare and _direct(layer, x)
            if direct:
                x = direct(layer, x, training)
            else:
                x = layer(x, training=training) if takes_training else layer(x)
        return _all_taken(x, masks)
    if masks and own_graph(model):
        return _all_taken(_through_graph(model, x, training, bare=bare, masks=masks), masks)
    if masks:
        raise RuntimeError("internal: Draws drew Dropout masks for a model this call does not run layer by layer (a "
                           "bug in native.torch.fast); train with compile=False meanwhile")
    if bare and own_graph(model) and _shaped(model, x):
        return _through_graph(model, x, training)
    return model(x, training=training)


def _all_taken(outputs, masks: list):
    """`outputs`, once every mask `Draws` drew has been taken by its Dropout."""
    if masks:
        raise RuntimeError(f"internal: Draws drew {len(masks)} more Dropout mask(s) than the model's layers took (a "
                           "bug in native.torch.fast); train with compile=False meanwhile")
    return outputs


def own_graph(model) -> bool:
    """A Functional model (`keras.Model(inputs, outputs)`, Keras's own class) whose `Layer.__call__` has nothing to
    do (no hook, activity regularizer or mixed dtype policy of its own) and whose layers all get the training flag
    from the runner (none holds layers but takes no `training`)."""
    return (internals.is_functional(model) and _call_idle(model) and model.compute_dtype == model.variable_dtype
            and not any(internals.sublayers(layer) and not internals.has_training_arg(layer) for layer in model.layers))


def _through_graph(model, x, training: bool, bare: bool = True, masks: list | None = None):
    """`Functional.call`: the inputs standardized and the graph run node by node by Keras's own runner
    (`_run_through_graph`), with Keras's `operation_fn` (the training flag to every layer that takes it) but, when
    `bare`, a layer's `call` where its wrapper has nothing to do, which shortens a Functional model's eager step as
    it does a Sequential one's (docs/dev-notes.md, "Measurements once quoted in the code"). `masks`: the Dropouts'
    masks `Draws` drew, taken in the runner's order, the order `Draws` found."""
    def operation(op):
        keras_call = internals.keras_operation(op, training)

        def call(*args, **kwargs):  # a node's recorded `training` is overridden by the runner's, as Keras does
            if masks and training and drops(op):
                return _dropped(args[0], masks.pop(0), op.rate)
            direct = (bare and len(args) == 1 and set(kwargs) <= {"training", "mask"} and kwargs.get("mask") is None
                      and _direct(op, args[0]))
            return direct(op, args[0], training) if direct else keras_call(*args, **kwargs)

        return call

    return internals.run_graph(model, x, operation)


def as_declared(model, x) -> bool:
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
    packed through torch's pytree, node by node): on torch that costs more than a `Dense` layer's own `__call__`
    (docs/dev-notes.md, "Measurements once quoted in the code"). Keras's own `Sequential.call` falls back to the layers
    in order when it has no graph; so does this, each layer through its own `Layer.__call__` (training flag, autocast,
    masks on the tensors, activity regularizers) or, when that has nothing to do, its `call` (`_bare`), bit-identical
    (tested on the zoo). A layer that holds layers but takes no `training` would lose the flag its inner layers read
    from the model's call, so such a model is called whole, as is a Sequential subclass with a `call` of its own, and a
    model whose own `__call__` has work to do (a torch hook on it, an activity regularizer of its own)."""
    if (not isinstance(model, keras.Sequential) or type(model).call is not keras.Sequential.call
            or type(model).__call__ is not keras.Sequential.__call__ or not internals.has_graph(model)):
        return None  # with no graph (no Input) `model(x)` already calls the layers in order
    if not _call_idle(model):  # its hooks were skipped without a word
        return None
    layers = [(layer, internals.has_training_arg(layer)) for layer in model.layers]
    if any(not takes and internals.sublayers(layer) for layer, takes in layers):
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
    return layer.call(x, training=training) if internals.has_training_arg(layer) else layer.call(x)


def _bare(layer, x) -> bool:
    """Calling `layer.call(x)` is calling `layer(x)`: everything `Layer.__call__` does around `call` has nothing to
    do. That wrapper (with torch's `nn.Module.__call__` and Keras's traceback filter inside it) costs a built
    `Dense` on torch more than its `call` does (docs/dev-notes.md, "torch: Keras's per-call Python was the step"). It
    has nothing to do for one of Keras's own layers (whose `call` adds no loss) when: the layer is built and holds no
    layers (none reads `training` from a call context); it has no activity regularizer and holds no loss (which the
    wrapper would clear: one left from an earlier call or an `add_loss` outside it), no rematerialization or quantized
    call, no torch hook; its input carries no mask and it makes none (`_makes_no_mask`); its `call` takes only
    `training` and a `mask` that is None by default; and the input already has the dtype the layer computes in, which is
    the dtype of its weights (no cast, no autocast scope). Else the layer is called as Keras calls it."""
    return (_bare_class(type(layer)) and not internals.sublayers(layer) and idle_wrapper(layer, x)
            and _makes_no_mask(layer, x))


def _makes_no_mask(layer, x) -> bool:
    """For an input without a mask, `Layer.__call__` puts a mask on the output only when the layer supports masking
    and its `compute_mask(x, None)` returns one: `Layer`'s own passes the input's (None) on, a global pooling's
    returns None, an `Embedding(mask_zero=True)` or a `Masking` makes one (and is called through Keras). Asked per
    call: a mask may depend on the input's values, and asking costs a pooling far less than its wrapper would
    (docs/dev-notes.md, "Measurements once quoted in the code"). A mask that `call` puts on its output itself (as
    `Masking`'s does) stays there either way."""
    return (type(layer).compute_mask is keras.Layer.compute_mask or not layer.supports_masking
            or layer.compute_mask(x, None) is None)


def idle_wrapper(layer, x) -> bool:
    """What `_bare` and `_plain_lstm` ask of any layer and its input: nothing for `Layer.__call__` to do."""
    return (isinstance(x, torch.Tensor) and layer.built and layer.activity_regularizer is None
            and not internals.held_losses(layer)
            and internals.remat_mode(layer) is None and getattr(layer, "quantization_mode", None) is None
            and not _hooked(layer) and internals.keras_mask(x) is None
            and x.dtype == _TORCH_DTYPES.get(layer.compute_dtype) and layer.compute_dtype == layer.variable_dtype)


def _plain_lstm(layer, x) -> bool:
    """Keras's own LSTM whose `call` on `x` is Keras's torch `lstm` on CPU (its torch backend's `rnn.py`: the
    inputs projected in one matmul, then a Python loop over the time steps, sigmoid and tanh gates): a sequence in
    the dtype of the layer and of its cell's weights, with no mask and no initial state, no dropout, not stateful,
    not backwards, no states returned, cuDNN not refused (`use_cudnn=False` takes Keras's cell-by-cell loop), the
    default activations, no torch autocast. And more than one row and one time step: torch projects an input whose
    time-major view is contiguous with the bias inside the matmul (`addmm`), where Keras adds it after, which
    rounds differently (`_lstm` makes every other input's time-major view a strided one, as Keras's is)."""
    cell = getattr(layer, "cell", None)
    return (type(layer) is keras.layers.LSTM and type(cell) is keras.layers.LSTMCell and idle_wrapper(layer, x)
            and x.ndim == 3
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
    are Keras's to the bit (tested), in C++ rather than Keras's Python, and faster (docs/dev-notes.md, "The LSTM in
    the eager torch loop"); oneDNN's fused LSTM is faster still but rounds differently (from the first forward on),
    so it is left off."""
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
    # torch's own hook dicts: torch has no public way to ask whether a module has hooks
    return bool(module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
                or module._backward_pre_hooks)


@functools.cache
def _bare_class(cls) -> bool:
    """What `_bare` asks of a layer's class, once per class: one of Keras's own layers, with `Layer`'s `__call__`,
    whose `call` takes nothing but its input, `training` and a `mask=None`. Not a `Lambda`: it runs your function,
    whose layers (untracked, in its closure) read `training` from the call context that only `__call__` opens."""
    parameters = list(inspect.signature(cls.call).parameters.values())[2:]  # after self and the input
    return (internals.is_keras_class(cls, "layers.") and cls.__call__ is keras.Layer.__call__
            and not issubclass(cls, keras.layers.Lambda)
            and all(p.name == "training" or (p.name == "mask" and p.default is None) for p in parameters))


def _nothing_around_layers() -> bool:
    """No Keras autocast scope is open and no torch global module hook is set (`_bare` checks the rest)."""
    hooks = torch.nn.modules.module  # torch's global hook dicts: no public way to ask whether any is set
    return (internals.autocast_scope() is None
            and not (hooks._global_forward_hooks or hooks._global_forward_pre_hooks or hooks._global_backward_hooks
                     or hooks._global_backward_pre_hooks))


def drops(layer) -> bool:
    """A Keras Dropout that drops something when it trains (a rate above 0): the layers whose masks `Draws` draws."""
    return isinstance(layer, keras.layers.Dropout) and layer.rate > 0


def _dropped(x, mask, rate: float):
    """Keras's seeded dropout on torch, given its mask (its torch backend's `random.dropout`)."""
    keep = 1.0 - rate
    return torch.where(torch.broadcast_to(mask, x.shape), x / keep, torch.zeros_like(x, dtype=x.dtype))
