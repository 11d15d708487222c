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
    assert {name: n for name, text in modules().items() if (n := code_lines(text)) > MAX_CODE_LINES} == {}


def test_the_engine_workers_import_no_feature():
    engines = {name: deps for name, deps in graph().items() if name.startswith("compare.engines")}
    assert {name: sorted(d for d in deps if d.startswith(FEATURES)) for name, deps in engines.items()
            if any(d.startswith(FEATURES) for d in deps)} == {}
