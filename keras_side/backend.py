"""Which engine Keras runs on, where that choice came from, and how to make it before the first `import keras`.

Keras reads its backend once, at the first `import keras`: the `KERAS_BACKEND` variable, else `backend` in
`keras.json` under `KERAS_HOME` (or `~/.keras`), else TensorFlow. After that import the choice is fixed for the
life of the process, which is why the referee runs one worker process per engine.
"""
from __future__ import annotations

import importlib.util
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

ENGINES = ("torch", "jax", "tensorflow")
KERAS_DEFAULT_BACKEND = "tensorflow"


class BackendError(RuntimeError):
    """The backend asked for cannot be had in this process."""


@dataclass(frozen=True)
class BackendChoice:
    name: str
    source: str  # "KERAS_BACKEND", the keras.json path, or "Keras default"


def keras_dir(env=os.environ) -> Path:
    """The folder Keras reads `keras.json` from (the same rule as Keras's own config module)."""
    if "KERAS_HOME" in env:
        return Path(env["KERAS_HOME"])
    home = os.path.expanduser("~")
    return Path(home if os.access(home, os.W_OK) else "/tmp") / ".keras"


def configured_backend(env=os.environ) -> BackendChoice:
    """The backend a fresh `import keras` would pick in this environment, and why."""
    if "KERAS_BACKEND" in env:
        return BackendChoice(env["KERAS_BACKEND"], "KERAS_BACKEND")
    config = keras_dir(env) / "keras.json"
    try:
        chosen = json.loads(config.read_text()).get("backend")
    except (OSError, ValueError):
        chosen = None
    if chosen:
        return BackendChoice(chosen, str(config))
    return BackendChoice(KERAS_DEFAULT_BACKEND, "Keras default")


def active_backend() -> BackendChoice:
    """The backend of this process: Keras's own answer once imported, else what the import would pick."""
    choice = configured_backend()
    keras = sys.modules.get("keras")
    if keras is None:
        return choice
    name = keras.config.backend()
    return choice if choice.name == name else BackendChoice(name, "fixed when keras was first imported")


ENGINE_PACKAGES = {"torch": "torch", "jax": "jax", "tensorflow": "tensorflow"}


def engine_installed(name: str) -> bool:
    """Whether the engine's package can be imported here (checked without importing it)."""
    return importlib.util.find_spec(ENGINE_PACKAGES[name]) is not None


def installed_engines() -> list[str]:
    """Every engine that can run here, in `ENGINES` order."""
    return [e for e in ENGINES if engine_installed(e)]


def own_cache(name: str) -> Path:
    """A folder of ours under the user's cache folder (XDG_CACHE_HOME, else ~/.cache)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "native-loops" / name


def own_keras_home() -> Path:
    """A Keras config folder of ours, so that a stray `~/.keras/keras.json` never picks the engine."""
    return own_cache("keras")


# JAX's persistent compilation cache (JAX's docs: "Persistent compilation cache"): what XLA compiled, kept on disk,
# so that a later process compiling the same program loads it instead. JAX keys an entry on the program, the compile
# options, the XLA flags, the versions and the device, so a hit is the executable a compile would give. Every
# compile is kept: JAX keeps only those over a second unless told, and ours mostly take less. Past the size the
# least recently used entries go, and with a size JAX also locks the folder, which our processes share.
JAX_CACHE_VARIABLE = "JAX_COMPILATION_CACHE_DIR"
JAX_CACHE_MAX_BYTES = 256 * 2**20


def jax_cache_environment(env=os.environ) -> dict[str, str]:
    """The variables that give a JAX process our compilation cache (`own_cache("jax")`), its entries cut short
    dropped first (`drop_cut_short`); none when the environment sets JAX_COMPILATION_CACHE_DIR already (a folder of
    the user's, or empty for no cache)."""
    if JAX_CACHE_VARIABLE in env:
        return {}
    folder = own_cache("jax")
    drop_cut_short(folder)
    return {JAX_CACHE_VARIABLE: str(folder), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
            "JAX_COMPILATION_CACHE_MAX_SIZE": str(JAX_CACHE_MAX_BYTES)}


def drop_cut_short(folder: Path) -> None:
    """Delete the cache entries that a process stopped while writing. JAX (0.10.2,
    `jax._src.lru_cache`) writes an entry in place, then its access time beside it (`<key>-atime`), so an entry
    without one was cut short (Ctrl-C between the two writes, a kill during the first): it may be truncated (a
    warning and a compile each time it is read), and JAX's eviction, which reads every entry's access time, then
    fails every later write (a warning; the cache no longer grows). A process writing one right now loses only
    that entry."""
    for entry in folder.glob("*-cache"):
        if not entry.with_name(entry.name.removesuffix("-cache") + "-atime").exists():
            entry.unlink(missing_ok=True)


def keras_defaults() -> None:
    """Put Keras's global settings back to its defaults (float32 and its dtype policy, epsilon 1e-7, channels last, no
    cap on fit's epochs or steps): a `keras.json` under a user's KERAS_HOME, or KERAS_MAX_EPOCHS, may change them,
    and every number we report assumes them, as do the worker's requests (each starts from them, whatever an earlier
    one's model builder set). Call it after `import keras`; it changes this process's Keras settings."""
    import keras

    keras.config.set_floatx("float32")
    keras.config.set_dtype_policy("float32")  # a builder's mixed_bfloat16 would outlive its model
    keras.config.set_epsilon(1e-7)
    keras.config.set_image_data_format("channels_last")
    keras.config.set_max_epochs(None)  # KERAS_MAX_EPOCHS / KERAS_MAX_STEPS_PER_EPOCH would cap what fit trains
    keras.config.set_max_steps_per_epoch(None)


def not_installed(name: str) -> str:
    """The one line for an engine this environment lacks, with the install that brings it."""
    return f"{name} is not installed; pip install 'native-loops[{name}]' brings it (`make setup` brings every engine)"


def use_backend(name: str) -> None:
    """Request `name` for this process; call it before anything imports keras.

    Raises:
        BackendError: unknown engine, or Keras already imported with another backend.
    """
    if name not in ENGINES:
        raise BackendError(f"unknown engine {name!r}; choose one of {', '.join(ENGINES)}")
    if not engine_installed(name):
        raise BackendError(not_installed(name))
    keras = sys.modules.get("keras")
    if keras is not None and keras.config.backend() != name:
        raise BackendError(
            f"Keras is already imported with backend {keras.config.backend()!r}, so {name!r} cannot be chosen "
            f"in this process; set KERAS_BACKEND={name} before anything imports keras (indirect imports too), "
            "or start a new process"
        )
    os.environ["KERAS_BACKEND"] = name
    os.environ.setdefault("KERAS_HOME", str(own_keras_home()))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's start-up chatter buries our output


def engine_environment(name: str, base=os.environ) -> dict[str, str]:
    """The environment of a child process that must run Keras on `name`, with our own KERAS_HOME."""
    if name not in ENGINES:
        raise BackendError(f"unknown engine {name!r}; choose one of {', '.join(ENGINES)}")
    env = dict(base)
    env["KERAS_BACKEND"] = name
    env.setdefault("KERAS_HOME", str(own_keras_home()))
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env
