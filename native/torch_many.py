"""Many small Keras models at once in PyTorch: `torch.func.vmap` over `model.stateless_call`, `torch.optim.Adam`.

    params = train_many(model, x, y, mask, cfg)   # x (models, rows, features), mask (models, rows)

The weights of all models are stacked on a leading axis and trained as two `nn.Parameter`s. The loss is the sum
of each model's own masked mean, so each model gets exactly its own gradient, and Adam is elementwise, so each
model gets its own update. One difference from training each model alone, stated plainly: the models step in
lockstep, so a model whose window runs out of rows before the epoch's last batch still takes Adam steps (with a
zero gradient, momentum only) and shares torch's step count. The walk-forward judges it against OLS instead.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from keras_side.config import TrainConfig


def valid_first(perm: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per model, `perm` reordered so the model's valid rows come first (a stable partition by prefix sums)."""
    valid = mask[:, perm] > 0
    n_valid = valid.sum(dim=1, keepdim=True)
    pos = torch.where(valid, valid.cumsum(1) - 1, n_valid + (~valid).cumsum(1) - 1)
    return torch.zeros_like(pos).scatter_(1, pos, perm.expand_as(pos))


def init_params(model, n_models: int, generator: torch.Generator) -> list[torch.nn.Parameter]:
    """Glorot-uniform matrices and zero vectors, one set per model, stacked on the first axis."""
    params = []
    for variable in model.trainable_variables:
        shape = tuple(variable.shape)
        if len(shape) >= 2:
            limit = math.sqrt(6.0 / (shape[-2] + shape[-1]))
            value = (torch.rand((n_models, *shape), generator=generator) * 2 - 1) * limit
        else:
            value = torch.zeros((n_models, *shape))
        params.append(torch.nn.Parameter(value))
    return params


def train_many(model, x: np.ndarray, y: np.ndarray, mask: np.ndarray, cfg: TrainConfig) -> list[np.ndarray]:
    generator = torch.Generator().manual_seed(cfg.seed)
    x, y, mask = torch.as_tensor(x), torch.as_tensor(y), torch.as_tensor(mask)
    n_models, n_rows = mask.shape
    n_batches = math.ceil(n_rows / cfg.batch_size)
    pad = n_batches * cfg.batch_size - n_rows
    params = init_params(model, n_models, generator)
    optimizer = torch.optim.Adam(params, lr=cfg.learning_rate, betas=(cfg.beta_1, cfg.beta_2), eps=cfg.epsilon)
    forward = torch.func.vmap(lambda p, xm: model.stateless_call(list(p), [], xm)[0])
    models = torch.arange(n_models)[:, None]
    for _ in range(cfg.epochs):
        order = valid_first(torch.randperm(n_rows, generator=generator), mask)
        order = torch.nn.functional.pad(order, (0, pad))
        live = torch.nn.functional.pad(mask[models, order[:, :n_rows]], (0, pad))
        xe, ye = x[models, order], y[models, order]  # one gather per epoch; batches are then views
        for b in range(n_batches):
            rows = slice(b * cfg.batch_size, (b + 1) * cfg.batch_size)
            pred = forward(params, xe[:, rows])
            weight = live[:, rows, None]
            per_model = (weight * (pred - ye[:, rows]) ** 2).sum((1, 2)) / weight.sum((1, 2)).clamp(min=1)
            optimizer.zero_grad(set_to_none=True)
            per_model.sum().backward()
            optimizer.step()
    return [p.detach().numpy() for p in params]


@torch.no_grad()
def predict_many(model, params: list[np.ndarray], x: np.ndarray) -> np.ndarray:
    forward = torch.func.vmap(lambda p, xm: model.stateless_call(list(p), [], xm)[0])
    return forward([torch.as_tensor(p) for p in params], torch.as_tensor(x)).numpy()
