"""pytest plugin (registered through the `pytest11` entry point): the `grad_parity` and `forward_parity` fixtures.

    def test_my_model_has_gradient_parity(grad_parity):
        grad_parity("mypkg.models:build", x, y, loss="mse")

    def test_my_model_predicts_alike(forward_parity):
        forward_parity("mypkg.models:build", x)

Choose engines with `@pytest.mark.grad_parity_engines("torch", "jax")` or `--grad-parity-engines torch,jax`
(default: every installed engine; both fixtures). One worker per engine is started on first use and kept for the
session, shared by both fixtures.
"""
from __future__ import annotations

import functools

import pytest

from compare import parity, runner
from keras_side.backend import installed_engines


def pytest_addoption(parser):
    parser.addoption("--grad-parity-engines", default=None, metavar="ENGINES",
                     help="comma-separated engines for the grad_parity and forward_parity fixtures (default: every "
                     "installed engine)")


def pytest_configure(config):
    config.addinivalue_line("markers", "grad_parity_engines(*engines): engines the parity fixtures (grad_parity, "
                            "forward_parity) compare")


@pytest.fixture(scope="session")
def grad_parity_pool(tmp_path_factory):
    """Lazily started workers, one per installed engine, shared by every grad_parity check of the session."""
    pools = []

    def get() -> runner.Pool:
        if not pools:
            pools.append(runner.Pool(installed_engines(), tmp_path_factory.mktemp("grad-parity")))
        return pools[0]

    yield get
    for pool in pools:
        pool.close()


@pytest.fixture
def grad_parity(request, grad_parity_pool):
    """`grad_parity(build_model, x, y, loss="mse", rtol=..., atol=...)`: see `compare.parity.assert_gradients_match`."""
    return functools.partial(_check, grad_parity_pool, _engines(request))


@pytest.fixture
def forward_parity(request, grad_parity_pool):
    """`forward_parity(build_model, x, rtol=..., atol=...)`: see `compare.parity.assert_forward_match`."""
    return functools.partial(_forward, grad_parity_pool, _engines(request))


def _engines(request) -> list[str] | None:
    marker = request.node.get_closest_marker("grad_parity_engines")
    option = request.config.getoption("--grad-parity-engines")
    return list(marker.args) if marker else option.split(",") if option else None


def _check(get_pool, engines, build_model, x, y, loss="mse", **kwargs):
    return parity.assert_gradients_match(build_model, x, y, loss, engines=engines, pool=get_pool(), **kwargs)


def _forward(get_pool, engines, build_model, x, **kwargs):
    return parity.assert_forward_match(build_model, x, engines=engines, pool=get_pool(), **kwargs)
