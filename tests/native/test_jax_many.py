import jax
import jax.numpy as jnp
import numpy as np

from compare.tolerances import VMAP_VS_ALONE_ATOL
from keras_side import models
from keras_side.config import TrainConfig
from native import jax_many


def test_valid_first_is_a_stable_partition():
    perm = jnp.array([5, 0, 3, 1, 4, 2])
    mask = jnp.array([1, 1, 0, 1, 0, 0], jnp.float32)  # rows 0, 1, 3 are valid
    assert jax_many.valid_first(perm, mask).tolist() == [0, 3, 1, 5, 4, 2]


def problem(models_count=6, rows=400, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(models_count, rows, 3)).astype(np.float32)
    y = (x @ rng.normal(size=(3, 1)) + 0.1 * rng.normal(size=(models_count, rows, 1))).astype(np.float32)
    lengths = rng.integers(100, rows, size=models_count)
    mask = (np.arange(rows)[None] < lengths[:, None]).astype(np.float32)
    return x, y * mask[..., None], mask


def test_every_vmapped_model_equals_the_model_trained_alone():
    x, y, mask = problem()
    cfg = TrainConfig(epochs=4)
    model = models.har()
    keys = jax.random.split(jax.random.key(0), len(x))
    compiled, args = jax_many.train_many(model, x, y, mask, keys, cfg)
    together = compiled(*args)
    fit_one = jax.jit(jax_many.make_fit_one(model, cfg, x.shape[1]))
    for m in range(len(x)):
        start = [p[m] for p in args[0]]
        alone = fit_one(start, x[m], y[m], mask[m], args[4])
        for a, t in zip(alone, together, strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(t[m]), atol=VMAP_VS_ALONE_ATOL, rtol=0)
        assert not np.allclose(np.asarray(alone[0]), np.asarray(start[0]))  # it did train


def test_padding_rows_change_nothing():
    """A model's result does not depend on what sits in its masked rows."""
    x, y, mask = problem(models_count=2)
    noisy_x = np.where(mask[..., None] > 0, x, 1e3).astype(np.float32)
    cfg, model = TrainConfig(epochs=2), models.har()
    keys = jax.random.split(jax.random.key(1), 2)
    clean = jax_many.train_many(model, x, y, mask, keys, cfg)
    noisy = jax_many.train_many(model, noisy_x, y, mask, keys, cfg)
    for a, b in zip(clean[0](*clean[1]), noisy[0](*noisy[1]), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
