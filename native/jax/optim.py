"""The JAX loop's optimizer: each Keras optimizer as an optax `GradientTransformation`, in two flavours.

    optimizer = optim.build(cfg)    # cfg.flavour: "exact" (the default) or "engine"

"exact" is Keras's update, step for step, as optax transformations:
  Adam, AdamW  `keras_adam`, written op for op as keras.optimizers.Adam computes it. Keras's ε is the paper's
               "epsilon hat": added to sqrt(v) before the bias correction, where optax adds its ε after (optax's ε
               at step t would be Keras's ε / sqrt(1 − β2^t)). AdamW decays p by lr·wd before the step.
  SGD          optax.scale_by_learning_rate *then* optax.trace: Keras folds the rate into the momentum buffer
               (m = μm − lr·g, p += m); optax.sgd traces the raw gradient and scales after (b = μb + g,
               p −= lr·b).
               The two are equal under a constant rate, not under a schedule.
  RMSprop      optax.rmsprop: ε inside the square root and the rate applied before the momentum, as in Keras.
  Adagrad      optax.adagrad: ε inside the square root, accumulator starting at 0.1, as in Keras.
  schedule     the Keras schedule object itself: a function of the step written in keras.ops, which optax calls
               with its step count, so every Keras schedule (yours too) is exact.
  clipnorm     each variable's gradient on its own (Keras); optax.clip_by_global_norm clips them together.
"engine" is optax's stock optimizer, schedule and clip given the same numbers: the nearest equivalent.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from keras_side.optimizers import keras_schedule
from keras_side.spec import SpecError, TrainConfig


def build(cfg: TrainConfig, learning_rate=None) -> optax.GradientTransformation:
    """Clipping, then the update rule, as `fit`'s Keras optimizer does them. `learning_rate` (an array, maybe
    traced: `optax.inject_hyperparams` passes one) replaces the spec's constant rate."""
    if learning_rate is not None and cfg.schedule is not None:
        raise SpecError(f"a learning rate of its own replaces a constant rate, not the {cfg.schedule} schedule")
    if cfg.flavour == "exact":
        rule = exact_rule(cfg, keras_schedule(cfg) if learning_rate is None else learning_rate)
    else:
        rule = engine_rule(cfg, engine_schedule(cfg) if learning_rate is None else learning_rate)
    return optax.chain(clip(cfg), rule)


def clip_by_norm_each(max_norm: float) -> optax.GradientTransformation:
    """Keras's `clipnorm`: each gradient scaled down to norm `max_norm` on its own."""

    def one(g):
        return g * max_norm / jnp.maximum(jnp.sqrt(jnp.sum(g * g)), max_norm)

    return optax.stateless(lambda updates, params=None: jax.tree.map(one, updates))


def clip_by_global_norm(max_norm: float) -> optax.GradientTransformation:
    """Keras's `global_clipnorm`: every gradient times c·min(1/‖all‖, 1/c) (optax's own rounds differently)."""

    def scale(updates, params=None):
        norm = jnp.sqrt(jnp.sum(jnp.stack([jnp.sum(jnp.square(g)) for g in jax.tree.leaves(updates)])))
        factor = max_norm * jnp.minimum(1.0 / norm, 1.0 / max_norm)
        return jax.tree.map(lambda g: g * factor, updates)

    return optax.stateless(scale)


def clip(cfg: TrainConfig) -> optax.GradientTransformation:
    exact = cfg.flavour == "exact"
    if cfg.clipnorm is not None:
        return clip_by_norm_each(cfg.clipnorm) if exact else optax.clip_by_global_norm(cfg.clipnorm)
    if cfg.global_clipnorm is not None:
        return (clip_by_global_norm if exact else optax.clip_by_global_norm)(cfg.global_clipnorm)
    if cfg.clipvalue is not None:
        return optax.clip(cfg.clipvalue)
    return optax.identity()


class KerasAdamState(NamedTuple):
    count: jax.Array
    m: optax.Updates
    v: optax.Updates


def keras_adam(learning_rate, beta_1: float = 0.9, beta_2: float = 0.999, epsilon: float = 1e-7,
               weight_decay: float | None = None) -> optax.GradientTransformation:
    """Keras's Adam (AdamW with `weight_decay`) as an optax transformation, in Keras's float32 arithmetic; the
    defaults are `keras.optimizers.Adam`'s."""

    def init(params):
        zeros = jax.tree.map(jnp.zeros_like, params)
        return KerasAdamState(jnp.zeros([], jnp.int32), zeros, zeros)

    def update(grads, state, params):
        lr = jnp.asarray(learning_rate(state.count) if callable(learning_rate) else learning_rate, jnp.float32)
        t = (state.count + 1).astype(jnp.float32)
        alpha = lr * jnp.sqrt(1 - jnp.power(jnp.float32(beta_2), t)) / (1 - jnp.power(jnp.float32(beta_1), t))
        m = jax.tree.map(lambda m, g: m + (g - m) * (1 - beta_1), state.m, grads)
        v = jax.tree.map(lambda v, g: v + (jnp.square(g) - v) * (1 - beta_2), state.v, grads)
        step = jax.tree.map(lambda m, v: (m * alpha) / (jnp.sqrt(v) + epsilon), m, v)  # ε before the correction
        if weight_decay:  # p ← (p − p·wd·lr) − step, given to optax as the difference it adds to p
            updates = jax.tree.map(lambda p, s: (p - p * weight_decay * lr) - s - p, params, step)
        else:
            updates = jax.tree.map(jnp.negative, step)
        return updates, KerasAdamState(state.count + 1, m, v)

    return optax.GradientTransformation(init, update)


def exact_rule(cfg: TrainConfig, lr) -> optax.GradientTransformation:
    """`lr`: a float, or a Keras LearningRateSchedule (`keras_schedule`): both are what optax takes."""
    if cfg.optimizer in ("adam", "adamw"):
        return keras_adam(lr, cfg.beta_1, cfg.beta_2, cfg.epsilon, cfg.decay)
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


def engine_rule(cfg: TrainConfig, lr) -> optax.GradientTransformation:
    if cfg.optimizer == "adam":
        return optax.adam(lr, b1=cfg.beta_1, b2=cfg.beta_2, eps=cfg.epsilon)
    if cfg.optimizer == "adamw":
        return optax.adamw(lr, b1=cfg.beta_1, b2=cfg.beta_2, eps=cfg.epsilon, weight_decay=cfg.decay)
    if cfg.optimizer == "sgd":
        return optax.sgd(lr, momentum=cfg.momentum or None, nesterov=cfg.nesterov)
    if cfg.optimizer == "rmsprop":
        return optax.rmsprop(lr, decay=cfg.rho, eps=cfg.epsilon, momentum=cfg.momentum or None)
    return optax.adagrad(lr, initial_accumulator_value=cfg.initial_accumulator_value, eps=cfg.epsilon)
