"""Embedding a Keras model in a PyTorch codebase: `KerasModule(model)` is the torch module a torch user expects.

    module = KerasModule(model); optimizer = torch.optim.Adam(module.parameters(), lr=1e-2)
    torch.save(module.state_dict(), "module.pt"); other.load_state_dict(torch.load("module.pt"))   # stable keys

A Keras model's own `state_dict()` has each weight twice (under the model and under its inner functional graph),
keyed by paths such as "sequential_3/dense_7/kernel" that Keras numbers from process-wide counters: a second
instance built in the same process, or in another process that built other models first, has other keys and cannot
load the first one's checkpoint. `stable_keys(model)` gives it the keys a torch user expects: each variable once,
"<index>.<name>" in `model.variables` order ("0.kernel", "1.bias"...), the same in every process.
"""
from __future__ import annotations

import copy
from pathlib import Path

import torch

from keras_side.files import atomic_file
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


class KerasModule(torch.nn.Module):
    """Any built Keras model as the torch module a torch codebase expects (`forward` calls the model):

    - `parameters()` in `model.variables` order, in this module and in any module that holds it. Keras registers
      its weights sorted by their auto-numbered paths ("dense_10" before "dense_9"), so another process that built
      other models first, or a `copy.deepcopy`, would have another order: an optimizer's state would resume onto the
      wrong tensors, and `AveragedModel` (EMA) pair the wrong ones.
    - `state_dict()` under stable keys (`stable_keys`), loadable in any process.
    - `train()` / `eval()` reach the Keras model as its `training` flag (Dropout, BatchNorm).
    - `.losses`: the model's own losses (regularizers, `add_loss`) of the last forward, to add to the loss.
    - A dtype cast (`.double()`, `.half()`) and `torch.autocast` are refused in one line: Keras computes in its dtype
      policy, whatever torch casts.
    """

    child = "keras"  # the attribute that holds the Keras model (its state dict keys' first part)

    def __init__(self, keras_model):
        super().__init__()
        self.variables = _Order(keras_model)  # registered first: torch yields each parameter where it first meets it
        setattr(self, self.child, stable_keys(keras_model))

    @property
    def model(self):
        return getattr(self, self.child)

    @property
    def losses(self) -> list:
        return list(self.model.losses)

    def forward(self, inputs, **kwargs):
        if torch.is_autocast_enabled("cpu") or torch.is_autocast_enabled("cuda"):
            raise RuntimeError(f"{type(self).__name__} under torch.autocast: the Keras layers keep computing in their "
                               f"dtype policy ({self.model.dtype_policy.name}) from weights autocast has cast once, "
                               "so they would train on stale casts; choose a mixed policy with "
                               "keras.config.set_dtype_policy('mixed_bfloat16') before building the model instead")
        # A Keras model reads `training` from its call, not from torch's `self.training`: pass it on.
        return self.model(inputs, training=self.training, **kwargs)

    def __deepcopy__(self, memo):
        """`copy.deepcopy` (an EMA copy, a snapshot): Keras copies its model by saving and loading it, which leaves
        torch's hooks and this module's parameter order behind: both are made again on the copy's Keras model."""
        clone = object.__new__(type(self))
        memo[id(self)] = clone
        clone.__dict__.update(copy.deepcopy(self.__dict__, memo))
        clone._modules["variables"] = _Order(stable_keys(clone.model))
        return clone

    def _apply(self, fn, recurse=True):
        """What torch's `.double()`, `.half()`, `.to(dtype)` and `.to(device)` call: a change of a weight's dtype is
        refused before anything is cast. After `.double()` the Keras part computed in float32 and answered in
        float64, at float32's precision, without a word."""
        for dtype in {p.dtype for p in self.parameters()}:
            cast = fn(torch.zeros((), dtype=dtype)).dtype
            if cast != dtype:
                raise TypeError(f"{type(self).__name__} keeps its dtypes: its {dtype} weights would become {cast}, "
                                f"but the Keras model computes in its dtype policy ({self.model.dtype_policy.name}) "
                                "whatever torch casts its weights to; choose the dtype with "
                                "keras.config.set_dtype_policy before building it (a float64 Dense computes in "
                                "float32 on torch in Keras 3.15.1: keras-team/keras#23704)")
        return super()._apply(fn, recurse)


