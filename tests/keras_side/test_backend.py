import json
import os
import subprocess
import sys

import keras
import pytest

from keras_side import backend
from tests.keras_side.conftest import ENGINE

PROBE = "import keras; from keras_side.backend import active_backend as a; c = a(); print(c.name, c.source, sep='|')"


def child_backend(tmp_path, **env_changes):
    home = tmp_path / "keras_home"
    home.mkdir(exist_ok=True)
    (home / "keras.json").write_text(json.dumps({"backend": "jax", "floatx": "float32"}))
    env = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"} | {"KERAS_HOME": str(home)} | env_changes
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip().splitlines()[-1].split("|")


def test_keras_json_picks_the_backend_without_the_variable(tmp_path):
    name, source = child_backend(tmp_path)
    assert name == "jax" and source.endswith("keras.json")


def test_variable_wins_over_keras_json(tmp_path):
    assert child_backend(tmp_path, KERAS_BACKEND=ENGINE) == [ENGINE, "KERAS_BACKEND"]


def test_configured_backend_precedence(tmp_path):
    default = backend.BackendChoice("tensorflow", "Keras default")
    assert backend.configured_backend({"KERAS_HOME": str(tmp_path)}) == default
    (tmp_path / "keras.json").write_text('{"backend": "torch"}')
    assert backend.configured_backend({"KERAS_HOME": str(tmp_path)}).name == "torch"
    both = {"KERAS_HOME": str(tmp_path), "KERAS_BACKEND": "jax"}
    assert backend.configured_backend(both) == backend.BackendChoice("jax", "KERAS_BACKEND")


def test_active_backend_is_this_process_engine():
    assert backend.active_backend().name == ENGINE == keras.config.backend()


def test_requesting_another_backend_after_import_fails_clearly():
    """Another installed engine: Keras is imported already; one that is not installed (a `[jax]`-only install): the
    extra that installs it."""
    others = [e for e in ("torch", "jax", "tensorflow") if e != ENGINE]
    installed = [e for e in others if backend.engine_installed(e)]
    for other in installed:
        with pytest.raises(backend.BackendError, match=f"already imported with backend '{ENGINE}'.*={other}"):
            backend.use_backend(other)
    for other in set(others) - set(installed):
        with pytest.raises(backend.BackendError, match=f"{other} is not installed; pip install 'native-loops.{other}"):
            backend.use_backend(other)
    backend.use_backend(ENGINE)  # the same engine is fine
    with pytest.raises(backend.BackendError, match="unknown engine 'mxnet'"):
        backend.use_backend("mxnet")


def test_engine_environment_never_uses_the_users_keras_dir():
    env = backend.engine_environment("jax", base={"HOME": "/home/someone"})
    assert env["KERAS_BACKEND"] == "jax" and "/home/someone/.keras" not in env["KERAS_HOME"]


def test_a_missing_engine_is_named_with_the_fix(monkeypatch):
    monkeypatch.setattr(backend, "engine_installed", lambda name: False)
    with pytest.raises(backend.BackendError, match=f"{ENGINE} is not installed; pip install 'native-loops.{ENGINE}.'"):
        backend.use_backend(ENGINE)


def test_each_request_to_a_worker_starts_from_kerass_defaults(monkeypatch):
    """A user's builder that sets floatx or a dtype policy (as `grad_parity`'s checks build one after another in the
    session's shared workers) left it set for every later request: a later check then computed in float64, and
    passed only because of the tests before it."""
    import io
    import json

    import keras

    from compare.engines import worker

    def careless(request, send):
        keras.config.set_floatx("float64")
        keras.config.set_dtype_policy("mixed_bfloat16")
        return {}

    monkeypatch.setitem(worker.HANDLERS, "careless", careless)
    monkeypatch.setitem(worker.HANDLERS, "settings", lambda request, send: {
        "floatx": keras.config.floatx(), "policy": keras.config.dtype_policy().name})
    protocol = io.StringIO()
    try:
        worker.serve([json.dumps({"cmd": "careless"}), json.dumps({"cmd": "settings"})], protocol)
    finally:
        keras.config.set_floatx("float32")
        keras.config.set_dtype_policy("float32")
    answers = [json.loads(line) for line in protocol.getvalue().splitlines()]
    assert answers[-1] == {"event": "done", "floatx": "float32", "policy": "float32"}, answers
