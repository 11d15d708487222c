"""`KerasModule`: any Keras model as the torch module a torch codebase expects. Its parameters come in the model's
own variable order, so an optimizer's state resumes onto the right tensors whatever the layers are named, and
`AveragedModel` (EMA) pairs the right ones after its deep copy."""
import copy

import keras
import numpy as np
import pytest
import torch
from torch.optim.swa_utils import AveragedModel

from keras_side.determinism import seed_everything
from keras_side.spec import TrainConfig
from native.torch import optim
from native.torch.host import KerasModule
from tests.native import users_models


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


# three float32 running-mean updates (avg + (new - avg) / (n + 1)) against NumPy's float32 mean of the same weights:
# a few ulps of weights of order 1, absolute (a weight near zero is as far off as a large one, so not relative)
EMA_VS_MEAN_ATOL = 1e-6


def test_an_ema_through_averaged_model_averages_each_weight_with_itself():
    seed_everything(0)  # the model's initial weights from its seed, not from what the tests before it drew
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
        np.testing.assert_allclose(got, expected, atol=EMA_VS_MEAN_ATOL, rtol=0)
    assert copy.deepcopy(module).state_dict().keys() == module.state_dict().keys()


def test_the_models_own_losses_and_autocast_refused():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1, kernel_regularizer=keras.regularizers.L2(0.1))])
    module = KerasModule(model)
    module(torch.ones(2, 3))
    assert len(module.losses) == 1 and module.losses[0].item() > 0
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(RuntimeError, match="under torch.autocast"):
        module(torch.ones(2, 3))


def test_a_loop_of_yours_over_a_dataloader_ends_where_fit_over_it_ends():
    """A torch user's data: a `TensorDataset` in a `DataLoader`, the short last batch included. `fit` over that
    loader and a plain torch loop over `KerasModule` (Keras's Adam as a torch optimizer, Keras's MSE,
    `module.train()`, a seeded Dropout) end on the same weights, to the bit. With a loader that shuffles, `fit`
    draws more from the loader's generator than one pass an epoch does: a first batch before training (to build
    its step) and, at each epoch's end, the next epoch's iterator, whose seed it draws then (Keras 3.15.1,
    `EpochIterator`). A loop that makes the same draws ends on fit's weights; one that does not, elsewhere."""
    from torch.utils.data import DataLoader, TensorDataset

    from keras_side.optimizers import keras_optimizer

    cfg, epochs = TrainConfig(learning_rate=0.05), 3
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(200, 3, generator=g), torch.randn(200, 1, generator=g)

    def loader(shuffle: bool):
        return DataLoader(TensorDataset(x, y), batch_size=32, shuffle=shuffle,
                          generator=torch.Generator().manual_seed(1))

    def fresh():
        keras.backend.clear_session()
        seed_everything(0)
        return mlp("first", "second", dropout=True)

    def fit(shuffle: bool):
        model = fresh()
        model.compile(optimizer=keras_optimizer(cfg), loss="mse")
        model.fit(loader(shuffle), epochs=epochs, shuffle=False, verbose=0)  # the loader shuffles
        return model.get_weights()

    def yours(shuffle: bool, as_fit_draws: bool = False):
        module = KerasModule(fresh())
        optimizer = optim.exact_optimizer(list(module.parameters()), cfg)
        loss_fn, batches = keras.losses.MeanSquaredError(), loader(shuffle)
        module.train()
        if as_fit_draws:
            next(iter(batches))
        for _ in range(epochs):
            for xb, yb in batches:
                optimizer.zero_grad()
                loss = loss_fn(yb, module(xb)) + sum(module.losses)
                loss.backward()
                optimizer.step()
            if as_fit_draws:
                iter(batches)
        return module.model.get_weights()

    def gap(a, b):
        return max(float(np.max(np.abs(u - v))) for u, v in zip(a, b, strict=True))

    assert gap(yours(shuffle=False), fit(shuffle=False)) == 0
    shuffled = fit(shuffle=True)
    assert gap(yours(shuffle=True, as_fit_draws=True), shuffled) == 0, f"keras {keras.__version__}: fit's draws moved"
    assert gap(yours(shuffle=True), shuffled) > 1e-3  # other batches: the test above can tell


