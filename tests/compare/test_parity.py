"""Gradient parity through the pytest plugin's `grad_parity` fixture, on every engine."""
import numpy as np
import pytest

from compare.parity import ParityError, assert_gradients_match
from keras_side import models
from tests.compare import parity_models

RNG = np.random.default_rng(0)
X3, Y = RNG.normal(size=(64, 3)).astype(np.float32), RNG.normal(size=(64, 1)).astype(np.float32)
IDS = RNG.integers(0, 6, size=(64, 1)).astype(np.int32)

KERAS_SIDE_INPUTS = {
    "har": X3, "mlp_sequential": X3, "mlp_functional": X3, "mlp_subclass": X3, "noisy_har": X3,
    "panel": [X3, IDS], "leverage": [X3, np.minimum(X3[:, :1], 0)],
}


def test_every_keras_side_model_is_listed():
    assert set(KERAS_SIDE_INPUTS) == set(models.BUILDERS)


@pytest.mark.parametrize("name", list(KERAS_SIDE_INPUTS))
def test_keras_side_models(grad_parity, name):
    grads = grad_parity(f"keras_side.models:{name}", KERAS_SIDE_INPUTS[name], Y)
    assert set(grads) == {"torch", "jax", "tensorflow"}
    assert all(np.any(g != 0) for gs in grads.values() for g in gs)


OTHERS = [
    ("dense_stack", RNG.normal(size=(32, 5)), "mse"),
    ("embedding_model", RNG.integers(0, 10, size=(32, 7)).astype(np.int32), "mse"),
    ("conv1d_model", RNG.normal(size=(32, 12, 2)), "mse"),
    ("lstm_model", RNG.normal(size=(32, 6, 2)), "mse"),
    ("layernorm_model", RNG.normal(size=(32, 5)), "huber"),
    ("custom_layer_model", RNG.normal(size=(32, 3)), parity_models.log_cosh),
]


@pytest.mark.parametrize("name, x, loss", OTHERS, ids=[o[0] for o in OTHERS])
def test_layer_zoo(grad_parity, name, x, loss):
    x = x.astype(np.float32) if x.dtype == np.float64 else x
    grad_parity(getattr(parity_models, name), x, Y[: len(x)], loss=loss)


@pytest.mark.grad_parity_engines("torch", "jax")
def test_marker_chooses_engines(grad_parity):
    assert set(grad_parity(parity_models.har, X3, Y)) == {"torch", "jax"}


def test_a_backend_dependent_gradient_is_caught_and_named(grad_parity):
    with pytest.raises(AssertionError) as err:
        grad_parity(parity_models.backend_dependent_model, X3, Y)
    header, columns, *rows = str(err.value).splitlines()
    assert "reference: float64 autograd on jax" in header and columns.split()[:3] == ["weight", "engine", "vs"]
    failing = {tuple(row.split()[:3]) for row in rows}
    assert failing == {("sequential/odd/kernel", "torch", other) for other in ("float64", "jax", "tensorflow")}


def test_unimportable_builder_is_a_clear_error():
    with pytest.raises(ParityError, match="module 'no_such_module' cannot be imported"):
        assert_gradients_match("no_such_module:build", X3, Y)
    with pytest.raises(ParityError, match="must be a function defined at module top level"):
        assert_gradients_match(lambda: None, X3, Y)
    with pytest.raises(ParityError, match="unknown engine\\(s\\) mxnet"):
        assert_gradients_match(parity_models.har, X3, Y, engines=["jax", "mxnet"])


@pytest.mark.parametrize("call, message", [
    # a NaN tolerance let every difference through (a comparison with NaN is false); a negative one failed equal ones
    (lambda g, f: g(parity_models.skewed_middle, X3, Y, rtol=float("nan")), "rtol must be a finite number >= 0"),
    (lambda g, f: f(parity_models.skewed_middle, X3, atol=-1e-6), "atol must be a finite number >= 0, got -1e-06"),
    (lambda g, f: g(parity_models.har, X3, Y, atol="1e-3"), "atol must be a finite number >= 0, got '1e-3'"),
    # no rows passed (every gradient 0), and rows that differ were each engine's own broadcasting error
    (lambda g, f: g(parity_models.skewed_middle, X3[:0], Y[:0]), "x and y have no rows; give at least one"),
    (lambda g, f: f(parity_models.skewed_middle, X3[:0]), "x and y have no rows; give at least one"),
    (lambda g, f: g(parity_models.har, X3, Y[:50]), "x and y must have the same number of rows; got \\[50, 64\\]"),
    (lambda g, f: f(parity_models.har, np.where(np.arange(64)[:, None] == 7, np.inf, X3)),
     "x holds NaN or inf \\(first in row 7\\)"),
    (lambda g, f: g(parity_models.har, {"x": X3}, Y), "x must be an array with one row per example"),
    (lambda g, f: g(parity_models.all_frozen, X3, Y), "all_frozen has no trainable weights, so there is no "
                                                       "gradient to compare"),
    (lambda g, f: g(parity_models.a_layer, X3, Y), "the model builder returned Dense, not a keras.Model"),
    # a list of targets was NumPy's ValueError (of another width) or "x and y must have the same number of rows"
    (lambda g, f: g(parity_models.har, X3, [Y, np.hstack([Y, Y])]), "y is a list: the gradient is compared for one "
                                                                   "target array and one loss"),
    (lambda g, f: g(parity_models.har, X3, [Y, Y]), "y is a list"),
    # x.tolist() reached the worker as 64 inputs ("received 64 input tensors")
    (lambda g, f: f(parity_models.har, X3.tolist()),
     "x is a Python list of lists, not of arrays; pass np.asarray\\(x\\)"),
    (lambda g, f: g(parity_models.har, X3, Y, seed=1.5), "seed must be a whole number >= 0, got 1.5"),  # NumPy's
    (lambda g, f: g(parity_models.har, X3, Y, weights=[np.full((3, 1), np.nan), np.zeros(1)]),  # a table of nan
     "weights for har/har/kernel hold NaN or inf; give finite weights"),
])
def test_bad_calls_are_one_clear_error(grad_parity, forward_parity, call, message):
    with pytest.raises(ParityError, match=message):
        call(grad_parity, forward_parity)


def test_a_failure_shows_the_users_call_not_the_plugins_frames(tmp_path):
    """A failing check's traceback is the test's own line and the message: the plugin's and the checks' frames (for a
    failed comparison, the source of `_compare` and the reprs of x and the weights) are hidden, as training_parity's
    were; the option's engines may have spaces (" jax" was an unknown engine). Every failure of a check, a table or
    a ParityError, leaves the plugin the same way (`plugin._alone`): here a ParityError, which starts no worker (the
    session's workers start once a call's arguments are checked)."""
    import subprocess
    import sys

    from tests.conftest import REPO

    (tmp_path / "test_mine.py").write_text(
        "import numpy as np\nfrom tests.compare import parity_models\n\n\n"
        "def test_mine(grad_parity):\n"
        "    x = np.ones((8, 3), np.float32)\n"
        "    grad_parity(parity_models.har, x, [x, x])\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
                           "--basetemp", str(tmp_path / "temp"), "--grad-parity-engines", "torch, jax",
                           str(tmp_path / "test_mine.py")],
                          capture_output=True, text=True, cwd=REPO)
    out = proc.stdout
    assert proc.returncode == 1 and "compare.parity.common.ParityError: y is a list" in out, out[-3000:]
    assert "grad_parity(parity_models.har, x, [x, x])" in out and "compare/parity/" not in out, out[-3000:]
    assert not list((tmp_path / "temp").glob("grad-parity*"))  # the workers' folder: none started


def test_engines_may_be_one_string():
    from compare.parity.common import check_engines

    assert check_engines("torch") == ["torch"] and check_engines("jax, tensorflow") == ["jax", "tensorflow"]
    with pytest.raises(ParityError, match="unknown engine\\(s\\) mxnet"):
        check_engines("torch,mxnet")


def test_failing_builder_names_the_callable(grad_parity):
    with pytest.raises(ParityError, match="tests.compare.parity_models:failing_model.*always fails"):
        grad_parity(parity_models.failing_model, X3, Y)


def test_readme_example_runs_in_a_project_that_never_heard_of_us(tmp_path):
    """The documented pytest example (docs/parity.md), pasted into an empty project: the entry point provides the
    fixture."""
    import re
    import subprocess
    import sys

    from tests.conftest import REPO

    page = (REPO / "docs" / "parity.md").read_text()
    example = re.search(r"```python\n# run by tests/compare/test_parity.py: tests/test_parity.py in your project\n(.*?)```",
                        page, re.S)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_parity.py").write_text(example.group(1))  # importable only through pytest's path
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_parity.py"],
                          cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "5 passed" in proc.stdout


def test_the_gradient_is_the_training_objectives(grad_parity):
    """A kernel regularizer is part of what `fit` minimizes, so it is part of the gradient every engine reports: at
    the same weights, the regularized Dense(1)'s kernel gradient is the plain one plus 2·0.05·kernel."""
    from compare.data import reference

    rng = np.random.default_rng(1)
    weights = [rng.normal(size=(3, 1)).astype(np.float32), rng.normal(size=(1,)).astype(np.float32)]
    plain = reference.mse_gradient(X3, Y, *weights)
    for engine, (kernel, bias) in grad_parity(parity_models.regularized, X3, Y, weights=weights).items():
        np.testing.assert_allclose(kernel, plain[0] + 0.1 * weights[0], rtol=1e-5, atol=1e-6, err_msg=engine)
        np.testing.assert_allclose(bias, plain[1], rtol=1e-5, atol=1e-6, err_msg=engine)


def test_your_own_weights_are_checked_against_the_model(grad_parity):
    with pytest.raises(ParityError, match=r"weights has 1 arrays but the model has 2 trainable weights"):
        grad_parity(parity_models.har, X3, Y, weights=[np.zeros((3, 1))])
    with pytest.raises(ParityError, match=r"weights for .*kernel have shape \(1, 3\), the model's is \(3, 1\)"):
        grad_parity(parity_models.har, X3, Y, weights=[np.zeros((1, 3)), np.zeros(1)])


def test_a_nan_gradient_fails(grad_parity):
    """NaN compares false with everything: a check that only asks `excess > 0` would pass it. A model whose output is
    NaN on finite inputs makes every engine's gradient NaN, and the check fails naming the weights (NaN inputs are
    refused before any engine runs: `test_bad_calls_are_one_clear_error`)."""
    with pytest.raises(AssertionError, match="nan"):
        grad_parity(parity_models.nan_inside, X3, Y)


@pytest.mark.parametrize("build, x", [(parity_models.har, X3), (parity_models.lstm_model, RNG.normal(size=(16, 6, 2))),
                                      (models.panel, [X3, IDS]), (parity_models.mlp_subclass, X3)],
                         ids=["har", "lstm", "panel", "subclass"])
def test_every_layers_output_matches(forward_parity, build, x):
    x = x.astype(np.float32) if isinstance(x, np.ndarray) and x.dtype == np.float64 else x
    outputs = forward_parity(build, x)
    assert set(outputs) == {"torch", "jax", "tensorflow"}
    names = list(outputs["jax"])
    assert all(list(o) == names for o in outputs.values()) and names
    if build is models.panel:  # every layer of the graph, inputs included, in the model's order
        assert set(names) == {"har_means", "asset_id", "asset_level", "flatten", "concat", "har"}


def test_the_first_layer_where_engines_part_is_named(forward_parity):
    with pytest.raises(AssertionError) as err:
        forward_parity(parity_models.skewed_middle, X3)
    header, columns, *rows = str(err.value).splitlines()
    assert "the engines first part at layer 'skew', 2 of 3" in header and columns.split()[0] == "layer"
    assert {row.split()[0] for row in rows} == {"skew", "last"} and all("torch" in row.split()[1:3] for row in rows)


def test_a_bad_loss_is_not_blamed_on_the_model(grad_parity):
    with pytest.raises(ParityError, match="could not run \\(the model, the loss or the data\\).*hubber"):
        grad_parity(parity_models.har, X3, Y, loss="hubber")


def test_non_trainable_weights_are_the_same_on_every_engine(forward_parity, grad_parity):
    """A frozen layer's weights are not among the trainable ones the check draws; the reference engine's are set on
    every engine, so the engines agree instead of each keeping its own random draw."""
    outputs = forward_parity(parity_models.frozen_layer, X3)
    assert list(outputs["torch"]) == ["first", "frozen", "last"]
    grad_parity(parity_models.frozen_layer, X3, Y)


def test_a_model_with_a_functional_backbone_is_compared_on_its_output(forward_parity):
    outputs = forward_parity(parity_models.with_backbone, X3)
    assert all(len(o) == 1 and next(iter(o.values())).shape == (64, 1) for o in outputs.values())


def test_a_project_with_its_own_compare_module_runs_its_tests_and_a_fixture_says_why_it_cannot(tmp_path):
    """pytest loads the plugin in every project at its start: a project's own `compare.py` (first on sys.path under
    `python -m pytest`) must not stop its tests, and a parity fixture used there fails in one line naming both."""
    import subprocess
    import sys

    (tmp_path / "compare.py").write_text("def compare(a, b):\n    return a == b\n")
    (tmp_path / "test_theirs.py").write_text(
        "import compare\n\n\ndef test_theirs():\n    assert compare.compare(1, 1)\n\n\n"
        "def test_with_a_fixture(grad_parity):\n    pass\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_theirs.py"],
                          cwd=tmp_path, capture_output=True, text=True)
    out = proc.stdout
    assert "1 passed" in out and "1 error" in out, out[-3000:]
    assert f"but `compare` here is {tmp_path / 'compare.py'}: rename your module" in out, out[-3000:]


def test_the_engine_free_core_imports_no_engine():
    """The CLI, the referee and the plugin import without torch, JAX, TensorFlow or Keras (`pip install
    native-loops[jax]` has no torch): each is blocked in a fresh interpreter, and `native-loops --help` still runs."""
    import subprocess
    import sys

    code = ("import sys\nfor name in ('torch', 'jax', 'tensorflow', 'keras', 'optax'):\n    sys.modules[name] = None\n"
            "import keras_side.pytest_plugin, compare.parity.plugin, compare.referee.checks\n"
            "from compare import cli\nsys.exit(cli.main(['--help']))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0 and "usage: native-loops" in proc.stdout, proc.stderr[-2000:]


def test_a_random_layer_in_training_mode_is_refused_before_it_is_blamed(forward_parity, grad_parity):
    """With training=True each engine (and the float64 reference) draws its own Dropout masks: one line, no table."""
    for check in (forward_parity, grad_parity):
        args = (X3,) if check is forward_parity else (X3, Y)
        with pytest.raises(ParityError, match="dropout_model draws random numbers while training \\(layer 'drop'\\)"):
            check(parity_models.dropout_model, *args, training=True)
    forward_parity(parity_models.dropout_model, X3)  # in inference mode it draws nothing: compared as any model


def test_two_engines_each_within_tolerance_of_float64_are_within_both_allowances_of_each_other():
    """Each engine may be its whole allowance from float64, on either side of it: a correct pair can be twice it
    apart (MultiHeadAttention's engines, 1.19e-6 apart against 1.17e-6 allowed, were failed)."""
    from compare.parity.common import mismatches

    reference, allowed = [np.array([1.0])], 1e-6 + 1e-4 * 1.0
    near = {"torch": [np.array([1.0 + 0.9 * allowed])], "jax": [np.array([1.0 - 0.9 * allowed])]}
    assert mismatches(["w"], near, reference, 1e-4, 1e-6) == []
    far = {"torch": [np.array([1.0 + 1.5 * allowed])], "jax": [np.array([1.0])]}
    assert [(r[1], r[2]) for r in mismatches(["w"], far, reference, 1e-4, 1e-6)] == [("torch", "float64")]
