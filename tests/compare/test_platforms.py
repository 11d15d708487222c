"""The pinned set on each platform (.ci/platforms.py): the markers pick one CPU build of torch and of TensorFlow per
platform, the CUDA set cannot take a CPU wheel, and the set-up's refusals are one line with exit 2. pip's dry run
itself needs the package index, so `make check-platforms` runs it, not this file; its verdicts are tested here on
planted pip outcomes."""
import importlib.util
import re
import subprocess
import sys

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from tests.conftest import REPO

spec = importlib.util.spec_from_file_location("platforms", REPO / ".ci" / "platforms.py")
platforms = importlib.util.module_from_spec(spec)
spec.loader.exec_module(platforms)
CPU_PLATFORMS = [t for t in platforms.PLATFORMS if not t.cuda]


def pins(lines, target):
    environment = platforms.marker_environment(target, "3.11")
    chosen = [Requirement(line) for line in lines]
    return {r.name.replace("_", "-"): str(r.specifier) for r in chosen
            if not r.marker or Marker(str(r.marker)).evaluate(environment)}


@pytest.mark.parametrize("target", CPU_PLATFORMS, ids=lambda t: t.name)
def test_each_platform_gets_one_cpu_build_of_torch_and_of_tensorflow(target):
    chosen = pins(platforms._lines(platforms.CONSTRAINTS.read_text()), target)
    linux = target.markers["sys_platform"] == "linux"
    x86 = linux and target.markers["platform_machine"] == "x86_64"
    assert chosen["torch"] == ("==2.13.0+cpu" if linux else "==2.13.0")
    assert ("tensorflow-cpu" in chosen, "tensorflow" in chosen) == (x86, not x86)


@pytest.mark.parametrize("target", CPU_PLATFORMS, ids=lambda t: t.name)
def test_the_projects_tensorflow_extra_asks_for_the_build_the_constraints_pin(target):
    import tomllib
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["tensorflow"]
    constrained = pins(platforms._lines(platforms.CONSTRAINTS.read_text()), target)
    asked = pins(extra, target)
    assert len(asked) == 1 and set(asked) <= set(constrained)


def test_the_cuda_set_refuses_torchs_cpu_build_and_drops_the_cpu_pins():
    torch = next(Requirement(p) for p in platforms.CUDA_PINS if p.startswith("torch"))
    assert not torch.specifier.contains("2.13.0+cpu") and torch.specifier.contains("2.13.0")
    kept = platforms._without(platforms._lines(platforms.CONSTRAINTS.read_text()), platforms.CPU_ONLY_PINS)
    assert {platforms._name(line) for line in kept}.isdisjoint({"torch", "tensorflow", "tensorflow-cpu"})
    assert SpecifierSet("==3.15.1").contains(pins(kept, platforms.PLATFORMS[-1])["keras"].lstrip("="))


def test_another_python_is_refused_in_one_line_by_the_makefile():
    """The Makefile's check is Python any interpreter runs (2.7 included): the version it expects passes, another
    version is one line and exit 2. (Run here with this interpreter, the version it expects set to this one's, then
    to another: `make test-newest` runs the suite on another Python.)"""
    makefile = (REPO / "Makefile").read_text()
    code = re.search(r"CHECK_PYTHON := (.*?)\nVENV", makefile, re.S)[1].replace("\\\n\t", "")
    here = "%d.%d" % sys.version_info[:2]
    assert '"3.11"' in code
    assert subprocess.run([sys.executable, "-c", code.replace('"3.11"', f'"{here}"')]).returncode == 0
    other = subprocess.run([sys.executable, "-c", code.replace('"3.11"', '"3.99"')], capture_output=True, text=True)
    assert other.returncode == 2 and other.stderr.count("\n") == 1
    assert other.stderr.startswith(f"native-loops: {sys.executable} is Python {here}; the pinned set")


