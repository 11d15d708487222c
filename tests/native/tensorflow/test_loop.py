import numpy as np

from keras_side import models
from keras_side.determinism import seed_everything
from keras_side.losses import keras_loss
from keras_side.metrics import EpochMetrics
from keras_side.optimizers import keras_optimizer
from keras_side.spec import TrainConfig
from native.tensorflow import loop as tf_loop


def test_step_traces_once_for_every_batch_size_and_gathers_its_rows(har):
    """The step takes the batch's row numbers and gathers the batch in its graph; its loss sum is rows × loss."""
    import tensorflow as tf

    seed_everything(0)
    model = models.har()
    optimizer = keras_optimizer(TrainConfig())
    optimizer.build(model.trainable_variables)
    step = tf_loop.make_step(model, keras_loss(TrainConfig()), optimizer, EpochMetrics(TrainConfig()),
                             (har.x_train, har.y_train, None))
    rows = np.arange(len(har.x_train))[::-1]  # not in order: the gather picks them
    for batch in (rows[0:128], rows[128:256], rows[:37]):
        expected = float(tf.reduce_mean(tf.square(model(har.x_train[batch]) - har.y_train[batch])))
        step.total.assign(0.0)
        np.testing.assert_allclose(float(step(batch)), expected, rtol=1e-6)
        np.testing.assert_allclose(float(step.total), expected * len(batch), rtol=1e-6)
    assert step.experimental_get_tracing_count() == 1


def test_batch_orders_are_seeded_permutations(har):
    cfg = TrainConfig(epochs=2)
    first, again = tf_loop.batch_orders(cfg, 50), tf_loop.batch_orders(cfg, 50)
    assert sorted(first[0]) == list(range(50)) and first[0].dtype == np.int64
    np.testing.assert_array_equal(first[1], again[1])
    assert not np.array_equal(first[0], first[1])


def test_keras_on_tensorflow_squares_an_embeddings_gradient_slices_unless_dense(panel):
    """An Embedding's gradient on TensorFlow is a tf.IndexedSlices, one slice per row of the batch. Keras's Adam
    squares the slices before repeated rows are summed, so its second moment is the sum of squares, not the square
    of the summed gradient that torch and JAX (dense gradients) use. One step from the same weights, checked against
    NumPy's Adam both ways; `TrainConfig(dense_gradients=True)` gives the standard update."""
    import tensorflow as tf

    from compare.data import panel as har_data

    data = har_data.prepare_panel(panel)
    x, y = [a[:128] for a in data.x_train], data.y_train[:128]

    def one_step(cfg):
        seed_everything(0)
        model = models.ensure_built(models.panel(), tuple(x))
        before = model.get_weights()[0]
        optimizer = keras_optimizer(cfg)
        optimizer.build(model.trainable_variables)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x, training=True) - y) ** 2)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        return before, model.get_weights()[0], grads[0]

    before, sparse_after, slices = one_step(TrainConfig())
    assert isinstance(slices, tf.IndexedSlices) and len(slices.indices) == 128  # repeated ids: 6 assets, 128 rows
    rows, values = slices.indices.numpy(), slices.values.numpy().astype(np.float64)
    summed = np.zeros_like(before, np.float64)
    squares = np.zeros_like(before, np.float64)
    np.add.at(summed, rows, values)
    np.add.at(squares, rows, values**2)
    cfg = TrainConfig()

    def adam_step(v):  # the first step from zero moments, Keras's epsilon hat
        m = (1 - cfg.beta_1) * summed
        alpha = cfg.learning_rate * np.sqrt(1 - cfg.beta_2) / (1 - cfg.beta_1)
        return before - alpha * m / (np.sqrt((1 - cfg.beta_2) * v) + cfg.epsilon)

    np.testing.assert_allclose(sparse_after, adam_step(squares), rtol=1e-5, atol=1e-7)
    _, dense_after, _ = one_step(TrainConfig(dense_gradients=True))
    np.testing.assert_allclose(dense_after, adam_step(summed**2), rtol=1e-5, atol=1e-7)
    gap = np.max(np.abs(sparse_after - dense_after))
    print(f"one Adam step on the Embedding: sparse against dense gradients {gap:.1e}")
    assert gap > 1e-3
