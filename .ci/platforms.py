"""The pinned set on every platform we support: which pins apply where, how `make` installs them, and pip's own
dry run for each platform.

    python .ci/platforms.py install [--device cpu|cuda|newest]  # what `make` runs with .venv's Python
    python .ci/platforms.py check [--only NAME ...]           # `make check-platforms`: the set on each platform

The pins themselves live in constraints.txt, with environment markers where a platform needs another build:
torch's CPU build is `2.13.0+cpu` on Linux, from the PyTorch CPU index (the default index's Linux wheels, x86-64
and aarch64, are CUDA builds of several GB), and plain `2.13.0` on macOS; `tensorflow-cpu` exists only for x86-64,
so macOS and aarch64 take `tensorflow`.

This file is tooling, not the package: it imports only the standard library and pip, so it runs before .venv
has anything installed.
"""

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONSTRAINTS = ROOT / "constraints.txt"
PYTHONS = ("3.11",)  # every pin has a wheel for these on each platform below; 3.11 is the one we test on
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
SUPPORTED = {("linux", "x86_64"), ("linux", "aarch64"), ("darwin", "arm64")}  # (sys.platform, machine)
UNREACHABLE = ("Could not fetch URL", "Failed to establish a new connection", "NameResolutionError")
# DEVICE=cuda (Linux x86-64 only): PyPI's torch there is the CUDA build (`!=...+cpu`: a wheel folder's CPU build
# would satisfy a bare ==2.13.0); TensorFlow's and JAX's CUDA 12 wheels. Resolved by check-platforms, not run here.
CUDA_PINS = ("torch==2.13.0,!=2.13.0+cpu", "tensorflow[and-cuda]==2.21.0", "jax[cuda12]==0.10.2")
CPU_ONLY_PINS = ("torch", "tensorflow-cpu", "tensorflow")  # replaced by CUDA_PINS on DEVICE=cuda


@dataclass(frozen=True)
class Platform:
    name: str
    pip_platforms: tuple[str, ...]  # wheel platform tags pip may take, newest first
    markers: dict  # the environment markers a Python on this platform reports
    cuda: bool = False


def _manylinux(arch, newest=28):
    return tuple(f"manylinux_2_{v}_{arch}" for v in range(newest, 16, -1)) + (f"manylinux2014_{arch}",)


LINUX = dict(sys_platform="linux", platform_system="Linux", os_name="posix")
MACOS = dict(sys_platform="darwin", platform_system="Darwin", os_name="posix")
PLATFORMS = (
    Platform("linux-x86_64", _manylinux("x86_64"), LINUX | dict(platform_machine="x86_64")),
    Platform("linux-aarch64", _manylinux("aarch64"), LINUX | dict(platform_machine="aarch64")),
    # macOS 14 (Sonoma) on Apple silicon: torch 2.13's macOS wheels need 14.0; pip takes older tags from it too.
    Platform("macos-arm64", ("macosx_14_0_arm64",), MACOS | dict(platform_machine="arm64")),
    Platform("linux-x86_64-cuda", _manylinux("x86_64"), LINUX | dict(platform_machine="x86_64"), cuda=True),
)


def fail(message):
    print(f"native-loops: {message}", file=sys.stderr)
    sys.exit(2)


def _pip(python, *args, quiet=True):
    command = [python, "-m", "pip", *args] + (["--quiet"] if quiet else [])
    return subprocess.run(command, capture_output=True, text=True)


def _cpu_torch_pin():
    return next(line.split(";")[0].strip() for line in CONSTRAINTS.read_text().splitlines()
                if line.startswith("torch==") and "+cpu" in line)


def torch_index(override=""):
    """The index for torch's CPU build on Linux: none when pip already finds it (a wheel folder in pip's
    config, as on our CI machine, or installed), else the PyTorch CPU index; `override` ("none" or a URL) wins."""
    if override:
        return None if override == "none" else override
    if sys.platform != "linux":
        return None
    probe = _pip(sys.executable, "install", "--dry-run", "--no-deps", _cpu_torch_pin())
    return None if probe.returncode == 0 else TORCH_CPU_INDEX


def _without(lines, names):
    return [line for line in lines if _name(line) not in names]


def _constraints(cuda: bool) -> list[str]:
    """The pins, less the CPU builds that the CUDA set replaces."""
    lines = _lines(CONSTRAINTS.read_text())
    return _without(lines, CPU_ONLY_PINS) if cuda else lines


