"""Your first training loop, on JAX: the HAR model trained by hand, as in the Keras guide "Writing a training
loop from scratch in JAX". Run it:

    python -m native.jax.first_loop

Corsi's HAR predicts tomorrow's log realized variance from the means of the last 1, 5 and 22 days: a `Dense(1)`.
Least squares (OLS) gives its best slopes in closed form, so the loop ends by printing its slopes beside OLS's.
`diff native/torch/first_loop.py native/jax/first_loop.py` shows only the engine; docs/lesson.md reads it line by
line, and `native/jax/loop.py` is the same loop with everything `fit` adds.
"""
import os

os.environ["KERAS_BACKEND"] = "jax"  # Keras reads it once, at its first import

import keras  # noqa: E402
import jax  # noqa: E402
import optax  # noqa: E402

from compare.data import panel, reference, synthetic  # noqa: E402
from keras_side import models  # noqa: E402
from native.jax.optim import keras_adam  # noqa: E402

EPOCHS, BATCH_SIZE, LEARNING_RATE, SEED = 40, 128, 0.01, 0


def main():
    # 1. Data: the features of each day and the next day's log RV, standardized with the training rows' statistics
    prices = synthetic.simulate(SEED)
    data = panel.prepare(prices)
    x, y = jax.numpy.asarray(data.x_train), jax.numpy.asarray(data.y_train)

    # 2. Model: Keras builds it; on JAX it is a pure function of its weights, `model.stateless_call`
    keras.utils.set_random_seed(SEED)
    model = models.har()

    # 3. Optimizer and loss: Adam as Keras computes it (optax's own adds its epsilon elsewhere), the mean squared error
    optimizer, loss_fn = keras_adam(LEARNING_RATE), keras.losses.MeanSquaredError()

    # 4. One step: forward, loss, gradients, update, a pure function of the state, compiled once by jax.jit
    @jax.jit
    def train_step(trainable, non_trainable, opt_state, x_batch, y_batch):
        def compute_loss(trainable):  # of the trainable weights alone: the gradient is taken with respect to them
            y_pred, updated = model.stateless_call(trainable, non_trainable, x_batch, training=True)
            return loss_fn(y_batch, y_pred), updated  # the state a layer moves (BatchNorm, Dropout's seed), new
        (loss, non_trainable), grads = jax.value_and_grad(compute_loss, has_aux=True)(trainable)
        updates, opt_state = optimizer.update(grads, opt_state, trainable)
        return (optax.apply_updates(trainable, updates), non_trainable, opt_state), loss

    # 5. The epochs: every row once per epoch, in a new order, a batch at a time; the state goes in and comes out
    trainable = [v.value for v in model.trainable_variables]
    state = (trainable, [v.value for v in model.non_trainable_variables], optimizer.init(trainable))
    for epoch, key in enumerate(jax.random.split(jax.random.key(SEED), EPOCHS)):
        order = jax.random.permutation(key, len(y))
        for start in range(0, len(y), BATCH_SIZE):
            rows = order[start:start + BATCH_SIZE]
            state, loss = train_step(*state, x[rows], y[rows])
        print(f"epoch {epoch + 1}: last batch's loss {float(loss):.4f}")
    for variable, value in zip(model.trainable_variables + model.non_trainable_variables, state[0] + state[1]):
        variable.assign(value)  # the trained state back into the Keras model

    # 6. The answer: the slopes in log-RV units, beside least squares' on the same rows
    _, slopes = data.scaling.to_original(*model.get_weights())  # from the kernel and bias
    ols = reference.ols_for(prices, data.asset, panel.DEFAULT_SPLIT)
    print("slopes (d1, s5, m22):", slopes.round(3), " OLS:", ols.slopes.round(3))
    return model, data


if __name__ == "__main__":
    main()
