import jax
import jax.numpy as jnp
import numpy as np
import pytest

from compare.referee.tolerances import SCAN_VS_LOOP_ATOL
from keras_side import models
from keras_side.config import take
from keras_side.spec import TrainConfig, keras_loss, keras_metrics
from keras_side.determinism import seed_everything
from native.jax import host as jax_host
from native.jax import loop as jax_loop
from native.jax import optim
from tests.native.loops import flat


def test_scan_driver_equals_python_loop(har):
    cfg = TrainConfig(epochs=5, metrics=("mae",))
    results = []
    for driver in ("loop", "scan"):
        seed_everything(0)
        results.append(jax_loop.train(models.har(), har, cfg, driver=driver))
    loop, scan = results
    assert scan.path == "jax-native-scan"
    np.testing.assert_allclose(flat(scan.weights), flat(loop.weights), atol=SCAN_VS_LOOP_ATOL, rtol=0)
    np.testing.assert_allclose(scan.val_loss, loop.val_loss, rtol=1e-5)
    np.testing.assert_allclose(scan.train_loss, loop.train_loss, rtol=1e-5)
    assert sorted(scan.metrics) == sorted(loop.metrics) == ["mae", "val_mae"]
    for name, values in loop.metrics.items():
        np.testing.assert_allclose(scan.metrics[name], values, rtol=1e-5, err_msg=name)


@pytest.mark.parametrize("validate", [True, False])
def test_the_fused_program_runs_only_the_epochs_it_is_given(har, validate):
    """The scan driver's first run, inside its compile time, is the program with no epoch in it: the state comes
    back as it went in, to the bit. Given 2 of 3 epochs, it ends where a 2-epoch program ends, to the bit; with
    validation or without (NaN in its place)."""
    cfg = TrainConfig(epochs=3, metrics=("mae",), validate=validate)
    seed_everything(0)
    model = models.har()
    optimizer, loss_fn, metrics = optim.build(cfg), keras_loss(cfg), keras_metrics(cfg)
    models.ensure_built(model, har.x_train)
    state = jax_loop.init_state(model, optimizer, metrics)
    train_xy, val = jax_loop.arrays(har)
    step = jax_loop.make_step(model, loss_fn, optimizer, metrics)
    evaluate = jax.jit(jax_loop.make_evaluate(model, loss_fn, metrics))
    orders = jnp.asarray(np.asarray(jax_loop.batch_orders(cfg, har.n_train)))
    run = jax.jit(jax_loop.make_fused(step, evaluate, metrics, train_xy, val, cfg))
    untouched, (losses, _, _) = run(state, orders, 0)
    assert all((a == b).all() for a, b in zip(jax.tree.leaves(untouched), jax.tree.leaves(state)))
    assert (losses == 0).all()
    two = jax.jit(jax_loop.make_fused(step, evaluate, metrics, train_xy, val, cfg.replace(epochs=2)))
    want, (want_losses, _, _) = two(state, orders[:2])
    got, (got_losses, _, _) = run(state, orders, 2)
    assert all((a == b).all() for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)))
    assert (got_losses[:2] == want_losses).all() and got_losses[2] == 0


def test_the_scan_driver_times_training_after_a_first_run_that_trains_nothing(har, monkeypatch):
    """The driver runs its program twice: first with no epoch (its seconds apart, inside the compile time), then
    with every epoch, the one it times."""
    asked = []
    make_fused = jax_loop.make_fused

    def spy(*args):
        run = make_fused(*args)

        def counted(state, orders, epochs=None):
            asked.append(epochs)
            return run(state, orders, epochs)
        return counted

    monkeypatch.setattr(jax_loop, "make_fused", spy)
    seed_everything(0)
    result = jax_loop.train(models.har(), har, TrainConfig(epochs=2), driver="scan")
    assert len(asked) == 1 and asked[0] is not None  # traced once, the epoch count an argument of the program
    assert 0 < result.first_run_seconds < result.compile_seconds and result.train_seconds > 0


def test_step_compiles_once_per_batch_shape(har):
    """Full batches and the short last one: two shapes, two compilations, however many epochs."""
    cfg = TrainConfig(epochs=2)
    seed_everything(0)
    model = models.har()
    optimizer = optim.build(cfg)
    step = jax_loop.make_step(model, keras_loss(cfg), optimizer)
    state = jax_loop.init_state(model, optimizer)
    x, y = jnp.asarray(har.x_train), jnp.asarray(har.y_train)
    for order in jax_loop.batch_orders(cfg, har.n_train):
        full, rest = jax_loop.split_batches(order, cfg.batch_size)
        for rows in [*full, rest]:
            state, _ = step(state, (take(x, rows), y[rows]))
    assert har.n_train % cfg.batch_size and step._cache_size() == 2


def test_batches_cover_every_row_once_with_no_padding(har):
    cfg = TrainConfig(epochs=3)
    orders = jax_loop.batch_orders(cfg, har.n_train)
    for order in orders:
        full, rest = jax_loop.split_batches(order, cfg.batch_size)
        assert full.shape == (har.n_train // 128, 128) and rest.shape == (har.n_train % 128,)
        assert sorted(np.concatenate([np.ravel(full), rest])) == list(range(har.n_train))


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


def test_the_fused_scan_refuses_early_stopping(har):
    import pytest

    from keras_side.spec import SpecError

    with pytest.raises(SpecError, match="cannot stop early"):
        jax_loop.train(models.har(), har, TrainConfig(epochs=2, patience=1), driver="scan")
