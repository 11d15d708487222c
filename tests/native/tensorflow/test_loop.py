import numpy as np

from keras_side import models
from keras_side.determinism import seed_everything
from keras_side.spec import TrainConfig, keras_loss, keras_optimizer
from native.tensorflow import loop as tf_loop


def test_step_traces_once_for_every_batch_size(har):
    seed_everything(0)
    model = models.har()
    optimizer = keras_optimizer(TrainConfig())
    optimizer.build(model.trainable_variables)
    step = tf_loop.make_step(model, keras_loss(TrainConfig()), optimizer, har.x_train, har.y_train)
    for rows in (slice(0, 128), slice(128, 256), slice(0, 37)):
        step(har.x_train[rows], har.y_train[rows])
    assert step.experimental_get_tracing_count() == 1


def test_batch_orders_are_seeded_permutations(har):
    cfg = TrainConfig(epochs=2)
    first, again = tf_loop.batch_orders(cfg, 50), tf_loop.batch_orders(cfg, 50)
    assert sorted(first[0].numpy()) == list(range(50))
    np.testing.assert_array_equal(first[1].numpy(), again[1].numpy())
    assert not np.array_equal(first[0].numpy(), first[1].numpy())
