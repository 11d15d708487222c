import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np

from compare.referee.tolerances import SHARDED_ATOL, VMAP_VS_ALONE_ATOL
from keras_side import models
from keras_side.initial import InitialWeights
from keras_side.spec import SpecError, TrainConfig
from native.jax import many as jax_many


def problem(groups=2, models_per_group=3, n=400, seed=0):
    """Groups of models sharing x and y, each model on its own expanding window (a prefix of the rows)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(groups, n, 3)).astype(np.float32)
    y = (x @ rng.normal(size=(3, 1)) + 0.1 * rng.normal(size=(groups, n, 1))).astype(np.float32)
    rows = rng.integers(100, n + 1, size=(groups, models_per_group)).astype(np.int32)
    params = InitialWeights.of(models.har, x[0]).draw_grid(rows.shape, seed)[0]  # the HAR's own initializers
    return x, y, rows, params


def test_an_epoch_sees_every_row_once():
    x = jnp.arange(10, dtype=jnp.float32)[:, None] * jnp.ones((1, 3))
    xb, yb, index = jax_many.epoch_batches(jax.random.key(3), x, x[:, :1], batch_size=4)
    assert xb.shape == (3, 4, 3) and index.shape == (3, 4)
    assert sorted(index.ravel().tolist()) == list(range(10)) + [10, 10]  # two padding positions, index N
    np.testing.assert_array_equal(np.asarray(xb[..., 0]), np.where(index < 10, index, 0))


def test_every_vmapped_model_equals_the_model_trained_alone():
    x, y, rows, params = problem()
    cfg, model = TrainConfig(epochs=4), models.har()
    compiled, args = jax_many.compile_many(model, x, y, rows, params, cfg)
    together = compiled(*args)
    fit_one = jax.jit(jax_many.make_fit_one(model, cfg))
    for g, m in np.ndindex(rows.shape):
        start = [p[g, m] for p in args[0]]
        alone = fit_one(start, x[g], y[g], rows[g, m], args[4])
        for a, t in zip(alone, together, strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(t[g, m]), atol=VMAP_VS_ALONE_ATOL, rtol=0)
        assert not np.allclose(np.asarray(alone[0]), np.asarray(start[0]))  # it did train
    for a, t in zip(jax_many.train_many(model, x, y, rows, params, cfg), together, strict=True):
        np.testing.assert_array_equal(a, np.asarray(t))  # the verb is the compiled program, run


def test_rows_outside_a_window_change_nothing():
    """A model's result does not depend on the rows after its window, nor on an empty window beside it."""
    x, y, rows, params = problem(groups=1)
    rows[0, 1] = 0  # an empty window: no rows, no update
    noisy = x.copy()
    noisy[0, rows[0, 0]:] = 1e3
    cfg, model = TrainConfig(epochs=2), models.har()
    clean = jax_many.compile_many(model, x, y, rows, params, cfg)
    dirty = jax_many.compile_many(model, noisy, y, rows, params, cfg)
    clean_params, dirty_params = clean[0](*clean[1]), dirty[0](*dirty[1])
    for a, b in zip(clean_params, dirty_params, strict=True):
        np.testing.assert_array_equal(np.asarray(a)[0, 0], np.asarray(b)[0, 0])
    for start, end in zip(clean[1][0], clean_params, strict=True):
        np.testing.assert_array_equal(np.asarray(start)[0, 1], np.asarray(end)[0, 1])


def test_sharded_over_two_devices_equals_one_device():
    assert len(jax.devices()) >= 2, "tests/native/conftest.py asks XLA for two host devices"
    x, y, rows, params = problem(models_per_group=4)
    cfg, model = TrainConfig(epochs=2), models.har()
    one = jax_many.compile_many(model, x, y, rows, params, cfg)
    two = jax_many.compile_many(model, x, y, rows, params, cfg, devices=jax.devices()[:2])
    assert len(two[1][0][0].sharding.device_set) == 2
    # equal to the bit on both machines seen so far; a CPU whose dot sums 4 models' terms in another order than 8
    # would not be (SHARDED_ATOL), as the walk-forward's forecasts were not on the second
    for a, b in zip(one[0](*one[1]), two[0](*two[1]), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=SHARDED_ATOL, rtol=0)


def test_predict_many_is_each_models_own_forward():
    x, y, rows, params = problem()
    compiled, args = jax_many.compile_many(models.har(), x, y, rows, params, TrainConfig(epochs=1))
    params = compiled(*args)
    x_next = np.random.default_rng(1).normal(size=rows.shape + (5, 3)).astype(np.float32)
    got = jax_many.predict_many(models.har(), params, x_next)
    kernel, bias = (np.asarray(p) for p in params)
    np.testing.assert_allclose(got, x_next @ kernel + bias[:, :, None], atol=1e-5, rtol=0)


# The seeds trainer: any zoo model, each seed as the fused scan driver trains it alone.
import pytest  # noqa: E402

