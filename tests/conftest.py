"""Shared fixtures. Engine tests (tests/keras_side, tests/native) run once per engine: `make test` sets
KERAS_BACKEND for each pytest process, because Keras fixes its backend at the first import."""
import os
import shutil
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
HANG_GUARD_S = 120  # waiting for a process to start, or to end: against a hang, never a measure of speed


def pid_exists(pid: int) -> bool:
    """Whether a process `pid` exists (signal 0 checks without sending anything)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True


def wait_for(condition, guard_s: float = HANG_GUARD_S) -> bool:
    """Whether `condition()` holds, asked every 50 ms until it does or `guard_s` have passed."""
    start = time.monotonic()
    while not condition() and time.monotonic() - start < guard_s:
        time.sleep(0.05)
    return condition()
# Never the user's ~/.keras: its keras.json may name an engine that is not installed.
os.environ.setdefault("KERAS_HOME", str(REPO / ".keras_home"))
# Nor the user's cache folder: what the tests' JAX workers compile (keras_side.backend.own_cache) stays in this
# checkout, and no test run reads what other runs of the package left in ~/.cache.
TEST_CACHE = REPO / ".test_cache"
os.environ["XDG_CACHE_HOME"] = str(TEST_CACHE)
# The JAX suite's own processes, and those they launch, compile through JAX's persistent cache, as compare's workers
# do: Keras jits each new model's step afresh, so the suite compiles the same programs many times over (the HAR's
# `fit`, test after test), and a hit loads the executable that compile would give (keras_side.backend). What it
# saves: docs/dev-notes.md, "make test's time". With no size limit: with one, JAX locks the folder and reads every
# entry's access time at each write, which took back what the hits saved. Without one JAX takes no lock and writes
# each entry in place, so a process killed mid-write (the fault tests kill some) may leave a truncated entry, read
# (a warning and a compile) by every later run: the folder is this session's, empty at its start and removed at its
# end (`pytest_sessionfinish`; a killed session's, by the next). A JAX_COMPILATION_CACHE_DIR of the caller's is kept.
JAX_SUITE_CACHE = None
if os.environ.get("KERAS_BACKEND") == "jax" and "JAX_COMPILATION_CACHE_DIR" not in os.environ:  # pytest's first process
    for stale in TEST_CACHE.glob("jax-suite-*"):
        if not pid_exists(int(stale.name.removeprefix("jax-suite-"))):
            shutil.rmtree(stale, ignore_errors=True)
    JAX_SUITE_CACHE = TEST_CACHE / f"jax-suite-{os.getpid()}"
    os.environ |= {"JAX_COMPILATION_CACHE_DIR": str(JAX_SUITE_CACHE),
                   "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}


def pytest_sessionfinish(session):
    if JAX_SUITE_CACHE is not None:  # the process that made it, after its xdist workers have ended
        shutil.rmtree(JAX_SUITE_CACHE, ignore_errors=True)


def users_keras_home(folder: Path, **more) -> Path:
    """`folder` made a KERAS_HOME whose keras.json is a user's that must reach none of our processes: floatx float16
    and another epsilon (and `more`, e.g. a backend)."""
    import json

    folder.mkdir(exist_ok=True)
    (folder / "keras.json").write_text(json.dumps({"floatx": "float16", "epsilon": 0.1, **more}))
    return folder


@pytest.fixture(scope="session")
def panel():
    from compare.data import synthetic

    return synthetic.simulate(0)


@pytest.fixture(scope="session")
def har(panel):
    from compare.data import panel as data

    return data.prepare(panel, source="synthetic(seed=0)")


@pytest.fixture(scope="session")
def converged(har):
    """The spec of `compare --converge` on the default data: every seed ends at OLS, up to mini-batch noise."""
    from compare.referee import checks
    from keras_side.spec import TrainConfig

    return TrainConfig(**checks.converge_spec(har.n_train, TrainConfig.batch_size))


@pytest.fixture(scope="session")
def ols_fit(panel):
    from compare.data import panel as data, reference

    return reference.ols_for(panel, data.DEFAULT_ASSET, data.DEFAULT_SPLIT, None)


# `make test` hands whole files to its xdist workers in this order (--no-loadscope-reorder: by default xdist puts the
# files with the most tests first, which sent test_distributed.py and test_zoo.py last). The files that take longest
# go first, so that none of them starts last and leaves the other worker idle (longest first); the rest keep their
# order. The files of 5 s or more, by the seconds each took in a fresh clone's `make test` on 2 cores (`--durations`,
# summed per file; an engine file by its longest engine; 2026-12-06): 95, 76, 67 (engine-free), 59, 50, 49 (torch,
# torch, TensorFlow) ... down to 5. Each pytest run sorts its own files by it. A stale list costs only time.
LONGEST_FIRST = ["compare/test_compare_cli.py", "compare/test_training_parity.py", "compare/test_parity.py",
                 "native/torch/test_compile.py", "native/torch/test_ddp.py", "native/tensorflow/test_mirrored.py",
                 "native/test_loops.py", "compare/test_distributed.py", "compare/test_bench.py",
                 "compare/test_verdict.py", "compare/test_readme.py", "native/jax/test_many.py",
                 "native/jax/test_sharded.py", "compare/test_zoo.py", "compare/test_walk_forward.py",
                 "compare/test_launchers.py", "native/torch/test_fast.py", "native/test_checkpoint.py",
                 "compare/test_seeds.py", "native/jax/test_convolution.py", "native/jax/test_scan.py",
                 "native/jax/test_pure.py", "keras_side/test_fit.py", "native/test_inputs.py",
                 "native/torch/test_host.py", "compare/test_exercises.py", "compare/test_stops.py",
                 "native/torch/test_module.py", "keras_side/test_determinism.py", "compare/test_children.py",
                 "keras_side/test_models.py", "keras_side/test_backend.py"]


def pytest_collection_modifyitems(config, items):
    """The tier's tests (`tests.tiers.fast_only_on`: the others deselected, as a matrix's other rows are), longest
    file first."""
    deselected = [item for item in items if (mark := item.get_closest_marker("full_only")) and mark.args[0]]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if item not in deselected]
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.relative_to(REPO / "tests").as_posix(), len(rank)))  # stable
