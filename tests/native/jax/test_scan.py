"""native.jax.scan: the reference loop's step, every epoch in one compiled `lax.scan`, tested against the loop."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from compare.referee.tolerances import SCAN_VS_LOOP_ATOL
from keras_side import models
from keras_side.determinism import seed_everything
from keras_side.losses import keras_loss
from keras_side.metrics import keras_metrics
from keras_side.spec import SpecError, TrainConfig
from native.jax import loop as jax_loop
from native.jax import optim, scan
from tests.native.loops import flat


def test_the_fused_scan_ends_where_the_reference_loop_ends(har):
    cfg = TrainConfig(epochs=5, metrics=("mae",))
    results = []
    for train in (jax_loop.train, scan.train):
        seed_everything(0)
        results.append(train(models.har(), har, cfg))
    looped, fused = results
    assert fused.path == "jax-native-scan"
    np.testing.assert_allclose(flat(fused.weights), flat(looped.weights), atol=SCAN_VS_LOOP_ATOL, rtol=0)
    np.testing.assert_allclose(fused.val_loss, looped.val_loss, rtol=1e-5)
    np.testing.assert_allclose(fused.train_loss, looped.train_loss, rtol=1e-5)
    assert sorted(fused.metrics) == sorted(looped.metrics) == ["mae", "val_mae"]
    for name, values in looped.metrics.items():
        np.testing.assert_allclose(fused.metrics[name], values, rtol=1e-5, err_msg=name)


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
    train_xy, val = scan.arrays(har)
    step = jax_loop.make_step(model, loss_fn, optimizer, metrics)
    evaluate = jax.jit(scan.make_evaluate(model, loss_fn, metrics))
    orders = jnp.asarray(np.asarray(jax_loop.batch_orders(cfg, har.n_train)))
    run = jax.jit(scan.make_fused(step, evaluate, metrics, train_xy, val, cfg))
    untouched, (losses, _, _) = run(state, orders, 0)
    assert all((a == b).all() for a, b in zip(jax.tree.leaves(untouched), jax.tree.leaves(state)))
    assert (losses == 0).all()
    two = jax.jit(scan.make_fused(step, evaluate, metrics, train_xy, val, cfg.replace(epochs=2)))
    want, (want_losses, _, _) = two(state, orders[:2])
    got, (got_losses, _, _) = run(state, orders, 2)
    assert all((a == b).all() for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)))
    assert (got_losses[:2] == want_losses).all() and got_losses[2] == 0


def test_the_scan_driver_times_training_after_a_first_run_that_trains_nothing(har, monkeypatch):
    """The driver runs its program twice: first with no epoch (its seconds apart, inside the compile time), then
    with every epoch, the one it times."""
    asked = []
    make_fused = scan.make_fused

    def spy(*args):
        run = make_fused(*args)

        def counted(state, orders, epochs=None):
            asked.append(epochs)
            return run(state, orders, epochs)
        return counted

    monkeypatch.setattr(scan, "make_fused", spy)
    seed_everything(0)
    result = scan.train(models.har(), har, TrainConfig(epochs=2))
    assert len(asked) == 1 and asked[0] is not None  # traced once, the epoch count an argument of the program
    assert 0 < result.first_run_seconds < result.compile_seconds and result.train_seconds > 0


def test_batches_are_cut_as_fit_cuts_them(har):
    cfg = TrainConfig(epochs=3)
    for order in jax_loop.batch_orders(cfg, har.n_train):
        full, rest = scan.split_batches(order, cfg.batch_size)
        assert full.shape == (har.n_train // 128, 128) and rest.shape == (har.n_train % 128,)
        assert sorted(np.concatenate([np.ravel(full), rest])) == list(range(har.n_train))


@pytest.mark.parametrize("option,match", [({"on_step": print}, "nothing can look in after a step"),
                                          ({"checkpoint": "ckpt"}, "no epoch ends where a checkpoint"),
                                          ({}, "cannot stop early")], ids=["on_step", "checkpoint", "patience"])
def test_the_fused_scan_refuses_what_needs_python_between_steps(har, option, match):
    cfg = TrainConfig(epochs=2, patience=None if option else 1)
    with pytest.raises(SpecError, match=match):
        scan.train(models.har(), har, cfg, **option)


def test_the_fast_paths_take_a_users_arrays_and_the_scan_refuses_a_loader_in_one_line():
    """What the reference loop takes as `fit` does (inputs as a dict by name, sample weights, validation_data; 96
    rows in batches of 40, the last one short), the fast paths take too: the convolution-as-matmul loop ends on the
    reference loop's weights to the bit (the model has no convolution), the fused scan within `SCAN_VS_LOOP_ATOL`. A
    loader, whose batches the scan cannot cut from whole arrays, is one line naming the reference loop, refused
    before the loader is read."""
    from native.jax import fast
    from tests.native.loops import Unread, engines_loader, fresh_users_model, users_arrays

    x, y, w, val = users_arrays()
    cfg = TrainConfig(epochs=3, batch_size=40, learning_rate=0.05)
    looped, matmul, fused = (train(fresh_users_model(), (x, y, w), cfg, validation_data=val)
                             for train in (jax_loop.train, fast.train, scan.train))
    assert (matmul.path, fused.path) == ("jax-native-fast", "jax-native-scan") and fused.units == "as given"
    for mine, reference in zip(matmul.weights, looped.weights, strict=True):
        np.testing.assert_array_equal(mine, reference)
    np.testing.assert_allclose(flat(fused.weights), flat(looped.weights), atol=SCAN_VS_LOOP_ATOL, rtol=0)
    np.testing.assert_allclose(fused.val_loss, looped.val_loss, rtol=1e-5)
    assert matmul.val_loss == looped.val_loss and len(fused.val_loss) == 3

    for loader in (engines_loader(x, y, w, 40), Unread()):
        with pytest.raises(SpecError, match=r"^the path jax-native-scan cuts its batches from whole arrays and "
                                            r"cannot train on a loader of batches; .* on the path jax-native$"):
            scan.train(fresh_users_model(), loader, cfg)
    with pytest.raises(SpecError, match=r"^the path jax-native-scan .* give validation_data=\(x_val, y_val\) arrays"):
        scan.train(fresh_users_model(), (x, y), cfg, validation_data=Unread())
    # the convolution-as-matmul loop is the reference loop's, a loader included
    looped, matmul = (train(fresh_users_model(), engines_loader(x, y, w, 40), cfg) for train in
                      (jax_loop.train, fast.train))
    for mine, reference in zip(matmul.weights, looped.weights, strict=True):
        np.testing.assert_array_equal(mine, reference)