from native.jax import loop, scan  # noqa: E402
from tests.native.many_seeds import (check_each_seed_trains_as_alone,  # noqa: E402
                                     check_predict_seeds_of_heads_of_different_widths)
from tests.native import floors as floors_check  # noqa: E402
from tests.tiers import rows  # noqa: E402


def scan_alone(model, data, cfg):
    return scan.train(model, data, cfg.replace(validate=False))


# make test: the convolution's 3-D inputs stand for the LSTM's.
@pytest.mark.parametrize("name", rows(["bn_mlp", "dropout_mlp", "lstm", "conv1d", "har_recent", "two_horizons"],
                                      fast=["bn_mlp", "dropout_mlp", "conv1d", "har_recent", "two_horizons"]))
def test_each_seed_trains_as_the_scan_driver_trains_it_alone(panel, name):
    """3-D inputs (the LSTM), BatchNorm's statistics and Dropout's seed state carried per model, sample weights,
    two outputs: what the walk-forward trainer could not take. And a convolution, which every model computes as the
    loop does (a matmul over the patches: `native.jax.convolution`), predictions too."""
    check_each_seed_trains_as_alone(jax_many, scan_alone, panel, name)


def test_a_recurrent_dropouts_seed_state_moves_at_each_validation_as_in_the_loop(panel):
    """An RNN draws its dropout masks in inference too, so each epoch's validation moves its seed state (the loop keeps
    it, as fit does): the seeds trainer, which validated once at the end, fell a draw behind an epoch (6e-2)."""
    import keras

    from keras_side.initial import InitialWeights
    from tests.native.many_seeds import alone, zoo_data

    data = zoo_data(panel, "lstm")
    data = dataclasses.replace(data, x_val=data.x_val[:100], y_val=data.y_val[:100])  # a validation is what it needs

    def build():
        return keras.Sequential([keras.Input(data.x_train.shape[1:]),
                                 keras.layers.LSTM(4, dropout=0.3, recurrent_dropout=0.3, seed=3),
                                 keras.layers.Dense(1)])

    cfg, seeds = TrainConfig(epochs=2), (3, 4)
    init = InitialWeights.of(build, data.x_train)
    start = init.draw(seeds)
    trained = jax_many.train_seeds(init.model, data, cfg, start, jax_many.seed_orders(cfg, seeds, data.n_train))
    for i, seed in enumerate(seeds):
        model = alone(build(), start, i)
        scan.train(model, data, cfg.replace(seed=seed))
        variables = [*model.trainable_variables, *model.non_trainable_variables]  # the seed state too
        for variable, value in zip(variables, [*trained["trainable"], *trained["non_trainable"]], strict=True):
            np.testing.assert_allclose(np.asarray(value[i]).astype(float),
                                       np.asarray(variable.value).astype(float), atol=VMAP_VS_ALONE_ATOL, rtol=0)


@pytest.mark.parametrize("n", [1, 2, 300, 2000])  # one row: no round; from 1,626 rows on (HAR: 2,900): two
def test_the_seeds_orders_are_the_loops_own_bit_for_bit(n):
    """`seed_orders` sorts jax.random's keys in NumPy: every order must be the one `loop.batch_orders` draws with
    that seed (jax.random.permutation), seeds at the ends of uint32; past it, the spec's own error (JAX's key would
    wrap)."""
    seeds, cfg = [0, 7, 2**31, 2**32 - 1], TrainConfig(epochs=3)
    got = jax_many.seed_orders(cfg, seeds, n)
    assert got.shape == (len(seeds), cfg.epochs, n)
    for order, seed in zip(got, seeds, strict=True):
        np.testing.assert_array_equal(order, np.asarray(loop.batch_orders(cfg.replace(seed=seed), n)))
    numpy = cfg.replace(batch_order="numpy")
    np.testing.assert_array_equal(jax_many.seed_orders(numpy, seeds[:2], n)[1],
                                  np.asarray(loop.batch_orders(numpy.replace(seed=7), n)))
    with pytest.raises(SpecError, match=re.escape("seed must be a whole number from 0 to 2**32 - 1")):
        jax_many.seed_orders(cfg, [1, 2**32 + 3], n)


def test_each_learning_rate_of_a_sweep_trains_as_alone(panel):
    check_each_seed_trains_as_alone(jax_many, scan_alone, panel, "har", seeds=(1, 2), learning_rates=[0.003, 0.03])


@pytest.mark.parametrize("driver", ["loop", "scan"])
@pytest.mark.parametrize("model", rows(floors_check.MODELS["jax"], fast=["har", "conv1d", "dropout_mlp"]))
def test_the_bench_floors_are_the_loop_without_keras(panel, model, driver):
    from compare.speed import floors

    floors_check.check_floor_trains_as_the_loop(panel, model, lambda *a, **k: floors.jax_raw(*a, driver=driver, **k),
                                                {"loop": loop.train, "scan": scan.train}[driver])


def test_predict_seeds_of_heads_of_different_widths(panel):
    check_predict_seeds_of_heads_of_different_widths(jax_many, panel)
