"""`KerasModule`: any Keras model as the torch module a torch codebase expects. Its parameters come in the model's
own variable order, so an optimizer's state resumes onto the right tensors whatever the layers are named, and
`AveragedModel` (EMA) pairs the right ones after its deep copy."""
import copy

import keras
import numpy as np
import pytest
import torch
from torch.optim.swa_utils import AveragedModel

from keras_side.spec import TrainConfig
from native.torch import optim
from native.torch.host import KerasModule


def mlp(first: str, second: str, dropout: bool = False):
    """Two Dense layers with these names: Keras orders its torch parameters by path, so "layer_10" comes before
    "layer_9" where `model.variables` has it after (as auto-numbered names do in a process that built other models
    first)."""
    layers = [keras.Input((3,)), keras.layers.Dense(4, name=first)]
    layers += [keras.layers.Dropout(0.2, seed=1)] if dropout else []
    return keras.Sequential(layers + [keras.layers.Dense(1, name=second)])


def batch(seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(32, 3, generator=g), torch.randn(32, 1, generator=g)


def step(module, optimizer, seed: int) -> None:
    x, y = batch(seed)
    optimizer.zero_grad()
    torch.mean((module(x) - y) ** 2).backward()
    optimizer.step()


def test_the_parameters_come_in_the_models_variable_order_whatever_the_names():
    low, high = mlp("layer_1", "layer_2"), mlp("layer_9", "layer_10")
    assert [tuple(p.shape) for p in low.parameters()] != [tuple(p.shape) for p in high.parameters()]  # the trap
    for model in (low, high):
        module = KerasModule(model)
        assert all(p is v.value for p, v in zip(module.parameters(), model.variables, strict=True))
        assert [n for n, _ in module.named_parameters()] == ["variables.0_kernel", "variables.1_bias",
                                                            "variables.2_kernel", "variables.3_bias"]
        holder = torch.nn.Sequential(module)  # a module of the user's holding it: the same order
        assert [p for p in holder.parameters()] == [p for p in module.parameters()]


@pytest.mark.parametrize("make", [lambda ps: optim.exact_optimizer(ps, TrainConfig()),
                                  lambda ps: torch.optim.Adam(ps, lr=0.01)], ids=["KerasAdam", "torch Adam"])
def test_an_optimizers_state_resumes_onto_a_model_whose_layers_are_named_otherwise(make, tmp_path):
    """Saved from one model, loaded into the same model built under other names (another process's counters): it
    goes on exactly as the first does."""
    torch.manual_seed(0)
    first = KerasModule(mlp("layer_1", "layer_2"))
    opt = make(list(first.parameters()))
    for seed in range(2):
        step(first, opt, seed)
    torch.save({"model": first.state_dict(), "optimizer": opt.state_dict()}, tmp_path / "ckpt.pt")
    second = KerasModule(mlp("layer_9", "layer_10"))
    resumed = make(list(second.parameters()))
    saved = torch.load(tmp_path / "ckpt.pt")
    second.load_state_dict(saved["model"])
    resumed.load_state_dict(saved["optimizer"])
    for seed in range(2, 4):
        step(first, opt, seed)
        step(second, resumed, seed)
    for a, b in zip(first.model.get_weights(), second.model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)


def test_an_ema_through_averaged_model_averages_each_weight_with_itself():
    torch.manual_seed(0)
    module = KerasModule(mlp("layer_9", "layer_10", dropout=True))
    ema = AveragedModel(module, multi_avg_fn=None, use_buffers=False,
                        avg_fn=lambda avg, new, n: avg + (new - avg) / (n + 1) if avg.is_floating_point() else new)
    opt = torch.optim.SGD([p for p in module.parameters() if p.is_floating_point()], lr=0.1)
    history = [[w.copy() for w in module.model.get_weights()]]
    for seed in range(3):
        module.train()
        step(module, opt, seed)
        ema.update_parameters(module)
        history.append([w.copy() for w in module.model.get_weights()])
    want = [np.mean([h[i] for h in history[1:]], axis=0) for i in range(len(history[0]))]
    for got, expected in zip(ema.module.model.get_weights(), want, strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-6)
    assert copy.deepcopy(module).state_dict().keys() == module.state_dict().keys()


def test_the_models_own_losses_and_autocast_refused():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1, kernel_regularizer=keras.regularizers.L2(0.1))])
    module = KerasModule(model)
    module(torch.ones(2, 3))
    assert len(module.losses) == 1 and module.losses[0].item() > 0
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(RuntimeError, match="under torch.autocast"):
        module(torch.ones(2, 3))
