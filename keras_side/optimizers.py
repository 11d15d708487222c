"""The Keras optimizer and learning-rate schedule a training spec names: what `fit` compiles with, and what the
TensorFlow loop applies. Keras is imported when one is built, not before."""
from __future__ import annotations

from keras_side.spec import OPTIMIZERS, TrainConfig


def keras_schedule(cfg: TrainConfig):
    """The Keras `LearningRateSchedule` of the spec, or the constant learning rate."""
    from keras.optimizers import schedules

    if cfg.schedule == "exponential":
        return schedules.ExponentialDecay(cfg.learning_rate, cfg.decay_steps, cfg.decay_rate)
    if cfg.schedule == "cosine":
        return schedules.CosineDecay(cfg.learning_rate, cfg.decay_steps, alpha=cfg.alpha,
                                     warmup_target=cfg.warmup_target, warmup_steps=cfg.warmup_steps)
    if cfg.schedule == "piecewise":
        return schedules.PiecewiseConstantDecay(list(cfg.boundaries), list(cfg.values))
    return cfg.learning_rate


def keras_optimizer(cfg: TrainConfig):
    """The `keras.optimizers` object `fit` compiles with (and the TensorFlow loop applies)."""
    import keras

    options = {"learning_rate": keras_schedule(cfg), "clipnorm": cfg.clipnorm, "global_clipnorm": cfg.global_clipnorm,
               "clipvalue": cfg.clipvalue}
    by_name = {
        "adam": dict(beta_1=cfg.beta_1, beta_2=cfg.beta_2, epsilon=cfg.epsilon),
        "adamw": dict(beta_1=cfg.beta_1, beta_2=cfg.beta_2, epsilon=cfg.epsilon, weight_decay=cfg.decay),
        "sgd": dict(momentum=cfg.momentum, nesterov=cfg.nesterov),
        "rmsprop": dict(rho=cfg.rho, momentum=cfg.momentum, epsilon=cfg.epsilon),
        "adagrad": dict(initial_accumulator_value=cfg.initial_accumulator_value, epsilon=cfg.epsilon),
    }
    optimizer = getattr(keras.optimizers, OPTIMIZERS[cfg.optimizer])
    return (_densified(optimizer) if cfg.dense_gradients else optimizer)(**options, **by_name[cfg.optimizer])


def _densified(optimizer: type) -> type:
    """The Keras optimizer class, summing each sparse gradient (TensorFlow's `tf.IndexedSlices`) into a dense
    tensor before its update (`fit` and every path that applies it call `apply`)."""
    from keras import ops

    from keras_side import internals

    class Densified(optimizer):
        def apply(self, grads, trainable_variables=None):
            # Reshaped to its variable's shape, a tf.IndexedSlices becomes a dense tensor with repeated rows summed
            # (keras.ops has no other densifying op); a dense gradient is unchanged. Without variables, apply()
            # updates the ones the optimizer was built with (JAX's `stateless_apply` calls it so).
            variables = internals.optimizer_variables(self) if trainable_variables is None else trainable_variables
            grads = [g if g is None else ops.reshape(g, v.shape) for g, v in zip(grads, variables, strict=True)]
            return super().apply(grads, trainable_variables)

    Densified.__name__ = Densified.__qualname__ = optimizer.__name__
    return Densified
