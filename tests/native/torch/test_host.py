"""The Keras model as a torch module: its parameters, the `functional_call` trap, a host module around it
(`native.torch.host`): training mode, checkpoints, dtypes, copies."""
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import torch

from compare.referee.tolerances import PORTABLE_ATOL
from keras_side import models
from keras_side.determinism import seed_everything
from native.torch import fast
from native.torch import host as torch_host


def test_keras_model_is_a_torch_module_with_its_weights_as_parameters():
    seed_everything(0)
    model = models.har()
    assert isinstance(model, torch.nn.Module)
    params = [p for p in model.parameters() if p.requires_grad]
    assert sorted(p.numel() for p in params) == sorted(int(np.prod(w.shape)) for w in model.trainable_weights)


def test_functional_call_trap_gives_zero_gradients(har):
    """Why the torch loop does not use torch.func.functional_call (keras-team/keras#20279): the Keras layers
    read their own variables, not the parameters passed in, so the gradient comes out zero or missing."""
    seed_everything(0)
    model = models.har()
    params = {name: p.detach().clone().requires_grad_(True) for name, p in model.named_parameters()}
    x, y = torch.as_tensor(har.x_train[:256]), torch.as_tensor(har.y_train[:256])
    loss = torch.mean((torch.func.functional_call(model, params, (x,)) - y) ** 2)
    grads = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
    assert all(g is None or float(g.abs().max()) == 0.0 for g in grads)
    ours = fast.grad_at(model, har.x_train[:256], har.y_train[:256])
    assert all(np.all(g != 0) for g in ours)


PREDICT_ON_JAX = """
import sys, numpy as np
from keras_side import models
from keras_side.spec import TrainConfig
model = models.har()
model.load_weights(sys.argv[1])
np.save(sys.argv[3], model.predict(np.load(sys.argv[2]), verbose=0))
"""

def test_keras_part_of_a_torch_host_trains_and_moves_to_jax(har, tmp_path):
    seed_everything(0)
    host = torch_host.HostModel(models.har())
    names = [n for n, _ in host.named_parameters()]
    assert names == ["variables.0_kernel", "variables.1_bias", "calibrate.weight", "calibrate.bias"]
    before = host.har.get_weights()[0].copy()
    x, y = torch.as_tensor(har.x_train), torch.as_tensor(har.y_train)
    losses = torch_host.train_host(host, x, y, steps=200, lr=0.02)
    assert losses[-1] < 0.5 * losses[0]
    assert not np.array_equal(host.har.get_weights()[0], before)
    again = torch_host.HostModel(models.har())  # (n,) targets are (n, 1) ones, as fit takes them (not (n, n))
    again.load_state_dict(host.state_dict())
    assert torch_host.train_host(again, x[:8], y[:8, 0], steps=1, lr=0.0) == torch_host.train_host(
        again, x[:8], y[:8], steps=1, lr=0.0)

    from tests.native.loops import constrained_mlp  # a Keras weight's constraint holds in the host's training too

    bound = torch_host.HostModel(models.ensure_built(constrained_mlp(), har.x_train))
    torch_host.train_host(bound, x, y, steps=50, lr=0.05)
    hidden, _, output, _ = bound.har.get_weights()
    assert np.linalg.norm(hidden, axis=0).max() <= 0.3 * (1 + 1e-6) and output.min() >= 0

    weights, x_path, out = tmp_path / "har.weights.h5", tmp_path / "x.npy", tmp_path / "pred.npy"
    host.har.save_weights(str(weights))
    np.save(x_path, har.x_test)
    env = {**os.environ, "KERAS_BACKEND": "jax"}
    subprocess.run([sys.executable, "-c", PREDICT_ON_JAX, str(weights), str(x_path), str(out)], env=env, check=True,
                   capture_output=True)
    with torch.no_grad():
        here = host.har(torch.as_tensor(har.x_test)).numpy()
    np.testing.assert_allclose(np.load(out), here, atol=PORTABLE_ATOL, rtol=0)


def test_host_train_and_eval_reach_the_keras_model():
    """`host.train()` turns the Keras model's Dropout on, `host.eval()` off, as for any torch submodule."""
    seed_everything(0)
    host = torch_host.HostModel(models.dropout_mlp(seed=None))
    x = torch.ones(64, 3)
    with torch.no_grad():
        host.train()
        assert not torch.equal(host(x), host(x))  # a new dropout mask each call
        host.eval()
        assert torch.equal(host(x), host(x))
        np.testing.assert_array_equal(host(x).numpy(), host.calibrate(host.har(x, training=False)).numpy())


SAVE_IN_ANOTHER_PROCESS = """
import sys, keras, torch
from native.torch.host import HostModel
from tests.native.torch.test_host import unnamed_model

torch.manual_seed(0)
keras.utils.set_random_seed(0)
host = HostModel(unnamed_model())
torch.save(host.state_dict(), sys.argv[1])
torch.save(host.eval()(torch.ones(4, 3)), sys.argv[2])
"""


def unnamed_model():
    """Every name auto-numbered by Keras (sequential_N, dense_N): the keys of its own state_dict depend on what the
    process built before; BatchNorm's statistics and a Dropout's seed state are variables too."""
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.BatchNormalization(),
                             keras.layers.Dropout(0.2, seed=1), keras.layers.Dense(1)])


def test_a_hosts_checkpoint_loads_in_another_process_and_in_this_one(tmp_path):
    """The Keras model's own state_dict has each weight twice, under counter-numbered keys; the host's has each
    variable once under "<index>.<name>": saved in one process, it loads in another that built other models first,
    and into a second instance in the same process."""
    import os
    import subprocess
    import sys

    from tests.conftest import REPO

    env = {**os.environ, "KERAS_BACKEND": "torch", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", SAVE_IN_ANOTHER_PROCESS, str(tmp_path / "host.pt"),
                           str(tmp_path / "out.pt")], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    saved = torch.load(tmp_path / "host.pt", weights_only=True)
    assert list(saved) == ["har.0.kernel", "har.1.bias", "har.2.gamma", "har.3.beta", "har.4.moving_mean",
                           "har.5.moving_variance", "har.6.seed_generator_state", "har.7.kernel", "har.8.bias",
                           "calibrate.weight", "calibrate.bias"]
    unnamed_model(), unnamed_model()  # this process's counters move on: its own keys now differ from the saver's
    here = torch_host.HostModel(unnamed_model())
    here.load_state_dict(saved)  # strict: every key found, none left over
    assert torch.equal(here.eval()(torch.ones(4, 3)), torch.load(tmp_path / "out.pt", weights_only=True))
    again = torch_host.HostModel(unnamed_model())
    again.load_state_dict(here.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(again.state_dict().values(), saved.values()))


def test_a_load_with_assign_is_refused_where_the_keras_layers_would_not_see_it():
    """`load_state_dict(sd, assign=True)` said "All keys matched" and swapped torch's parameters, but the Keras
    layers went on computing with (and training) their old tensors."""
    seed_everything(0)
    source, target = torch_host.HostModel(models.har()), torch_host.HostModel(models.har())
    x = torch.ones((4, 3))
    before = target.eval()(x)
    with pytest.raises(RuntimeError, match="har: load_state_dict\\(..., assign=True\\) would put new tensors in "
                                           "torch's parameters, which the Keras layers do not compute with"):
        target.load_state_dict(source.state_dict(), assign=True)
    target.load_state_dict(source.state_dict())
    assert torch.equal(target.eval()(x), source.eval()(x)) and not torch.equal(before, target(x))


def test_a_host_keeps_its_dtypes():
    """`host.double()` cast every weight to float64 and the Keras part went on computing in float32: an answer in
    float64 at float32's precision, without a word. Refused now, before anything is cast; devices still move."""
    host = torch_host.HostModel(models.har())
    for change in (host.double, host.half, lambda: host.to(torch.float64)):
        with pytest.raises(TypeError, match=r"^HostModel keeps its dtypes: its torch.float32 weights would become "
                                            r"torch.float(64|16), but the Keras model computes in its dtype policy "
                                            r"\(float32\)"):
            change()
        assert {p.dtype for p in host.parameters()} == {torch.float32}  # nothing half-cast
    assert host.to("cpu") is host and host.float() is host


def test_a_deep_copy_of_a_host_keeps_its_keys_and_its_weights():
    """An EMA copy or a snapshot: Keras copies its model by saving and loading it, and the copy's state dict had
    Keras's numbered keys ("har._torch_params.har/kernel"), which no fresh host loads."""
    import copy

    seed_everything(0)
    host = torch_host.HostModel(models.dropout_mlp())
    clone = copy.deepcopy(host)
    assert clone.har is not host.har and list(clone.state_dict()) == list(host.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(clone.state_dict().values(), host.state_dict().values()))
    with torch.no_grad():
        clone.har.layers[0].kernel.assign(clone.har.layers[0].kernel + 1)  # its own weights, not the source's
    fresh = torch_host.HostModel(models.dropout_mlp())
    fresh.load_state_dict(clone.state_dict())
    x = torch.ones((4, 3))
    assert torch.equal(fresh.eval()(x), clone.eval()(x)) and not torch.equal(fresh(x), host.eval()(x))
