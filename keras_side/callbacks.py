"""Early stopping with `restore_best_weights`: the one callback every loop reproduces, as Keras's rule in plain
Python (tested against `keras.callbacks.EarlyStopping` itself).

    stop = EarlyStopping(cfg.patience)
    for epoch in ...:
        ...
        if stop.update(epoch, val_loss, model.get_weights):
            break
    model.set_weights(stop.best_weights)   # restore_best_weights, whether training stopped early or not
"""
from __future__ import annotations


class EarlyStopping:
    """Keras's rule on the validation loss (min_delta 0): every epoch counts one more epoch waited; a loss below the
    best so far resets the wait and keeps the weights; once the wait reaches `patience` (never at the first epoch),
    training stops. The best weights come back at the end."""

    def __init__(self, patience: int):
        self.patience, self.wait = patience, 0
        self.best, self.best_epoch, self.best_weights, self.stopped_epoch = None, 0, None, None

    def update(self, epoch: int, value: float, weights) -> bool:
        """After `epoch` (from 0) with validation loss `value`: whether to stop. `weights()` is called only for an
        epoch that is the best so far."""
        self.wait += 1
        if self.best is None or value < self.best:
            self.best, self.best_epoch, self.best_weights, self.wait = value, epoch, weights(), 0
            return False
        if self.wait >= self.patience and epoch > 0:
            self.stopped_epoch = epoch
            return True
        return False
