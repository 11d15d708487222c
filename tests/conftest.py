"""Shared fixtures. Engine tests (tests/keras_side, tests/native) run once per engine: `make test` sets
KERAS_BACKEND for each pytest process, because Keras fixes its backend at the first import."""
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# Never the user's ~/.keras: its keras.json may name an engine that is not installed.
os.environ.setdefault("KERAS_HOME", str(REPO / ".keras_home"))


@pytest.fixture(scope="session")
def panel():
    from compare import synthetic

    return synthetic.simulate(0)


@pytest.fixture(scope="session")
def har(panel):
    from compare import data

    return data.prepare(panel, source="synthetic(seed=0)")


@pytest.fixture(scope="session")
def ols_fit(panel):
    from compare import data, reference

    return reference.ols_for(panel, data.DEFAULT_ASSET, data.DEFAULT_SPLIT, None)