def test_a_checkpoint_resumes_bit_identically_in_a_process_that_built_other_models_first(tmp_path):
    """`save_checkpoint` after 2 of 4 epochs; then, as in another process: other models built first (the layers
    named otherwise), torch's global generator and the loader's moved on, `load_checkpoint`, 2 more epochs. The
    run ends where the uninterrupted one ends, to the bit: an unseeded Dropout (torch's global generator), a
    shuffling DataLoader (its own generator), a cosine schedule and Keras's Adam all resumed."""
    from torch.utils.data import DataLoader, TensorDataset

    from native.torch.host import load_checkpoint, save_checkpoint

    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(100, 3, generator=g), torch.randn(100, 1, generator=g))

    def setup(names, seed):
        seed_everything(seed)  # Keras's initializers and torch's global generator
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, name=names[0]), keras.layers.Dropout(0.3),
                                  keras.layers.Dense(1, name=names[1])])
        module = KerasModule(model)
        optimizer = optim.exact_optimizer(list(module.parameters()), TrainConfig(learning_rate=0.05))
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=16)
        generator = torch.Generator().manual_seed(seed)
        return module, optimizer, scheduler, generator, DataLoader(data, batch_size=32, shuffle=True,
                                                                    generator=generator)

    def epochs(count, module, optimizer, scheduler, generator, loader):
        module.train()
        for _ in range(count):
            for x, y in loader:
                optimizer.zero_grad()
                torch.mean((module(x) - y) ** 2).backward()
                optimizer.step()
                scheduler.step()

    uninterrupted = setup(("layer_1", "layer_2"), seed=0)
    epochs(4, *uninterrupted)
    first = setup(("layer_1", "layer_2"), seed=0)
    epochs(2, *first)
    save_checkpoint(tmp_path / "ckpt.pt", *first[:3], generators=[first[3]])
    resumed = setup(("layer_9", "layer_10"), seed=7)  # other names, other random states: all of it restored
    load_checkpoint(tmp_path / "ckpt.pt", *resumed[:3], generators=[resumed[3]])
    epochs(2, *resumed)
    for a, b in zip(uninterrupted[0].model.get_weights(), resumed[0].model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="holds 1 generator\\(s\\) and a scheduler; give load_checkpoint the same"):
        load_checkpoint(tmp_path / "ckpt.pt", *resumed[:3])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt"]  # written whole: no temporary left


@pytest.mark.parametrize("name", list(users_models.MODELS))
def test_a_users_model_trains_through_keras_module_as_fit_trains_it(name):
    """Six models of a user's own (LayerNorm + Dropout + L2, attention, a masked GRU with dropout, two inputs, an
    `add_loss` layer, BatchNorm), each through `KerasModule` in a plain torch loop over a `DataLoader` of the user's
    data, and through `fit` over the same loader: the same weights, to the bit."""
    from torch.utils.data import DataLoader, Dataset

    x, y = users_models.data(name)

    class Rows(Dataset):  # ((inputs...), target) per row: the loader batches each input
        def __len__(self):
            return len(y)

        def __getitem__(self, i):
            return (tuple(a[i] for a in x) if isinstance(x, tuple) else x[i]), y[i]

    cfg = TrainConfig(learning_rate=0.01)
    want = users_models.compiled(name, cfg)
    want.fit(DataLoader(Rows(), batch_size=32), epochs=3, shuffle=False, verbose=0)  # the loader's order

    module = KerasModule(users_models.fresh(name))
    optimizer, loss_fn = optim.exact_optimizer(list(module.parameters()), cfg), keras.losses.MeanSquaredError()
    module.train()
    for _ in range(3):
        for xb, yb in DataLoader(Rows(), batch_size=32):
            optimizer.zero_grad()
            loss = loss_fn(yb, module(xb)) + sum(module.losses)
            loss.backward()
            optimizer.step()
    for got, expected in zip(module.model.get_weights(), want.get_weights(), strict=True):
        np.testing.assert_array_equal(got, expected)
