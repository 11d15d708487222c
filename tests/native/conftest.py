import os

from tests.engines import require_backend

ENGINE = require_backend()

# Two host devices, so the sharded walk-forward trainer is tested against one device. XLA reads this when JAX
# starts, which is after this file: nothing above imports jax.
SHARDING_DEVICES = 2
if ENGINE == "jax" and "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               f" --xla_force_host_platform_device_count={SHARDING_DEVICES}").strip()

# Engine-specific files are collected only in their engine's pytest process (`make test` runs one per engine).
ENGINE_FILES = {
    "torch": ["test_torch_loop.py", "test_torch_many.py"],
    "jax": ["test_jax_loop.py", "test_jax_many.py"],
    "tensorflow": ["test_tf_loop.py"],
}
collect_ignore = [f for engine, files in ENGINE_FILES.items() if engine != ENGINE for f in files]