def install(device, index_override):
    """Install the pinned set into this Python (.venv's), or with `newest` the newest releases the index has
    (`make test-newest`), printing the pip command first, as make would. What pip cannot do well is refused first,
    in one line: a platform without the set's wheels, a venv without pip, a venv that holds the other DEVICE's set
    (CPU and CUDA builds of TensorFlow share one package folder)."""
    here = (sys.platform, platform.machine())
    if here not in SUPPORTED and device != "newest":
        fail(f"the pinned set has CPU builds for Linux x86-64, Linux aarch64 and macOS arm64, not {here[0]} "
             f"{here[1]} (torch 2.13 has no wheel for it)")
    if device == "cuda" and here != ("linux", "x86_64"):
        fail(f"DEVICE=cuda needs Linux x86-64 (this is {here[0]} {here[1]}); leave DEVICE unset for the CPU set")
    if _pip(sys.executable, "--version").returncode != 0:
        fail(f"{sys.prefix} has no pip (on Debian and Ubuntu, install python3.11-venv): remove it and run make again")
    marker = Path(sys.prefix) / "native-loops-device"
    if marker.exists() and marker.read_text().strip() != device:
        fail(f"{sys.prefix} holds the DEVICE={marker.read_text().strip()} set: run `make clean` before installing "
             f"DEVICE={device}")
    if device == "newest":  # what `pip install native-loops[all]` gives a user today: no pins of ours
        args = ["install", "--upgrade", "--upgrade-strategy", "eager", "-e", f"{ROOT}[all,test]"]
    elif device == "cpu":
        index = torch_index(override=index_override)
        args = ["install", "-c", str(CONSTRAINTS), *(["--extra-index-url", index] if index else []),
                "-e", f"{ROOT}[all,test]"]
    else:
        cuda_constraints = Path(sys.prefix) / "constraints-cuda.txt"
        cuda_constraints.write_text("\n".join(_constraints(cuda=True)) + "\n")
        args = ["install", "-c", str(cuda_constraints), "-e", f"{ROOT}[torch,jax,test]", *CUDA_PINS]
    command = [sys.executable, "-m", "pip", *args, "--quiet"]
    print(" ".join(command), flush=True)
    done = subprocess.run(command).returncode
    if done == 0:
        marker.write_text(device + "\n")
    sys.exit(done)


# ---- check-platforms: pip's dry run per platform --------------------------------------------------------------

# pip evaluates environment markers (ours and every dependency's) against the machine it runs on, even with
# --platform: from Linux, torch's macOS wheel then "needs" its Linux-only CUDA packages. So the dry run runs pip
# with its marker environment set to the target's; tags, Requires-Python and the resolver are pip's own.
PIP_FOR_TARGET = """
import json, sys
import pip._vendor.packaging.markers as markers
from pip._internal.cli.main import main
target = json.loads(sys.argv[1])
default = markers.default_environment
markers.default_environment = lambda: default() | target
sys.exit(main(sys.argv[2:]))
"""


def marker_environment(target, python):
    return target.markers | dict(python_version=python, python_full_version=f"{python}.0",
                                 implementation_name="cpython", platform_python_implementation="CPython")


def _name(line):
    return line.split(";")[0].split("==")[0].split(">")[0].split("<")[0].split("[")[0].strip().lower().replace("_", "-")


def _lines(text):
    return [line.split("#")[0].strip() for line in text.splitlines() if line.split("#")[0].strip()]


def _dry_run(target, python, requirements, constraints, index):
    """pip's dry run for `target`: (pip's exit status, its stderr, {package: version})."""
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        (folder / "requirements.txt").write_text("\n".join(requirements) + "\n")
        (folder / "constraints.txt").write_text("\n".join(constraints) + "\n")
        args = ["install", "--dry-run", "--ignore-installed", "--only-binary=:all:", "--target", str(folder / "t"),
                "--python-version", python, "--implementation", "cp", "--abi", f"cp{python.replace('.', '')}",
                *[a for tag in target.pip_platforms for a in ("--platform", tag)],
                "-r", str(folder / "requirements.txt"), "-c", str(folder / "constraints.txt"),
                "--report", str(folder / "report.json"), "--quiet"]
        args += ["--extra-index-url", index] if index else []
        environment = json.dumps(marker_environment(target, python))
        done = subprocess.run([sys.executable, "-c", PIP_FOR_TARGET, environment, *args],
                              capture_output=True, text=True)
        if done.returncode != 0:
            return done.returncode, done.stderr, {}
        report = json.loads((folder / "report.json").read_text())
    return 0, "", {_name(i["metadata"]["name"]): i["metadata"]["version"] for i in report["install"]}


