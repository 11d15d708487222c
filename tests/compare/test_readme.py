"""The README's and docs' code: every Python block runs as written, in a fresh process of its engine (a block that
starts with `# snippet: <engine>`), or in the test it names (`# run by tests/...py: ...`, which reads it from the
page), or is an excerpt (`# excerpt: <file>`), found line for line in that file, so it cannot go stale."""
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
BLOCKS = [(page.relative_to(REPO).as_posix(), code) for page in PAGES
          for code in re.findall(r"```python\n(.*?)```", page.read_text(), re.S)]
SNIPPETS = [(page, *re.match(r"# snippet: (\w+)\n(.*)", code, re.S).groups()) for page, code in BLOCKS
            if code.startswith("# snippet: ")]
EXCERPTS = [(page, *re.match(r"# excerpt: (\S+)\n(.*)", code, re.S).groups()) for page, code in BLOCKS
            if code.startswith("# excerpt: ")]


def test_the_embedding_page_has_a_snippet_per_engine():
    assert {engine for page, engine, _ in SNIPPETS if page == "docs/embedding.md"} == {"jax", "tensorflow", "torch"}


def test_every_page_is_linked_from_the_readme():
    readme = (REPO / "README.md").read_text()
    assert [p.name for p in PAGES[1:] if f"docs/{p.name}" not in readme] == []


def test_every_python_block_runs_or_is_an_excerpt():
    unmarked = [(page, code.splitlines()[0]) for page, code in BLOCKS
                if not code.startswith(("# snippet: ", "# excerpt: ", "# run by tests/"))]
    assert unmarked == []
    for page, code in BLOCKS:
        if code.startswith("# run by "):  # the test it names reads this page
            test = code.split()[3].rstrip(":")
            assert page in (REPO / test).read_text(), (page, test)


@pytest.mark.parametrize("page, engine, code", SNIPPETS, ids=[f"{p}:{e}:{i}" for i, (p, e, _) in enumerate(SNIPPETS)])
def test_snippet_runs(page, engine, code, tmp_path):
    env = {**os.environ, "KERAS_BACKEND": engine, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]


def found_in(excerpt: list[str], lines: list[str]) -> bool:
    """`excerpt` is a run of `lines`, each with the same indentation taken off (blank lines match blank ones)."""
    for start, line in enumerate(lines):
        indent = line[:len(line) - len(line.lstrip())]
        if line.strip() and line == indent + excerpt[0] and all(
                (want == "" and got.strip() == "") or got == indent + want
                for want, got in zip(excerpt, lines[start:start + len(excerpt)], strict=False)) \
                and len(lines) - start >= len(excerpt):
            return True
    return False


@pytest.mark.parametrize("page, source, code", EXCERPTS, ids=[f"{p}:{s}:{i}" for i, (p, s, _) in enumerate(EXCERPTS)])
def test_excerpt_is_in_its_file(page, source, code):
    lines = (REPO / source).read_text().splitlines()
    assert found_in(code.rstrip("\n").splitlines(), lines), f"{page} quotes {source}, which no longer has these lines"


def test_an_excerpt_that_changed_is_not_found():
    lines = ["def f(x):", "    y = x + 1", "", "    return y"]
    assert found_in(["y = x + 1", "", "return y"], lines)
    assert not found_in(["y = x + 2", "", "return y"], lines) and not found_in(["return y", "y = x + 1"], lines)
