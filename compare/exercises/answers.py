"""The answers to docs/exercises.md: each step of `compare/exercises/steps.py` fixed, the change marked `# fixed:`.
Check them with `python -m compare.exercises --steps compare.exercises.answers`."""


def torch_step_1(model, optimizer, x, y):
    import torch

    y_pred = model(x, training=True)
    loss = torch.mean((y_pred - y) ** 2) + sum(model.losses)  # fixed: fit minimizes the loss plus model.losses
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss


def torch_step_2(model, optimizer, x, y):
    import torch

    y_pred = model(x, training=True)  # fixed: fit calls the model with training=True, so Dropout drops
    loss = torch.mean((y_pred - y) ** 2)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss


def jax_step_3(model, optimizer):
    import jax
    import jax.numpy as jnp
    import optax

    def loss_fn(trainable, non_trainable, x, y):
        y_pred, non_trainable = model.stateless_call(trainable, non_trainable, x, training=True)
        return jnp.mean((y_pred - y) ** 2), non_trainable  # fixed: the new moving statistics come back out

    def step(state, x, y):
        trainable, non_trainable, opt_state = state
        (loss, non_trainable), grads = jax.value_and_grad(loss_fn, has_aux=True)(trainable, non_trainable, x, y)
        updates, opt_state = optimizer.update(grads, opt_state, trainable)
        return (optax.apply_updates(trainable, updates), non_trainable, opt_state), loss, grads

    return step


def torch_step_4(model, optimizer, x, y):
    import torch

    y_pred = model(x, training=True)  # fixed: the short batch as it comes; padding rows join BatchNorm's statistics
    loss = torch.mean((y_pred - y) ** 2)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss


def torch_step_5(model, optimizer, x, y):  # the step was right: exercise 5 is about the optimizer
    return torch_step_4(model, optimizer, x, y)


def torch_adam_5(params):
    from native.torch.optim import KerasAdam

    return KerasAdam(params, lr=0.01, eps=1e-3)  # fixed: Keras's epsilon, added before the bias correction


def torch_step_6(model, optimizer, x, y):
    import torch

    y_pred = model(x, training=True)
    loss = torch.mean((y_pred - y) ** 2)  # fixed: Keras's losses average over the batch
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss


def jax_step_7(model, optimizer):  # exercise 3's answer: a pure step computes from the state it is handed
    return jax_step_3(model, optimizer)


def torch_step_8(model, optimizer, x, y):
    import torch

    y_pred = model(x, training=True)
    loss = torch.mean((y_pred - y) ** 2)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    with torch.no_grad():  # fixed: fit applies each weight's constraint after every update
        for variable in model.trainable_variables:
            if variable.constraint is not None:
                variable.value.copy_(variable.constraint(variable.value))
    return loss
