"""The guard every engine test directory loads first: which engine this pytest process runs."""
import os

import pytest

from keras_side.backend import ENGINES


def require_backend() -> str:
    engine = os.environ.get("KERAS_BACKEND")
    if engine not in ENGINES:
        raise pytest.UsageError(
            f"engine tests need KERAS_BACKEND set to one of {', '.join(ENGINES)} (got {engine!r}); "
            "run `make test`, which runs them once per engine"
        )
    return engine