def resolve(target, python, index):
    """The install `make` does, resolved by pip for `target`: (verdict, {package: version}, note), the verdict
    "yes", "NO", or "partly" when only torch could not be checked because its index is out of reach."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    # CUDA: TensorFlow's CUDA build comes from CUDA_PINS (the extra would add tensorflow-cpu beside it)
    extras = ("torch", "jax", "test") if target.cuda else ("torch", "jax", "tensorflow", "test")
    requirements = project["dependencies"] + [d for e in extras for d in project["optional-dependencies"][e]]
    constraints = _constraints(target.cuda)
    if target.cuda:
        requirements += list(CUDA_PINS)
    # On Linux, torch's CPU build comes from the PyTorch CPU index unless a wheel folder here has it.
    cpu_torch = target.markers["sys_platform"] == "linux" and not target.cuda
    status, stderr, resolved = _dry_run(target, python, requirements, constraints, None)
    if status and cpu_torch and "torch" in stderr:
        index = index or TORCH_CPU_INDEX
        status, stderr, resolved = _dry_run(target, python, requirements, constraints, index)
        if status and any(s in stderr for s in UNREACHABLE):
            status, stderr, resolved = _dry_run(target, python, _without(requirements, ("torch",)),
                                                _without(constraints, ("torch",)), None)
            if status == 0:
                return "partly", resolved, f"all but torch; {index} is out of reach from here"
    if status:
        errors = [line for line in stderr.splitlines() if line.startswith("ERROR")]
        return "NO", {}, (errors or stderr.splitlines() or ["pip failed"])[-1]
    unpinned = sorted(set(resolved) - {_name(line) for line in constraints})
    if target.cuda:
        return "yes", resolved, f"{len(unpinned)} packages beyond the CPU pins (the CUDA libraries)"
    if unpinned:
        return "NO", resolved, f"not pinned in constraints.txt: {', '.join(unpinned)}"
    return "yes", resolved, ""


def check(only):
    """Exit 0 when every platform resolves, 1 when one does not, 3 when one could be checked only in part."""
    targets = [t for t in PLATFORMS if not only or t.name in only]
    index = torch_index()
    version = _pip(sys.executable, "--version", quiet=False).stdout.split()[1]
    print(f"pip {version} dry run (--only-binary=:all: --platform TAG --python-version V, markers evaluated for the "
          f"target); torch's CPU index on this machine: {index or 'not needed (pip finds the CPU build without it)'}\n")
    print("| platform | Python | resolves | packages | torch | tensorflow | jax | keras | note |")
    print("|---|---|---|---|---|---|---|---|---|")
    verdicts = []
    for target in targets:
        for python in PYTHONS:
            verdict, resolved, note = resolve(target, python, index)
            verdicts.append(verdict)
            tf = (f"tensorflow-cpu {resolved['tensorflow-cpu']}" if "tensorflow-cpu" in resolved
                  else resolved.get("tensorflow", ""))
            print(f"| {target.name} | {python} | {verdict} | {len(resolved)} | {resolved.get('torch', '')} | {tf} | "
                  f"{resolved.get('jax', '')} | {resolved.get('keras', '')} | {note} |", flush=True)
    sys.exit(1 if "NO" in verdicts else 3 if "partly" in verdicts else 0)


def main(argv=None):
    parser = argparse.ArgumentParser(prog=".ci/platforms.py", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    setup = commands.add_parser("install")
    setup.add_argument("--device", choices=("cpu", "cuda", "newest"), default="cpu")
    setup.add_argument("--torch-index", default="", help="'none', or the URL of torch's CPU wheels (Linux)")
    verify = commands.add_parser("check")
    verify.add_argument("--only", nargs="*", choices=[t.name for t in PLATFORMS])
    args = parser.parse_args(argv)
    if args.command == "install":
        install(args.device, args.torch_index)
    else:
        check(args.only)


if __name__ == "__main__":
    main()
