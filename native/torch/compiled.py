"""The compiled fast path on torch (`fast.train(..., compile=True)`, path `torch-native-compile`): what
`torch.compile` needs to run the fast loop's step in one graph, tested equal to the eager loop and the reference one.

    native-loops train --path torch-native-compile   # or: from native.torch import fast; fast.train(..., compile=True)

For a model with no non-trainable variables (`stateless`) the objective's gradient is one graph, forward and backward
together (`compiled_gradient`: `torch.func.grad` of the model's call under Keras's `StatelessScope`, the parameters'
values in, their gradients out into each `.grad`); for a model with moving statistics (BatchNorm) the fast loop
compiles the batch loss and AOTAutograd its backward, through autograd's engine. A seeded Dropout's masks are drawn
before each step, as Keras draws them, and handed to the graph (`Draws`), so a model whose only state is its
Dropouts' seeds is `stateless` too. A Dropout they cannot be drawn for keeps Keras's own draw: unseeded, torch's own
dropout inside the graph, with the compiled loss; seeded, a graph break at each draw. dynamo's guards are skipped
once every batch shape is compiled (`guards_skipped`). The torch privates read here (dynamo's tally and stance) are
the only way torch offers to tell whether a step ran in one graph.
"""
from __future__ import annotations

import keras
import torch
from torch._dynamo.utils import counters  # dynamo's tally of graphs and breaks: torch has no public one

from keras_side import internals
from keras_side.arrays import keras_inputs, take
from keras_side.models import drawing_layers
from keras_side.spec import SpecError
from native.torch.bypass import as_declared, drops, forward, idle_wrapper, in_order, own_graph
from native.torch.loop import tensors


class Draws:
    """The masks of a model's Dropouts, drawn outside the compiled step and handed to it as inputs. Drawn inside, by
    Keras's torch seed generator (a `torch.Generator`, which Keras marks `torch.compiler.disable`), they break the
    graph at every draw (5 breaks a step on dropout_mlp).

    Each mask is drawn as Keras's seeded Dropout draws it, by Keras's own `torch_seed_generator` (which advances the
    layer's seed state as its call would) and `torch.bernoulli`, and applied as Keras applies it (`_dropped`): the
    same masks, the same outputs, the same seed states, to the bit (tested). `Draws.of(model, x)` is None unless
    `forward` calls the model layer by layer on inputs like `x` (a Sequential model's layers in order, or a
    Functional model's graph by Keras's runner: `_dropout_inputs`) and its only layers that draw are Keras's own
    seeded Dropouts (a rate between 0 and 1, no noise shape) around which `Layer.__call__` has nothing to do (no
    mask on the input, no cast, no activity regularizer, no hook: `idle_wrapper`, asked of each Dropout's input in
    an inference call of one row, which also gives its shape). A Dropout called twice draws twice, in call order."""

    def __init__(self, layers: list, shapes: list[tuple[int, ...]]):
        """`layers`: the Dropouts in the order the model calls them; `shapes`: each one's input, but for the rows."""
        self.layers, self.shapes = layers, shapes

    @classmethod
    def of(cls, model, x) -> Draws | None:
        """The model's Draws for inputs like `x` (arrays or tensors), or None."""
        device = torch.device(internals.torch_device())
        if not all(p.device.type == device.type for p in model.parameters()):  # where Keras draws its masks
            return None
        sample = keras_inputs(tensors(take(x, slice(0, 1)), device))
        with torch.no_grad(), keras.StatelessScope():  # an inference call of one row: no state moves
            found = _dropout_inputs(model, sample)
        dropouts = [layer for layer, _ in found or ()]
        if not dropouts or any(layer not in dropouts for layer in drawing_layers(model)) or not all(
                drawable(layer) and idle_wrapper(layer, inputs) for layer, inputs in found):
            return None
        return cls(dropouts, [tuple(inputs.shape[1:]) for _, inputs in found])

    def __call__(self, rows: int) -> tuple[torch.Tensor, ...]:
        """One mask per Dropout for a batch of `rows`, each layer's seed state advanced by one draw."""
        return tuple(torch.bernoulli(torch.full((rows, *shape), 1.0 - layer.rate, device=internals.torch_device()),
                                     generator=internals.torch_seed_generator(layer.seed_generator)).bool()
                     for layer, shape in zip(self.layers, self.shapes))


def _dropout_inputs(model, x) -> list | None:
    """`[(dropout, its input)]` in the order `forward` calls the model's Dropouts (rate above 0) on `x`: a
    Sequential model's layers one after another, or a Functional model's graph by Keras's runner (as `Layer.__call__`
    gives them their inputs, in inference mode); None for a model `forward` does not call layer by layer."""
    found, layers = [], in_order(model)
    if layers is not None and as_declared(model, x):
        for layer, takes_training in layers:
            if drops(layer):
                found.append((layer, x))
            x = layer(x, training=False) if takes_training else layer(x)
        return found
    if not own_graph(model):
        return None

    def operation(op):
        keras_call = internals.keras_operation(op, False)

        def call(*args, **kwargs):
            if drops(op):
                found.append((op, args[0]))
            return keras_call(*args, **kwargs)

        return call

    internals.run_graph(model, x, operation)
    return found


def drawable(layer) -> bool:
    """A layer whose masks `Draws` can draw: Keras's own seeded Dropout, no noise shape, a rate below 1."""
    return (type(layer) is keras.layers.Dropout and layer.rate < 1 and layer.noise_shape is None
            and internals.initial_seed(layer.seed_generator) is not None)


