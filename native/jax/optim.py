"""The JAX loop's optimizer: each Keras optimizer as an optax `GradientTransformation`, in two flavours.

    optimizer = optim.build(cfg)    # cfg.flavour: "exact" (the default) or "engine"

"exact" is Keras's update, step for step, assembled from optax's own pieces:
  Adam, AdamW  optax.adam / optax.adamw with ε injected per step as ε/sqrt(1 − β2^t). Keras's ε is the paper's
               "epsilon hat": it is added to sqrt(v) before the bias correction, where optax adds its ε after.
  SGD          optax.scale_by_learning_rate *then* optax.trace: Keras folds the rate into the momentum buffer
               (m = μm − lr·g, p += m); optax.sgd traces the raw gradient and scales after (b = μb + g, p −= lr·b).
               The two are equal under a constant rate, not under a schedule.
  RMSprop      optax.rmsprop: ε inside the square root and the rate applied before the momentum, as in Keras.
  Adagrad      optax.adagrad: ε inside the square root, accumulator starting at 0.1, as in Keras.
  schedule     the Keras schedule object itself: a function of the step written in keras.ops, which optax calls
               with its step count, so every Keras schedule (yours too) is exact.
  clipnorm     each variable's gradient on its own (Keras); optax.clip_by_global_norm clips them together.
"engine" is optax's stock optimizer, schedule and clip given the same numbers: the nearest equivalent.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from keras_side.spec import TrainConfig, keras_schedule


def build(cfg: TrainConfig) -> optax.GradientTransformation:
    """Clipping, then the update rule, as `fit`'s Keras optimizer does them."""
    rule = exact_rule(cfg) if cfg.flavour == "exact" else engine_rule(cfg)
    return optax.chain(clip(cfg), rule)


def clip_by_norm_each(max_norm: float) -> optax.GradientTransformation:
    """Keras's `clipnorm`: each gradient scaled down to norm `max_norm` on its own."""

    def one(g):
        return g * max_norm / jnp.maximum(jnp.sqrt(jnp.sum(g * g)), max_norm)

    return optax.stateless(lambda updates, params=None: jax.tree.map(one, updates))


def clip(cfg: TrainConfig) -> optax.GradientTransformation:
    if cfg.clipnorm is not None:
        return clip_by_norm_each(cfg.clipnorm) if cfg.flavour == "exact" else optax.clip_by_global_norm(cfg.clipnorm)
    if cfg.global_clipnorm is not None:
        return optax.clip_by_global_norm(cfg.global_clipnorm)
    if cfg.clipvalue is not None:
        return optax.clip(cfg.clipvalue)
    return optax.identity()


def epsilon_hat(cfg: TrainConfig):
    """Keras's Adam ε as optax's: at step t (count t − 1), ε / sqrt(1 − β2^t)."""
    return lambda count: cfg.epsilon / jnp.sqrt(1 - cfg.beta_2 ** (count + 1))


def exact_rule(cfg: TrainConfig) -> optax.GradientTransformation:
    lr = keras_schedule(cfg)  # a float, or a Keras LearningRateSchedule: both are what optax takes
    if cfg.optimizer in ("adam", "adamw"):
        options = dict(learning_rate=lr, b1=cfg.beta_1, b2=cfg.beta_2, eps=epsilon_hat(cfg))
        if cfg.optimizer == "adamw":
            return optax.inject_hyperparams(optax.adamw)(**options, weight_decay=cfg.decay)
        return optax.inject_hyperparams(optax.adam)(**options)
    if cfg.optimizer == "sgd":
        if not cfg.momentum:
            return optax.sgd(lr)
        return optax.chain(optax.scale_by_learning_rate(lr), optax.trace(decay=cfg.momentum, nesterov=cfg.nesterov))
    if cfg.optimizer == "rmsprop":
        return optax.rmsprop(lr, decay=cfg.rho, eps=cfg.epsilon, momentum=cfg.momentum or None)
    return optax.adagrad(lr, initial_accumulator_value=cfg.initial_accumulator_value, eps=cfg.epsilon)


def engine_schedule(cfg: TrainConfig):
    """optax's own schedule with the Keras spec's numbers."""
    if cfg.schedule == "exponential":
        return optax.exponential_decay(cfg.learning_rate, cfg.decay_steps, cfg.decay_rate)
    if cfg.schedule == "cosine" and cfg.warmup_steps:
        # optax's decay_steps counts the warmup; Keras's does not.
        return optax.warmup_cosine_decay_schedule(cfg.learning_rate, cfg.warmup_target, cfg.warmup_steps,
                                                  cfg.warmup_steps + cfg.decay_steps, cfg.alpha * cfg.warmup_target)
    if cfg.schedule == "cosine":
        return optax.cosine_decay_schedule(cfg.learning_rate, cfg.decay_steps, cfg.alpha)
    if cfg.schedule == "piecewise":  # optax switches at count == boundary, Keras one step later
        scales = {b: cfg.values[i + 1] / cfg.values[i] for i, b in enumerate(cfg.boundaries)}
        return optax.piecewise_constant_schedule(cfg.values[0], scales)
    return cfg.learning_rate


def engine_rule(cfg: TrainConfig) -> optax.GradientTransformation:
    lr = engine_schedule(cfg)
    if cfg.optimizer == "adam":
        return optax.adam(lr, b1=cfg.beta_1, b2=cfg.beta_2, eps=cfg.epsilon)
    if cfg.optimizer == "adamw":
        return optax.adamw(lr, b1=cfg.beta_1, b2=cfg.beta_2, eps=cfg.epsilon, weight_decay=cfg.decay)
    if cfg.optimizer == "sgd":
        return optax.sgd(lr, momentum=cfg.momentum or None, nesterov=cfg.nesterov)
    if cfg.optimizer == "rmsprop":
        return optax.rmsprop(lr, decay=cfg.rho, eps=cfg.epsilon, momentum=cfg.momentum or None)
    return optax.adagrad(lr, initial_accumulator_value=cfg.initial_accumulator_value, eps=cfg.epsilon)
