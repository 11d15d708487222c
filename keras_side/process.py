"""How a process ended, the signals held while a step must not be cut in two, and children that end with their
parent. Engine-free.

    subprocess.Popen(with_parent([sys.executable, "-m", "compare.engines.worker"]))   # ends when this process does

Every process this package starts (an engine's worker, torchrun, a launcher, JAX's processes) is started through
`with_parent`, and a torchrun rank calls `die_with_parent` first thing (torchrun starts it, not this package): a SIGKILL of the command (the OOM killer, a
scheduler's hard stop) ends them too, at once, rather than leave them training for nobody.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>: the signal this process gets when the thread that started it ends


def exit_reason(code: int) -> str:
    """How a process ended, from its return code (negative: the signal that killed it)."""
    if code >= 0:
        return f"exit code {code}"
    try:
        return f"killed by signal {-code} ({signal.Signals(-code).name})"
    except ValueError:  # a signal number without a name
        return f"killed by signal {-code}"


@contextmanager
def interrupts_held():
    """Hold Ctrl-C and SIGTERM for the block, then deliver them as they came: for a step that must not be cut in
    two (raised inside `subprocess.Popen` after the fork, an interrupt would lose the started process, which then
    outlives the run; between a checkpoint's rename and the removal of the one before it, it would leave both).
    Only the main thread receives signals; elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = []
    previous = {s: signal.signal(s, lambda signum, frame: held.append(signum)) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for signum in held:
            signal.raise_signal(signum)  # to the handler that was there: KeyboardInterrupt, Terminated, or the default


def process_state(pid: int) -> str | None:
    """The state letter Linux's /proc gives the process `pid` ("R" running, "S" waiting, "T" stopped, "Z" ended but
    not yet reaped...), or None once it is gone, or where there is no /proc."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def is_stopped(pid: int) -> bool:
    """Whether the process `pid` is stopped (SIGSTOP, a debugger); False once it is gone, or without /proc. A process
    that hangs in a deadlock or a collective looks as any waiting one does: no runtime can tell it from its peers."""
    return process_state(pid) in ("T", "t")


def die_with_parent(parent: int | None = None, signum: int = signal.SIGKILL) -> None:
    """Linux: have the kernel send this process `signum` when its parent dies, however it dies (SIGKILL too); and
    exit at once if `parent`, the pid that started it, is gone already (then this process has a new parent, whose
    death the call would wait for). Elsewhere nothing: macOS has no such call (a worker there still ends at the end
    of its stdin, when it is waiting for a request)."""
    if not sys.platform.startswith("linux"):
        return
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if parent is not None and os.getppid() != parent:
        os._exit(128 + signum)  # as if the signal had come: the parent died before it could be asked for


def with_parent(command: list[str], signum: int = signal.SIGKILL) -> list[str]:
    """`command` run so that it ends with this process: through `python -m keras_side.process`, which asks for
    `signum` on this process's death (`die_with_parent`) and then becomes `command` (exec: same pid, no process
    between). The kernel watches the thread that starts the child, not the process: from a thread other than the
    main one, which may end before the child should, the command is returned as it is (no such guarantee)."""
    if threading.current_thread() is not threading.main_thread():
        return list(command)
    return [sys.executable, "-m", "keras_side.process", str(os.getpid()), str(int(signum)), "--", *command]


def _exec_with_parent(argv: list[str]) -> None:
    """`python -m keras_side.process PARENT SIGNAL -- COMMAND...`, what `with_parent` writes."""
    parent, signum, separator, *command = argv
    if separator != "--" or not command:
        raise SystemExit("usage: python -m keras_side.process PARENT SIGNAL -- COMMAND...")
    die_with_parent(int(parent), int(signum))
    os.execvp(command[0], command)


if __name__ == "__main__":
    _exec_with_parent(sys.argv[1:])
