"""What every path checks before it trains, each a `SpecError` naming the fix: one loss per target, the model's
inputs and outputs against the data, class labels its loss can take, no stateful recurrent layer."""
from __future__ import annotations

import warnings

from keras_side.arrays import take
from keras_side.spec import SpecError, TrainConfig


def check_outputs(cfg: TrainConfig, targets: int) -> None:
    """A `SpecError` unless the spec's losses fit the data's targets: one loss for one target, one per target for
    several (a model with several outputs)."""
    if cfg.outputs != targets:
        have = f"{targets} targets (one per output)" if targets > 1 else "one target"
        raise SpecError(f"the data has {have} but the spec gives loss={cfg.loss!r}; give "
                        + (f"loss as a tuple of {targets} losses" if targets > 1 else "one loss"))


def check_data(cfg: TrainConfig, data, model) -> None:
    """What every path checks before it trains, a `SpecError` naming the fix: one loss per target, one output of the
    (built) model per target, and class labels its loss can take."""
    check_outputs(cfg, data.outputs)
    check_model_inputs(model, data.x_train)
    check_model_outputs(model, data.outputs)
    check_labels(cfg, data, model)
    check_stateless(model)


def check_model_inputs(model, x) -> None:
    """A `SpecError` unless a Sequential or Functional model's declared inputs take `x`: one array per input, each
    of the width (last axis) its input declares, where it declares one. Keras said it from inside the first call,
    on torch in 9 lines about the loop's one-row probe. The other axes are not checked: Keras runs an RNN declared
    for 10 days on 12 (it warns). A subclassed model declares nothing: Keras says it then."""
    try:
        inputs = model.inputs
    except (AttributeError, ValueError):
        return
    if not inputs:
        return
    arrays = x if isinstance(x, (list, tuple)) else (x,)
    if len(arrays) != len(inputs):
        raise SpecError(f"the model has {len(inputs)} input(s) but x holds {len(arrays)} array(s); give one array "
                        "per input (x as a tuple, in the model's order)")
    for i, (tensor, array) in enumerate(zip(inputs, arrays)):
        declared, rows = tuple(tensor.shape[1:]), tuple(getattr(array, "shape", ())[1:])
        if len(declared) == len(rows) and rows and declared[-1] is not None and declared[-1] != rows[-1]:
            which = f"x[{i}]" if len(arrays) > 1 else "x"
            from keras_side.internals import input_layer_name

            name = input_layer_name(tensor)  # its Input layer's name, not the tensor's
            raise SpecError(f"{which} has rows of shape {rows} but the model's input {name!r} takes "
                            f"{tuple(declared)}; give data of the model's input shape, or build the model for yours")


def check_stateless(model) -> None:
    """A `SpecError` for a recurrent layer built `stateful=True`: it carries its state from one batch to the next,
    which takes batches of one fixed size in an order kept from epoch to epoch, where every path here shuffles each
    epoch and calls the model on other batch sizes (a probe row, a whole split). It failed deep inside Keras (a
    batch size it did not expect, or torch's in-place error)."""
    from keras_side.internals import all_layers

    layer = next((layer for layer in all_layers(model, include_self=True) if getattr(layer, "stateful", False)), None)
    if layer is not None:
        raise SpecError(f"layer {layer.name!r} is stateful (stateful=True), which carries its state across batches "
                        "of one fixed size in a fixed order; every path here shuffles each epoch and calls the model "
                        "on other batch sizes, so build it with stateful=False")


def check_model_outputs(model, targets: int) -> None:
    """A `SpecError` unless a Sequential or Functional model has one output per target (a subclassed model's outputs
    are not known before it is called: its loss says it then)."""
    try:
        outputs = model.outputs
    except (AttributeError, ValueError):
        return
    if outputs is not None and len(outputs) != targets:
        raise SpecError(f"the model has {len(outputs)} outputs but the data has {targets} target(s); give one target "
                        "per output (y as a tuple), or a model with one output per target")


def check_labels(cfg: TrainConfig, data, model=None) -> None:
    """A `SpecError` for class labels a sparse categorical loss cannot take: a label that is not a whole number from
    0, or (given the model) not below its output's width. Keras checks none: torch raises deep in its loss ("Target 5
    is out of bounds"), and JAX trains on without a word (its one-hot of such a label is zeros), so `fit` itself
    parted between engines."""
    import numpy as np

    if "sparse_categorical_crossentropy" not in cfg.losses:
        return
    widths = _output_widths(model, data.x_train) if model is not None else None
    for i, name in enumerate(cfg.losses):
        if name != "sparse_categorical_crossentropy":
            continue
        width = widths[i] if widths and len(widths) == cfg.outputs else None
        for split in ("train", "val", "test"):
            y = getattr(data, f"y_{split}", None)  # a loader's batches (`Batches`): its first batch's alone
            if y is None:
                continue
            y = np.asarray(y[i] if isinstance(y, tuple) else y)
            bad = (y < 0) | (y != np.floor(y)) | (y >= width if width is not None else False)
            if bad.any():
                which = f"target {i} of the {split} rows" if cfg.outputs > 1 else f"the {split} targets"
                classes = (f"0 to {width - 1} (the model's {width} outputs)" if width is not None else
                           "whole numbers from 0")
                raise SpecError(f"{which} hold the label {y[bad].flat[0]:g}, which sparse_categorical_crossentropy "
                                f"cannot take: its labels are {classes}; renumber the classes from 0")


def _output_widths(model, x) -> list[int] | None:
    """The last axis of each of the model's outputs, from Keras's symbolic pass over one row (a subclassed model's
    too, which has no `outputs`); None where Keras cannot run the model so (its labels' range is then unchecked)."""
    import keras


    row = take(x, slice(0, 1))
    symbolic = [keras.KerasTensor(a.shape, a.dtype.name) for a in row] if isinstance(row, tuple) else \
        keras.KerasTensor(row.shape, row.dtype.name)
    try:
        spec = model.compute_output_spec(symbolic)
    except Exception:  # any error of the model's own: the training that follows raises it where it belongs
        return None
    return [s.shape[-1] for s in (spec if isinstance(spec, (list, tuple)) else [spec])]


def warn_unseeded(model) -> None:
    """On torch, a warning naming a layer that drops out unseeded: Keras draws its masks from torch's global
    generator, which `fit`'s data loader draws from too, so this loop's masks (and weights) are not `fit`'s."""
    from keras_side.internals import global_generator_layers

    unseeded = global_generator_layers(model)
    if unseeded:
        warnings.warn(f"layer {unseeded[0].name!r} drops out unseeded: on torch, Keras draws its masks from torch's "
                      "global generator, which fit's data loader draws from too, so this loop's masks (and weights) "
                      "are not fit's; give it a seed (Dropout(rate, seed=...), LSTM(..., seed=...)) to train as fit "
                      "does", stacklevel=3)
