"""native.jax.loop, the reference loop: what the engine-parametrized tests/native/test_loops.py does not ask."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from keras_side import models
from keras_side.data import batch_slices
from keras_side.determinism import seed_everything
from keras_side.losses import keras_loss
from keras_side.spec import TrainConfig
from native.jax import host as jax_host
from native.jax import loop as jax_loop
from native.jax import optim


def test_step_compiles_once_per_batch_shape(har):
    """Full batches and the short last one: two shapes, two compilations, however many epochs."""
    cfg = TrainConfig(epochs=2)
    seed_everything(0)
    model = models.har()
    optimizer = optim.build(cfg)
    step = jax_loop.make_step(model, keras_loss(cfg), optimizer)
    state = jax_loop.init_state(model, optimizer)
    for order in np.asarray(jax_loop.batch_orders(cfg, har.n_train)):
        for rows in batch_slices(har.n_train, cfg.batch_size):
            state, _ = step(state, jax_loop.rows_of(har, order[rows]))
    assert har.n_train % cfg.batch_size and step._cache_size() == 2


def test_batches_cover_every_row_once_with_no_padding(har):
    cfg = TrainConfig(epochs=3)
    for order in np.asarray(jax_loop.batch_orders(cfg, har.n_train)):
        batches = [order[rows] for rows in batch_slices(har.n_train, cfg.batch_size)]
        assert [len(b) for b in batches] == [128] * (har.n_train // 128) + [har.n_train % 128]
        assert sorted(np.concatenate(batches)) == list(range(har.n_train))


def test_the_compiled_step_is_compiled_before_the_epochs_and_timed_apart(har, monkeypatch):
    """Both batch shapes are compiled before the first epoch (`compile_step`), so the epochs' time is training: no
    step of an epoch traces."""
    traced = []
    make_step = jax_loop.make_step

    def spy(*args):
        step = make_step(*args)
        traced.append(step)
        return step

    monkeypatch.setattr(jax_loop, "make_step", spy)
    seed_everything(0)
    result = jax_loop.train(models.har(), har, TrainConfig(epochs=2, validate=False))
    assert traced[0]._cache_size() == 2 and result.compile_seconds > 0 and result.train_seconds > 0


def test_noise_seed_state_is_threaded_and_written_back(har):
    seed_everything(0)
    model = models.ensure_built(models.noisy_har(), har.x_train)
    before = [np.asarray(v.value) for v in model.non_trainable_variables]
    jax_loop.train(model, har, TrainConfig(epochs=1))
    after = [np.asarray(v.value) for v in model.non_trainable_variables]
    assert before and any(not np.array_equal(a, b) for a, b in zip(before, after))


def test_vmap_over_assets_equals_a_loop(panel):
    from compare.data import panel as data

    assets = sorted(panel["activo"].unique())
    sets = [data.prepare(panel, asset=a) for a in assets]
    rows = min(d.n_train for d in sets)
    xs = jnp.stack([d.x_train[:rows] for d in sets])
    ys = jnp.stack([d.y_train[:rows] for d in sets])
    seed_everything(0)
    model = models.har()
    trainable = [v.value for v in model.trainable_variables]
    loss, grads = jax_host.panel_loss_and_grad(model)(trainable, xs, ys)
    one = jax.value_and_grad(lambda tv, x, y: jnp.mean((model.stateless_call(tv, [], x)[0] - y) ** 2))
    looped = [one(trainable, x, y) for x, y in zip(xs, ys)]
    np.testing.assert_allclose(loss, np.mean([v for v, _ in looped]), rtol=1e-6)
    for i, g in enumerate(grads):
        np.testing.assert_allclose(g, np.mean([gs[i] for _, gs in looped], axis=0), rtol=1e-5, atol=1e-7)


def test_the_panel_program_calls_a_model_without_a_training_flag_as_keras_does():
    """A subclassed model whose `call` takes no `training` (a TypeError from `stateless_call` before)."""
    import keras

    class NoFlag(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(1)

        def call(self, x):
            return self.dense(x)

    model = models.ensure_built(NoFlag(), np.zeros((1, 3), np.float32))
    xs, ys = jnp.ones((2, 4, 3)), jnp.zeros((2, 4, 1))
    loss, grads = jax_host.panel_loss_and_grad(model)([v.value for v in model.trainable_variables], xs, ys)
    want = np.mean((np.asarray(model(np.ones((4, 3), np.float32)))) ** 2)
    assert float(loss) == pytest.approx(want, rel=1e-6) and len(grads) == 2
    xs = jnp.arange(24.0).reshape(2, 4, 3) / 10  # rows that differ, so a broadcast (n, n) would differ too
    program, trainable = jax_host.panel_loss_and_grad(model), [v.value for v in model.trainable_variables]
    flat_targets, _ = program(trainable, xs, jnp.arange(8.0).reshape(2, 4))  # (n,) targets: as fit takes them
    column_targets, _ = program(trainable, xs, jnp.arange(8.0).reshape(2, 4, 1))  # (it broadcast to (n, n))
    assert float(flat_targets) == float(column_targets)
