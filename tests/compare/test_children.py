"""No process of ours outlives its parent: a SIGKILL of the command (the OOM killer, a scheduler's hard stop) ends
the engine workers, the launchers and their processes with it (`keras_side.process`; torchrun's ranks:
tests/native/torch/test_ddp.py).

Each child here would wait forever on its own (it sleeps and reads nothing), so only its parent's death can end it:
a test fails if it is still there after `HANG_GUARD_S`, a bound against a hang, not a measure of speed (the kernel
sends the signal as the parent dies)."""
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from keras_side.process import process_state, with_parent
from tests.conftest import REPO, wait_for

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")

SLEEPER = "import os, sys, time; open(sys.argv[1] + '/' + str(os.getpid()), 'w').close(); time.sleep(10**6)"


def alive(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie, ended but not yet reaped, is not)."""
    return process_state(pid) not in (None, "Z")


def sleepers(folder: Path, count: int) -> list[int]:
    """The pids the sleepers wrote into `folder`, once `count` of them have."""
    assert wait_for(lambda: len(list(folder.iterdir())) >= count), "the children did not start"
    return sorted(int(p.name) for p in folder.iterdir())


def killed_parent(tmp_path, script: str, count: int, *args: str) -> list[int]:
    """Run `script` (a parent that starts `count` sleepers writing their pids into a folder, then waits), SIGKILL it
    once they are up, and return the sleepers' pids."""
    pids = tmp_path / "pids"
    pids.mkdir()
    parent = subprocess.Popen([sys.executable, "-c", script, str(pids), *args], cwd=REPO, start_new_session=True,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        children = sleepers(pids, count)
    finally:
        parent.kill()
        parent.wait()
    return children


def assert_all_end(children: list[int]) -> None:
    try:
        assert wait_for(lambda: not any(alive(pid) for pid in children)), "a child outlived its parent"
    finally:
        for pid in children:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_child_started_with_its_parent_ends_when_the_parent_is_killed(tmp_path):
    script = ("import subprocess, sys, time; from keras_side.process import with_parent; "
              f"subprocess.Popen(with_parent([sys.executable, '-c', {SLEEPER!r}, sys.argv[1]])); time.sleep(10**6)")
    assert_all_end(killed_parent(tmp_path, script, 1))


def test_a_child_whose_parent_is_gone_before_it_asks_ends_at_once(tmp_path):
    """The kernel's call cannot see a parent that died before it was made: the child checks, and exits."""
    gone = subprocess.Popen(["true"])
    gone.wait()  # ended and reaped: its pid names no parent of anything
    proc = subprocess.run([sys.executable, "-m", "keras_side.process", str(gone.pid), str(int(signal.SIGKILL)), "--",
                           sys.executable, "-c", "print('ran')"], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 128 + signal.SIGKILL and proc.stdout == ""


def test_the_engine_workers_end_when_the_command_is_killed(tmp_path):
    script = ("import sys, time; from pathlib import Path; from compare.engines import runner; "
              f"runner.WORKER = ('-c', {SLEEPER!r}, sys.argv[1]); "
              "pool = runner.Pool(['torch', 'jax'], Path(sys.argv[1]).parent / 'run'); time.sleep(10**6)")
    assert_all_end(killed_parent(tmp_path, script, 2))


def test_a_launcher_ends_when_the_command_is_killed(tmp_path):
    """`native-loops distributed` waits on each engine's launcher (torchrun, JAX's, TensorFlow's)."""
    script = ("import os, sys; from pathlib import Path; from compare import distributed; "
              f"distributed._run([sys.executable, '-c', {SLEEPER!r}, sys.argv[1]], dict(os.environ), "
              "Path(sys.argv[1]).parent / 'launch.log')")
    assert_all_end(killed_parent(tmp_path, script, 1))


def test_with_parent_runs_the_command_itself(tmp_path):
    """No process between: the child's pid is the command's, and its exit code is the command's."""
    proc = subprocess.Popen(with_parent([sys.executable, "-c", "import os; print(os.getpid()); raise SystemExit(3)"]),
                            cwd=REPO, stdout=subprocess.PIPE, text=True)
    out, _ = proc.communicate()
    assert proc.returncode == 3 and out.strip() == str(proc.pid)


def test_with_parent_from_another_thread_leaves_the_command_as_it_is():
    """The kernel watches the thread that starts a child: from a thread that may end first, no such guarantee."""
    import threading

    found = []
    thread = threading.Thread(target=lambda: found.append(with_parent(["echo"])))
    thread.start()
    thread.join()
    assert found == [["echo"]] and with_parent(["echo"])[-2:] == ["--", "echo"]


def descendants(pid: int) -> set[int]:
    """Every live process started by `pid`, or by one it started, however deep (Linux's /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):  # ended while we looked
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return {p for p in found if alive(p)}


def command_names(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@pytest.mark.parametrize("command, started", [
    (["compare", "--quick", "--engines", "torch,jax"], "compare.engines.worker"),
    (["distributed", "--engines", "jax", "--processes", "2", "--epochs", "200"], "native.jax.sharded"),
], ids=["compare", "distributed"])
def test_a_command_killed_leaves_no_process_behind(tmp_path, command, started):
    """SIGKILL of the command itself, once it has started what it starts (the workers; the launchers and their
    processes): every process under it ends."""
    cli = subprocess.Popen([sys.executable, "-m", "compare.cli", *command, "--out", str(tmp_path / "run")], cwd=REPO,
                           env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        assert wait_for(lambda: any(started in command_names(p) for p in descendants(cli.pid)) or cli.poll() is not None)
        under = descendants(cli.pid)
        assert cli.poll() is None and under, "the command ended before it could be killed"
    finally:
        cli.kill()
        cli.wait()
    assert_all_end(sorted(under))
