"""Embedding a Keras model in a PyTorch codebase: it is a `torch.nn.Module`, so it is simply a submodule.

    host = HostModel(models.har()); optimizer = torch.optim.Adam(host.parameters(), lr=1e-2)
    torch.save(host.state_dict(), "host.pt"); other.load_state_dict(torch.load("host.pt"))   # stable keys

A Keras model's own `state_dict()` has each weight twice (under the model and under its inner functional graph),
keyed by paths such as "sequential_3/dense_7/kernel" that Keras numbers from process-wide counters: a second
instance built in the same process, or in another process that built other models first, has other keys and cannot
load the first one's checkpoint. `stable_keys(model)` gives it the keys a torch user expects: each variable once,
"<index>.<name>" in `model.variables` order ("0.kernel", "1.bias"...), the same in every process.
"""
from __future__ import annotations

import copy

import torch

from keras_side.losses import as_fit_shapes


def stable_keys(model):
    """Install `state_dict` and `load_state_dict` hooks on a Keras model (a torch module on this backend) so that it
    saves and loads every variable once, under "<index>.<name>" (a random layer's seed state included, which the
    model's own `state_dict` leaves out). A state dict with the model's own keys still loads; `assign=True` is
    refused (the layers would go on computing with the tensors it replaced). Returns the model."""
    if not model.built:
        raise ValueError(f"stable_keys needs a built model (its variables exist once it is built); build "
                         f"{model.name!r} first, e.g. with keras.Input or model.build(input_shape)")
    variables = list(model.variables)
    keys = [f"{i}.{v.name}" for i, v in enumerate(variables)]
    index = {id(v.value): i for i, v in enumerate(variables)}
    # The model's own keys (relative to it) and the variable each holds: two keys for most variables.
    own = {k: index[id(t)] for k, t in model.state_dict(keep_vars=True).items() if id(t) in index}

    def save(module, state_dict, prefix, local_metadata):
        for key in own:
            state_dict.pop(prefix + key, None)
        for key, variable in zip(keys, variables):
            state_dict[prefix + key] = variable.value.detach()

    def load(module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs):
        if local_metadata.get("assign_to_params_buffers"):  # it matched every key, and the model kept its weights
            for key in [k for k in state_dict if k.startswith(prefix)]:
                del state_dict[key]  # nothing of the Keras model is assigned: it stays as it was
            error_msgs.append(f"{prefix.rstrip('.') or 'the Keras model'}: load_state_dict(..., assign=True) would put "
                              "new tensors in torch's parameters, which the Keras layers do not compute with: load "
                              "without assign")
            return
        if not any(prefix + key in state_dict for key in keys):
            return  # the model's own keys: torch loads them as they are
        values = {i: state_dict.pop(prefix + key) for i, key in enumerate(keys) if prefix + key in state_dict}
        for key, i in own.items():  # where torch loads each variable from: every own key of it gets its value
            if i in values:
                state_dict[prefix + key] = values[i]
        covered = set(own.values())
        with torch.no_grad():
            for i, value in values.items():  # a variable torch does not hold as a parameter (a seed state)
                if i not in covered:
                    if tuple(value.shape) != tuple(variables[i].shape):
                        error_msgs.append(f"size mismatch for {prefix}{keys[i]}: copying a param with shape "
                                          f"{tuple(value.shape)}, the model's is {tuple(variables[i].shape)}")
                    else:
                        variables[i].assign(value)

    model.register_state_dict_post_hook(save)
    model.register_load_state_dict_pre_hook(load)
    return model


class HostModel(torch.nn.Module):
    """A plain torch module: a Keras model (the HAR, or any one-output model), then a torch `nn.Linear(1, 1)` that
    recalibrates its forecast."""

    def __init__(self, keras_model):
        super().__init__()
        self.har = stable_keys(keras_model)  # registering the Keras model registers its weights with torch
        self.calibrate = torch.nn.Linear(1, 1)

    def __deepcopy__(self, memo):
        """`copy.deepcopy(host)` (an EMA copy, a snapshot): Keras copies its model by saving and loading it, which
        leaves the hooks of `stable_keys` behind, so the copy's state dict had Keras's numbered keys again. They are
        installed on the copy's Keras model (any module holding one needs the same after a deepcopy)."""
        clone = object.__new__(type(self))
        memo[id(self)] = clone
        clone.__dict__.update(copy.deepcopy(self.__dict__, memo))
        stable_keys(clone.har)
        return clone

    def _apply(self, fn, recurse=True):
        """What torch's `.double()`, `.half()`, `.to(dtype)` and `.to(device)` call: a change of a weight's dtype is
        refused before anything is cast. Keras computes in its dtype policy whatever torch casts its weights to:
        after `.double()` the Keras part computed in float32 and answered in float64, at float32's precision,
        without a word."""
        for dtype in {p.dtype for p in self.parameters()}:
            cast = fn(torch.zeros((), dtype=dtype)).dtype
            if cast != dtype:
                raise TypeError(f"HostModel keeps its dtypes: its {dtype} weights would become {cast}, but the Keras "
                                f"model computes in its dtype policy ({self.har.dtype_policy.name}) whatever torch "
                                "casts its weights to; choose the dtype with keras.config.set_dtype_policy before "
                                "building it (a float64 Dense computes in float32 on torch in Keras 3.15.1: "
                                "keras-team/keras#23704)")
        return super()._apply(fn, recurse)

    def forward(self, x):
        # A Keras model reads `training` from its call, not from torch's `self.training`: pass it on, so that
        # `host.train()` / `host.eval()` switch Dropout, GaussianNoise and BatchNorm as they do in a torch module.
        return self.calibrate(self.har(x, training=self.training))


def train_host(host: HostModel, x: torch.Tensor, y: torch.Tensor, *, steps: int, lr: float) -> list[float]:
    """Full-batch Adam on every parameter of the host, Keras's and torch's alike, the Keras weights' constraints
    applied after each step as Keras's optimizer applies them (`fast.constrain`); returns the loss per step."""
    from native.torch.fast import constrain, constraints_of

    optimizer, constrained = torch.optim.Adam(host.parameters(), lr=lr), constraints_of(host.har)
    losses = []
    for _ in range(steps):
        target, pred = as_fit_shapes(y, host(x))  # a (n,) target is a (n, 1) one, as fit takes it: not (n, n)
        loss = torch.mean((pred - target) ** 2)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        constrain(constrained)
        losses.append(loss.item())
    return losses
