"""The torch loop's optimizer: each Keras optimizer as a `torch.optim.Optimizer`, a scheduler and a clip, in two
flavours.

    optimizer, scheduler, clip = optim.build(params, cfg)     # cfg.flavour: "exact" (default) or "engine"
    loss.backward(); clip(params); optimizer.step(); scheduler.step()   # clip, scheduler: None when unused

"exact" is Keras's update as a `torch.optim.Optimizer`, written op for op as Keras's own optimizers compute it on
this backend (keras/src/backend/torch/optimizers: `torch._foreach_*` in float32), so the loop steps as `fit` does
to the last bit. Where torch's stock optimizer differs, and why:
  Adam, AdamW  Keras's ε is the paper's "epsilon hat": added to sqrt(v) *before* the bias correction, where
               torch adds its ε after (torch's ε at step t would be Keras's ε / sqrt(1 − β2^t)). Keras also
               computes the bias corrections 1 − β^t in float32. AdamW decays p by lr·wd before the step in both.
  SGD          Keras folds the rate into the momentum buffer, m = μm − lr·g, p += m; torch.optim.SGD keeps
               b = μb + g and steps −lr·b: equal under a constant rate, not under a schedule.
  RMSprop      ε inside the square root (torch: outside); the rate applied before the momentum.
  Adagrad      ε inside the square root (torch: outside).
  schedule     `LambdaLR` over the Keras schedule object itself (a function of the step).
  clipnorm     each variable on its own (Keras); torch.nn.utils.clip_grad_norm_ clips them together, and adds 1e-6
               to the norm.
"engine" is torch's stock optimizer, scheduler and clip given the same numbers: the nearest equivalent.
"""
from __future__ import annotations

import torch
from torch.optim import lr_scheduler

from keras_side.optimizers import keras_schedule
from keras_side.spec import SpecError, TrainConfig

F32 = torch.float32  # Keras keeps its rate, step count and betas as float32 tensors


def build(params: list[torch.nn.Parameter], cfg: TrainConfig, *, compile: bool = False):
    """(optimizer, scheduler or None, clip(params) or None) for the spec's flavour. `compile=True` runs a Keras-exact
    update through `torch.compile` (see `_Keras.compile`); torch's own Adam is already one fused kernel."""
    exact = cfg.flavour == "exact"
    optimizer = (exact_optimizer if exact else engine_optimizer)(params, cfg)
    if compile and exact:
        optimizer.compile()
    scheduler = (exact_scheduler if exact else engine_scheduler)(optimizer, cfg)
    return optimizer, scheduler, clip(cfg)


