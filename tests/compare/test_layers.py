"""The package's layers, read from its imports: no module imports itself back through others, no package of
`compare` imports one that imports it back, no module is over MAX_CODE_LINES lines of code, and the engine
workers' package (`compare.engines`) imports no feature (a feature's worker task is named "module:function")."""
import ast

from tests.compare.test_lesson import code_lines
from tests.conftest import REPO

PACKAGES = ("native", "keras_side", "compare")
MAX_CODE_LINES = 400  # a module a maintainer reads in one sitting (issue "One driver, one step per engine")
FEATURES = ("compare.referee", "compare.speed", "compare.parity", "compare.commands", "compare.exercises")


def modules() -> dict[str, str]:
    found = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            name = ".".join(path.relative_to(REPO).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path.read_text()
    return found


def imports(text: str, known) -> set[str]:
    """The modules of `known` a module's source imports, at any depth of its code (a function's lazy import too)."""
    found = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found |= {node.module} & known
            found |= {f"{node.module}.{a.name}" for a in node.names} & known
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names} & known
    return found


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Each strongly connected group of more than one node (Tarjan's algorithm)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while (w := stack.pop()) != v:
                on.discard(w)
                group.append(w)
            on.discard(v)
            if group:
                found.append(sorted([v, *group]))

    for v in list(edges):
        if v not in index:
            visit(v)
    return found


def graph() -> dict[str, set[str]]:
    texts = modules()
    return {name: imports(text, set(texts)) - {name} for name, text in texts.items()}


def layer(module: str) -> str:
    """A subpackage of `compare` as one node (`compare.referee`); any other module as itself."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "compare" and len(parts) > 2 else module


def test_no_module_imports_itself_back():
    assert cycles(graph()) == []


def test_no_package_of_compare_imports_itself_back():
    edges = {}
    for module, deps in graph().items():
        edges.setdefault(layer(module), set()).update(layer(d) for d in deps if layer(d) != layer(module))
    assert cycles(edges) == []


def test_the_cycle_finder_finds_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_is_over_its_length():
    """The package's modules and the tests' alike."""
    tests = {str(path.relative_to(REPO)): path.read_text() for path in (REPO / "tests").rglob("*.py")}
    assert {name: n for name, text in (modules() | tests).items() if (n := code_lines(text)) > MAX_CODE_LINES} == {}


def test_the_engine_workers_import_no_feature():
    engines = {name: deps for name, deps in graph().items() if name.startswith("compare.engines")}
    assert {name: sorted(d for d in deps if d.startswith(FEATURES)) for name, deps in engines.items()
            if any(d.startswith(FEATURES) for d in deps)} == {}


ENGINES = ("torch", "jax", "tensorflow")
LAUNCHERS = {"torch": "ddp", "jax": "sharded", "tensorflow": "mirrored"}  # one verb set: `launcher` below
# The functions whose arguments differ between engines by what the engine is, each with why; every other public
# function that two engines' modules of one name both define takes the same arguments.
ENGINE_SHAPED = {
    ("loop", "make_step"): "the step is where the engines differ (docs/lesson.md): torch's takes its scheduler and "
                           "clip, TensorFlow's the arrays it gathers batches from in its graph",
    ("loop", "evaluate"): "JAX's takes the state explicitly: its model is a pure function of it",
    ("optim", "build"): "a torch optimizer holds the parameters it updates; an optax transformation holds none",
}


def public_functions(engine: str, module: str) -> dict[str, list[str]]:
    """A module's public functions, each as the names of its positional parameters in order (its keyword-only
    ones, after `*`, are each engine's own options: torch's compile, JAX's devices)."""
    path = REPO / "native" / engine / f"{module}.py"
    if not path.exists():
        return {}
    return {n.name: [a.arg for a in n.args.posonlyargs + n.args.args]
            for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")}


def verbs() -> dict[tuple[str, str], dict[str, list[str]]]:
    """(module, function) -> {engine: its positional parameters}, for what at least two engines define; the
    data-parallel launchers (`ddp`, `sharded`, `mirrored`) as one module, `launcher`."""
    modules = {p.stem for engine in ENGINES for p in (REPO / "native" / engine).glob("*.py")} - {"__init__"}
    found = {}
    for module in sorted(modules - set(LAUNCHERS.values())) + ["launcher"]:
        for engine in ENGINES:
            own = LAUNCHERS[engine] if module == "launcher" else module
            for name, params in public_functions(engine, own).items():
                found.setdefault((module, name), {})[engine] = params
    return {verb: per for verb, per in found.items() if len(per) > 1}


def test_every_verb_takes_the_same_arguments_on_every_engine():
    differ = {verb: per for verb, per in verbs().items()
              if verb not in ENGINE_SHAPED and len({tuple(p) for p in per.values()}) > 1}
    assert differ == {}
    assert {("loop", "train"), ("checkpoint", "read"), ("many", "train_many"), ("launcher", "train"),
            ("launcher", "shard_loss")} <= set(verbs())  # the verbs the issue named are among those compared
    assert set(ENGINE_SHAPED) <= set(verbs())  # no exemption outlives its function
