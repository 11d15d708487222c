# Two commands on a fresh clone: `make compare` (the main job) and `make test` (every test, every engine; the big
# matrices in a fast subset: `make test-full` runs them whole, tests/tiers.py).
# Both create .venv and install the pinned set (constraints.txt) once; the stamp is keyed on what was installed.
# The set is for Python 3.11 on Linux x86-64, Linux aarch64 and macOS arm64, CPU builds (.ci/platforms.py).
PYTHON ?= python3.11
# DEVICE=cuda: the CUDA builds of torch, TensorFlow and JAX instead (Linux x86-64 with an NVIDIA GPU); `newest`:
# the newest releases, no pins (what `make test-newest` installs).
DEVICE ?= cpu
# Where torch's CPU build comes from on Linux: empty = found on its own (a wheel folder in pip's config) or else the
# PyTorch CPU index; `none`, or another URL (a mirror), to decide yourself.
TORCH_INDEX ?=
# Any Python can run this check (2.7 included), so another version gets one line, not a traceback.
CHECK_PYTHON := import sys; v = "%d.%d" % sys.version_info[:2]; ok = v == "3.11"; ok or sys.stderr.write( \
	"native-loops: %s is Python %s; the pinned set (constraints.txt) is for Python 3.11: run make with " \
	"PYTHON=/path/to/python3.11 (pyenv, or uv python install 3.11)\n" % (sys.executable, v)); sys.exit(0 if ok else 2)
VENV := .venv
BIN := $(VENV)/bin
ENGINES ?= torch jax tensorflow
STAMP := $(VENV)/.installed-$(DEVICE)-$(shell cat constraints.txt pyproject.toml | sha256sum | cut -c1-16)
# Our processes never read the user's ~/.keras/keras.json (it may name an engine that is not installed).
export KERAS_HOME := $(CURDIR)/.keras_home

.PHONY: setup compare bench walk-forward test test-full test-newest check-platforms clean

setup: $(STAMP)

$(STAMP): constraints.txt pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "native-loops: $(PYTHON) not found: install Python 3.11," \
		"or run make with PYTHON=/path/to/python3.11" >&2; exit 2; }
	@$(if $(filter newest,$(DEVICE)),true,$(PYTHON) -c '$(CHECK_PYTHON)')
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python .ci/platforms.py install --device $(DEVICE) --torch-index '$(TORCH_INDEX)'
	rm -f $(VENV)/.installed-*
	touch $@

compare: $(STAMP)
	$(BIN)/native-loops compare

bench: $(STAMP)
	$(BIN)/native-loops bench

walk-forward: $(STAMP)
	$(BIN)/native-loops walk-forward

# Engine-free tests once, then the engine tests in one pytest run per engine (the backend is fixed at the first
# `import keras`). Each run spreads its test files over TEST_JOBS pytest-xdist workers (a file stays on one worker,
# so a module's fixture is computed once): most tests wait on processes they start (engine workers, launchers), and
# one file at a time left half of a 2-core machine idle. The files go out longest first (tests/conftest.py keeps
# that order: --no-loadscope-reorder). Two tests at a time, a run's workers keep their priority (NATIVE_LOOPS_NICE=0:
# docs/compare.md). pytest exits 5 when it collects nothing, which fails the target.
TEST_JOBS ?= 2
PYTEST := NATIVE_LOOPS_NICE=0 $(BIN)/python -m pytest -n $(TEST_JOBS) --dist loadfile --no-loadscope-reorder
test: $(STAMP)
	$(PYTEST) tests/compare
	for engine in $(ENGINES); do \
		KERAS_BACKEND=$$engine $(PYTEST) tests/keras_side tests/native || exit 1; \
	done

# The same tests with every row of the big matrices (every zoo model, launcher and engine the fast subset leaves out).
test-full:
	NATIVE_LOOPS_FULL_TESTS=1 $(MAKE) test

# The same tests on the newest releases the package index has for NEWEST_PYTHON (Python 3.11 to 3.13): no
# constraints.txt, what `pip install native-loops[all]` gives a user today, in their own environment. Its last
# result is in docs/setup.md. Linux's newest torch is a CUDA build of several GB; `rm -r .venv-newest` to take releases
# newer than its first install.
NEWEST_PYTHON ?= python3.12
test-newest:
	$(MAKE) test VENV=.venv-newest PYTHON=$(NEWEST_PYTHON) DEVICE=newest

# pip's dry run of the install above for each platform we support (needs the package index; not in `make test`).
check-platforms: $(STAMP)
	$(BIN)/python .ci/platforms.py check

clean:
	rm -rf $(VENV) .venv-newest .keras_home .pytest_cache .test_cache
