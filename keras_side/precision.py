"""Float64 end to end, for gradient checks against the float64 formula.

A float64 dtype policy alone is not enough: `keras.Input` takes its dtype from `floatx`, not from the policy, so
a Sequential or Functional model would round its inputs to float32 before a float64 `Dense` ever sees them (a 5e-9
gap on JAX). `float64()` sets both, and JAX's x64 switch. What is left on torch is upstream: Keras
3.15.1's `result_type` maps float64 to float32 on every backend but TensorFlow (`BIT64_TO_BIT32_DTYPE` in
keras/src/backend/common/dtypes.py), so `ops.matmul` and `ops.add` compute in float32 (keras-team/keras#23704).
"""
from __future__ import annotations

from contextlib import contextmanager

# Engines on which Keras 3.15.1 really computes a float64 Dense in float64.
TRUE_FLOAT64 = ("jax", "tensorflow")
FLOAT64_UPSTREAM_CAUSE = (
    "keras 3.15.1 result_type maps float64 to float32 on non-TensorFlow backends (BIT64_TO_BIT32_DTYPE), so "
    "ops.matmul computes a float64 Dense in float32 on torch: keras-team/keras#23704"
)


@contextmanager
def float64():
    """Build models inside this block to compute in float64; the previous settings come back on exit."""
    import keras  # here, not at the top: the referee reads TRUE_FLOAT64 without choosing a backend

    floatx, policy = keras.config.floatx(), keras.config.dtype_policy()
    jax_x64 = None
    if keras.config.backend() == "jax":
        import jax

        jax_x64 = jax.config.jax_enable_x64
        jax.config.update("jax_enable_x64", True)
    keras.config.set_floatx("float64")
    keras.config.set_dtype_policy("float64")
    try:
        yield
    finally:
        keras.config.set_floatx(floatx)
        keras.config.set_dtype_policy(policy)
        if jax_x64 is not None:
            import jax

            jax.config.update("jax_enable_x64", jax_x64)


@contextmanager
def mixed_bfloat16():
    """Build models inside this block to compute in bfloat16 with float32 weights (Keras's "mixed_bfloat16"
    policy); every path, `fit` and the native loops alike, trains them as they are."""
    import keras

    policy = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        yield
    finally:
        keras.config.set_dtype_policy(policy)
