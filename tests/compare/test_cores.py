"""keras_side.cores: a launched process pins every thread of it, the ones it had before the call too, to its core of
NATIVE_LOOPS_CPUS (Linux); a process that names no index takes every core named; a run on n cores takes n physical
cores where there are."""
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from keras_side import cores

ROOT = Path(__file__).resolve().parents[2]
# A thread started before the call, then the cores of every thread of the process after it.
PROBE = """
import json, sys, threading
from keras_side import cores
started = threading.Event()
threading.Thread(target=lambda: (started.set(), threading.Event().wait(5)), daemon=True).start()
started.wait()
cores.pin_launched(None if sys.argv[1] == "all" else int(sys.argv[1]))
print(json.dumps(cores.cores_in_use()))
"""
CAN_PIN = hasattr(os, "sched_setaffinity")


def pinned(index: str, named: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != cores.CPUS_VARIABLE} | ({cores.CPUS_VARIABLE: named}
                                                                               if named is not None else {})
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-c", PROBE, index], env=env, capture_output=True, text=True, cwd=ROOT)


@pytest.mark.skipif(not CAN_PIN, reason="this system cannot pin a thread to a core (macOS)")
def test_a_launched_process_is_pinned_to_its_core_every_thread_of_it():
    usable = sorted(os.sched_getaffinity(0))
    named = ",".join(map(str, usable[-2:]))
    last = str(len(usable[-2:]) - 1)  # the launch's last process: the last core named
    assert json.loads(pinned(last, named).stdout) == usable[-1:]
    assert json.loads(pinned("all", named).stdout) == usable[-2:]  # a process that runs every device: every core
    assert json.loads(pinned("0", None).stdout) == usable  # nothing named: nothing pinned


@pytest.mark.skipif(not CAN_PIN, reason="this system cannot pin a thread to a core (macOS)")
def test_a_process_with_no_core_named_for_it_is_an_error_that_says_so():
    failed = pinned("3", "0,1")
    assert failed.returncode != 0 and "NATIVE_LOOPS_CPUS=0,1 names no core for process 3" in failed.stderr


def test_the_last_n_timing_cores_are_on_n_physical_cores(monkeypatch, tmp_path):
    """Linux's sysfs with SMT numbered sibling after sibling (CPUs 0 and 1 on one core, 2 and 3 on the next): the
    last two timing cores are 0 and 2, one a physical core, and the last one is 2; without SMT, the CPUs in order;
    where sysfs says nothing, each CPU is its own core."""
    def topology(core_of):
        for cpu in range(4):
            folder = tmp_path / core_of.__name__ / f"cpu{cpu}" / "topology"
            folder.mkdir(parents=True)
            (folder / "physical_package_id").write_text("0\n")
            (folder / "core_id").write_text(f"{core_of(cpu)}\n")
        return tmp_path / core_of.__name__

    def smt(cpu):
        return cpu // 2

    def no_smt(cpu):
        return cpu

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    monkeypatch.setattr(os, "sched_setaffinity", lambda pid, cpus: None, raising=False)
    monkeypatch.setattr(cores, "SYSFS", topology(smt))
    assert cores.timing_cpus()[-2:] == [0, 2] and cores.timing_cpus()[-1:] == [2]
    monkeypatch.setattr(cores, "SYSFS", topology(no_smt))
    assert cores.timing_cpus() == [0, 1, 2, 3]
    monkeypatch.setattr(cores, "SYSFS", tmp_path / "nowhere")
    assert cores.timing_cpus() == [0, 1, 2, 3]


@pytest.mark.skipif(not CAN_PIN, reason="this system cannot pin a thread to a core (macOS)")
def test_every_thread_goes_back_to_its_cores_after_the_block():
    """Each thread of the process on the block's core inside it, each on its own cores again after it, a thread that
    was running before the block included; a thread started inside keeps the block's core (Linux's inheritance)."""
    release = threading.Event()
    before_block = threading.Thread(target=release.wait, daemon=True)
    before_block.start()
    had = {t: os.sched_getaffinity(t) for t in cores._threads()}
    last = sorted(os.sched_getaffinity(0))[-1:]
    with cores.on_cpus(last, every_thread=True):
        assert all(os.sched_getaffinity(t) == set(last) for t in had)
        inside = threading.Thread(target=release.wait, daemon=True)
        inside.start()
    assert {t: os.sched_getaffinity(t) for t in had} == had
    assert os.sched_getaffinity(inside.native_id) == set(last)
    release.set()
