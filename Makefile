# Two commands on a fresh clone: `make compare` (the main job) and `make test` (every test, every engine).
# Both create .venv and install the pinned set (constraints.txt) once; the stamp is keyed on what was installed.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
ENGINES ?= torch jax tensorflow
STAMP := $(VENV)/.installed-$(shell cat constraints.txt pyproject.toml | sha256sum | cut -c1-16)
# Our processes never read the user's ~/.keras/keras.json (it may name an engine that is not installed).
export KERAS_HOME := $(CURDIR)/.keras_home

.PHONY: setup compare bench walk-forward test clean

setup: $(STAMP)

$(STAMP): constraints.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[tensorflow,test]'
	rm -f $(VENV)/.installed-*
	touch $@

compare: $(STAMP)
	$(BIN)/native-loops compare

bench: $(STAMP)
	$(BIN)/native-loops bench

walk-forward: $(STAMP)
	$(BIN)/native-loops walk-forward

# Engine-free tests once, then the engine tests in one pytest process per engine (the backend is fixed at
# the first `import keras`). pytest exits 5 when it collects nothing, which fails the target.
test: $(STAMP)
	$(BIN)/python -m pytest tests/compare
	for engine in $(ENGINES); do \
		KERAS_BACKEND=$$engine $(BIN)/python -m pytest tests/keras_side tests/native || exit 1; \
	done

clean:
	rm -rf $(VENV) .keras_home .pytest_cache
