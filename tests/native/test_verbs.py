"""One signature per verb on every engine (#50): the reference loops' verbs are written here once, engine-free, and
each engine's suite checks its own native paths against them, so that a change to one engine's verb fails until the
others follow. `fit`'s paths (`keras_side.fit`, `native.<engine>.train_step`) take the package's `HarData` and no
`validation_data`: a user's own arrays go to Keras's `model.fit` itself."""
import importlib
import inspect

import pytest

from compare.engines import paths
from tests.native.conftest import ENGINE

# Each verb's parameters in order; "*" marks a keyword-only one.
VERBS = {
    "train": ["model", "data", "cfg", "*validation_data", "*progress", "*on_step", "*checkpoint", "*resume"],
    "grad_at": ["model", "x", "y", "*loss", "*training"],
    "predict": ["model", "x"],
    "epoch_batches": ["model", "data", "cfg"],
}
# What a fast path takes beyond the reference loop's arguments (its `paths.Path.options`).
OPTIONS = {"native.torch.fast": {"train": ["*compile"]}}
NATIVE = sorted({p.module for p in paths.PATHS.values()
                 if p.engine == ENGINE and p.module.startswith("native.") and not p.module.endswith(".train_step")})


def parameters(verb) -> list[str]:
    return [("*" if p.kind is p.KEYWORD_ONLY else "") + p.name for p in inspect.signature(verb).parameters.values()]


def test_the_reference_loop_has_every_verb():
    loop = importlib.import_module(paths.LOOP_MODULES[ENGINE])
    assert {verb: parameters(getattr(loop, verb)) for verb in VERBS} == VERBS


@pytest.mark.parametrize("module", NATIVE)
def test_every_native_path_takes_the_reference_loops_arguments(module):
    """A fast path has `train` and whichever other verbs it computes its own way (the fused scan takes the reference
    loop's `grad_at` and `predict`), each with the reference loop's arguments, plus its own options."""
    found = importlib.import_module(module)
    verbs = [verb for verb in VERBS if verb in vars(found) and callable(vars(found)[verb])]
    assert "train" in verbs
    for verb in verbs:
        own = OPTIONS.get(module, {}).get(verb, [])
        assert [p for p in parameters(vars(found)[verb]) if p not in own] == VERBS[verb], (module, verb)
        assert set(own) <= set(parameters(vars(found)[verb])), (module, verb)
