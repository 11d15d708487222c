"""The training spec: what Keras would refuse, or a path cannot honour, is one clear error naming the field."""
import json
import re

import pytest

from keras_side.spec import SpecError, TrainConfig


@pytest.mark.parametrize("changes, message", [
    (dict(learning_rate=-0.01), "learning_rate must be a positive number"),
    (dict(learning_rate=float("nan")), "learning_rate must be a positive number"),
    (dict(momentum=0.9), "momentum is an option of sgd and rmsprop"),
    (dict(optimizer="sgd", nesterov=True), "nesterov needs optimizer='sgd' with momentum > 0"),
    (dict(weight_decay=0.01), "weight_decay (>= 0) is supported with optimizer='adamw' only"),
    (dict(clipnorm=1.0, clipvalue=0.5), "set at most one of clipnorm, global_clipnorm and clipvalue"),
    (dict(clipnorm=0.0), "clipnorm must be a positive number"),
    (dict(loss="hinge"), "unknown loss 'hinge'"),
    (dict(from_logits=True), "from_logits applies to"),
    (dict(optimizer="lion"), "unknown optimizer 'lion'"),
    (dict(metrics=("accuracy",)), "metrics must be distinct names among"),
    (dict(schedule="step"), "unknown schedule 'step'"),
    (dict(schedule="piecewise", boundaries=(10,), values=(0.1,)), "one more value than boundaries"),
    (dict(schedule="cosine", warmup_steps=5), "needs both warmup_steps > 0 and warmup_target"),
    (dict(schedule="cosine", warmup_steps=5, warmup_target=0.0), "needs both warmup_steps > 0 and warmup_target > 0"),
    (dict(schedule="cosine", alpha=2.0), "alpha (the cosine's floor, a share of the rate) must be in [0, 1]"),
    (dict(schedule="exponential", decay_rate=-1.0), "decay_rate must be > 0"),
    (dict(schedule="exponential", warmup_steps=5), "warmup_steps is an option of the cosine schedule"),
    (dict(boundaries=(10,), values=(0.1, 0.01)), "boundaries is an option of the piecewise schedule"),
    (dict(rho=0.5), "rho is an option of rmsprop, not of optimizer 'adam'"),
    (dict(optimizer="sgd", epsilon=1e-3), "epsilon is an option of adam, adamw, rmsprop, adagrad"),
    (dict(beta_1=1.5), "beta_1 must be in [0, 1)"),
    (dict(clipnorm=float("nan")), "clipnorm must be a positive number"),
    (dict(epochs=2.5), "epochs and batch_size must be whole numbers"),
    (dict(seed=-1), "seed must be a whole number from 0 to 2**32 - 1 (NumPy's and JAX's seeds), got -1"),
    (dict(seed=2**32), "seed must be a whole number from 0 to 2**32 - 1"),  # was NumPy's ValueError, mid-training
    (dict(flavour="fast"), "flavour must be 'exact' or 'engine'"),
    (dict(patience=0), "early stopping needs patience >= 1 and validate=True"),
    (dict(patience=2, validate=False), "early stopping needs patience >= 1 and validate=True"),
    (dict(loss=("mse", "hinge")), "unknown loss 'hinge'"),
    (dict(loss=()), "loss is an empty tuple"),
    (dict(loss_weights=(1.0, 0.5)), "loss_weights weighs the losses of a model with several outputs"),
    (dict(loss=("mse",), loss_weights=(0.5,)), "loss_weights weighs the losses of a model with several outputs"),
    (dict(loss=("mse", "mae"), loss_weights=(1.0,)), "loss_weights has 1 weight(s) for 2 output losses"),
    (dict(loss=("mse", "mae"), loss_weights=(1.0, -0.5)), "loss_weights must be numbers >= 0, at least one"),
    (dict(loss=("mse", "mae"), loss_weights=(0, 0)), "loss_weights must be numbers >= 0, at least one of them > 0"),
    (dict(loss=("mse", "mae"), loss_weights="1,0.5"), "loss_weights must be a tuple of numbers"),
    (dict(loss=("mse", "mae"), loss_weights=0.5), "loss_weights must be a tuple of numbers"),
    # a field of the wrong kind (JSON gives strings and nulls): each was a TypeError from a comparison further on
    (dict(learning_rate="0.1"), "learning_rate must be a number, got '0.1'"),
    (dict(epsilon=None), "epsilon must be a number, got None"),
    (dict(optimizer="sgd", momentum="0.9"), "momentum must be a number, got '0.9'"),
    (dict(clipnorm=True), "clipnorm must be a number, got True"),
    (dict(patience="3"), "patience must be a whole number, got '3'"),
    (dict(metrics="mae"), "metrics must be a tuple of names (a JSON list), got 'mae'"),  # was "got m, a, e"
    (dict(schedule="piecewise", boundaries=(10.7,), values=(0.1, 0.01)), "boundaries must be a tuple of whole"),
    (dict(dense_gradients="no"), "dense_gradients must be True or False, got 'no'"),
    (dict(validate=None), "validate must be True or False"),
    (dict(loss=("mse", "mae"), metrics=("mae",)), "metrics on a model with several outputs"),
], ids=lambda v: str(v)[:40])
def test_a_spec_no_path_can_honour_is_one_clear_error(changes, message):
    with pytest.raises(SpecError, match=re.escape(message)):
        TrainConfig(**changes)


def test_numpy_arrays_and_whole_floats_are_a_schedules_boundaries_and_values():
    import numpy as np

    cfg = TrainConfig(schedule="piecewise", boundaries=np.array([10, 20]), values=np.linspace(0.1, 0.01, 3))
    assert cfg.boundaries == (10, 20) and cfg.values == pytest.approx((0.1, 0.055, 0.01))
    assert TrainConfig(schedule="piecewise", boundaries=[10.0], values=[0.1, 0.01]).boundaries == (10,)


def test_a_name_that_is_not_a_field_is_one_clear_error_naming_the_nearest():
    """It was a TypeError from the dataclass ("unexpected keyword argument"), with no hint."""
    with pytest.raises(SpecError, match=r"^'optimiser' is not a field of the training spec \(did you mean "
                                        r"'optimizer'\?\); its fields: epochs, batch_size"):
        TrainConfig.from_dict({"optimiser": "sgd"})
    with pytest.raises(SpecError, match=r"^'clip_norm' is not a field .*\(did you mean 'clipnorm'\?\)"):
        TrainConfig().replace(clip_norm=1.0)
    with pytest.raises(SpecError, match=r"^'zzz' is not a field of the training spec; its fields: "):
        TrainConfig.from_dict({"zzz": 1})
    assert TrainConfig.from_dict({"optimizer": "sgd"}) == TrainConfig(optimizer="sgd")
    # the constructor too, and another library's name for a field (difflib finds no 'learning_rate' in 'lr')
    with pytest.raises(SpecError, match=r"^'lr' is not a field of the training spec \(did you mean 'learning_rate'"):
        TrainConfig(lr=0.1)
    with pytest.raises(SpecError, match=r"^'epoch' is not a field .*\(did you mean 'epochs'\?\)"):
        TrainConfig(2, epoch=3)


def test_a_spec_travels_as_json_and_comes_back_equal():
    import json

    cfg = TrainConfig(optimizer="sgd", momentum=0.9, schedule="piecewise", boundaries=(10, 20),
                      values=(0.1, 0.01, 1e-3), metrics=("mae",), clipvalue=0.5, patience=3)
    assert TrainConfig(**json.loads(json.dumps(cfg.to_dict()))) == cfg
    two = TrainConfig(loss=("mse", "mae"), loss_weights=(1.0, 0.5))
    assert TrainConfig(**json.loads(json.dumps(two.to_dict()))) == two
    assert TrainConfig(loss=["mse"]) == TrainConfig() and TrainConfig().outputs == 1 and two.outputs == 2


def test_the_losses_must_fit_the_targets():
    from keras_side.checks import check_outputs

    check_outputs(TrainConfig(), 1)
    check_outputs(TrainConfig(loss=("mse", "mae")), 2)
    with pytest.raises(SpecError, match=re.escape("the data has 2 targets (one per output) but the spec gives "
                                                  "loss='mse'; give loss as a tuple of 2 losses")):
        check_outputs(TrainConfig(), 2)
    with pytest.raises(SpecError, match="the data has one target"):
        check_outputs(TrainConfig(loss=("mse", "mae")), 1)


def test_a_builder_the_module_does_not_have_is_one_clear_error():
    """It was the AttributeError, with a traceback from every process a launcher started."""
    from keras_side.spec import resolve

    assert callable(resolve("keras_side.models:har"))
    with pytest.raises(SpecError, match="^'keras_side.models:nope': module 'keras_side.models' has no 'nope'; give "
                                        "module:function$"):
        resolve("keras_side.models:nope")
    for missing, name in (("nomodule:f", "nomodule"), ("keras_side.nomodule:f", "keras_side.nomodule")):
        with pytest.raises(SpecError, match=f"^'{missing}': no module named '{name}' here; give module:function"):
            resolve(missing)  # was ModuleNotFoundError at the first step
    from keras_side.losses import keras_loss

    with pytest.raises(SpecError, match="no module named 'nomodule'"):  # a loss so named, as a path builds it
        keras_loss(TrainConfig(loss="nomodule:f"))


def test_numpy_integers_are_whole_numbers():
    """A seed from np.arange was refused: "seed must be a whole number ..., got np.int64(3)"."""
    import numpy as np

    cfg = TrainConfig(seed=np.int64(3), epochs=np.int32(2), batch_size=np.uint16(64))
    assert (cfg.seed, cfg.epochs, cfg.batch_size) == (3, 2, 64) and type(cfg.seed) is int
    assert json.loads(json.dumps(cfg.to_dict()))["seed"] == 3  # what the worker protocol and the reports carry
    with pytest.raises(SpecError, match="seed must be a whole number from 0 to 2"):
        TrainConfig(seed=np.uint64(2**32))
