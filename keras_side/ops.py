"""Portable computation: written once with `keras.ops`, it runs on every engine and returns that engine's tensor."""
from __future__ import annotations

import math

from keras import ops

TRADING_DAYS = 252


def sharpe_ratio(returns, periods_per_year: int = TRADING_DAYS):
    """Annualized Sharpe ratio of each column: mean / std · sqrt(periods), population std (ddof=0).

    Args:
        returns: (days,) or (days, assets) daily returns.
    Returns:
        A scalar or (assets,) tensor of the active engine (torch.Tensor, jax.Array, tf.Tensor).
    """
    r = ops.convert_to_tensor(returns)
    return ops.mean(r, axis=0) / ops.std(r, axis=0) * math.sqrt(periods_per_year)


def mean_squared_error(y_true, y_pred):
    """The loss every path minimizes: the plain mean of squared errors (not optax's half of it)."""
    return ops.mean(ops.square(ops.subtract(y_pred, y_true)))
