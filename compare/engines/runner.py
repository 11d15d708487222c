"""One worker process per engine (the backend is fixed at the first `import keras`), driven over a JSON pipe.

    outcome = runner.run(data, cfg, ["torch", "jax"], folder)   # trains, takes gradients, swaps weights

Workers of different engines run concurrently (`jobs` at a time); a worker that crashes, or an engine that is not
installed, is recorded with its reason and the other engines carry on.
"""
from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from compare.data import reference
from compare.engines import paths
from compare.errors import NativeLoopsError
from keras_side.backend import (JAX_CACHE_VARIABLE, engine_environment, engine_installed, jax_cache_environment,
                                not_installed)
from keras_side.data import HarData
from keras_side.process import interrupts_held, with_parent
from keras_side.spec import TrainConfig
from keras_side.zoo import ZOO

WORKER = ("-m", "compare.engines.worker")  # test seam: tests point this at a worker that misbehaves on purpose
# Each worker asks for one thread (keras_side.determinism.THREADS; JAX: XLA_ONE_THREAD, which holds only Eigen: XLA's
# own runtime may use a second core, so the timed commands pin instead: keras_side.cores). A full compare on 2 cores
# ends soonest with all three workers at once (docs/dev-notes.md, "Measurements once quoted in the code").
JOBS = 3
# (Not `intra_op_parallelism_threads=1`, the folklore of jax-ml/jax#743: it is no XLA flag, XLA reads no flag after it,
# and it changes neither the thread count nor the CPU time, measured.)
XLA_ONE_THREAD = "--xla_cpu_multi_thread_eigen=false"
# A worker that sends nothing for this long is stopped and its engine fails, so a hung engine or `build_model`
# cannot hang a run. The longest silence measured in our own requests is a few seconds (the walk-forward). The
# clock starts when the worker says it is ready (its engine imported): start-up is never mistaken for a hang, and
# has its own, generous limit (an engine's first import on a fresh, busy machine can take a minute).
QUIET_LIMIT_S = 600.0
STARTUP_LIMIT_S = 900.0
# TensorFlow's `fit` is the slowest of the three engines on every zoo model (`native-loops bench --models all`), so its
# worker, which computes on one thread, has the most to do: the other workers run at a lower priority, and take what
# TensorFlow leaves of the cores. Measured in paired runs of a warm `make compare`, twice (docs/compare.md): faster so
# than with no niceness, or with JAX's worker alone niced.
# Niceness ranks processes across the machine, not within a run: beside other busy jobs the niced workers wait on
# those instead. NATIVE_LOOPS_NICE sets how much lower (0 to 19; `make test`, which runs two tests at a time: 0).
CRITICAL, BEHIND_NICE, NICE_VARIABLE = "tensorflow", 10, "NATIVE_LOOPS_NICE"
MANY_ENGINES = tuple(paths.MANY_MODULES)  # the engines with a many-model trainer
HAR = ZOO["har"].build  # the model `compare` trains unless told another


def xla_flags(flags: str = "") -> str:
    """A caller's `flags` (host devices) and the one-thread flag: joined, never one replacing the other."""
    return " ".join(filter(None, (flags, XLA_ONE_THREAD)))


