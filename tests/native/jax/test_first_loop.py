"""The lesson's JAX loops: the first loop ends on the reference loop's weights, bit for bit, near OLS; both stay
short and on Keras's and JAX's public API."""
import ast
from pathlib import Path

import keras
import numpy as np

from compare.data import panel, reference, synthetic
from compare.referee.tolerances import SLOPE_ATOL
from keras_side import models
from keras_side.spec import TrainConfig
from native.jax import first_loop, loop

FIRST_LOOP, LOOP = Path(first_loop.__file__), Path(loop.__file__)


def test_the_first_loop_ends_on_the_reference_loops_weights_near_ols(capsys):
    model, data = first_loop.main()
    keras.utils.set_random_seed(first_loop.SEED)
    reference_weights = loop.train(models.har(), data, TrainConfig()).weights
    for ours, theirs in zip(model.get_weights(), reference_weights, strict=True):
        np.testing.assert_array_equal(ours, theirs)
    kernel, bias = model.get_weights()
    _, slopes = data.scaling.to_original(kernel, bias)
    ols = reference.ols_for(synthetic.simulate(first_loop.SEED), data.asset, panel.DEFAULT_SPLIT, None)
    np.testing.assert_allclose(slopes, ols.slopes, atol=SLOPE_ATOL)
    assert "slopes (d1, s5, m22):" in capsys.readouterr().out


def code_lines(path: Path) -> int:
    """Lines of code: not blank, not a comment, not a docstring."""
    source = path.read_text()
    docstrings = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)) and ast.get_docstring(node) is not None:
            docstrings.update(range(node.body[0].lineno, node.body[0].end_lineno + 1))
    return sum(1 for i, line in enumerate(source.splitlines(), 1)
               if line.strip() and not line.strip().startswith("#") and i not in docstrings)


def test_the_loops_fit_on_a_screen_and_use_public_api_only():
    assert code_lines(FIRST_LOOP) <= 40 and code_lines(LOOP) <= 150
    for path in (FIRST_LOOP, LOOP):
        source = path.read_text()
        assert "keras.src" not in source, path.name
        imported = {a.name for n in ast.walk(ast.parse(source)) if isinstance(n, (ast.Import, ast.ImportFrom))
                    for a in n.names}
        assert "convolution" not in imported, f"{path.name} swaps Keras's convolution: a fast path's business"
        private = [n.attr for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Attribute) and n.attr[0] == "_"]
        assert not private, f"{path.name} reads {private}"


def test_the_reference_loop_has_the_torch_loops_verbs_in_its_order():
    """`diff native/torch/loop.py native/jax/loop.py` reads as the same loop: the same first functions, in order."""
    def functions(path):
        return [n.name for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef)]

    torch_loop = LOOP.parent.parent / "torch" / "loop.py"
    verbs = ["make_step", "evaluate", "batch_orders", "train"]
    assert functions(LOOP)[:4] == functions(torch_loop)[:4] == verbs
    assert functions(LOOP)[-2:] == functions(torch_loop)[-2:] == ["grad_at", "predict"]
