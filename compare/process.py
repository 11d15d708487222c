"""How the command's process stops and writes. Ctrl-C and SIGTERM are raised where the program is (`stop_handlers`),
so that every `finally` runs: workers stopped, temporary folders removed. A closed stdout or stderr is os.devnull, and
a stdout that refuses a write (a full disk, a closed pipe) is one `StdoutFailed`, not a traceback."""
from __future__ import annotations

import os
import queue
import signal
import sys
import threading
import time
from contextlib import contextmanager


class Terminated(BaseException):
    """SIGTERM (what `timeout`, `kill` and CI send), raised where the program is, so that every `finally` runs: the
    run folder's temporary twin is removed and the workers are stopped, as for Ctrl-C. A BaseException, as
    KeyboardInterrupt is, so that no `except Exception` on the way swallows it."""


STOPS = (signal.SIGINT, signal.SIGTERM)


def _stop(signum, frame):
    """The first Ctrl-C or SIGTERM stops the run where it is. The next one does not cut that stopping short (workers
    killed and waited for, temporary folders removed: cut short, it would leave a worker or a half-written folder
    behind); it says what is going on. The one after that quits at once, whatever is left."""
    if _inside(_swallowed, frame):  # raised in the hook, Python would drop it for good: sent again, later
        return _swallowed.pending.put(signum)
    for stop in STOPS:
        signal.signal(stop, _stopping)
    raise KeyboardInterrupt if signum == signal.SIGINT else Terminated


def _stopping(signum, frame):
    _stopping.presses = getattr(_stopping, "presses", 0) + 1
    if _stopping.presses == 1:
        print("native-loops: stopping the workers and removing temporary folders; once more to quit at once",
              file=sys.stderr, flush=True)
    else:
        os._exit(130 if signum == signal.SIGINT else 143)


REDELIVER_S = 0.05  # not a limit on anything: a stop sent again lands wherever the main thread is by then


def _swallowed(unraisable) -> None:
    """`sys.unraisablehook` while a command runs. A signal that lands while Python runs a garbage-collection
    callback or a `__del__` (JAX registers a gc callback) raises `_stop`'s exception there, where Python prints it
    and drops it: the stop would be lost, and the run would go on. `_send_again`'s thread sends that signal again,
    so that the main thread takes it where it is next. Should that be another such callback, this hook takes it
    again; should it be this hook itself (a busy machine can keep the main thread here for a while), `_stop` hands
    it back rather than raise it here, where nothing would take it. Neither waits for anything: `SimpleQueue.put`
    is the one call Python makes safe inside a signal handler that interrupts it."""
    if not isinstance(unraisable.exc_value, (KeyboardInterrupt, Terminated)):
        return _swallowed.previous(unraisable)
    for stop in STOPS:  # still the first press: the stop never happened
        signal.signal(stop, _stop)
    _stopping.presses = 0  # one more press taken meanwhile by `_stopping` was not a second one
    _swallowed.pending.put(signal.SIGINT if isinstance(unraisable.exc_value, KeyboardInterrupt) else signal.SIGTERM)


def _send_again(pending: queue.SimpleQueue) -> None:
    """The thread behind `_swallowed`: each signal put in `pending` is sent to this process again, REDELIVER_S later,
    until None."""
    while (signum := pending.get()) is not None:
        time.sleep(REDELIVER_S)
        os.kill(os.getpid(), signum)


def _inside(function, frame) -> bool:
    """Whether `frame` runs in a call of `function`, however deep."""
    while frame is not None and frame.f_code is not function.__code__:
        frame = frame.f_back
    return frame is not None


@contextmanager
def stop_handlers():
    """The handlers of Ctrl-C and SIGTERM (`_stop`, `_stopping`, `_swallowed`) for the block; the caller's after it.
    Signals reach the main thread only: elsewhere, or inside such a block already, this does nothing. A stop that
    `_send_again` still holds when the block ends is raised here, as the block's own."""
    if threading.current_thread() is not threading.main_thread() or sys.unraisablehook is _swallowed:
        yield
        return
    pending, previous_hook, previous = queue.SimpleQueue(), sys.unraisablehook, {}
    again = threading.Thread(target=_send_again, args=(pending,), name="native-loops-stops", daemon=True)
    try:
        _swallowed.pending, _swallowed.previous, _stopping.presses = pending, previous_hook, 0
        sys.unraisablehook = _swallowed
        again.start()
        for stop in STOPS:
            previous[stop] = signal.signal(stop, _stop)
        yield
    finally:
        left = []
        try:
            pending.put(None)
            if again.ident is not None:
                again.join()
            while not pending.empty():  # put back after the thread's last read: never sent
                left.append(pending.get())
        finally:
            for stop, handler in previous.items():  # called from Python (a test, a script): the caller's own handlers
                signal.signal(stop, handler)
            sys.unraisablehook = previous_hook
        if left:
            raise KeyboardInterrupt if left[0] == signal.SIGINT else Terminated


def closed_streams_to_devnull() -> None:
    """A closed stdout or stderr (`native-loops data >&-`) is None in Python, and the first print a traceback. Its
    descriptor is pointed at os.devnull, so no file this run opens lands on 1 or 2, where a print would write into it,
    and the stream is that descriptor."""
    for fd, name in ((1, "stdout"), (2, "stderr")):
        if getattr(sys, name) is not None:
            continue
        try:
            os.fstat(fd)
        except OSError:  # closed: os.devnull there (not at the lowest free descriptor: stdin may be closed too)
            _devnull_onto(fd)
        setattr(sys, name, open(fd, "w", closefd=False))


def _devnull_onto(fd: int) -> None:
    """Descriptor `fd` made os.devnull, open or closed before."""
    null = os.open(os.devnull, os.O_WRONLY)
    if null == fd:  # fd was closed and the lowest free descriptor
        return
    try:
        os.dup2(null, fd)
    finally:
        os.close(null)


class StdoutFailed(Exception):
    """Standard output refused a write: a full disk (`> /dev/full`), a pipe whose reader has gone (`| head -1`).
    Not an OSError, so that no handler of a file's errors takes it for its own."""


class Stdout:
    """sys.stdout during a command: the same stream, its write errors raised as `StdoutFailed`."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError as err:
            raise StdoutFailed(err.strerror or str(err)) from None

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as err:
            raise StdoutFailed(err.strerror or str(err)) from None

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name):
        return getattr(self._stream, name)


def discard(stream) -> None:
    """What `stream` still buffers goes to os.devnull, so that exiting does not fail on it again; its descriptor
    refuses every write anyway. Nothing for a stream without one (pytest's capture)."""
    try:
        fd = stream.fileno()
    except (OSError, ValueError):
        return
    _devnull_onto(fd)
