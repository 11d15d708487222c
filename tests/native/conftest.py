from tests.engines import require_backend

ENGINE = require_backend()

# Engine-specific files are collected only in their engine's pytest process (`make test` runs one per engine).
ENGINE_FILES = {
    "torch": ["test_torch_loop.py", "test_torch_many.py"],
    "jax": ["test_jax_loop.py", "test_jax_many.py"],
    "tensorflow": ["test_tf_loop.py"],
}
collect_ignore = [f for engine, files in ENGINE_FILES.items() if engine != ENGINE for f in files]
