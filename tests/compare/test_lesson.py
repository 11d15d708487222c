"""The lesson's loops as a learner reads them (docs/lesson.md): a first loop per engine of at most 40 lines of code,
a reference loop per engine of at most 150, public API only, the same shape on every engine."""
import ast
import difflib
import re

import pytest

from tests.conftest import REPO

ENGINES = ("torch", "jax", "tensorflow")
FIRST_LOOP_LINES = 40  # the Keras guide's loop on one screen (issue "The lesson on one screen")
REFERENCE_LOOP_LINES = 150  # everything fit does, still readable top to bottom
# in this order on every engine
SHARED = ["make_step", "evaluate", "batch_orders", "epoch_batches", "train", "grad_at", "predict"]
ENGINE_LINES = 30  # the lines a first loop may have that torch's does not: the engine's calls, not another loop
FAST_MODULES = {"fast", "bypass", "compiled", "losses", "convolution", "scan"}  # the speed machinery behind the loops
PRIVATE = re.compile(r"\bkeras\.src\b|\.\_[A-Za-z]")  # Keras's private modules, any underscore attribute


def source(engine: str, name: str) -> str:
    return (REPO / "native" / engine / f"{name}.py").read_text()


def code_lines(text: str) -> int:
    """Lines that are neither blank, nor a comment, nor part of a docstring."""
    docstrings = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)) and ast.get_docstring(node) is not None:
            first = node.body[0]
            docstrings.update(range(first.lineno, first.end_lineno + 1))
    return sum(1 for i, line in enumerate(text.splitlines(), 1)
               if line.strip() and not line.strip().startswith("#") and i not in docstrings)


def test_code_lines_counts_what_a_reader_reads():
    text = '"""Doc.\n\nmore."""\nimport os\n\n# a comment\ndef f():\n    """Doc."""\n    return 1  # why\n'
    assert code_lines(text) == 3


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("name, most", [("first_loop", FIRST_LOOP_LINES), ("loop", REFERENCE_LOOP_LINES)])
def test_a_loop_fits_on_its_screen(engine, name, most):
    assert code_lines(source(engine, name)) <= most


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("name", ["first_loop", "loop"])
def test_a_loop_uses_public_api_only(engine, name):
    text = source(engine, name)
    private = [line.strip() for line in text.splitlines() if PRIVATE.search(line)]
    attributes = [n.attr for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Attribute) and n.attr[0] == "_"]
    assert private == [] and attributes == []
    assert not native_modules(text) & FAST_MODULES
    # nor our one module of internals by name (the checks and model helpers it calls in keras_side read it)
    assert "keras_side.internals" not in text and "import internals" not in text


def native_modules(text: str) -> set[str]:
    """The modules of `native.<engine>` a file imports, by their last name (`from native.torch import fast`,
    `from native.torch.fast import train`, `import native.torch.fast`)."""
    found = set()
    for n in ast.walk(ast.parse(text)):
        if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("native."):
            parts = n.module.split(".")
            found |= {a.name for a in n.names} if len(parts) == 2 else {parts[2]}
        elif isinstance(n, ast.Import):
            found |= {a.name.split(".")[2] for a in n.names if a.name.startswith("native.") and a.name.count(".") >= 2}
    return found


def test_the_check_for_fast_path_imports_finds_them():
    assert native_modules("from native.torch import fast, optim\nfrom keras_side.losses import verb_loss\n") == {
        "fast", "optim"}
    assert native_modules("from native.jax.scan import train\nimport native.torch.bypass\n") == {"scan", "bypass"}


def keras_src_imports(text: str) -> list[str]:
    """The `keras.src` modules a file imports (docstrings and comments may name them)."""
    tree = ast.parse(text)
    return [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("keras.src")]\
        + [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names if a.name.startswith("keras.src")]


