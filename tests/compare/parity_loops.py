"""Users' own training steps for the loop-parity tests: one per engine that equals `fit`, and planted faults. Each
engine's worker imports this module, so engine imports stay inside the functions."""
from compare.parity import timing

torch_step = timing.torch_step  # the step of a torch codebase, which equals fit


def torch_step_without_model_losses(model, optimizer, x, y):
    """Planted fault: the regularizers' penalty (`model.losses`) is left out of the loss."""
    import torch

    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x, training=True), y)
    loss.backward()
    optimizer.step()
    return loss


def torch_step_without_zero_grad(model, optimizer, x, y):
    """Planted fault: the gradients are never zeroed, so each step applies the sum of every step's so far."""
    import torch

    loss = torch.nn.functional.mse_loss(model(x, training=True), y) + sum(model.losses)
    loss.backward()
    optimizer.step()
    return loss


def torch_step_in_inference_mode(model, optimizer, x, y):
    """Planted fault: the model called without `training=True` (Dropout keeps everything, BatchNorm normalizes by its
    moving statistics), as a torch user's `model.eval()` would leave it."""
    import torch

    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y) + sum(model.losses)
    loss.backward()
    optimizer.step()
    return loss


def torch_step_clipping_with_a_sign_fault(model, optimizer, x, y):
    """Planted fault inside a step that clips (torch's `clip_grad_norm_`, as the spec's global_clipnorm): the first
    layer's kernel moves against its update."""
    import torch

    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x, training=True), y) + sum(model.losses)
    loss.backward()
    torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], CLIP)
    kernel = model.trainable_weights[0].value
    before = kernel.detach().clone()
    optimizer.step()
    with torch.no_grad():
        kernel.copy_(2 * before - kernel)
    return loss


def torch_step_clipping(model, optimizer, x, y):
    """A step that clips its gradients itself (torch's `clip_grad_norm_`) where the spec's optimizer clips them too:
    clipping to a norm twice is clipping once, so it equals fit."""
    import torch

    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x, training=True), y) + sum(model.losses)
    loss.backward()
    torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], CLIP)
    optimizer.step()
    return loss


CLIP = 0.1  # the spec's global_clipnorm in the clipping tests: gradients here are ~1, so every step clips


def torch_sgd(params):
    """A user's own optimizer: torch's SGD with the clipping tests' rate, which clips nothing itself."""
    import torch

    return torch.optim.SGD(params, lr=0.05)


def torch_adam(params):
    """Planted fault, as a user's optimizer: torch's stock Adam with the spec's numbers; its epsilon is added after
    the bias correction, where Keras adds it before."""
    import torch

    return torch.optim.Adam(params, lr=0.01, eps=1e-3)


def jax_step(model, optimizer):
    """The step of a JAX codebase: value_and_grad over stateless_call, optax, the new non-trainable state kept."""
    import jax
    import jax.numpy as jnp
    import optax

    def loss_fn(trainable, non_trainable, x, y):
        y_pred, non_trainable, losses = model.stateless_call(trainable, non_trainable, x, training=True,
                                                             return_losses=True)
        return jnp.mean(jnp.square(y_pred - y)) + sum(losses), non_trainable

    def step(state, x, y):
        trainable, non_trainable, opt_state = state
        (loss, non_trainable), grads = jax.value_and_grad(loss_fn, has_aux=True)(trainable, non_trainable, x, y)
        updates, opt_state = optimizer.update(grads, opt_state, trainable)
        return (optax.apply_updates(trainable, updates), non_trainable, opt_state), loss, grads

    return step


def jax_step_dropping_state(model, optimizer):
    """Planted fault: the non-trainable state stateless_call returns (BatchNorm's moving statistics) is dropped."""
    import jax
    import jax.numpy as jnp
    import optax

    def loss_fn(trainable, non_trainable, x, y):
        y_pred, _ = model.stateless_call(trainable, non_trainable, x, training=True)
        return jnp.mean(jnp.square(y_pred - y))

    def step(state, x, y):
        trainable, non_trainable, opt_state = state
        loss, grads = jax.value_and_grad(loss_fn)(trainable, non_trainable, x, y)
        updates, opt_state = optimizer.update(grads, opt_state, trainable)
        return (optax.apply_updates(trainable, updates), non_trainable, opt_state), loss

    return step


def optax_adam():
    """Planted fault, as a user's optimizer: optax's stock Adam with the spec's numbers (epsilon after the bias
    correction, where Keras adds it before)."""
    import optax

    return optax.adam(0.01, eps=1e-3)


def tensorflow_step(model, optimizer):
    """The step of a TensorFlow codebase: GradientTape, the Keras optimizer's apply, the gradients returned."""
    import tensorflow as tf

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
            if model.losses:
                loss = loss + tf.add_n(model.losses)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        return loss, grads

    return step


def torch_step_that_never_steps(model, optimizer, x, y):
    """Planted fault: the gradient is taken but never applied (no `optimizer.step()`)."""
    import torch

    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x, training=True), y)
    loss.backward()
    return loss


def tensorflow_step_of_three(model, optimizer):
    """Planted fault: a TensorFlow step that returns three values."""
    step = tensorflow_step(model, optimizer)
    return lambda x, y: (*step(x, y), 0.0)


def not_a_step(model, optimizer, x, y):
    return "nothing"


def torch_step_that_hangs(model, optimizer, x, y):
    import threading

    threading.Event().wait()  # forever: only the runner's quiet limit ends it


def torch_step_that_dies(model, optimizer, x, y):
    import os

    os._exit(3)

