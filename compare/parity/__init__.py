"""Parity of any Keras model across engines and loops, from your own tests (or through the pytest fixtures of
`keras_side.pytest_plugin`, the work in `compare.parity.plugin`).

    assert_gradients_match(build, x, y)          # one point: the training objective's gradient, every engine
    assert_forward_match(build, x)               # one point: every layer's output, every engine
    assert_training_matches(build, x, y, spec=..., epochs=2)          # every step of fit, train_step, native
    assert_loop_matches_fit(build, "mypkg.loops:step", x, y, engine="torch")   # your own step against fit

Modules: `point` (gradients and layer outputs at given weights), `training` (trajectories and the localization of
their first divergence), `steps` (what a worker runs for them), `plugin` (the fixtures), `common`.
"""
from compare.parity.common import ParityError, callable_spec, loss_spec, reference_engine
from compare.parity.point import assert_forward_match, assert_gradients_match
from compare.parity.training import assert_loop_matches_fit, assert_training_matches

__all__ = ["ParityError", "assert_forward_match", "assert_gradients_match", "assert_loop_matches_fit",
           "assert_training_matches", "callable_spec", "loss_spec", "reference_engine"]
