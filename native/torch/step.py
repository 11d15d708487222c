"""The torch step's pieces that the fast paths and the launchers share: the gradient through autograd, then the
update Keras's optimizer makes (the clip, the optimizer's step, the weight constraints, the schedule), with torch's
optimizer (`native.torch.optim`). The reference loop (`native.torch.loop`) writes the same step out in its
`make_step`; `native.torch.fast` runs it fast, `native.torch.ddp` on a rank's shard of the loss."""
from __future__ import annotations

import torch

from keras_side.models import weight_constraints
from keras_side.spec import TrainConfig
from native.torch import optim


def constraints_of(model) -> list[tuple[torch.Tensor, object]]:
    """`(parameter, constraint)` for each trainable variable with a constraint (`weight_constraints`)."""
    return [(v.value, c) for v, c in zip(model.trainable_variables, weight_constraints(model)) if c is not None]


def constrain(constrained: list[tuple[torch.Tensor, object]]) -> None:
    """Each constraint on its parameter, in place, after the optimizer's step: Keras's optimizer assigns
    `constraint(variable)` to the variable (`BaseOptimizer.apply`), the same ops on the same values."""
    with torch.no_grad():
        for p, constraint in constrained:
            p.copy_(constraint(p))


def through_autograd(batch_loss, optimizer):
    """`backward(*batch) -> (loss, outputs)`: the batch's loss through the model (`batch_loss(*batch)`), then
    autograd, the gradients left in each `.grad` for the optimizer."""
    def backward(*batch):
        loss, outputs = batch_loss(*batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        return loss, outputs

    return backward


class Updates:
    """`update()`, after backward has left the gradients in each `.grad`: the clip, the optimizer's step, the weight
    constraints, the schedule's step: what Keras's `optimizer.apply` does, with torch's optimizer (`optim.build`)."""

    def __init__(self, model, cfg: TrainConfig, *, compile: bool = False):
        # A layer's seed and BatchNorm's moving statistics are frozen Parameters, which the layers update themselves.
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer, self.scheduler, self.clip = optim.build(self.params, cfg, compile=compile)
        self.constrained = constraints_of(model)

    def __call__(self) -> None:
        if self.clip:
            self.clip(self.params)  # Keras clips inside its optimizer; torch between backward and step
        self.optimizer.step()
        if self.constrained:
            constrain(self.constrained)
        if self.scheduler:
            self.scheduler.step()  # once a batch: Keras's schedules count optimizer steps
