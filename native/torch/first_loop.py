"""Your first training loop, on torch: the HAR model trained by hand, as in the Keras guide "Writing a training
loop from scratch in PyTorch". Run it:

    python -m native.torch.first_loop

Corsi's HAR predicts tomorrow's log realized variance from the means of the last 1, 5 and 22 days: a `Dense(1)`.
Least squares (OLS) gives its best slopes in closed form, so the loop ends by printing its slopes beside OLS's.
`diff native/torch/first_loop.py native/jax/first_loop.py` shows only the engine; docs/lesson.md reads it line by
line, and `native/torch/loop.py` is the same loop with everything `fit` adds.
"""
import os

os.environ["KERAS_BACKEND"] = "torch"  # Keras reads it once, at its first import

import keras  # noqa: E402
import torch  # noqa: E402

from compare.data import panel, reference, synthetic  # noqa: E402
from keras_side import models  # noqa: E402
from native.torch.optim import KerasAdam  # noqa: E402

EPOCHS, BATCH_SIZE, LEARNING_RATE, SEED = 40, 128, 0.01, 0


def main():
    # 1. Data: the features of each day and the next day's log RV, standardized with the training rows' statistics
    prices = synthetic.simulate(SEED)
    data = panel.prepare(prices)
    x, y = torch.as_tensor(data.x_train), torch.as_tensor(data.y_train)

    # 2. Model: Keras builds it; on torch it is a torch.nn.Module
    keras.utils.set_random_seed(SEED)
    model = models.har()

    # 3. Optimizer and loss: Adam as Keras computes it (torch's own adds its epsilon elsewhere), the mean squared error
    optimizer = KerasAdam(model.parameters(), lr=LEARNING_RATE)
    loss_fn = keras.losses.MeanSquaredError()

    # 4. One step: forward, loss, gradients, update
    def train_step(x_batch, y_batch):
        y_pred = model(x_batch, training=True)
        loss = loss_fn(y_batch, y_pred)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    # 5. The epochs: every row once per epoch, in a new order, a batch at a time
    generator = torch.Generator().manual_seed(SEED)
    for epoch in range(EPOCHS):
        order = torch.randperm(len(y), generator=generator)
        for start in range(0, len(y), BATCH_SIZE):
            rows = order[start:start + BATCH_SIZE]
            loss = train_step(x[rows], y[rows])
        print(f"epoch {epoch + 1}: last batch's loss {loss.item():.4f}")

    # 6. The answer: the slopes in log-RV units, beside least squares' on the same rows
    _, slopes = data.scaling.to_original(*model.get_weights())  # from the kernel and bias
    ols = reference.ols_for(prices, data.asset, panel.DEFAULT_SPLIT)
    print("slopes (d1, s5, m22):", slopes.round(3), " OLS:", ols.slopes.round(3))
    return model, data


if __name__ == "__main__":
    main()
