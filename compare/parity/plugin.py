"""pytest plugin (registered through the `pytest11` entry point): the parity fixtures.

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
"""
from __future__ import annotations

import functools

import pytest

from compare import parity
from compare.engines import runner
from keras_side.backend import installed_engines


def pytest_addoption(parser):
    parser.addoption("--grad-parity-engines", default=None, metavar="ENGINES",
                     help="comma-separated engines for the grad_parity, forward_parity and training_parity fixtures "
                     "(default: every installed engine)")


def pytest_configure(config):
    config.addinivalue_line("markers", "grad_parity_engines(*engines): engines the parity fixtures (grad_parity, "
                            "forward_parity, training_parity) compare")


@pytest.fixture(scope="session")
def grad_parity_pool(tmp_path_factory):
    """Lazily started workers, one per installed engine, shared by every grad_parity check of the session."""
    pools = []

    def get() -> runner.Pool:
        if not pools:
            pools.append(runner.Pool(installed_engines(), tmp_path_factory.mktemp("grad-parity"),
                                     compile_cache=True))
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


@pytest.fixture
def training_parity(request, grad_parity_pool):
    """`training_parity(build_model, x, y, spec=..., steps=... or epochs=..., paths=...)`: see
    `compare.parity.assert_training_matches`."""
    return functools.partial(_training, grad_parity_pool, _engines(request))


@pytest.fixture
def loop_parity(grad_parity_pool):
    """`loop_parity(build_model, train_step, x, y, engine=..., spec=..., steps=... or epochs=...)`: see
    `compare.parity.assert_loop_matches_fit`."""
    def check(*args, **kwargs):
        __tracebackhide__ = True
        return _alone(parity.assert_loop_matches_fit, *args, pool=grad_parity_pool, **kwargs)

    return check


def _engines(request) -> list[str] | None:
    marker = request.node.get_closest_marker("grad_parity_engines")
    option = request.config.getoption("--grad-parity-engines")
    return list(marker.args) if marker else [e.strip() for e in option.split(",")] if option else None


def _check(get_pool, default_engines, build_model, x, y, loss="mse", **kwargs):
    __tracebackhide__ = True
    kwargs.setdefault("engines", default_engines)  # the call's own engines before the marker's and the option's
    return _alone(parity.assert_gradients_match, build_model, x, y, loss, pool=get_pool, **kwargs)


def _forward(get_pool, default_engines, build_model, x, **kwargs):
    __tracebackhide__ = True
    kwargs.setdefault("engines", default_engines)
    return _alone(parity.assert_forward_match, build_model, x, pool=get_pool, **kwargs)


def _training(get_pool, default_engines, build_model, x, y, **kwargs):
    __tracebackhide__ = True
    kwargs.setdefault("engines", default_engines)
    return _alone(parity.assert_training_matches, build_model, x, y, pool=get_pool, **kwargs)


def _alone(check, *args, **kwargs):
    """`check(...)`, given the session's pool getter as `pool` (called once the arguments are checked: a call refused
    for them starts no worker). Its failure (the table, or the one line of a ParityError) reaches pytest with none of
    this package's frames: the test shows the user's own call and the message, not our code around it."""
    __tracebackhide__ = True
    try:
        return check(*args, **kwargs)
    except (parity.ParityError, AssertionError) as err:
        raise err.with_traceback(None) from None
