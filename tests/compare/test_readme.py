"""The README's embedding snippets run as written, each in a fresh process of its engine."""
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO

SNIPPETS = re.findall(r"```python\n# README snippet: (\w+)\n(.*?)```", (REPO / "README.md").read_text(), re.S)


def test_readme_has_a_snippet_per_host_engine():
    assert sorted(engine for engine, _ in SNIPPETS) == ["jax", "torch"]


@pytest.mark.parametrize("engine, code", SNIPPETS, ids=[engine for engine, _ in SNIPPETS])
def test_readme_snippet_runs(engine, code, tmp_path):
    env = {**os.environ, "KERAS_BACKEND": engine, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
