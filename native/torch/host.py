"""Embedding a Keras model in a PyTorch codebase: it is a `torch.nn.Module`, so it is simply a submodule.

    host = HostModel(models.har()); optimizer = torch.optim.Adam(host.parameters(), lr=1e-2)
"""
from __future__ import annotations

import torch


class HostModel(torch.nn.Module):
    """A plain torch module: a Keras model (the HAR, or any one-output model), then a torch `nn.Linear(1, 1)` that
    recalibrates its forecast."""

    def __init__(self, keras_model):
        super().__init__()
        self.har = keras_model  # registering the Keras model registers its weights with torch
        self.calibrate = torch.nn.Linear(1, 1)

    def forward(self, x):
        # A Keras model reads `training` from its call, not from torch's `self.training`: pass it on, so that
        # `host.train()` / `host.eval()` switch Dropout, GaussianNoise and BatchNorm as they do in a torch module.
        return self.calibrate(self.har(x, training=self.training))


def train_host(host: HostModel, x: torch.Tensor, y: torch.Tensor, *, steps: int, lr: float) -> list[float]:
    """Full-batch Adam on every parameter of the host, Keras's and torch's alike; returns the loss per step."""
    optimizer = torch.optim.Adam(host.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        loss = torch.mean((host(x) - y) ** 2)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses
