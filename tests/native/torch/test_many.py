import keras
import numpy as np
import pytest
import torch
from torch._dynamo.utils import counters

from compare.referee.tolerances import TRACED_VS_FUSED_ADAM_ATOL, VMAP_VS_ALONE_ATOL
from keras_side import models
from keras_side.initial import InitialWeights
from keras_side.spec import TrainConfig
from native.torch import many as torch_many


def problem(groups=2, models_per_group=3, n=300, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(groups, n, 3)).astype(np.float32)
    y = (x @ rng.normal(size=(3, 1)) + 0.1 * rng.normal(size=(groups, n, 1))).astype(np.float32)
    rows = rng.integers(40, n + 1, size=(groups, models_per_group))
    return x, y, rows


def test_every_batched_model_equals_the_model_trained_alone():
    """Stacked weights, the sum of per-model losses, elementwise Adam, and every model stepping on every batch:
    each model's trajectory is its own."""
    x, y, rows = problem()
    cfg, model = TrainConfig(epochs=3), models.har()
    start = InitialWeights.of(models.har, x[0]).draw_grid(rows.shape, 1)[0]
    together = torch_many.train_many(model, x, y, rows, start, cfg)
    for g, m in np.ndindex(rows.shape):
        alone = torch_many.train_many(model, x[g:g + 1], y[g:g + 1], rows[g:g + 1, m:m + 1],
                                      [p[g:g + 1, m:m + 1] for p in start], cfg)
        for t, a in zip(together, alone, strict=True):
            np.testing.assert_allclose(t[g, m], a[0, 0], atol=VMAP_VS_ALONE_ATOL, rtol=0)
        assert not np.allclose(together[0][g, m], start[0][g, m])  # it did train


def test_an_empty_window_stays_where_it_started():
    x, y, rows = problem(groups=1)
    rows[0, 2] = 0
    cfg, model = TrainConfig(epochs=2), models.har()
    start = InitialWeights.of(models.har, x[0]).draw_grid(rows.shape, 0)[0]
    end = torch_many.train_many(model, x, y, rows, start, cfg)
    for s, e in zip(start, end, strict=True):
        np.testing.assert_array_equal(s[0, 2], e[0, 2])


def test_windows_too_long_for_float_positions_are_refused():
    """The windows' masks compare row positions as float32 (exact below 2**24): a longer series is refused, not
    masked wrongly."""
    x = np.empty((1, 2 ** 24, 3), np.float32)  # never touched: the check reads its shape
    with pytest.raises(ValueError, match="exact below 2"):
        torch_many.train_many(models.har(), x, x[..., :1], np.ones((1, 1)), [], TrainConfig(epochs=1))


def test_predict_many_is_each_models_own_forward():
    x, y, rows = problem()
    start = InitialWeights.of(models.har, x[0]).draw_grid(rows.shape, 0)[0]
    params = torch_many.train_many(models.har(), x, y, rows, start, TrainConfig(epochs=1))
    x_next = np.random.default_rng(1).normal(size=rows.shape + (5, 3)).astype(np.float32)
    got = torch_many.predict_many(models.har(), params, x_next)
    np.testing.assert_allclose(got, x_next @ params[0] + params[1][:, :, None], atol=1e-5, rtol=0)


# The seeds trainer: each seed as the torch loop trains it alone; what cannot be stacked is refused.
from keras_side.spec import SpecError  # noqa: E402
from keras_side.zoo import ZOO  # noqa: E402
from native.torch import loop  # noqa: E402
from tests.native.many_seeds import (check_each_seed_trains_as_alone,  # noqa: E402
                                     check_predict_seeds_of_heads_of_different_widths, zoo_data)
from tests.native import floors as floors_check  # noqa: E402


def loop_alone(model, data, cfg):
    return loop.train(model, data, cfg.replace(validate=False))


@pytest.mark.parametrize("name", ["bn_mlp", "lstm", "har_recent", "two_horizons"])
def test_each_seed_trains_as_the_loop_trains_it_alone(panel, name):
    check_each_seed_trains_as_alone(torch_many, loop_alone, panel, name)


def test_each_learning_rate_of_a_sweep_trains_as_alone(panel):
    check_each_seed_trains_as_alone(torch_many, loop_alone, panel, "har", seeds=(1, 2), learning_rates=[0.003, 0.03])


