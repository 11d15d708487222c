"""Model builders for the data-parallel fault tests: the second process dies while building the model, as a process
that crashes (torchrun sets RANK; a jax.distributed process knows its index)."""
import os
import threading

import keras

from keras_side import models


def dies_in_the_second_process():
    if _second_process():
        os._exit(3)
    return models.har()


def compiled_har():
    """The HAR, already compiled: the native loops train it, and `keras_side.fit.train` refuses it (it compiles from
    the spec): a fit that fails, on its own."""
    model = models.har()
    model.compile(optimizer="adam", loss="mse")
    return model


def draws_otherwise_in_the_second_process():
    """dropout_mlp, except that in the second process `torch.bernoulli` keeps what it drops: a rank whose device draws
    otherwise from the same seed state, as a GPU of another model can."""
    if _second_process():
        import torch

        bernoulli = torch.bernoulli
        torch.bernoulli = lambda *args, **kwargs: 1.0 - bernoulli(*args, **kwargs)
    return models.dropout_mlp()


def har_in_the_first_process_only():
    """The HAR in the first process; the second never builds its model, waiting until the launcher stops it (as it
    does once the first has ended): the first refuses a spec alone, whatever the machine's load."""
    if _second_process():
        threading.Event().wait()
    return models.har()


def _second_process() -> bool:
    if keras.config.backend() == "jax":
        import jax

        return jax.process_index() == 1
    return os.environ.get("RANK") == "1"


class DiesMidRun(keras.layers.Layer):
    """The identity, except that in the second process the 5th training step ends the process: a rank that crashes
    in the middle of a run, while the others wait for it in a collective. On JAX the step is compiled, so the count
    runs on the host through `jax.debug.callback`, once per step and device."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.second, self.steps = _second_process(), [0]

    def _tick(self, *shard):
        self.steps[0] += 1
        if self.second and self.steps[0] == 5:
            self.fault()

    def fault(self):
        os._exit(3)

    def call(self, x, training=None):
        if training:
            if keras.config.backend() == "jax":
                import jax

                # Every process compiles the same program; `partitioned` runs the callback on each device's own
                # shard, so in its own process (unpartitioned, only the first device's process would run it).
                jax.debug.callback(self._tick, x, partitioned=True)
            else:
                self._tick()
        return x


def dies_mid_run():
    return keras.Sequential([keras.Input((3,)), DiesMidRun(name="fault"), keras.layers.Dense(1, name="out")])


class HangsMidRun(DiesMidRun):
    """The same, except that the second process hangs at its 5th step instead: only a collective's timeout ends
    the run."""

    def fault(self):
        import threading

        threading.Event().wait()  # forever


def hangs_mid_run():
    return keras.Sequential([keras.Input((3,)), HangsMidRun(name="fault"), keras.layers.Dense(1, name="out")])


def processes_naming(path) -> list[str]:
    """The live processes whose command line names `path` (a test's folder): none may outlive a launch."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if str(path).encode() in f.read():
                        found.append(entry)
            except OSError:  # ended while we looked
                pass
    return found


class StopsMidRun(DiesMidRun):
    """The same, except that the second process stops itself (SIGSTOP) at its 5th step, as a hostile user's
    `kill -STOP` does: the launcher can tell it from the processes that wait for it."""

    def fault(self):
        import signal

        os.kill(os.getpid(), signal.SIGSTOP)


def stops_mid_run():
    return keras.Sequential([keras.Input((3,)), StopsMidRun(name="fault"), keras.layers.Dense(1, name="out")])


class WaitsMidRun(DiesMidRun):
    """The same, except that the second process, at its 5th step, writes its pid into the folder named by
    NATIVE_LOOPS_TEST_MARKS and waits forever (the first waits for it in a collective): only something from outside
    ends the run."""

    def fault(self):
        import threading

        open(os.path.join(os.environ["NATIVE_LOOPS_TEST_MARKS"], str(os.getpid())), "w").close()
        threading.Event().wait()


def waits_mid_run():
    return keras.Sequential([keras.Input((3,)), WaitsMidRun(name="fault"), keras.layers.Dense(1, name="out")])
