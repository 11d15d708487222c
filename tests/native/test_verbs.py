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


# fit, fit with our step, the reference loop, and the fast path where the engine has one (the compiled one runs the
# same driver, and the fused scan refuses an `on_step`)
ON_STEP = [f"keras-{ENGINE}", f"keras-{ENGINE}-train-step", f"{ENGINE}-native"] + [
    name for name in [f"{ENGINE}-native-fast"] if name in paths.PATHS]


@pytest.mark.parametrize("name", ON_STEP)
def test_every_path_calls_on_step_with_the_steps_loss_or_none(har, name):
    """`on_step` has one signature on every path, `on_step(loss)`, once per optimizer step: the batch's loss from
    the loops and the paths on the driver; None from `fit`'s paths, whose callback sees the epoch's running mean,
    not the batch's loss. (The fused scan refuses an `on_step`: nothing runs between its steps.)"""
    import numpy as np

    from keras_side import models
    from keras_side.determinism import seed_everything
    from keras_side.spec import TrainConfig

    cfg, seen = TrainConfig(epochs=1, batch_size=512, validate=False), []
    seed_everything(0)
    paths.get(name).train(models.har(), har, cfg, on_step=lambda *args: seen.append(args))
    assert len(seen) == -(-har.n_train // cfg.batch_size)  # a call per step, the short last one included
    if name.startswith("keras-"):
        assert seen == [(None,)] * len(seen)
    else:
        assert all(len(args) == 1 and np.isfinite(float(args[0])) for args in seen)