@pytest.mark.parametrize("name, spec, says", [
    ("har", {"clipnorm": 1.0}, "clip them together"),
    ("har", {"global_clipnorm": 1.0}, "clip them together"),
    ("dropout_mlp", {}, "draws its own"),
    ("constrained_mlp", {}, "has a constraint \\(MaxNorm\\)"),
])
def test_what_would_tie_the_models_together_is_refused(panel, name, spec, says):
    from tests.native.loops import constrained_mlp

    data = zoo_data(panel, "har" if name == "constrained_mlp" else name)
    init = InitialWeights.of(constrained_mlp if name == "constrained_mlp" else ZOO[name].builder(), data.x_train)
    cfg = TrainConfig(epochs=1).replace(**spec)
    with pytest.raises(SpecError, match=says):
        torch_many.train_seeds(init.model, data, cfg, init.draw([0, 1]), torch_many.seed_orders(cfg, [0, 1],
                                                                                                 data.n_train))


@pytest.mark.parametrize("model", floors_check.MODELS["torch"])
def test_the_bench_floor_is_the_loop_without_keras(panel, model):
    from compare.speed import floors

    floors_check.check_floor_trains_as_the_loop(panel, model, floors.torch_raw, loop.train)


def test_the_stage_breakdown_times_every_stage_of_both_steps(har):
    from compare.speed import floors

    found = floors.torch_stages(models.ensure_built(models.har(), har.x_train), har, TrainConfig(epochs=1))
    assert set(found) == {"keras", "raw"} and all(list(row) == list(floors.STAGES) for row in found.values())
    assert all(v > 0 for row in found.values() for v in row.values())


def test_the_compiled_walk_forward_trainer_equals_the_eager_one():
    """#15: the stacked trainer's steps compiled (`torch.func.grad` and torch's functional Adam in one graph,
    `STEPS_PER_CALL` steps a call) against autograd's backward and `torch.optim.Adam`'s fused kernel, eager: the same
    weights (each model as alone). 3 batches an epoch: with an odd count a last chunk of one step, a graph of its own;
    each graph compiled once: traced before Keras's scope slot existed, the first would guard on its absence and
    recompile."""
    x, y, rows = problem()
    cfg, model = TrainConfig(epochs=3), models.har()
    start = InitialWeights.of(models.har, x[0]).draw_grid(rows.shape, 1)[0]
    epochs = []
    keras.utils.clear_session()  # as in a fresh worker: no scope has run yet
    counters.clear()
    compiled = torch_many.train_many(model, x, y, rows, start, cfg, compile=True, epoch_seconds=epochs)
    n_batches, per_call = -(-x.shape[1] // cfg.batch_size), torch_many.STEPS_PER_CALL
    chunk_lengths = {min(per_call, n_batches - b) for b in range(0, n_batches, per_call)}
    assert len(epochs) == 3 and counters["stats"]["unique_graphs"] == len(chunk_lengths) == 2
    eager = torch_many.train_many(model, x, y, rows, start, cfg)
    for e, c in zip(eager, compiled, strict=True):
        np.testing.assert_allclose(c, e, atol=TRACED_VS_FUSED_ADAM_ATOL, rtol=0)


def test_the_walk_forward_trainer_is_a_plain_loop_over_each_window():
    """One model of the stacked trainer against the loop it stands for, written here in plain torch: each epoch the
    generator's permutation of every row, batches of 128 (the last one short), the mean squared error over the
    batch's rows inside the window (none inside: a zero gradient, and Adam still steps), `torch.optim.Adam`."""
    x, y, rows = problem(groups=1, models_per_group=2, n=300)  # 3 batches an epoch
    cfg = TrainConfig(epochs=3)
    start = InitialWeights.of(models.har, x[0]).draw_grid(rows.shape, 2)[0]
    trained = torch_many.train_many(models.har(), x, y, rows, start, cfg)
    for m in range(rows.shape[1]):
        kernel, bias = (torch.tensor(p[0, m]).requires_grad_() for p in start)
        adam = torch.optim.Adam([kernel, bias], lr=cfg.learning_rate, betas=(cfg.beta_1, cfg.beta_2), eps=cfg.epsilon)
        shuffle, xs, ys = torch.Generator().manual_seed(cfg.seed), torch.tensor(x[0]), torch.tensor(y[0])
        for _ in range(cfg.epochs):
            order = torch.randperm(x.shape[1], generator=shuffle)
            for batch in order.split(cfg.batch_size):
                inside = batch[batch < int(rows[0, m])]
                adam.zero_grad()
                error = ((xs[inside] @ kernel + bias - ys[inside]) ** 2).sum() / max(len(inside), 1)
                error.backward()
                adam.step()
        np.testing.assert_allclose(trained[0][0, m], kernel.detach().numpy(), atol=VMAP_VS_ALONE_ATOL, rtol=0)
        np.testing.assert_allclose(trained[1][0, m], bias.detach().numpy(), atol=VMAP_VS_ALONE_ATOL, rtol=0)


def test_predict_seeds_of_heads_of_different_widths(panel):
    check_predict_seeds_of_heads_of_different_widths(torch_many, panel)
