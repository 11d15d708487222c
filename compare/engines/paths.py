"""Every training path by name: which engine runs it and which module's verbs (`train`, `grad_at`, `predict`)."""
from __future__ import annotations

import dataclasses
import functools
import importlib
from dataclasses import dataclass, field

from compare.errors import NativeLoopsError
from keras_side.backend import ENGINES

LOOP_MODULES = {"torch": "native.torch.loop", "jax": "native.jax.loop", "tensorflow": "native.tensorflow.loop"}
# The engines with a many-model trainer (`train_many`: every seed, learning rate or window in one program), and its module.
MANY_MODULES = {"jax": "native.jax.many", "torch": "native.torch.many"}


@dataclass(frozen=True)
class Path:
    name: str
    engine: str
    module: str
    options: dict = field(default_factory=dict)  # keyword arguments of the module's `train`
    spec: dict = field(default_factory=dict)  # changes to the TrainConfig (e.g. the optimizer flavour)

    def load(self):
        """The module with the verbs; import it only in a process whose backend is `engine`."""
        return importlib.import_module(self.module)

    def train(self, model, data, cfg, *, progress=None, **extra):
        """Train with this path's module; `extra` reaches its `train` (`on_step`, `checkpoint`, `resume`)."""
        result = self.load().train(model, data, cfg.replace(**self.spec), progress=progress, **self.options, **extra)
        return dataclasses.replace(result, path=self.name)


PATHS = {
    p.name: p
    for engine in ENGINES
    for p in (Path(f"keras-{engine}", engine, "keras_side.fit"), Path(f"{engine}-native", engine, LOOP_MODULES[engine]))
}
PATHS |= {f"keras-{e}-train-step": Path(f"keras-{e}-train-step", e, f"native.{e}.train_step") for e in ENGINES}
# The JAX loop's fast paths, each tested to end on the reference loop's weights: Keras's 1-D convolution as a matmul
# (`native.jax.fast`), and every epoch in one compiled `lax.scan` (`native.jax.scan`, the convolution as a matmul too).
PATHS["jax-native-fast"] = Path("jax-native-fast", "jax", "native.jax.fast")
PATHS["jax-native-scan"] = Path("jax-native-scan", "jax", "native.jax.scan")
# The torch loop's fast paths (`native.torch.fast`), each tested to end on the reference loop's weights: Keras's call
# wrapper bypassed where it has nothing to do, and the step through `torch.compile`.
PATHS["torch-native-fast"] = Path("torch-native-fast", "torch", "native.torch.fast")
PATHS["torch-native-compile"] = Path("torch-native-compile", "torch", "native.torch.fast", {"compile": True})
# The fast loop with torch's stock optimizer (`flavour="engine"`), timed beside it by the bench: what the
# Keras-exact optimizer costs.
PATHS["torch-native-engine"] = Path("torch-native-engine", "torch", "native.torch.fast", spec={"flavour": "engine"})
PATHS["torch-native-compile-engine"] = Path("torch-native-compile-engine", "torch", "native.torch.fast",
                                            {"compile": True}, {"flavour": "engine"})


def get(name: str) -> Path:
    if name not in PATHS:
        raise NativeLoopsError(f"unknown path {name!r}; choose one of {', '.join(PATHS)}")
    return PATHS[name]


def for_engine(engine: str) -> list[Path]:
    """The referee's two paths per engine: model.fit and the native loop."""
    return [PATHS[f"keras-{engine}"], PATHS[f"{engine}-native"]]


@functools.cache
def loop(engine: str):
    """The native loop module of `engine` (its `grad_at` and `predict`)."""
    return importlib.import_module(LOOP_MODULES[engine])
