"""The README's and docs' code: every Python block runs as written, in a fresh process of its engine (a block that
starts with `# snippet: <engine>`), or in the test it names (`# run by tests/...py: ...`, which reads it from the
page), or is an excerpt (`# excerpt: <file>`), found line for line in that file, so it cannot go stale. Every other
block says what it is: `bash`, commands whose programs, modules, make targets and `native-loops` options exist (they
are parsed here, not run), or `text`, an output or a usage line, not run."""
import functools
import os
import re
import shlex
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
FENCES = [(page.relative_to(REPO).as_posix(), lang, code) for page in PAGES
          for lang, code in re.findall(r"^```(\w*)\n(.*?)^```", page.read_text(), re.M | re.S)]


def test_the_embedding_page_has_a_snippet_per_engine():
    assert {engine for page, engine, _ in SNIPPETS if page == "docs/embedding.md"} == {"jax", "tensorflow", "torch"}


def test_every_page_is_linked_from_the_readme():
    readme = (REPO / "README.md").read_text()
    assert [p.name for p in PAGES[1:] if f"docs/{p.name}" not in readme] == []


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def prose(page) -> str:
    """The page without its code blocks (a `# comment` in one is not a heading, a `[x](y)` not a link)."""
    return re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)


@functools.lru_cache(maxsize=None)
def anchors(page) -> set[str]:
    """The `#anchor` of every heading of a page (read once, however many links point into it)."""
    return {slug(h) for h in re.findall(r"^#+ (.*)$", prose(page), re.M)}


def broken_links(page) -> list[str]:
    """The page's relative links whose file, or whose #anchor in it, is not there."""
    text = prose(page)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(target)
        elif anchor and linked.suffix == ".md":
            broken += [target] if anchor not in anchors(linked) else []
    return broken


def test_every_link_resolves():
    found = {p.name: broken_links(p) for p in PAGES}
    assert {name: links for name, links in found.items() if links} == {}


def test_a_broken_link_is_found(tmp_path):
    (tmp_path / "a.md").write_text("# A page: `x`\n[ok](a.md#a-page-x) [no](b.md) [gone](a.md#b) [web](https://x.y)\n"
                                   "[code](a.md#a-comment)\n```python\n# a comment\n```\n")
    assert broken_links(tmp_path / "a.md") == ["b.md", "a.md#b", "a.md#a-comment"]


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


def test_every_block_says_what_it_is():
    assert [(page, code.splitlines()[0]) for page, lang, code in FENCES if lang not in ("python", "bash", "text")] == []


def commands(code: str) -> list[list[str]]:
    """A bash block's commands as words: continued lines joined, comments and leading VAR=value assignments dropped."""
    found = []
    for line in code.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        while words and re.match(r"^\w+=", words[0]):
            words = words[1:]
        if words:
            found.append(words)
    return found


COMMANDS = [(page, words) for page, lang, code in FENCES if lang == "bash" for words in commands(code)]
TARGETS = set(re.findall(r"^([\w-]+):", (REPO / "Makefile").read_text(), re.M))


def module_exists(name: str) -> bool:
    path = REPO.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__main__.py").is_file()


def command_problem(words: list[str]) -> str | None:
    """What is wrong with a documented command, or None: its program, module, make target or CLI options."""
    program, args = os.path.basename(words[0]), words[1:]
    if program == "make":
        return None if all(a in TARGETS or "=" in a for a in args) else f"no make target among {args}"
    if program == "cp":
        return None if (REPO / args[0]).is_file() else f"no file {args[0]}"
    if program == "native-loops":
        from compare import cli

        try:
            cli.parser().parse_args(args)
        except SystemExit:
            return f"native-loops refuses {args}"
        return None
    if program in ("python", "python3", "torchrun") and "-m" in args:
        module = args[args.index("-m") + 1]
        return None if module_exists(module) else f"no module {module}"
    return f"a program these docs do not use: {program}"


@pytest.mark.parametrize("page, words", COMMANDS, ids=[f"{p}:{i}" for i, (p, _) in enumerate(COMMANDS)])
def test_a_documented_command_exists(page, words):
    assert command_problem(words) is None, (page, " ".join(words), command_problem(words))


def test_a_command_that_went_stale_is_found():
    assert command_problem(["make", "tests"]) and command_problem(["python", "-m", "native.torch.loops"])
    assert command_problem([".venv/bin/native-loops", "zoo", "--modles", "lstm"])  # a misspelt option
    assert command_problem(["cp", "compare/exercises/step.py", "x.py"]) and command_problem(["pip", "install", "x"])
    assert command_problem(["make", "test"]) is None and command_problem(["python", "-m", "compare.exercises"]) is None
