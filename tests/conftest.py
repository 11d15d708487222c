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


# `make test` hands whole files to its xdist workers in collection order. The files that take longest (measured, on
# 2 cores) go first, so that none of them starts last and leaves the other worker idle (longest first); the rest
# keep their order. A stale list costs only time.
LONGEST_FIRST = ["test_zoo.py", "test_distributed.py", "test_compare_cli.py", "test_training_parity.py",
                 "test_bench.py", "test_parity.py", "test_checkpoint.py", "test_sharded.py", "test_ddp.py",
                 "test_mirrored.py"]


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each file's tests in their order
