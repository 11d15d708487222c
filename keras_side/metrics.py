"""`fit`'s metric bookkeeping for a loop that runs eagerly (torch) or in `tf.function` (TensorFlow): update on
every batch, read and reset at the end of the epoch, as `fit` does. JAX threads the same metrics' state through its
pure step instead (`native/jax/loop.py`).

    metrics = EpochMetrics(cfg); metrics.update(y, pred); metrics.close("val_")
"""
from __future__ import annotations

from keras_side.spec import METRICS, TrainConfig


class EpochMetrics:
    """The spec's `keras.metrics` objects and their per-epoch history, named as `fit`'s History names them."""

    def __init__(self, cfg: TrainConfig):
        self.metrics = keras_metrics(cfg)
        self.history: dict[str, list[float]] = {}

    def __bool__(self) -> bool:
        return bool(self.metrics)

    def update(self, y_true, y_pred) -> None:
        """Unweighted, as `fit` updates `compile(metrics=...)`: only `weighted_metrics` take the sample weights."""
        for metric in self.metrics:
            metric.update_state(y_true, y_pred)

    def close(self, prefix: str = "") -> None:
        """Record each metric's value over the samples seen since the last close ("val_" for validation), reset."""
        for metric in self.metrics:
            self.history.setdefault(prefix + metric.name, []).append(float(metric.result()))
            metric.reset_state()


def keras_metrics(cfg: TrainConfig) -> list:
    """Fresh `keras.metrics` objects, one per name: what `fit` compiles with, and what each loop accumulates. A
    metric accumulates over the epoch's samples (an accuracy is the share of right answers, not a mean of batch
    accuracies) and is reset at each epoch."""
    import keras

    return [getattr(keras.metrics, METRICS[name])(name=name) for name in cfg.metrics]
