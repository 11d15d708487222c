import os

from keras_side.backend import ENGINES
from tests.engines import require_backend

ENGINE = require_backend()

# Two host devices, so the sharded walk-forward trainer is tested against one device. XLA reads this when JAX
# starts, which is after this file: nothing above imports jax.
SHARDING_DEVICES = 2
if ENGINE == "jax" and "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               f" --xla_force_host_platform_device_count={SHARDING_DEVICES}").strip()

# An engine's folder (tests/native/<engine>/, mirroring native/<engine>/) is collected only in that engine's
# pytest process (`make test` runs one per engine).
collect_ignore = [engine for engine in ENGINES if engine != ENGINE]
