"""How a process ended, and the signals held while a step must not be cut in two. Engine-free."""
from __future__ import annotations

import signal
import threading
from contextlib import contextmanager


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
