"""The exercises' training steps, each with one thing `fit` does left out. Copy this file into a module of your own
(`cp compare/exercises/steps.py my_steps.py`), fix the steps there, and check them with `python -m compare.exercises N
--steps my_steps` (docs/exercises.md); this copy stays broken, for the tests. Each engine's worker imports the
module, so each step imports its engine inside itself.

A torch step is `step(model, optimizer, x, y) -> loss`; a JAX one is `make_step(model, optimizer) -> step(state, x,
y) -> (state, loss, grads)`, pure, with `state = (trainable, non_trainable, opt_state)` (docs/parity.md).
"""


def torch_step_1(model, optimizer, x, y):
    """Exercise 1, on a model with an L2 penalty on its hidden layer's kernel and activity (`mlp_l2`)."""
    import torch

    y_pred = model(x, training=True)
    loss = torch.mean((y_pred - y) ** 2)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss


def torch_step_2(model, optimizer, x, y):
    """Exercise 2, on a model with a seeded Dropout(0.2) (`dropout_mlp`)."""
    import torch

    y_pred = model(x)
    loss = torch.mean((y_pred - y) ** 2)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss


def jax_step_3(model, optimizer):
    """Exercise 3, on a model with a BatchNormalization (`bn_mlp`)."""
    import jax
    import jax.numpy as jnp
    import optax

    def loss_fn(trainable, non_trainable, x, y):
        y_pred, _ = model.stateless_call(trainable, non_trainable, x, training=True)
        return jnp.mean((y_pred - y) ** 2)

    def step(state, x, y):
        trainable, non_trainable, opt_state = state
        loss, grads = jax.value_and_grad(loss_fn)(trainable, non_trainable, x, y)
        updates, opt_state = optimizer.update(grads, opt_state, trainable)
        return (optax.apply_updates(trainable, updates), non_trainable, opt_state), loss, grads

    return step


def torch_step_4(model, optimizer, x, y):
    """Exercise 4, on a model with a BatchNormalization (`bn_mlp`), 60 rows in batches of 16: the last one has 12."""
    import torch

    rows = len(x)
    if rows < 16:  # one shape for every batch: the short last batch padded with zeros, their predictions dropped
        x = torch.cat([x, torch.zeros((16 - rows, *x.shape[1:]), dtype=x.dtype)])
    y_pred = model(x, training=True)[:rows]
    loss = torch.mean((y_pred - y) ** 2)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss


def torch_step_5(model, optimizer, x, y):
    """Exercise 5: this step is right; the optimizer below is what to look at (the spec sets epsilon=1e-3)."""
    import torch

    y_pred = model(x, training=True)
    loss = torch.mean((y_pred - y) ** 2)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss


def torch_adam_5(params):
    """Exercise 5's optimizer: the spec's Adam, lr=0.01 and epsilon=1e-3."""
    import torch

    return torch.optim.Adam(params, lr=0.01, eps=1e-3)


def torch_step_6(model, optimizer, x, y):
    """Exercise 6, on the HAR (`har`), compiled with loss="mse" and optimizer="sgd"."""
    import torch

    y_pred = model(x, training=True)
    loss = torch.sum((y_pred - y) ** 2)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss


def jax_step_7(model, optimizer):
    """Exercise 7, on a model with a seeded Dropout(0.2) (`dropout_mlp`)."""
    import jax
    import jax.numpy as jnp
    import optax

    model_state = [v.value for v in model.non_trainable_variables]  # the model's non-trainable values

    def loss_fn(trainable, x, y):
        y_pred, non_trainable = model.stateless_call(trainable, model_state, x, training=True)
        return jnp.mean((y_pred - y) ** 2), non_trainable

    def step(state, x, y):
        trainable, _, opt_state = state
        (loss, non_trainable), grads = jax.value_and_grad(loss_fn, has_aux=True)(trainable, x, y)
        updates, opt_state = optimizer.update(grads, opt_state, trainable)
        return (optax.apply_updates(trainable, updates), non_trainable, opt_state), loss, grads

    return step


def torch_step_8(model, optimizer, x, y):
    """Exercise 8, on the HAR with a max-norm constraint on its kernel (`compare.exercises:har_max_norm`)."""
    import torch

    y_pred = model(x, training=True)
    loss = torch.mean((y_pred - y) ** 2)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss
