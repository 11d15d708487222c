"""`native-loops zoo`: a fast subset of the matrix (six models, few rows, one epoch) on every installed engine;
bad options are one-line errors that write nothing. `native-loops zoo` with no options runs the full matrix."""
import contextlib
import io
import json

import numpy as np
import pytest

from compare import cli
from compare.referee import figures, zoo
from compare.data import synthetic
from compare.referee.tolerances import HISTORY_ATOL, ZOO_ATOL
from keras_side.backend import installed_engines
from keras_side.zoo import OPTIMIZERS
from tests.tiers import rows

FAST = ["--rows", "300", "--epochs", "1"]  # three batches, the last one short
# The CLI's subset: a model for each kind of data and each thing a cell handles (sample weights, penalties, a sequence,
# two outputs, a metric, two inputs), on every engine. Every zoo model is stepped against `fit` on every path and
# engine in test_training_parity.py, BatchNorm's below; `native-loops zoo` runs the whole matrix.
MODELS = ["har_recent", "mlp_l2", "conv1d", "two_horizons", "classifier", "panel"]


def run_cli(args):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(["zoo", *args])
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def every_model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("zoo") / "run"
    code, text, _ = run_cli([*FAST, "--models", ",".join(MODELS), "--optimizers", "adam", "--no-fast-paths", "--out",
                             str(folder)])
    return code, folder, json.loads((folder / "zoo.json").read_text()), text


def test_every_model_on_every_engine_ends_where_fit_ends(every_model):
    code, folder, report, text = every_model
    assert code == 0, [c for c in report["cells"] if c["judged"] and not c["passed"]]
    engines = installed_engines()
    assert len(zoo.paths_on("tensorflow")) == 2  # TensorFlow's optimizers are Keras's: no stock flavour
    assert len(report["cells"]) == len(MODELS) * sum(len(zoo.paths_on(e)) for e in engines)
    judged = [c for c in report["cells"] if c["judged"]]
    assert {(c["model"], c["engine"], c["path"]) for c in judged} == {
        (m, e, p) for m in MODELS for e in engines for p in ("train-step", "native")}
    assert all(c["gap"] <= ZOO_ATOL and c["tolerance"] == ZOO_ATOL for c in judged)
    assert all(c["history_gap"] <= HISTORY_ATOL for c in judged)  # the loss, mae and accuracy per epoch
    assert report["seed"] == 0 and report["versions"]["keras"] == "3.15.1" and report["incomplete"] == {}
    assert (folder / "zoo.png").stat().st_size > 0 and not list(folder.glob("*.npz"))
    assert "judged cells within" in text and "two_horizons" in text


# make test: a two-output Functional model (BatchNorm's compiled step and scan: tests/native/torch/test_compile.py,
# tests/native/jax/test_many.py).
FAST_PATH_MODELS = rows(["bn_mlp", "two_horizons"], fast=["two_horizons"])
# make test: JAX's fast paths through the zoo; torch's fast and compiled loops end on the reference loop's weights in
# tests/native/torch/test_fast.py and test_compile.py, where `make test` runs them.
FAST_PATH_ENGINES = [e for e in ("jax",) if e in installed_engines()]


def test_each_engines_fast_path_ends_where_fit_ends(tmp_path):
    """torch's fast and compiled loops, JAX's convolution as a matmul and fused scan, judged as the native loop is (the CLI's full run judges them on
    every model; here few, to keep `make test`'s compiles few). Only the engines that have one: TensorFlow's cells
    are the fixture's above."""
    engines = rows([e for e in installed_engines() if e in zoo.FAST_PATHS], fast=FAST_PATH_ENGINES)
    report = zoo.run(synthetic.simulate(0), models=FAST_PATH_MODELS, engines=engines, optimizers=["adam"],
                     folder=tmp_path, epochs=1, rows=300, fast=True)
    fast = [c for c in report["cells"] if c["path"] in zoo.FAST_PATHS.get(c["engine"], ())]
    assert {(c["engine"], c["path"]) for c in fast} == {(e, p) for e in engines for p in zoo.FAST_PATHS[e]}
    assert engines and len(fast) == len(FAST_PATH_MODELS) * 2 * len(engines) and all(c["judged"] for c in fast)
    assert zoo.passed(report), [c for c in report["cells"] if c["judged"] and not c["passed"]]
    assert zoo.paths_on("tensorflow", fast=True) == zoo.paths_on("tensorflow")  # no fast path there


def test_the_figure_shows_the_worst_judged_path_of_each_cell():
    """Whatever order the paths' cells come in, a cell of the figure is its worst path; a failed one is ✗ (inf)."""
    def cell(path, gap, optimizer="adam"):
        return {"model": "har", "optimizer": optimizer, "path": path, "gap": gap}

    cells = [cell("train-step", 0.0), cell("native", 1e-7), cell("native-compile", 1e-8),
             cell("native", float("nan"), "sgd"), cell("native-compile", 1e-8, "sgd")]
    grid = figures.zoo_grid(cells, ["har", "mlp_l2"], ["adam", "sgd"], floor=-9.0)
    assert grid[0, 0] == pytest.approx(-7.0) and grid[0, 1] == np.inf and np.isnan(grid[1]).all()
    assert figures.zoo_grid(cells[:1], ["har"], ["adam"], floor=-9.0)[0, 0] == -9.0  # bit-identical: the floor
    history_off = cell("native", 1e-9) | {"passed": False}  # its weights within the tolerance, its history not
    assert figures.zoo_grid([history_off], ["har"], ["adam"], floor=-9.0)[0, 0] == np.inf


# make test: every setting on torch, in one worker (torch's Keras-exact optimizers are the package's own torch.optim
# classes, JAX's the package's own composition of optax transforms, TensorFlow's Keras's: tests/native/test_optim.py
# steps every engine's against Keras's, every setting, in each engine's suite); `make test-full` (and `native-loops
# zoo`): every setting on every engine, through the zoo's loops.
OPTIMIZER_ENGINES = [e for e in rows(["torch", "jax", "tensorflow"], fast=["torch"]) if e in installed_engines()]


def test_every_optimizer_setting_on_a_regularized_model(tmp_path):
    """Each optimizer, schedule and clip of the zoo, on the MLP whose penalties ride in the objective (each engine's
    Keras-exact optimizers are also stepped against Keras's, every setting on every engine, on a kernel and a bias,
    in tests/native/test_optim.py); plain Adam, on this MLP too, is the test above's."""
    others = [name for name in OPTIMIZERS if name != "adam"]
    report = zoo.run(synthetic.simulate(0), models=["mlp_l2"], engines=OPTIMIZER_ENGINES, optimizers=others,
                     folder=tmp_path, epochs=1, rows=300)
    judged = [c for c in report["cells"] if c["judged"]]
    assert {(c["engine"], c["optimizer"]) for c in judged} == {(e, o) for e in OPTIMIZER_ENGINES for o in others}
    assert len(judged) == len(others) * len(OPTIMIZER_ENGINES) * 2  # fit's own train_step and the native loop
    assert zoo.passed(report), [c for c in judged if not c["passed"]]


@pytest.mark.parametrize("args, message", [
    (["--models", "har,resnet"], "unknown model(s) resnet"),
    (["--models", "har,bn_mlp,har"], "--models names har more than once"),
    (["--optimizers", "lion"], "unknown optimizer(s) lion"),
    (["--rows", "0"], "--rows must be at least 1"),
    (["--rows", "99999999"], "--rows 99,999,999: more than the 2,263 training rows of classifier;"),  # not capped
    (["--epochs", "0"], "--epochs must be at least 1"),
    (["--engines", "torch,mxnet"], "unknown engine(s) mxnet"),
], ids=["model", "repeated", "optimizer", "rows", "too-many-rows", "epochs", "engine"])
def test_bad_options_are_one_line_and_write_nothing(tmp_path, args, message):
    code, out, err = run_cli([*args, "--out", str(tmp_path / "run")])
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists() and out == ""