class _Order(torch.nn.ParameterDict):
    """The Keras model's parameters once more, in `model.variables` order, under "<index>_<name>": what
    `parameters()` walks first. The state dict leaves them out (`stable_keys` saves each variable once); torch's
    extension points for a module's own part of the state dict are its `_save_to_state_dict` and
    `_load_from_state_dict`."""

    def __init__(self, keras_model):
        super().__init__({f"{i}_{v.name}": v.value for i, v in enumerate(keras_model.variables)
                          if isinstance(v.value, torch.nn.Parameter)})

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        pass

    def _load_from_state_dict(self, *args, **kwargs):
        pass


def save_checkpoint(path, module: torch.nn.Module, optimizer, scheduler=None, *, generators=()) -> None:
    """Everything a resumed run needs to go on as the uninterrupted one, in one file: `module`'s state dict (a
    `KerasModule`'s, or a module of yours holding one: each Keras variable once under stable keys, a seeded
    layer's seed state included), the optimizer's and the scheduler's, and the random state: torch's global
    generator (Keras's unseeded dropout draws from it), CUDA's where there is one, and each of `generators` (your
    DataLoader's, in the order `load_checkpoint` gets them). Written whole (`atomic_file`): a run killed while
    writing leaves the file it had."""
    with atomic_file(path) as tmp:
        torch.save({"module": module.state_dict(), "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict() if scheduler else None, "rng": torch.get_rng_state(),
                    "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
                    "generators": [g.get_state() for g in generators]}, tmp)


def load_checkpoint(path, module: torch.nn.Module, optimizer, scheduler=None, *, generators=()) -> None:
    """What `save_checkpoint` wrote into `module`, `optimizer`, `scheduler` and `generators`, in place, in this
    process or another one (which may have built other models first: the keys and the parameters' order do not
    depend on Keras's name counters). Read with `weights_only=True`: nothing in the file can run code."""
    saved = torch.load(Path(path), weights_only=True)
    if len(saved["generators"]) != len(generators) or (saved["scheduler"] is None) != (scheduler is None):
        raise ValueError(f"{path} holds {len(saved['generators'])} generator(s) and "
                         f"{'no' if saved['scheduler'] is None else 'a'} scheduler; give load_checkpoint the same "
                         "ones save_checkpoint had")
    module.load_state_dict(saved["module"])
    optimizer.load_state_dict(saved["optimizer"])
    if scheduler:
        scheduler.load_state_dict(saved["scheduler"])
    torch.set_rng_state(saved["rng"])
    if saved["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(saved["cuda"])
    for generator, state in zip(generators, saved["generators"], strict=True):
        generator.set_state(state)


class HostModel(KerasModule):
    """The HAR's example of a `KerasModule`: a Keras model (the HAR, or any one-output model), then a torch
    `nn.Linear(1, 1)` that recalibrates its forecast."""

    child = "har"

    def __init__(self, keras_model):
        super().__init__(keras_model)
        self.calibrate = torch.nn.Linear(1, 1)

    def forward(self, x):
        return self.calibrate(super().forward(x))


def train_host(host: HostModel, x: torch.Tensor, y: torch.Tensor, *, steps: int, lr: float) -> list[float]:
    """Full-batch Adam on every parameter of the host, Keras's and torch's alike, the Keras weights' constraints
    applied after each step as Keras's optimizer applies them (`step.constrain`); returns the loss per step."""
    from native.torch.step import constrain, constraints_of

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
