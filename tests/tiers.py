"""The two sizes of the test suite. `make test` runs a fast subset of each big matrix (zoo models × engines ×
paths, launchers × models): a row for each thing the code under test branches on, so the subset can still fail.
`make test-full` (NATIVE_LOOPS_FULL_TESTS=1) runs every row. The CLI runs the matrices whole as well:
`native-loops zoo`, `native-loops distributed`, `native-loops compare`."""
import os

import pytest

FULL = os.environ.get("NATIVE_LOOPS_FULL_TESTS") == "1"


def rows(every, fast):
    """The rows of a parametrized test this run takes: all of `every` under `make test-full`, else those whose name
    (the row itself, or its first item) is in `fast`, in `every`'s order."""
    every = list(every)
    names = [row[0] if isinstance(row, tuple) else row for row in every]
    unknown = set(fast) - set(names)
    if unknown:
        raise ValueError(f"the fast subset names rows the matrix does not have: {sorted(unknown)}")
    return every if FULL else [row for row, name in zip(every, names) if name in fast]



def fast_only_on(condition: bool):
    """A test that `make test` runs only where `condition` holds (one engine's suite, say, where the code under test
    is engine-free) and `make test-full` everywhere: elsewhere it is deselected at collection (tests/conftest.py),
    as a matrix's other rows are, never collected and skipped."""
    return pytest.mark.full_only(not (FULL or condition))


FULL_ONLY = fast_only_on(False)  # a test that only `make test-full` runs (its reason beside it)
