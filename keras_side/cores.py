"""Which cores a process computes on: a timed run pinned to its own.

    with cores.on_cpus([3], every_thread=True): ...   # every thread of this process on core 3 for the block
    cores.pin_launched(rank)                          # a launched process on its core of NATIVE_LOOPS_CPUS

Every process of ours asks its engine for one thread (keras_side.determinism.THREADS), and torch and TensorFlow keep
to it. JAX does not: XLA_ONE_THREAD holds only Eigen, and XLA's CPU runtime takes no thread count (jax-ml/jax#1539),
while Keras's `fit` on JAX runs its Python beside the step on a second core (docs/dev-notes.md). So whatever is timed
against something else is pinned instead: `native-loops bench` and `walk-forward` pin each timed request of a worker,
`distributed` pins each process of a launch to a core of its own and the one-process run to one of them. Linux only
(per-thread affinity over /proc/self/task); elsewhere nothing is pinned and the runs say so.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path

# The cores a launched process computes on, comma-separated ("0,1"): process (rank) i of a launch takes the i-th;
# a process that runs every device itself (fit under Keras's distribution, MirroredStrategy) takes them all.
CPUS_VARIABLE = "NATIVE_LOOPS_CPUS"
SYSFS = Path("/sys/devices/system/cpu")  # where Linux says which logical CPUs share a physical core


def timing_cpus() -> list[int] | None:
    """The cores a timed run may use, in order: a run on n cores takes the last n, which are on n physical cores
    where this process may use that many (with SMT, two logical CPUs of one core share its units, so a run on both
    is not two cores' worth). None where the system cannot pin (macOS)."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    seen, firsts, siblings = set(), [], []
    for cpu in sorted(os.sched_getaffinity(0)):
        core = physical_core(cpu)
        (siblings if core in seen else firsts).append(cpu)
        seen.add(core)
    return siblings + firsts


def physical_core(cpu: int):
    """(package, core) of a logical CPU, from Linux's sysfs; the CPU itself where it does not say."""
    topology = SYSFS / f"cpu{cpu}" / "topology"
    try:
        return tuple(int((topology / name).read_text()) for name in ("physical_package_id", "core_id"))
    except (OSError, ValueError):
        return ("cpu", cpu)


def _threads() -> list[int]:
    """This process's threads (Linux: their ids in /proc/self/task), or the calling thread alone (0) where /proc
    does not say."""
    return [int(t) for t in os.listdir("/proc/self/task")] if os.path.isdir("/proc/self/task") else [0]


def _pin_every_thread(cpus) -> dict[int, set[int]]:
    """Every thread on `cpus`, listed again until no new one appears (a thread started meanwhile by one not yet
    pinned keeps its maker's cores); the cores each had."""
    before: dict[int, set[int]] = {}
    seen: set[int] = set()
    while new := [t for t in _threads() if t not in seen]:
        seen.update(new)
        for task in new:
            with contextlib.suppress(ProcessLookupError):  # a thread that has ended since
                before[task] = os.sched_getaffinity(task)
                os.sched_setaffinity(task, set(cpus))
    return before


@contextlib.contextmanager
def on_cpus(cpus: list[int] | None, *, every_thread: bool = False):
    """The calling thread, or every thread of this process, on `cpus` for the block, then each back on the cores it
    had (Linux: each thread has its own affinity, and a thread made inside the block keeps the block's); nothing
    when `cpus` is None."""
    if not cpus:
        yield
        return
    before = {}
    try:
        if every_thread:
            before = _pin_every_thread(cpus)
        else:
            before[0] = os.sched_getaffinity(0)
            os.sched_setaffinity(0, set(cpus))
        yield
    finally:
        for task, cores in before.items():
            with contextlib.suppress(ProcessLookupError):
                os.sched_setaffinity(task, cores)


def cores_in_use() -> list[int] | None:
    """The cores any thread of this process may run on now; None where the system does not say (macOS)."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    cores = set()
    for task in _threads():
        with contextlib.suppress(ProcessLookupError):
            cores |= os.sched_getaffinity(task)
    return sorted(cores)


def pin_launched(index: int | None = None) -> None:
    """Every thread of this launched process, for the rest of its life, on its cores of CPUS_VARIABLE: the
    `index`-th (its process or rank in the launch) or, with None, all of them. Call it first thing: a thread made
    later keeps its maker's cores. Nothing is pinned where the variable is unset or the system cannot pin."""
    named = os.environ.get(CPUS_VARIABLE)
    if not named or not hasattr(os, "sched_setaffinity"):
        return
    cpus = [int(c) for c in named.split(",")]
    if index is not None and not 0 <= index < len(cpus):
        raise ValueError(f"{CPUS_VARIABLE}={named} names no core for process {index}: name one a process")
    _pin_every_thread(cpus if index is None else cpus[index:index + 1])
