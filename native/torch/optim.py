"""The torch loop's optimizer: each Keras optimizer as a `torch.optim.Optimizer`, a scheduler and a clip, in two
flavours.

    optimizer, scheduler, clip = optim.build(params, cfg)     # cfg.flavour: "exact" (default) or "engine"
    loss.backward(); clip(params); optimizer.step(); scheduler.step()

"exact" is Keras's update, step for step, in torch's optimizer API:
  Adam, AdamW  torch.optim.Adam / AdamW (fused) with ε set per step to ε/sqrt(1 − β2^t). Keras's ε is the paper's
               "epsilon hat", added to sqrt(v) before the bias correction; torch adds its ε after. AdamW decays
               p by lr·wd before the step in both.
  SGD          `KerasSGD`: the rate folded into the momentum buffer, m = μm − lr·g, p += m. torch.optim.SGD keeps
               b = μb + g and steps −lr·b: equal under a constant rate, not under a schedule.
  RMSprop      `KerasRMSprop`: ε inside the square root (torch: outside), the rate before the momentum.
  Adagrad      `KerasAdagrad`: ε inside the square root (torch: outside).
  schedule     `LambdaLR` over the Keras schedule object itself (a function of the step).
  clipnorm     each variable on its own (Keras); torch.nn.utils.clip_grad_norm_ clips them together, and adds 1e-6
               to the norm.
"engine" is torch's stock optimizer, scheduler and clip given the same numbers: the nearest equivalent.
"""
from __future__ import annotations

import math

import torch
from torch.optim import lr_scheduler

from keras_side.spec import SpecError, TrainConfig, keras_schedule


def build(params: list[torch.nn.Parameter], cfg: TrainConfig):
    """(optimizer, scheduler or None, clip(params) or None) for the spec's flavour."""
    exact = cfg.flavour == "exact"
    optimizer = (exact_optimizer if exact else engine_optimizer)(params, cfg)
    scheduler = (exact_scheduler if exact else engine_scheduler)(optimizer, cfg)
    return optimizer, scheduler, clip(cfg)


class _EpsilonHat:
    """Mixin for torch's Adam and AdamW: Keras's ε as torch's, ε/sqrt(1 − β2^t) at step t."""

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            group.setdefault("keras_epsilon", group["eps"])
            group["keras_step"] = group.get("keras_step", 0) + 1
            group["eps"] = group["keras_epsilon"] / math.sqrt(1 - group["betas"][1] ** group["keras_step"])
        return super().step(closure)


class KerasAdam(_EpsilonHat, torch.optim.Adam):
    """`torch.optim.Adam` that steps exactly as `keras.optimizers.Adam`."""


class KerasAdamW(_EpsilonHat, torch.optim.AdamW):
    """`torch.optim.AdamW` that steps exactly as `keras.optimizers.AdamW`."""


class KerasSGD(torch.optim.Optimizer):
    """Keras's SGD: m = μm − lr·g, then p += m (Nesterov: p += μm − lr·g); without momentum p −= lr·g."""

    def __init__(self, params, lr: float, momentum: float = 0.0, nesterov: bool = False):
        super().__init__(params, dict(lr=lr, momentum=momentum, nesterov=nesterov))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            lr, mu = group["lr"], group["momentum"]
            for p in (p for p in group["params"] if p.grad is not None):
                if not mu:
                    p.sub_(p.grad * lr)
                    continue
                m = self.state[p].setdefault("momentum", torch.zeros_like(p))
                m.mul_(mu).sub_(p.grad * lr)
                p.add_(m * mu - p.grad * lr if group["nesterov"] else m)


class KerasRMSprop(torch.optim.Optimizer):
    """Keras's RMSprop: v = ρv + (1 − ρ)g², step = lr·g/sqrt(v + ε); with momentum, m = μm + step, p −= m."""

    def __init__(self, params, lr: float, rho: float = 0.9, momentum: float = 0.0, eps: float = 1e-7):
        super().__init__(params, dict(lr=lr, rho=rho, momentum=momentum, eps=eps))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            lr, rho, mu, eps = group["lr"], group["rho"], group["momentum"], group["eps"]
            for p in (p for p in group["params"] if p.grad is not None):
                v = self.state[p].setdefault("velocity", torch.zeros_like(p))
                v.mul_(rho).add_(p.grad.square() * (1 - rho))
                increment = p.grad * lr / torch.sqrt(v + eps)
                if mu:
                    m = self.state[p].setdefault("momentum", torch.zeros_like(p))
                    increment = m.mul_(mu).add_(increment)
                p.sub_(increment)


class KerasAdagrad(torch.optim.Optimizer):
    """Keras's Adagrad: a += g² (a starts at 0.1), p −= lr·g/sqrt(a + ε)."""

    def __init__(self, params, lr: float, initial_accumulator_value: float = 0.1, eps: float = 1e-7):
        super().__init__(params, dict(lr=lr, initial_accumulator_value=initial_accumulator_value, eps=eps))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in (p for p in group["params"] if p.grad is not None):
                a = self.state[p].setdefault("sum", torch.full_like(p, group["initial_accumulator_value"]))
                a.add_(p.grad.square())
                p.sub_(p.grad * group["lr"] / torch.sqrt(a + group["eps"]))


