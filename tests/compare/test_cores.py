"""keras_side.cores: a launched process pins every thread of it, the ones it had before the call too, to its core of
NATIVE_LOOPS_CPUS (Linux); a process that names no index takes every core named."""
import json
import os
import subprocess
import sys

import pytest

from keras_side import cores

# A thread started before the call, then the cores of every thread of the process (cores_in_use) after it.
PROBE = """
import json, sys, threading
from keras_side import cores
started = threading.Event()
threading.Thread(target=lambda: (started.set(), threading.Event().wait(5)), daemon=True).start()
started.wait()
index = None if sys.argv[1] == "all" else int(sys.argv[1])
print(json.dumps([cores.pin_launched(index), cores.cores_in_use()]))
"""
CAN_PIN = hasattr(os, "sched_setaffinity")


def pinned(index: str, named: str | None):
    env = {k: v for k, v in os.environ.items() if k != cores.CPUS_VARIABLE} | ({cores.CPUS_VARIABLE: named}
                                                                               if named is not None else {})
    return subprocess.run([sys.executable, "-c", PROBE, index], env=env, capture_output=True, text=True)


def cores_after(index: str, named: str | None) -> list[int]:
    """What `pin_launched` returned and what every thread may use after it: the same."""
    said, every_thread = json.loads(pinned(index, named).stdout)
    assert said == every_thread
    return every_thread


@pytest.mark.skipif(not CAN_PIN, reason="this system cannot pin a thread to a core (macOS)")
def test_a_launched_process_is_pinned_to_its_core_every_thread_of_it():
    usable = sorted(os.sched_getaffinity(0))
    named = ",".join(map(str, usable[-2:]))
    assert cores_after(str(len(usable[-2:]) - 1), named) == usable[-1:]  # the launch's last process: the last core
    assert cores_after("all", named) == usable[-2:]  # a process that runs every device: every core named
    assert cores_after("0", None) == usable  # nothing named: nothing pinned


@pytest.mark.skipif(not CAN_PIN, reason="this system cannot pin a thread to a core (macOS)")
def test_a_process_with_no_core_named_for_it_is_an_error_that_says_so():
    failed = pinned("3", "0,1")
    assert failed.returncode != 0 and "NATIVE_LOOPS_CPUS=0,1 names no core for process 3" in failed.stderr


def test_the_last_n_timing_cores_are_on_n_physical_cores(monkeypatch):
    """With SMT numbered sibling after sibling (CPUs 0 and 1 on one core, 2 and 3 on the next), the last two timing
    cores are 0 and 2, one a physical core, and the last one is 2; without SMT, the CPUs in order."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    monkeypatch.setattr(os, "sched_setaffinity", lambda pid, cpus: None, raising=False)
    monkeypatch.setattr(cores, "_physical_core", lambda cpu: (0, cpu // 2))
    assert cores.timing_cpus()[-2:] == [0, 2] and cores.timing_cpus()[-1:] == [2]
    monkeypatch.setattr(cores, "_physical_core", lambda cpu: (0, cpu))
    assert cores.timing_cpus() == [0, 1, 2, 3]
