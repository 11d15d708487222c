"""Each Keras optimizer setting, stepped by Keras and by the engine's optimizer in both flavours on the same
gradients: "exact" equals Keras, and "engine" differs exactly where a convention says it must. Runs once per engine.

Every case is set in a regime where its convention shows (tiny gradients for an epsilon, a schedule for SGD's
folded rate, a boundary inside the run for a piecewise schedule), so ignoring the convention fails the test.
"""
import keras
import numpy as np
import pytest

from compare.referee.tolerances import OPTIMIZER_CONVENTION_MIN, OPTIMIZER_EXACT_ATOL, OPTIMIZER_ROUNDING_ATOL
from keras_side.optimizers import keras_optimizer
from keras_side.spec import TrainConfig
from tests.native.conftest import ENGINE

STEPS = 40
SHAPES = [(3, 4), (4,)]  # a kernel and a bias: two variables, so per-variable and global clipping differ

# case -> (spec, engines on which the stock optimizer differs from Keras, and why)
CASES = {
    "adam-epsilon": (TrainConfig(epsilon=1e-3), {"torch", "jax"}),  # ε added after the bias correction
    "adamw-epsilon": (TrainConfig(optimizer="adamw", weight_decay=0.1, epsilon=1e-3), {"torch", "jax"}),
    "sgd-momentum-schedule": (TrainConfig(optimizer="sgd", learning_rate=0.1, momentum=0.9, schedule="exponential",
                                          decay_steps=5, decay_rate=0.5), {"torch", "jax"}),  # rate after momentum
    "sgd-nesterov-schedule": (TrainConfig(optimizer="sgd", learning_rate=0.1, momentum=0.9, nesterov=True,
                                          schedule="exponential", decay_steps=5, decay_rate=0.5), {"torch", "jax"}),
    "rmsprop-epsilon": (TrainConfig(optimizer="rmsprop", epsilon=1e-3, momentum=0.5), {"torch"}),  # ε outside sqrt
    "adagrad-epsilon": (TrainConfig(optimizer="adagrad", epsilon=1e-3, initial_accumulator_value=0.0), {"torch"}),
    "adam-clipnorm": (TrainConfig(clipnorm=0.05, epsilon=1e-12), {"torch", "jax"}),  # clipped together
    "adam-global-clipnorm": (TrainConfig(global_clipnorm=0.05, epsilon=1e-12), set()),
    "adam-clipvalue": (TrainConfig(clipvalue=0.01, epsilon=1e-12), set()),
    "adam-cosine-warmup": (TrainConfig(schedule="cosine", learning_rate=0.001, warmup_target=0.01, warmup_steps=10,
                                       decay_steps=30, alpha=0.1, epsilon=1e-12), set()),
    "sgd-piecewise": (TrainConfig(optimizer="sgd", schedule="piecewise", boundaries=(9, 19),
                                  values=(0.1, 0.01, 0.001)), {"torch", "jax"}),  # switches a step early
    "adam-cosine-past-the-end": (TrainConfig(schedule="cosine", decay_steps=20, alpha=0.1, epsilon=1e-12),
                                 {"torch"}),  # torch's cosine climbs back up after T_max
}


def gradients(scale: float):
    """The same gradient sequence for every optimizer: STEPS draws per variable, seeded."""
    rng = np.random.default_rng(0)
    return [[(scale * rng.normal(size=s)).astype(np.float32) for s in SHAPES] for _ in range(STEPS)]


def start():
    rng = np.random.default_rng(1)
    return [rng.normal(size=s).astype(np.float32) for s in SHAPES]


def keras_steps(cfg, grads):
    variables = [keras.Variable(w) for w in start()]
    optimizer = keras_optimizer(cfg)
    optimizer.build(variables)
    for g in grads:
        optimizer.apply([keras.ops.convert_to_tensor(a) for a in g], variables)
    return [keras.ops.convert_to_numpy(v.value) for v in variables]


def native_steps(cfg, grads):
    """The engine's own optimizer API driven with the same gradients."""
    if ENGINE == "torch":
        import torch

        from native.torch import optim

        params = [torch.nn.Parameter(torch.as_tensor(w)) for w in start()]
        optimizer, scheduler, clip = optim.build(params, cfg)
        for g in grads:
            for p, a in zip(params, g):
                p.grad = torch.as_tensor(a).clone()
            if clip:
                clip(params)
            optimizer.step()
            if scheduler:
                scheduler.step()
        return [p.detach().numpy() for p in params]
    if ENGINE == "jax":
        import jax.numpy as jnp
        import optax

        from native.jax import optim

        params = [jnp.asarray(w) for w in start()]
        optimizer = optim.build(cfg)
        state = optimizer.init(params)
        for g in grads:
            updates, state = optimizer.update([jnp.asarray(a) for a in g], state, params)
            params = optax.apply_updates(params, updates)
        return [np.asarray(p) for p in params]
    return keras_steps(cfg, grads)  # TensorFlow's own optimizers are Keras's


def gap(got, want) -> float:
    return max(float(np.max(np.abs(g - w))) for g, w in zip(got, want, strict=True))


def moved(want) -> float:
    return max(float(np.max(np.abs(w - s))) for w, s in zip(want, start()))


@pytest.mark.parametrize("case", CASES)
def test_exact_flavour_steps_as_keras(case):
    cfg, _ = CASES[case]
    grads = gradients(1e-3 if "epsilon" in case else 1.0)
    found = gap(native_steps(cfg, grads), keras_steps(cfg, grads))
    print(f"{ENGINE} {case}: exact {found:.1e}")
    assert found <= OPTIMIZER_EXACT_ATOL


@pytest.mark.parametrize("case", CASES)
def test_engine_flavour_differs_where_its_convention_does(case):
    cfg, differs_on = CASES[case]
    grads = gradients(1e-3 if "epsilon" in case else 1.0)
    want = keras_steps(cfg, grads)
    found = gap(native_steps(cfg.replace(flavour="engine"), grads), want)
    print(f"{ENGINE} {case}: engine {found:.1e} ({found / moved(want):.1e} of the distance moved)")
    if ENGINE in differs_on:
        assert found > OPTIMIZER_CONVENTION_MIN * moved(want)
    else:
        assert found <= OPTIMIZER_ROUNDING_ATOL