def test_keras_internals_are_imported_in_one_module_only():
    """keras_side/internals.py holds every Keras internal with its reason, and its test names the Keras version when
    one moves; any other module of the package goes through it."""
    files = [p for package in ("native", "compare", "keras_side") for p in (REPO / package).rglob("*.py")]
    found = {str(p.relative_to(REPO)): keras_src_imports(p.read_text()) for p in files}
    assert found["keras_side/internals.py"]
    assert {f: m for f, m in found.items() if m and f != "keras_side/internals.py"} == {}
    assert keras_src_imports("import keras.src.ops\nfrom keras.src.backend import nn\n") == [
        "keras.src.backend", "keras.src.ops"]


def test_the_check_for_private_api_finds_it():
    assert PRIVATE.search("from keras.src.models import functional") and PRIVATE.search("layer._losses")
    assert not PRIVATE.search("model.__class__ and keras.layers.Dense")


def top_level(text: str) -> list[str]:
    return [n.name for n in ast.parse(text).body if isinstance(n, ast.FunctionDef)]


def test_the_reference_loops_have_one_shape():
    for engine in ENGINES:
        names = top_level(source(engine, "loop"))
        assert [n for n in names if n in SHARED] == SHARED, engine
    for verb in ("train", "grad_at", "predict", "batch_orders"):  # the same arguments everywhere (docs/lesson.md)
        signatures = {engine: ast.unparse(next(n.args for n in ast.parse(source(engine, "loop")).body
                                               if isinstance(n, ast.FunctionDef) and n.name == verb))
                      for engine in ENGINES}
        assert len(set(signatures.values())) == 1, (verb, signatures)


def sections(text: str) -> list[str]:
    """A first loop's section headers, `# 1. Data`, up to their colon."""
    return [line.strip().split(":")[0] for line in text.splitlines() if re.match(r"\s*# \d\. ", line)]


def test_the_first_loops_differ_only_where_the_engine_does():
    torch = source("torch", "first_loop")
    assert sections(torch) == ["# 1. Data", "# 2. Model", "# 3. Optimizer and loss", "# 4. One step",
                               "# 5. The epochs", "# 6. The answer"]
    for engine in ("jax", "tensorflow"):
        other = source(engine, "first_loop")
        assert sections(other) == sections(torch), engine
        assert top_level(other) == top_level(torch) == ["main"]
        same = [line for line in torch.splitlines() if line in other.splitlines()]
        # everything but the engine's lines is shared: the data, the model, the answer, the constants, the epochs
        for line in ("EPOCHS, BATCH_SIZE, LEARNING_RATE, SEED = 40, 128, 0.01, 0", "    model = models.har()",
                     "    return model, data"):
            assert line in same, (engine, line)
        changed = sum(1 for d in difflib.ndiff(torch.splitlines(), other.splitlines())
                      if d.startswith("+ ") and d[2:].strip())
        assert changed <= ENGINE_LINES, (engine, changed)


def test_the_lessons_gaps_are_the_zoos():
    """docs/lesson.md's appendix quotes, for each item of `fit`, the zoo's `native` row of the model it names."""
    zoo = (REPO / "docs" / "zoo.md").read_text()
    native = {m: [t, j, tf] for m, t, j, tf in re.findall(r"^\| (\w+) \| native \| (\S+) \| (\S+) \| (\S+) \|$", zoo,
                                                           re.M)}
    lesson = (REPO / "docs" / "lesson.md").read_text()
    quoted = re.findall(r"\| ([^|]+) \(([\w, -]+)\) \|$", lesson[lesson.index("## Appendix"):], re.M)
    named = [(cells.split(", "), model) for cells, model in quoted if re.fullmatch(r"\w+", model)]
    assert len(named) >= 8 and all(cells == native.get(model) for cells, model in named), named
    largest = [max(rows, key=float) for rows in zip(*native.values())]  # torch's, JAX's, TensorFlow's over the zoo
    bounds = [cells for cells, over in quoted if over == "every model, over the six settings"]
    assert bounds and all(cells == f"≤ {largest[0]}, ≤ {largest[1]}, {largest[2]}" for cells in bounds), bounds
