"""One worker process per engine (the backend is fixed at the first `import keras`), driven over a JSON pipe.

    outcome = runner.run(data, cfg, ["torch", "jax"], folder)   # trains, takes gradients, swaps weights

Workers of different engines run concurrently (`jobs` at a time); a worker that crashes, or an engine that is not
installed, is recorded with its reason and the other engines carry on.
"""
from __future__ import annotations

import importlib.util
import json
import queue
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from compare import reference
from keras_side.backend import engine_environment
from keras_side.config import HarData, TrainConfig

WORKER = ("-m", "compare.worker")  # test seam: tests point this at a worker that misbehaves on purpose
ENGINE_PACKAGES = {"torch": "torch", "jax": "jax", "tensorflow": "tensorflow"}
# Each worker computes on one thread (keras_side.determinism.THREADS): two run side by side on two cores.
JOBS = 2
XLA_ONE_THREAD = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"


def engine_installed(engine: str) -> bool:
    return importlib.util.find_spec(ENGINE_PACKAGES[engine]) is not None


class Worker:
    """A live worker process for one engine; `ask` sends a request and yields its events."""

    def __init__(self, engine: str, folder: Path):
        self.engine, self.folder = engine, folder
        folder.mkdir(parents=True, exist_ok=True)
        self.log = folder / "worker.log"
        env = engine_environment(engine)
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {XLA_ONE_THREAD}".strip()
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen([sys.executable, *WORKER], env=env, text=True,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log)

    def ask(self, cmd: str, request: dict):
        try:
            self.proc.stdin.write(json.dumps({"cmd": cmd, "out": str(self.folder), **request}) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass  # the process is gone: reading its stdout below ends at once and reports why
        for line in self.proc.stdout:
            event = json.loads(line)
            yield event
            if event["event"] in ("done", "error"):
                return
        yield {"event": "error", "message": f"worker exited (code {self.proc.wait()}): {self._last_log_line()}"}

    def _last_log_line(self) -> str:
        lines = [ln for ln in self.log.read_text().splitlines() if ln.strip()]
        return lines[-1] if lines else "no output"

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write('{"cmd": "exit"}\n')
                self.proc.stdin.flush()
                self.proc.wait(timeout=30)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self.proc.kill()


@dataclass
class Outcome:
    folder: Path
    engines: list[str]
    failed: dict[str, str] = field(default_factory=dict)  # engine -> why it is incomplete

    @property
    def complete(self) -> list[str]:
        return [e for e in self.engines if e not in self.failed]

    def engine_folder(self, engine: str) -> Path:
        return self.folder / "engines" / engine


def _each(workers: dict[str, Worker], outcome: Outcome, make_request, on_event, jobs: int) -> None:
    """Send one request to every live worker, `jobs` at a time, and feed every event to `on_event`."""
    events: queue.Queue = queue.Queue()
    gate = threading.Semaphore(jobs)

    def drive(engine: str, worker: Worker):
        try:
            with gate:
                for event in worker.ask(*make_request(engine)):
                    events.put((engine, event))
        except Exception as err:  # a runner bug must not hang the run: report it as this engine's failure
            events.put((engine, {"event": "error", "message": f"runner: {type(err).__name__}: {err}"}))
        finally:
            events.put((engine, None))

    live = {e: w for e, w in workers.items() if e not in outcome.failed}
    threads = [threading.Thread(target=drive, args=item, daemon=True) for item in live.items()]
    for t in threads:
        t.start()
    running = len(threads)
    while running:
        engine, event = events.get()
        if event is None:
            running -= 1
        elif event["event"] == "error":
            outcome.failed[engine] = event["message"]
        else:
            on_event(engine, event)


def run(data: HarData, cfg: TrainConfig, engines: list[str], folder: Path, *, float64: bool = False,
        on_event=lambda engine, event: None, jobs: int = JOBS) -> Outcome:
    """Train every path on every engine, take gradients at fixed weights, and predict with every other engine's
    weights. Everything lands under `folder`; read it back with `compare.checks`."""
    outcome = Outcome(folder, list(engines))
    data_file = folder / "data.npz"
    data.save(data_file)
    x, y, weights = reference.fixed_batch(data.x_train, data.y_train, seed=cfg.seed)
    np.savez(folder / "batch.npz", x=x, y=y, kernel=weights[0], bias=weights[1])
    init = [w.tolist() for w in initial_weights(data, cfg.seed)]
    for engine in engines:
        if not engine_installed(engine):
            outcome.failed[engine] = f"{engine} is not installed; `make setup` installs every engine"
    workers = {e: Worker(e, outcome.engine_folder(e)) for e in outcome.complete}
    try:
        base = {"data": str(data_file), "config": cfg.__dict__}
        _each(workers, outcome, lambda e: ("train", {**base, "init_weights": init}), on_event, jobs)
        _each(workers, outcome, lambda e: ("gradients", {"batch": str(folder / "batch.npz"), "float64": float64}),
              on_event, jobs)
        h5 = {p.stem.removesuffix(".weights"): str(p) for e in outcome.complete
              for p in outcome.engine_folder(e).glob("*.weights.h5")}
        _each(workers, outcome, lambda e: ("cross_predict", {"data": str(data_file), "weights": h5}), on_event, jobs)
    finally:
        for worker in workers.values():
            worker.close()
    return outcome


def initial_weights(data: HarData, seed: int) -> list[np.ndarray]:
    """The same-arithmetic run's starting point: Glorot-uniform kernel and zero bias drawn by NumPy."""
    rng = np.random.default_rng(seed + 1)
    k = data.x_train.shape[1]
    limit = np.sqrt(6.0 / (k + 1))
    return [rng.uniform(-limit, limit, size=(k, 1)).astype(np.float32), np.zeros(1, np.float32)]