def guards_skipped():
    """torch's stance that checks only the guards that tell its compiled graphs apart (`skip_guard_eval_unsafe`).

    Before running a compiled graph dynamo checks every assumption it traced under, here every Keras attribute the
    forward read (the layers' flags, dtype policies, Keras's global state): a sizeable share of a small model's
    compiled step (docs/dev-notes.md, "Measurements once quoted in the code"; entering the stance around each call
    would cost as much again, so the loop enters it once an epoch). "Unsafe"
    means two things. A change that would need a new graph (a shape, a dtype) is an error, not a recompile. And a
    Python value a graph read (a layer's attribute, a float) is no longer checked: changed, the old graph runs on.
    The loop enters it after the first epoch has compiled every batch shape of the run, only when that epoch traced
    one graph each (`one_graph`) and there is no `on_step` of yours, which could change what the graphs read. In the
    loop's own code nothing changes a shape, a dtype or the model, and the rate and step reach the optimizer as
    tensors: the same graphs run, and the weights end where they end with every guard checked, to the bit (tested).
    A step with graph breaks (a Dropout that `Draws` cannot draw: Keras's seed generator runs outside the graph)
    resumes through pieces that dynamo re-specializes as it goes, so it keeps every guard."""
    return torch.compiler.set_stance(skip_guard_eval_unsafe=True)


def stateless(model, draws: Draws | None = None) -> bool:
    """The compiled loop may take the model's gradient in one graph (`compiled_gradient`): the model has no
    non-trainable variables (no moving statistics, no seed, no frozen weights) but the seed states of Dropouts whose
    masks are drawn outside the graph (`draws`), and wraps no torch module of its own (`TorchModuleWrapper`, whose
    call runs the module's own parameters, which no mapping of Keras's variables reaches)."""
    drawn = {id(layer.seed_generator.state) for layer in draws.layers} if draws else set()
    return all(id(v) in drawn for v in model.non_trainable_variables) and not any(
        isinstance(layer, keras.layers.TorchModuleWrapper) for layer in internals.all_layers(model))


def compiled_gradient(model, loss_fn, draws: Draws | None = None):
    """`backward(x, y, w) -> (loss, outputs)` for a `stateless` model, the gradients left in its variables' `.grad`
    for the optimizer: the objective's gradient with respect to the trainable variables' values, the forward and the
    backward compiled in one graph (`compiled_grad` of a call under Keras's `StatelessScope`, which maps each
    variable to the value given and collects the regularizers' losses; the model called as `fit` calls it, through
    its `__call__`). Compiling the loss alone and calling `backward` on it runs the compiled backward through
    autograd's engine, between two compiled-autograd wrappers, and is slower (docs/dev-notes.md, "torch compiled: the
    gradient in one graph"). Tested equal to the eager loop. The variables stay the `nn.Module`'s parameters that
    the optimizer steps. A step that cannot be one graph (a custom layer drawing unseeded random numbers, whose state
    the scope would not keep) is refused at its first batch (`SpecError`): train it with `compile=False`. A variable the
    objective never reaches gets no gradient (None, found by autograd at the first batch), as in `fit`, whose optimizer
    skips it: `torch.func.grad` would give it zeros, which a weight decay would then shrink. With `draws`, the Dropouts'
    masks are drawn before each step and the graph takes them as inputs, the model called layer by layer (`forward`)."""
    variables = model.trainable_variables

    def objective(values, xb, yb, wb, masks):
        with keras.StatelessScope(list(zip(variables, values)), collect_losses=True):
            if masks:  # layer by layer, each Dropout given its mask (Draws)
                outputs = forward(model, xb, training=True, masks=masks)
            else:
                outputs = model(keras_inputs(xb), training=True)
            losses = model.losses
        # Each layer that added a loss in the scope keeps its id() in a set; traced, torch 2.15's dynamo cannot write
        # such an id back into the layer when the graph ends ("Reconstruction of FakeIdVariable"): emptied here,
        # in the graph, no id outlives the step (the ids matter only inside the scope).
        internals.clear_losses(model)
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
    internals.clear_losses(model)
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
    stance = torch._dynamo.eval_frame._stance  # torch has no public getter for the stance set
    return (counters["stats"]["unique_graphs"] > 0 and not counters["graph_break"] and not counters["unimplemented"]
            and stance.stance == "default" and not stance.skip_guard_eval_unsafe)


def fresh_losses(model, compiled):
    """`compiled`, called after the model's losses of the last call are cleared, outside the graph.

    A layer's activity regularizer leaves its loss in the layer (`_losses`), and the next call clears it. Traced,
    that clearing reads the last step's loss tensor, and dynamo guards on it: a new tensor each step, so a recompile
    each step, until torch's recompile limit and its silent fall-back to eager (found on mlp_l2 by `guards_skipped`,
    under which a recompile is an error). Cleared here, the graph meets empty lists, every step alike."""
    def call(*args):
        internals.clear_losses(model)
        return compiled(*args)

    return call


def traceable(model) -> None:
    """What torch.compile needs of a Keras model to trace its step in one graph. BatchNormalization keeps its reduction
    axes in a list Keras tracks (a `TrackedList`), which dynamo cannot hand to `torch.mean`: a graph break at each
    moment (8 a step on bn_mlp, and torch's recompile limit). A tuple is the same axes. Every zoo model then traces
    in one graph, dropout_mlp with its masks drawn before the step (`Draws`; Keras's torch seed generator is
    `torch.compiler.disable`d, 5 breaks a step without them; tested)."""
    for layer in internals.all_layers(model):
        if isinstance(layer, keras.layers.BatchNormalization):
            internals.untrack_reduction_axes(layer)
