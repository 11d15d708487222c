"""The pytest plugin (the `pytest11` entry point of native-loops): the parity fixtures.

    def test_my_model_has_gradient_parity(grad_parity):
        grad_parity("mypkg.models:build", x, y, loss="mse")

    def test_my_model_predicts_alike(forward_parity):
        forward_parity("mypkg.models:build", x)

    def test_my_model_trains_alike(training_parity):
        training_parity("mypkg.models:build", x, y, spec={"optimizer": "sgd"}, epochs=2)

    def test_my_loop_is_fit(loop_parity):
        loop_parity("mypkg.models:build", "mypkg.loops:torch_step", x, y, engine="torch")

Choose engines with `@pytest.mark.grad_parity_engines("torch", "jax")` or `--grad-parity-engines torch,jax`
(default: every installed engine; every fixture but `loop_parity`, whose step names its engine). One worker per
engine is started on first use and kept for the session, shared by every fixture.

pytest loads this module in every project where native-loops is installed, at its start. So it imports nothing
but pytest: the fixtures' work (`compare.parity.plugin`) is imported when a test first uses one. A project with a
`compare` module of its own then runs its tests as before, and a test that uses a fixture gets one line naming both.
"""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

OURS = Path(__file__).resolve().parent.parent / "compare"  # the package the fixtures' work lives in


def pytest_addoption(parser):
    parser.addoption("--grad-parity-engines", default=None, metavar="ENGINES",
                     help="comma-separated engines for the grad_parity, forward_parity and training_parity fixtures "
                     "(default: every installed engine)")


def pytest_configure(config):
    config.addinivalue_line("markers", "grad_parity_engines(*engines): engines the parity fixtures (grad_parity, "
                            "forward_parity, training_parity) compare")


def work():
    """`compare.parity.plugin`, or one line when `compare` is another project's module."""
    __tracebackhide__ = True
    try:
        return importlib.import_module("compare.parity.plugin")
    except ImportError:
        found = getattr(sys.modules.get("compare"), "__file__", None)
        if found is None or Path(found).resolve().parent == OURS:
            raise
    pytest.fail(f"native-loops' parity fixtures need its own package `compare` ({OURS}), but `compare` here is "
                f"{found}: rename your module, or run pytest with --import-mode=importlib so that it is not imported "
                "as `compare`", pytrace=False)


@pytest.fixture(scope="session")
def grad_parity_pool(tmp_path_factory):
    """Lazily started workers, one per installed engine, shared by every parity check of the session."""
    yield from work().pool(tmp_path_factory)


@pytest.fixture
def grad_parity(request, grad_parity_pool):
    """`grad_parity(build_model, x, y, loss="mse", rtol=..., atol=...)`: see `compare.parity.assert_gradients_match`."""
    return work().grad_parity(request, grad_parity_pool)


@pytest.fixture
def forward_parity(request, grad_parity_pool):
    """`forward_parity(build_model, x, rtol=..., atol=...)`: see `compare.parity.assert_forward_match`."""
    return work().forward_parity(request, grad_parity_pool)


@pytest.fixture
def training_parity(request, grad_parity_pool):
    """`training_parity(build_model, x, y, spec=..., steps=... or epochs=..., paths=...)`: see
    `compare.parity.assert_training_matches`."""
    return work().training_parity(request, grad_parity_pool)


@pytest.fixture
def loop_parity(grad_parity_pool):
    """`loop_parity(build_model, train_step, x, y, engine=..., spec=..., steps=... or epochs=...)`: see
    `compare.parity.assert_loop_matches_fit`."""
    return work().loop_parity(grad_parity_pool)
