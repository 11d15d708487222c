"""The parity fixtures' work: what `keras_side.pytest_plugin` (the `pytest11` entry point) calls once a test uses a
fixture. See that module for the fixtures and how to choose engines.
"""
from __future__ import annotations

import functools

from compare import parity
from compare.engines import runner
from keras_side.backend import installed_engines


def pool(tmp_path_factory):
    """Lazily started workers, one per installed engine, shared by every check of the session: yields `get()`."""
    pools = []

    def get() -> runner.Pool:
        if not pools:
            pools.append(runner.Pool(installed_engines(), tmp_path_factory.mktemp("grad-parity"),
                                     compile_cache=True))
        return pools[0]

    yield get
    for started in pools:
        started.close()


def grad_parity(request, get_pool):
    return functools.partial(_check, get_pool, _engines(request))


def forward_parity(request, get_pool):
    return functools.partial(_forward, get_pool, _engines(request))


def training_parity(request, get_pool):
    return functools.partial(_training, get_pool, _engines(request))


def loop_parity(get_pool):
    def check(*args, **kwargs):
        __tracebackhide__ = True
        return _alone(parity.assert_loop_matches_fit, *args, pool=get_pool, **kwargs)

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