class _Keras(torch.optim.Optimizer):
    """What every Keras-exact optimizer shares: its slots, the float32 rate and step, and the update loop.

    Keras computes its scalars (the rate, the step count, Adam's bias corrections) as float32 tensors, and so does
    this, though NumPy's float32 would be far cheaper: torch's CPU `sqrt` is not correctly rounded in float32 (many
    steps' `sqrt(1 − β2^t)` come out one ulp off IEEE's, where NumPy's is exact: docs/dev-notes.md, "Measurements
    once quoted in the code"), and the last bit of the rate is the last bit of every weight."""

    slots: tuple[str, ...] = ()
    compilable = True  # the update reads its rate and step as tensors only

    def compile(self) -> None:
        """The update through `torch.compile`: its `torch._foreach_*` calls, each a pass over every weight in eager
        mode, become one fused kernel, a shorter compiled step (docs/dev-notes.md, "Measurements once quoted in the
        code"). The rate and the step count come in as float32 tensors, so a schedule or the next step never recompiles
        it. Equal to the eager update within float32 rounding (the fused kernel may contract a multiply and an add), not
        to the bit."""
        if self.compilable:
            self.update = torch.compile(self.update)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """torch's `zero_grad` less its profiler label: its `record_function`, and the wrapper that keeps dynamo out,
        cost a small model's step more than setting two gradients to None is worth (docs/dev-notes.md, "torch:
        Keras's per-call Python was the step")."""
        if not set_to_none:
            return super().zero_grad(set_to_none=False)
        for group in self.param_groups:
            for p in group["params"]:
                p.grad = None

    def _slot(self, p: torch.Tensor, name: str, group: dict) -> torch.Tensor:
        state = self.state[p]
        if name not in state:
            state[name] = torch.full_like(p, group.get("initial_accumulator_value", 0.0))
        return state[name]

    @torch.no_grad()
    def step(self, closure=None):
        """One update from the gradients the parameters hold. `closure`, as torch's optimizers take it: a function
        that zeroes the gradients, computes the loss, calls `backward` and returns the loss; it is called first
        (with gradients on) and its loss returned."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            group["step"] = group.get("step", 0) + 1
            slots = [[self._slot(p, name, group) for p in params] for name in self.slots]
            self.update(params, [p.grad for p in params], *slots, lr=self._float32("lr", group["lr"]),
                        t=self._float32("step", float(group["step"])), group=group)
        return loss

    def _float32(self, name: str, value: float) -> torch.Tensor:
        """`value` as a float32 scalar tensor, made again only when it changes: a new tensor every step would add its
        own dispatch to every step."""
        cache = self.__dict__.setdefault("_scalars", {})
        if name not in cache or cache[name][0] != value:
            cache[name] = (value, torch.tensor(value, dtype=F32))
        return cache[name][1]


class KerasAdam(_Keras):
    """`keras.optimizers.Adam` (and AdamW with `weight_decay`) as a torch optimizer."""

    slots = ("m", "v")

    def __init__(self, params, lr: float, betas=(0.9, 0.999), eps: float = 1e-7, weight_decay: float | None = None):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        for name, beta in zip(("b1", "b2"), betas):
            self._float32(name, beta)  # made here, so a compiled update only reads them

    def update(self, params, grads, m, v, *, lr, t, group):
        (b1, b2), eps = group["betas"], group["eps"]
        if group["weight_decay"]:  # AdamW: decay first, by the current rate times the decay
            torch._foreach_mul_(params, 1 - group["weight_decay"] * lr)
        alpha = lr * torch.sqrt(1 - torch.pow(self._float32("b2", b2), t)) / (1 - torch.pow(self._float32("b1", b1), t))
        torch._foreach_mul_(m, b1)
        torch._foreach_add_(m, grads, alpha=1 - b1)
        torch._foreach_mul_(v, b2)
        torch._foreach_add_(v, torch._foreach_mul(grads, grads), alpha=1 - b2)
        # p −= α·m / (sqrt(v) + ε): ε meets sqrt(v) before the bias correction that α carries
        step = torch._foreach_div(torch._foreach_mul(m, alpha), torch._foreach_add(torch._foreach_sqrt(v), eps))
        torch._foreach_add_(params, step, alpha=-1)


class KerasSGD(_Keras):
    """`keras.optimizers.SGD`: m = μm − lr·g, then p += m (Nesterov: p += μm − lr·g); else p −= lr·g."""

    slots = ("momentum_buffer",)
    compilable = False  # Keras steps by the rate as a Python number (`alpha=`): `.item()` would break the graph

    def __init__(self, params, lr: float, momentum: float = 0.0, nesterov: bool = False):
        super().__init__(params, dict(lr=lr, momentum=momentum, nesterov=nesterov))

    def update(self, params, grads, buffers, *, lr, t, group):
        mu, lr = group["momentum"], lr.item()
        if not mu:
            torch._foreach_add_(params, grads, alpha=-lr)
            return
        torch._foreach_mul_(buffers, mu)
        torch._foreach_add_(buffers, grads, alpha=-lr)  # the rate goes into the buffer
        if group["nesterov"]:
            torch._foreach_add_(params, grads, alpha=-lr)
            torch._foreach_add_(params, buffers, alpha=mu)
        else:
            torch._foreach_add_(params, buffers)


class KerasRMSprop(_Keras):
    """`keras.optimizers.RMSprop`: v = ρv + (1 − ρ)g², step = lr·g / sqrt(v + ε); momentum: m = μm + step."""

    slots = ("velocity", "momentum_buffer")

    def __init__(self, params, lr: float, rho: float = 0.9, momentum: float = 0.0, eps: float = 1e-7):
        super().__init__(params, dict(lr=lr, rho=rho, momentum=momentum, eps=eps))

    def update(self, params, grads, velocity, buffers, *, lr, t, group):
        rho, mu = group["rho"], group["momentum"]
        torch._foreach_mul_(velocity, rho)
        torch._foreach_add_(velocity, torch._foreach_mul(grads, grads), alpha=1 - rho)
        denominators = torch._foreach_add(velocity, group["eps"])  # ε inside the square root
        torch._foreach_sqrt_(denominators)
        increments = torch._foreach_div(torch._foreach_mul(grads, lr), denominators)
        if mu:
            torch._foreach_mul_(buffers, mu)
            torch._foreach_add_(buffers, increments)
            increments = buffers
        torch._foreach_add_(params, increments, alpha=-1)


class KerasAdagrad(_Keras):
    """`keras.optimizers.Adagrad`: a += g² (a starts at 0.1), p −= lr·g / sqrt(a + ε)."""

    slots = ("sum",)

    def __init__(self, params, lr: float, initial_accumulator_value: float = 0.1, eps: float = 1e-7):
        super().__init__(params, dict(lr=lr, initial_accumulator_value=initial_accumulator_value, eps=eps))

    def update(self, params, grads, accumulators, *, lr, t, group):
        torch._foreach_add_(accumulators, torch._foreach_mul(grads, grads))
        step = torch._foreach_div(torch._foreach_mul(grads, lr),
                                  torch._foreach_sqrt(torch._foreach_add(accumulators, group["eps"])))
        torch._foreach_add_(params, step, alpha=-1)


def exact_optimizer(params, cfg: TrainConfig) -> torch.optim.Optimizer:
    if cfg.optimizer in ("adam", "adamw"):
        return KerasAdam(params, cfg.learning_rate, (cfg.beta_1, cfg.beta_2), cfg.epsilon, cfg.decay)
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
    """Keras's `clipnorm`, in place: each gradient g becomes g·c / max(‖g‖, c) on its own."""
    for g in (p.grad for p in params if p.grad is not None):
        g.copy_(g * max_norm / torch.clamp(torch.sqrt(torch.sum(torch.square(g))), min=max_norm))


def clip_global_norm_(params, max_norm: float) -> None:
    """Keras's `global_clipnorm`, in place: every gradient times c·min(1/‖all‖, 1/c)."""
    grads = [p.grad for p in params if p.grad is not None]
    norm = torch.sqrt(torch.sum(torch.stack([torch.sum(torch.square(g)) for g in grads])))
    torch._foreach_mul_(grads, max_norm * torch.minimum(1.0 / norm, torch.tensor(1.0 / max_norm)))


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