@pytest.mark.parametrize("here, device, message", [
    (("darwin", "x86_64"), "cpu", "the pinned set has CPU builds for Linux x86-64, Linux aarch64 and macOS arm64, "
                                  "not darwin x86_64"),
    (("win32", "AMD64"), "cpu", "not win32 AMD64"),
    (("darwin", "arm64"), "cuda", "DEVICE=cuda needs Linux x86-64 (this is darwin arm64)"),
])
def test_a_platform_without_the_set_is_refused_before_pip_runs(monkeypatch, capsys, here, device, message):
    monkeypatch.setattr(sys, "platform", here[0])
    monkeypatch.setattr(platforms.platform, "machine", lambda: here[1])
    monkeypatch.setattr(platforms, "_pip", lambda *a, **k: pytest.fail("pip ran"))
    with pytest.raises(SystemExit) as stop:
        platforms.install(device, "")
    err = capsys.readouterr().err
    assert stop.value.code == 2 and message in err and err.count("\n") == 1


def test_a_venv_without_pip_or_with_the_other_devices_set_is_refused(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(platforms.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    monkeypatch.setattr(platforms, "_pip", lambda *a, **k: subprocess.CompletedProcess(a, 1, "", "No module named pip"))
    with pytest.raises(SystemExit) as stop:
        platforms.install("cpu", "")
    assert stop.value.code == 2
    assert "has no pip (on Debian and Ubuntu, install python3.11-venv)" in capsys.readouterr().err
    monkeypatch.setattr(platforms, "_pip", lambda *a, **k: subprocess.CompletedProcess(a, 0, "pip 23.2.1", ""))
    monkeypatch.setattr(platforms.subprocess, "run", lambda *a, **k: pytest.fail("pip install ran"))
    (tmp_path / "native-loops-device").write_text("cuda\n")
    with pytest.raises(SystemExit) as stop:
        platforms.install("cpu", "none")
    assert stop.value.code == 2 and "holds the DEVICE=cuda set: run `make clean` before installing DEVICE=cpu" in \
        capsys.readouterr().err


@pytest.mark.parametrize("override, expected", [("none", None), ("https://mirror/whl/cpu", "https://mirror/whl/cpu")])
def test_a_torch_index_given_by_the_user_wins(monkeypatch, override, expected):
    monkeypatch.setattr(platforms, "_pip", lambda *a, **k: pytest.fail("probed pip"))
    assert platforms.torch_index(override=override) == expected


def planted(outcomes):
    """A stand-in for pip's dry run: each call takes the next (status, stderr, resolved)."""
    calls = []

    def dry_run(target, python, requirements, constraints, index):
        calls.append((index, any(platforms._name(r) == "torch" for r in requirements)))
        return outcomes[len(calls) - 1]
    return dry_run, calls


def test_verdicts_on_planted_pip_outcomes(monkeypatch):
    linux, macos = platforms.PLATFORMS[1], platforms.PLATFORMS[2]
    pinned = {platforms._name(line): "v" for line in platforms._lines(platforms.CONSTRAINTS.read_text())}
    # Everything resolves, all of it pinned.
    monkeypatch.setattr(platforms, "_dry_run", planted([(0, "", pinned)])[0])
    assert platforms.resolve(macos, "3.11", None)[0] == "yes"
    # A package the set does not pin is drift: NO, named.
    monkeypatch.setattr(platforms, "_dry_run", planted([(0, "", pinned | {"surprise": "1"})])[0])
    verdict, _, note = platforms.resolve(macos, "3.11", None)
    assert verdict == "NO" and "surprise" in note
    # torch's CPU build missing here, its index out of reach: the rest is checked without torch, "partly".
    dry_run, calls = planted([(1, "ERROR: No matching distribution found for torch==2.13.0+cpu", {}),
                              (1, "WARNING: Could not fetch URL https://download.pytorch.org/whl/cpu/torch/", {}),
                              (0, "", pinned)])
    monkeypatch.setattr(platforms, "_dry_run", dry_run)
    verdict, _, note = platforms.resolve(linux, "3.11", None)
    assert verdict == "partly" and "out of reach" in note
    assert calls == [(None, True), (platforms.TORCH_CPU_INDEX, True), (None, False)]
    # A real conflict stays a failure, with pip's last error line.
    monkeypatch.setattr(platforms, "_dry_run", planted([(1, "ERROR: a\nERROR: ResolutionImpossible", {})])[0])
    assert platforms.resolve(macos, "3.11", None)[1:] == ({}, "ERROR: ResolutionImpossible")