def exact_optimizer(params, cfg: TrainConfig) -> torch.optim.Optimizer:
    adam = dict(lr=cfg.learning_rate, betas=(cfg.beta_1, cfg.beta_2), eps=cfg.epsilon, fused=True)
    if cfg.optimizer == "adam":
        return KerasAdam(params, **adam)
    if cfg.optimizer == "adamw":
        return KerasAdamW(params, **adam, weight_decay=cfg.decay)
    if cfg.optimizer == "sgd":
        return KerasSGD(params, cfg.learning_rate, cfg.momentum, cfg.nesterov)
    if cfg.optimizer == "rmsprop":
        return KerasRMSprop(params, cfg.learning_rate, cfg.rho, cfg.momentum, cfg.epsilon)
    return KerasAdagrad(params, cfg.learning_rate, cfg.initial_accumulator_value, cfg.epsilon)


def engine_optimizer(params, cfg: TrainConfig) -> torch.optim.Optimizer:
    adam = dict(lr=cfg.learning_rate, betas=(cfg.beta_1, cfg.beta_2), eps=cfg.epsilon, fused=True)
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, **adam)
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(params, **adam, weight_decay=cfg.decay)
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, cfg.learning_rate, momentum=cfg.momentum, nesterov=cfg.nesterov)
    if cfg.optimizer == "rmsprop":
        return torch.optim.RMSprop(params, cfg.learning_rate, alpha=cfg.rho, eps=cfg.epsilon, momentum=cfg.momentum)
    return torch.optim.Adagrad(params, cfg.learning_rate, eps=cfg.epsilon,
                               initial_accumulator_value=cfg.initial_accumulator_value)


def exact_scheduler(optimizer, cfg: TrainConfig):
    """The Keras schedule, called with the step, as torch's learning rate (a factor of the base rate)."""
    if cfg.schedule is None:
        return None
    schedule = keras_schedule(cfg)
    return lr_scheduler.LambdaLR(optimizer, lambda step: float(schedule(step)) / cfg.learning_rate)


def engine_scheduler(optimizer, cfg: TrainConfig):
    """torch's own scheduler with the Keras spec's numbers, stepped once per batch."""
    if cfg.schedule == "exponential":
        return lr_scheduler.ExponentialLR(optimizer, gamma=cfg.decay_rate ** (1 / cfg.decay_steps))
    if cfg.schedule == "cosine" and cfg.warmup_steps:
        for group in optimizer.param_groups:  # torch warms up *to* the base rate
            group["lr"] = cfg.warmup_target
        warmup = lr_scheduler.LinearLR(optimizer, cfg.learning_rate / cfg.warmup_target, 1.0, cfg.warmup_steps)
        cosine = lr_scheduler.CosineAnnealingLR(optimizer, cfg.decay_steps, cfg.alpha * cfg.warmup_target)
        return lr_scheduler.SequentialLR(optimizer, [warmup, cosine], milestones=[cfg.warmup_steps])
    if cfg.schedule == "cosine":  # after decay_steps torch's cosine climbs back up; Keras's stays at its floor
        return lr_scheduler.CosineAnnealingLR(optimizer, cfg.decay_steps, cfg.alpha * cfg.learning_rate)
    if cfg.schedule == "piecewise":
        ratios = {round(b / a, 12) for a, b in zip(cfg.values, cfg.values[1:])}
        if len(ratios) != 1:
            raise SpecError("torch's MultiStepLR divides by one factor at every boundary; these values change "
                            "by several factors, so use flavour='exact' on torch")
        for group in optimizer.param_groups:
            group["lr"] = cfg.values[0]
        return lr_scheduler.MultiStepLR(optimizer, list(cfg.boundaries), gamma=ratios.pop())  # switches a step early
    return None


def clip_each_norm_(params, max_norm: float) -> None:
    """Keras's `clipnorm`: each gradient scaled down to norm `max_norm` on its own, in place."""
    for p in (p for p in params if p.grad is not None):
        p.grad.mul_(max_norm / torch.clamp(torch.linalg.vector_norm(p.grad), min=max_norm))


def clip_global_norm_(params, max_norm: float) -> None:
    """Keras's `global_clipnorm`: every gradient scaled by max_norm / max(global norm, max_norm), in place."""
    grads = [p.grad for p in params if p.grad is not None]
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    torch._foreach_mul_(grads, max_norm / torch.clamp(norm, min=max_norm))


def clip(cfg: TrainConfig):
    exact = cfg.flavour == "exact"
    if cfg.clipnorm is not None:
        return (lambda ps: clip_each_norm_(ps, cfg.clipnorm)) if exact else (
            lambda ps: torch.nn.utils.clip_grad_norm_(ps, cfg.clipnorm))
    if cfg.global_clipnorm is not None:
        return (lambda ps: clip_global_norm_(ps, cfg.global_clipnorm)) if exact else (
            lambda ps: torch.nn.utils.clip_grad_norm_(ps, cfg.global_clipnorm))
    if cfg.clipvalue is not None:
        return lambda ps: torch.nn.utils.clip_grad_value_(ps, cfg.clipvalue)
    return None