class Worker:
    """A live worker process for one engine; `ask` sends a request and yields its events."""

    def __init__(self, engine: str, folder: Path, env: dict[str, str] | None = None, *, nice: int = 0,
                 compile_cache: bool = False):
        self.engine, self.folder = engine, folder
        folder.mkdir(parents=True, exist_ok=True)
        self.log = folder / "worker.log"
        extra = dict(env or {})  # a caller's XLA flags (host devices) join the one-thread flags, never replace them
        env = engine_environment(engine) | {"XLA_FLAGS": xla_flags(extra.pop("XLA_FLAGS", ""))} | extra
        if engine == "jax" and compile_cache:  # it loads what an earlier process compiled (jax_cache_environment)
            env |= jax_cache_environment(env)
        elif engine == "jax":  # a run that times its compiles compiles
            env.pop(JAX_CACHE_VARIABLE, None)
        # The caller's import path too: a user's `build_model` may live where only pytest put it on sys.path.
        env["PYTHONPATH"] = os.pathsep.join([p for p in sys.path if p and os.path.isdir(p)] +
                                            [env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(with_parent([sys.executable, *WORKER]), env=env, text=True,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log)
        self.ready = False  # set by the pool when the worker's "ready" event is taken off its queue
        if nice:  # lower than the caller's own niceness (a niced caller cannot go below its own)
            os.setpriority(os.PRIO_PROCESS, self.proc.pid, min(19, os.getpriority(os.PRIO_PROCESS, 0) + nice))

    def ask(self, cmd: str, request: dict):
        try:
            self.proc.stdin.write(json.dumps({"cmd": cmd, "out": str(self.folder), **request}) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass  # the process is gone: reading its stdout below ends at once and reports why
        for line in self.proc.stdout:
            try:
                event = json.loads(line)
            except json.JSONDecodeError:  # printed by a library before the worker took over stdout: not ours
                continue
            yield event
            if event["event"] in ("done", "error"):
                return
        code = self.proc.wait()
        if code < 0:  # a signal: the log's last line (often an engine's start-up banner) says nothing about it
            try:
                why = f"worker killed by signal {-code} ({signal.Signals(-code).name})"
            except ValueError:  # a number without a name (a real-time signal)
                why = f"worker killed by signal {-code}"
        else:
            why = f"worker exited (code {code}): {self._last_log_line()}"
        yield {"event": "error", "message": why}

    def _last_log_line(self) -> str:
        lines = [ln for ln in self.log.read_text().splitlines() if ln.strip()]
        return lines[-1] if lines else "no output"

    def request_exit(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write('{"cmd": "exit"}\n')
                self.proc.stdin.flush()
            except BrokenPipeError:
                pass

    def close(self) -> None:
        self.request_exit()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@dataclass
class Outcome:
    """Where a compare run's workers wrote, and which engines did not finish (engine -> why)."""

    folder: Path
    engines: list[str]
    failed: dict[str, str] = field(default_factory=dict)

    @property
    def complete(self) -> list[str]:
        return [e for e in self.engines if e not in self.failed]

    def engine_folder(self, engine: str) -> Path:
        return self.folder / "engines" / engine


class Pool:
    """One live worker per engine, reused for every request: `pool.each(cmd, request_for)`.

    Engines that are not installed, or whose worker crashes or fails a request, land in `failed` with the reason;
    later requests go only to the others. `compile_cache`: JAX loads what an earlier process compiled of the same
    program (`keras_side.backend.jax_cache_environment`), for the runs that check what is computed; a run that times
    its compiles leaves it off, and so compiles.
    """

    def __init__(self, engines: list[str], folder: Path, *, jobs: int = JOBS, env: dict[str, str] | None = None,
                 compile_cache: bool = False):
        missing = {e: not_installed(e) for e in engines if not engine_installed(e)}
        self.outcome, self.jobs = Outcome(Path(folder), list(engines), missing), jobs
        self.quiet_limit, self.startup_limit = QUIET_LIMIT_S, STARTUP_LIMIT_S  # read here, so a test can shorten them
        self.failed, self.engine_folder = self.outcome.failed, self.outcome.engine_folder
        self.workers = {}
        try:
            with interrupts_held():  # an interrupt never lands between a worker's fork and this record of it
                behind = behind_nice()
                for engine in self.live:
                    nice = behind if CRITICAL in self.live and engine != CRITICAL else 0
                    self.workers[engine] = Worker(engine, self.engine_folder(engine), env, nice=nice,
                                                  compile_cache=compile_cache)
        except BaseException:  # a failed start, or an interrupt, half-way: stop the workers already started
            self.close(abort=True)
            raise

    @property
    def live(self) -> list[str]:
        return self.outcome.complete

    def each(self, cmd: str, request_for=lambda engine: {}, on_event=lambda engine, event: None, *,
             only: list[str] | None = None, fail_engines: bool = True, then=()) -> dict[str, str]:
        """Send `cmd` to every live worker (or those in `only`), `jobs` at a time; pass progress events to
        `on_event`. `then`: more (cmd, request_for) that each worker is asked in turn once its request is done,
        without waiting for the other workers. Returns the errors of these requests by engine. An engine whose
        request fails leaves the pool when `fail_engines` (a compare run); one whose process died always does."""
        events: queue.Queue = queue.Queue()
        gate = threading.Semaphore(self.jobs)
        heard: dict[str, float] = {}  # engine -> when its request started or last sent an event

        def drive(engine: str):
            try:
                with gate:
                    for asked, request in [(cmd, request_for), *then]:
                        heard[engine] = time.monotonic()
                        failed = False
                        for event in self.workers[engine].ask(asked, request(engine)):
                            events.put((engine, event))
                            failed = event["event"] == "error"
                        if failed:
                            break
            except Exception as err:  # a runner bug must not hang the run: it fails this engine
                events.put((engine, {"event": "error", "message": f"runner: {type(err).__name__}: {err}"}))
            finally:
                events.put((engine, None))

        targets = [e for e in self.live if only is None or e in only]
        threads = [threading.Thread(target=drive, args=(e,), daemon=True) for e in targets]
        for t in threads:
            t.start()
        errors, running, stopped = {}, set(targets), set()
        while running:
            try:
                engine, event = events.get(timeout=min(1.0, self.quiet_limit))
                heard[engine] = time.monotonic()
            except queue.Empty:
                engine = event = None
            stopped |= self._stop_quiet(running - stopped, heard)  # checked on every pass: others may be chatty
            if engine is None:
                continue
            if event is None:
                running.discard(engine)
            elif event["event"] == "ready":  # from now on the quiet limit applies, counted from this moment
                self.workers[engine].ready = True
            elif event["event"] == "error":
                if engine in stopped and self.workers[engine].ready:
                    event["message"] = (f"the {engine} worker sent nothing for {self.quiet_limit:.0f} s and was "
                                        "stopped; look for a hang in the engine or in your code (build_model, "
                                        "a loss or a training step)")
                elif engine in stopped:
                    event["message"] = (f"the {engine} worker did not start within {self.startup_limit:.0f} s and "
                                        f"was stopped; check that `import keras` works with KERAS_BACKEND={engine}")
                errors[engine] = event["message"]
                if fail_engines or self.workers[engine].proc.poll() is not None:
                    self.failed[engine] = event["message"]
            else:
                on_event(engine, event)
        return errors

    def started(self) -> None:
        """Wait until every live worker has imported its engine: before a timed request, so that no other worker's
        start-up shares its core."""
        self.each("started")

    def _stop_quiet(self, engines: set[str], heard: dict[str, float]) -> set[str]:
        """Kill the workers among `engines` that have been silent past the limit (the start-up limit until they are
        ready); their requests then end."""
        limit = {e: self.quiet_limit if self.workers[e].ready else self.startup_limit for e in engines}
        quiet = {e for e in engines if e in heard and time.monotonic() - heard[e] > limit[e]}
        for engine in quiet:
            self.workers[engine].proc.kill()
        return quiet

    def close(self, *, abort: bool = False) -> None:
        """Let every worker finish and exit; `abort` stops them at once (an interrupted run has no use for them)."""
        for worker in self.workers.values():  # all at once: each takes a moment to exit
            if abort:
                worker.proc.kill()
            else:
                worker.request_exit()
        for worker in self.workers.values():
            worker.close()

    def __enter__(self) -> "Pool":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self.close(abort=exc_type is not None)


def behind_nice() -> int:
    """How much lower the workers off the critical path run: NATIVE_LOOPS_NICE, or BEHIND_NICE."""
    value = os.environ.get(NICE_VARIABLE, str(BEHIND_NICE))
    if not (value.isascii() and value.isdigit() and int(value) <= 19):
        raise NativeLoopsError(f"{NICE_VARIABLE} must be a niceness from 0 to 19, got {value!r}; unset it for "
                               f"{BEHIND_NICE}")
    return int(value)


def run(data: HarData, cfg: TrainConfig, engines: list[str], folder: Path, *, build: str = HAR,
        har: bool = True, same_epochs: int | None = None, float64: bool = False, seeds: list[int] = (),
        plant: dict | None = None, on_event=lambda engine, event: None, jobs: int = JOBS) -> Outcome:
    """Train every path on every engine, take the HAR's gradients at fixed weights, and predict with every other
    engine's weights. `build` names the model ("module:function", e.g. a zoo model's); `har=False` says it is not
    the plain HAR regression: then there is no gradient formula to check, and the same-arithmetic run starts from
    one engine's seeded weights, not NumPy's. `same_epochs`: how long the same-arithmetic run trains (default
    `cfg.epochs`). `seeds`: the HAR trained once per seed by each engine with a many-model trainer (the seed-noise
    check's yardstick). `plant`: {"path": ..., "fault": ...} trains that path with a fault
    (`compare.engines.faults`). Everything lands under `folder`; read it back with `compare.referee.checks`."""
    data_file, batch_file, init_file = folder / "data.npz", folder / "batch.npz", folder / "init.npz"
    data.save(data_file)
    if har:
        x, y, weights = reference.fixed_batch(data.x_train, data.y_train, seed=cfg.seed)
        np.savez(batch_file, x=x, y=y, kernel=weights[0], bias=weights[1])
        np.savez(init_file, **{f"w_{i}": w for i, w in enumerate(initial_weights(data, cfg.seed))})
    with Pool(engines, folder, jobs=jobs, compile_cache=True) as pool:
        for engine in [] if har else list(pool.live):  # the first engine that can build the model draws its start
            request = {"data": str(data_file), "build": build, "seed": cfg.seed, "init": str(init_file)}
            if not pool.each("init", lambda e: request, only=[engine]):
                break
        train = {"data": str(data_file), "config": cfg.to_dict(), "init": str(init_file), "build": build,
                 "same_epochs": same_epochs or cfg.epochs} | ({"plant": plant} if plant else {})
        # The yardstick of seed_noise (the HAR once per seed, by the engines with a many-model trainer) is asked
        # with the training, so that it runs while the slowest engine (TensorFlow's fit) is still training.
        many = {"name": "seeds", "fit": False, "seeds": seeds} if har and seeds else None
        # The HAR's gradients need no training: each worker takes them as soon as its own training is done.
        gradients = [("gradients", lambda e: {"batch": str(batch_file), "float64": float64})] if har else []
        pool.each("train", lambda e: train | ({"many": many} if many and e in MANY_ENGINES else {}), on_event,
                  then=gradients)
        h5 = {p.stem.removesuffix(".weights"): str(p)
              for e in pool.live for p in pool.engine_folder(e).glob("*.weights.h5")}
        pool.each("cross_predict", lambda e: {"data": str(data_file), "weights": h5, "build": build})
    return pool.outcome


def initial_weights(data: HarData, seed: int) -> list[np.ndarray]:
    """The same-arithmetic run's starting point: Glorot-uniform kernel and zero bias drawn by NumPy."""
    rng = np.random.default_rng(seed + 1)
    k = data.x_train.shape[1]
    limit = np.sqrt(6.0 / (k + 1))
    return [rng.uniform(-limit, limit, size=(k, 1)).astype(np.float32), np.zeros(1, np.float32)]
