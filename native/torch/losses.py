"""Keras's losses written in torch, for the fast paths: the same torch operations Keras dispatches to, without its
per-call dispatch (tested bit-identical to Keras's losses).

    from native.torch import losses; loss_fn = losses.spec_loss(cfg, same_rank=True)   # loss_fn(y, outputs, w)

`spec_loss` is the spec's loss reduced as `fit` reduces it; a loss not written here is Keras's own.
"""
from __future__ import annotations

import torch

from keras_side import internals
from keras_side.losses import keras_loss, training_loss
from keras_side.spec import TrainConfig


def mse(y_true, y_pred):
    return torch.mean((y_pred - y_true) ** 2)


# Keras's per-sample MSE and MAE, the same torch operations Keras dispatches to (tested bit-identical).
TORCH_LOSSES = {
    "mse": lambda y_true, y_pred: torch.mean(torch.square(y_true - y_pred), dim=-1),
    "mae": lambda y_true, y_pred: torch.mean(torch.abs(y_true - y_pred), dim=-1),
}
# The same for the losses that take logits (`from_logits=True`). Keras's own binary cross-entropy asks
# `torch.backends.mps.is_available()` on every call, a graph break under torch.compile (tested bit-identical).
TORCH_LOGIT_LOSSES = {
    "binary_crossentropy": lambda y_true, y_pred: torch.mean(torch.nn.functional.binary_cross_entropy_with_logits(
        y_pred, y_true.to(y_pred.dtype), reduction="none"), dim=-1),
}


def spec_loss(cfg: TrainConfig, same_rank: bool):
    """`loss(y_true, y_pred)`: the spec's loss reduced as `fit` reduces it, sum / count of the per-sample losses.

    Keras's per-sample loss (`Loss.call`) also shapes the targets as `fit` does ((n,) against (n, 1)). When they
    already have the outputs' rank, MSE, MAE and the cross-entropy from logits are written in torch: the same numbers
    without Keras's per-call dispatch, a large share of the eager step forward and backward (measured in
    docs/dev-notes.md, beside the Keras-exact Adam).
    Several outputs: each output's loss, times its `loss_weights`, summed as `compile` combines them (Keras's losses
    and `OutputLosses` where one is not written here)."""
    table, losses = TORCH_LOGIT_LOSSES if cfg.from_logits else TORCH_LOSSES, keras_loss(cfg)
    if cfg.outputs == 1:
        return _batch_mean(table[cfg.loss] if same_rank and cfg.loss in table else losses.call, losses)
    if not (same_rank and all(name in table for name in cfg.losses)):
        return training_loss(cfg)
    means, weights = [_batch_mean(table[name], loss) for name, loss in zip(cfg.losses, losses)], cfg.loss_weights

    def combined(y_true, y_pred, sample_weight=None):  # `OutputLosses`, in torch: each in float32, weighed, summed
        values = [mean(y_t, y_p, sample_weight).to(torch.float32)
                  for mean, y_t, y_p in zip(means, y_true, y_pred, strict=True)]
        return sum(values if weights is None else [value * w for value, w in zip(values, weights)])

    return combined


def _batch_mean(per_sample, loss):
    """The batch's mean of `per_sample` as Keras's `Loss.__call__` takes it: half-precision predictions in float32
    first (a mixed-precision model's loss is float32), and a prediction that carries a mask (a sequence's padded
    steps) to the Keras `loss` itself, which weighs the masked steps out."""
    def mean(y_true, y_pred, sample_weight=None):
        if internals.keras_mask(y_pred) is not None:
            return loss(y_true, y_pred, sample_weight)
        if y_pred.dtype in (torch.float16, torch.bfloat16):
            y_pred = y_pred.float()
        values = per_sample(y_true, y_pred)
        if sample_weight is not None:  # weighted, then still divided by the count (Keras's sum_over_batch_size)
            values = values * sample_weight.reshape(values.shape)
        return torch.sum(values) / values.numel()

    return mean
