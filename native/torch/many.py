"""Many small Keras models at once in PyTorch: `torch.func.vmap` over `model.stateless_call`, `torch.optim.Adam`.

    params = train_many(model, x, y, rows, cfg)   # x (groups, N, features), rows (groups, models)

The same scheme as `native/jax/many.py`: model (g, m) trains on the first `rows[g, m]` rows of group g; each
epoch shuffles the N positions once for every model, and a model's loss on a batch is the mean over the batch's
rows inside its window. The weights of all models are stacked on two leading axes and trained as `nn.Parameter`s;
the loss is the sum of the models' own losses, so each model gets exactly its own gradient, and Adam is
elementwise, so each gets its own update. Every model steps on every batch, so each trains exactly as it would
alone (tested).
"""
from __future__ import annotations

import math

import numpy as np
import torch

from keras_side.spec import TrainConfig


def init_params(model, shape: tuple[int, ...], generator: torch.Generator) -> list[torch.nn.Parameter]:
    """Glorot-uniform matrices and zero vectors, one set per model, stacked on the leading `shape` axes."""
    params = []
    for variable in model.trainable_variables:
        own = tuple(variable.shape)
        if len(own) >= 2:
            limit = math.sqrt(6.0 / (own[-2] + own[-1]))
            value = (torch.rand((*shape, *own), generator=generator) * 2 - 1) * limit
        else:
            value = torch.zeros((*shape, *own))
        params.append(torch.nn.Parameter(value))
    return params


def _forward(model):
    """(groups, models, ...) params and (groups, batch, F) inputs -> (groups, models, batch, 1) predictions."""
    one = lambda p, xb: model.stateless_call(list(p), [], xb)[0]  # noqa: E731
    return torch.func.vmap(torch.func.vmap(one, in_dims=(0, None)))  # inner: the group's models share x


def train_many(model, x: np.ndarray, y: np.ndarray, rows: np.ndarray, cfg: TrainConfig,
               params: list[np.ndarray] | None = None) -> list[np.ndarray]:
    """Train every model; returns the weights stacked as (groups, models, ...). `params` sets the starting weights
    (default: drawn from `cfg.seed`); the epochs' permutations come from their own generator, seeded `cfg.seed`."""
    x, y, rows = torch.as_tensor(x), torch.as_tensor(y), torch.as_tensor(rows)
    if params is None:
        params = init_params(model, tuple(rows.shape), torch.Generator().manual_seed(cfg.seed))
    else:
        params = [torch.nn.Parameter(torch.as_tensor(p).clone()) for p in params]
    optimizer = torch.optim.Adam(params, lr=cfg.learning_rate, betas=(cfg.beta_1, cfg.beta_2), eps=cfg.epsilon,
                                 fused=True)
    forward, shuffle = _forward(model), torch.Generator().manual_seed(cfg.seed)
    n_rows = x.shape[1]
    n_batches = math.ceil(n_rows / cfg.batch_size)
    x, y = torch.nn.functional.pad(x, (0, 0, 0, 1)), torch.nn.functional.pad(y, (0, 0, 0, 1))  # padding row n_rows
    for _ in range(cfg.epochs):
        order = torch.nn.functional.pad(torch.randperm(n_rows, generator=shuffle),
                                        (0, n_batches * cfg.batch_size - n_rows), value=n_rows)
        xe, ye = x[:, order], y[:, order]  # one gather per group and epoch; batches are then views
        for b in range(n_batches):
            batch = slice(b * cfg.batch_size, (b + 1) * cfg.batch_size)
            inside = (order[batch] < rows[..., None]).to(x.dtype)[..., None]  # (groups, models, batch, 1)
            pred = forward(params, xe[:, batch])
            error = inside * (pred - ye[:, None, batch]) ** 2
            per_model = error.sum((2, 3)) / inside.sum((2, 3)).clamp(min=1)
            optimizer.zero_grad(set_to_none=True)
            per_model.sum().backward()
            optimizer.step()
    return [p.detach().numpy() for p in params]


@torch.no_grad()
def predict_many(model, params: list[np.ndarray], x: np.ndarray) -> np.ndarray:
    """params stacked (groups, models, ...), x (groups, models, H, F) -> (groups, models, H, 1)."""
    one = lambda p, xm: model.stateless_call(list(p), [], xm)[0]  # noqa: E731
    return torch.func.vmap(torch.func.vmap(one))([torch.as_tensor(p) for p in params], torch.as_tensor(x)).numpy()
