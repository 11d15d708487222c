"""The Keras losses a training spec names, and how every path but `fit` calls them: the spec's loss (several
outputs combined as `compile` combines them), `grad_at`'s batch loss, targets shaped as `fit` shapes them. Keras is
imported when a loss is built, not before."""
from __future__ import annotations

from keras_side.spec import LOGIT_LOSSES, LOSSES, TrainConfig, resolve


def _one_loss(name: str, from_logits: bool):
    import keras

    if name in LOSSES:
        options = {"from_logits": from_logits} if name in LOGIT_LOSSES else {}
        return getattr(keras.losses, LOSSES[name])(**options)
    from keras_side.internals import LossFunctionWrapper  # what `compile(loss=fn)` wraps a plain function in

    return LossFunctionWrapper(resolve(name), name=name.split(":")[1])


def keras_loss(cfg: TrainConfig):
    """What `compile(loss=...)` takes: the `keras.losses.Loss` object, or a list of them, one per output (with
    `cfg.loss_weights` as `loss_weights`)."""
    losses = [_one_loss(name, cfg.from_logits) for name in cfg.losses]
    return losses if cfg.outputs > 1 else losses[0]


def as_fit_shapes(y, pred):
    """`(y, pred)` as `fit`'s losses see them, output by output: Keras's own `squeeze_or_expand_to_same_rank` (a
    target one rank short of a prediction whose last axis is 1 gains that axis), so that a loss written for `y` and
    `pred` of one shape never broadcasts a (n,) target against a (n, 1) prediction into (n, n). A target with
    another number of rows than the prediction is a ValueError."""
    from keras_side.internals import squeeze_or_expand_to_same_rank

    if isinstance(pred, (list, tuple)):
        pairs = [as_fit_shapes(t, p) for t, p in zip(y, pred, strict=True)]
        return tuple(t for t, _ in pairs), type(pred)(p for _, p in pairs)
    if y.shape[0] != pred.shape[0]:
        raise ValueError(f"y has {y.shape[0]} rows and x {pred.shape[0]}; give one target per example")
    return squeeze_or_expand_to_same_rank(y, pred)


def verb_loss(loss, mse, y, pred, mean):
    """`grad_at`'s batch loss: `mean(loss(y, pred))` for a loss of the caller's, which gets the targets and
    predictions as they are; a loss of the spec's by name (`"mae"`, `"huber"`, a `"module:function"`: `LOSSES`), or
    else the engine's `mse`, as `compile` takes one loss for several outputs, each output's mean, summed (the
    default takes one output's predictions, not a list)."""
    if isinstance(loss, str):  # a name is looked up: called as given, it would be "'str' object is not callable"
        mse = keras_loss(TrainConfig(loss=loss))
    elif loss is not None:
        return mean(loss(y, pred))
    if isinstance(pred, (list, tuple)):
        return sum(mean(mse(t, p)) for t, p in zip(y, pred, strict=True))
    return mean(mse(y, pred))


def training_loss(cfg: TrainConfig):
    """The loss every path but `fit` calls: `loss(y_true, y_pred, sample_weight=None)` -> the batch mean, with
    Keras's target shaping. One output: the spec's `keras.losses.Loss` itself, so the loss can never differ from
    `fit`'s. Several: `OutputLosses`, which combines them as `compile` does."""
    loss = keras_loss(cfg)
    return OutputLosses(loss, cfg.loss_weights) if cfg.outputs > 1 else loss


class OutputLosses:
    """Per-output losses and `loss_weights` combined as `compile` combines them (Keras's `CompileLoss`): each loss
    on its output and target, in float32, times its weight, summed. The same sample weights go to every output."""

    def __init__(self, losses: list, weights: tuple[float, ...] | None = None):
        self.losses, self.weights = losses, weights

    def __call__(self, y_true, y_pred, sample_weight=None):
        from keras import ops

        values = []
        for i, (loss, y_t, y_p) in enumerate(zip(self.losses, y_true, y_pred, strict=True)):
            value = ops.cast(loss(y_t, y_p, sample_weight), "float32")
            values.append(value if self.weights is None else ops.multiply(value, self.weights[i]))
        return sum(values)
