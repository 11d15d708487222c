"""The README's and docs' code snippets run as written, each in a fresh process of its engine (a block that starts
with `# snippet: <engine>`)."""
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SNIPPETS = [(page.relative_to(REPO).as_posix(), engine, code) for page in PAGES
            for engine, code in re.findall(r"```python\n# snippet: (\w+)\n(.*?)```", page.read_text(), re.S)]


def test_the_embedding_page_has_a_snippet_per_host_engine():
    assert sorted(engine for page, engine, _ in SNIPPETS if page == "docs/embedding.md") == ["jax", "torch"]


def test_every_page_is_linked_from_the_readme():
    readme = (REPO / "README.md").read_text()
    assert [p.name for p in PAGES[1:] if f"docs/{p.name}" not in readme] == []


@pytest.mark.parametrize("page, engine, code", SNIPPETS, ids=[f"{p}:{e}:{i}" for i, (p, e, _) in enumerate(SNIPPETS)])
def test_snippet_runs(page, engine, code, tmp_path):
    env = {**os.environ, "KERAS_BACKEND": engine, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
