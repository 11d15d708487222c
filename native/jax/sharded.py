"""The JAX loop data-parallel: the batch axis sharded over devices with `jax.sharding`, the same jitted step.

    weights = sharded.train(build, data, cfg)                 # every device JAX sees: local ones, or, after
                                                              # jax.distributed.initialize(), every process's
    python -m native.jax.sharded --processes 2 --data data.npz --out weights.npz   # several processes on this host

The weights and the optimizer state are replicated; each global batch (the batch `fit` would take) is split along
its rows over a one-axis mesh, and `jax.jit` compiles the step of `native.jax.loop` for those shardings: XLA adds
the all-reduce that the batch mean needs. The code does not change between one process with several devices and
several processes (`jax.distributed`): every array is built with `jax.make_array_from_callback`, each process
filling only the shards its own devices hold. A global batch whose rows do not split evenly over the devices (the
short last one) is replicated instead: every device computes it whole, the same numbers.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from keras_side import cores
from keras_side.arrays import keras_inputs, take
from keras_side.backend import keras_defaults
from keras_side.checks import check_data
from keras_side.data import HarData, batch_slices, numpy_orders
from keras_side.files import save_npz
from keras_side.losses import training_loss
from keras_side.models import ensure_built
from keras_side.process import exit_reason, is_stopped, with_parent
from keras_side.results import save_trained
from keras_side.spec import SpecError, TrainConfig, data_parallel_config
from native import driver, preflight
from native.jax import convolution, loop, optim

# Our watchdogs' bounds are limits, named as compare's runner names its own (`QUIET_LIMIT_S`, `STARTUP_LIMIT_S`); an
# engine's own bound keeps the engine's word (JAX's `initialization_timeout`, torch's process-group `timeout`).
# jax.distributed's coordinator waits this long for every process to join; a process that dies later is seen by
# the launcher (it ends), one that hangs is not: a gloo collective in jax 0.10.2 waits for it forever. So the
# launcher watches each process's finished steps and stops the run when none finishes one for QUIET_LIMIT_S
# (NATIVE_LOOPS_COLLECTIVE_TIMEOUT_S, as torch's process-group timeout), counting only once a first step has
# finished (before it, imports and compiles are start-up, bounded by STARTUP_LIMIT_S).
JOIN_TIMEOUT_S = 60
QUIET_LIMIT_S = 60
STARTUP_LIMIT_S = 900
# The walk-forward is one compiled call that reports no steps: a bound on the whole run instead (it takes seconds).
WALK_FORWARD_LIMIT_S = 3600


def put(array, sharding: NamedSharding) -> jax.Array:
    """A global array from a value every process holds whole: each process fills the shards of its own devices."""
    host = np.asarray(array)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def train(build, data: HarData, cfg: TrainConfig, *, devices=None, on_step=None) -> list[np.ndarray]:
    """The native loop's step on the model `build()` makes, over a mesh of `devices` (default: every device of every
    process); returns the trained weights, the same on every process. The batch order is the shared NumPy one, so
    every process cuts the same global batches. `on_step(loss)`, if given, runs after each step is dispatched (the
    launcher's progress). The epochs are the driver's (`native.driver.run`), the step the reference loop's
    (`loop.make_step`), compiled for the mesh (`MeshSteps`)."""
    if data.w_train is not None:
        raise SpecError("the data-parallel loop takes no sample weights; train without them")
    model = ensure_built(build(), data.x_train)
    check_data(cfg, data, model)  # as the one-process loop: JAX would train on such labels without a word
    engine = MeshSteps(model, data, cfg, list(devices or jax.devices()))
    with convolution.as_matmuls():  # the step traced inside: a 1-D convolution as a matmul, as the fast paths do
        driver.run(engine, cfg, on_step=on_step)
    local = jax.tree.map(lambda a: np.asarray(a.addressable_data(0)), engine.state)  # this process's replica
    loop.write_back(model, local)
    return model.get_weights()


class MeshSteps(driver.Engine):
    """Global batches over a one-axis mesh, for `driver.run`: the weights and the optimizer state replicated, each
    batch's rows split over the devices (replicated when they do not split evenly), the reference loop's step."""

    def __init__(self, model, data: HarData, cfg: TrainConfig, devices: list):
        self.model, self.data, self.cfg, self.devices = model, data, cfg, devices
        mesh = Mesh(np.asarray(devices), ("batch",))
        self.replicated = NamedSharding(mesh, PartitionSpec())
        self.by_rows = NamedSharding(mesh, PartitionSpec("batch"))
        optimizer = optim.build(cfg)
        self.jitted = loop.make_step(model, training_loss(cfg), optimizer)
        self.state = jax.tree.map(lambda a: put(a, self.replicated), loop.init_state(model, optimizer))
        self.orders = numpy_orders(cfg.seed, data.n_train, cfg.epochs)

    def batches(self, epoch: int):
        for rows in batch_slices(self.data.n_train, self.cfg.batch_size):
            idx = self.orders[epoch][rows]
            sharding = self.by_rows if len(idx) % len(self.devices) == 0 else self.replicated
            yield jax.tree.map(lambda a: put(a, sharding), (keras_inputs(take(self.data.x_train, idx)),
                                                            keras_inputs(take(self.data.y_train, idx))))

    def step(self, batch):
        self.state, loss = self.jitted(self.state, batch)
        return loss

    def epoch_loss(self, losses: list, rows: list[int]) -> float:
        """The mean over the rows; each loss is replicated, so this process's copy (its whole value may live on
        other processes' devices too, where `float` would refuse it)."""
        return float(np.average([np.asarray(loss.addressable_data(0)) for loss in losses], weights=rows))


def fit_train(build, data: HarData, cfg: TrainConfig, *, devices=None) -> list[np.ndarray]:
    """`fit` itself, the Keras way: under `keras.distribution.DataParallel`, Keras shards every batch over the
    devices. Keras 3.15.1 shards each batch evenly or not at all (a jax IndivisibleError): every batch of training,
    validation and the final predictions must split over the devices, which is checked here first. With one
    device, plain `fit`."""
    from contextlib import nullcontext

    import keras

    from keras_side import fit

    devices = list(devices or jax.devices())
    sizes = {"training": [r.stop - r.start for r in batch_slices(data.n_train, cfg.batch_size)],
             "test": [data.n_test]} | ({"validation": [data.n_val]} if cfg.validate else {})
    for split, batches in sizes.items():
        odd = [b for b in batches if b % len(devices)]
        if odd:
            raise SpecError(f"keras.distribution.DataParallel shards every batch evenly over the {len(devices)} "
                            f"devices, and a {split} batch of {odd[0]} rows does not split; choose rows and a batch "
                            "size that do, or the native sharded loop (sharded.train), which replicates such a batch")
    with keras.distribution.DataParallel(devices=devices).scope() if len(devices) > 1 else nullcontext():
        model = ensure_built(build(), data.x_train)
        fit.train(model, data, cfg)
    return model.get_weights()


PROG = "python -m native.jax.sharded"


def _process(args) -> int:
    """One process of a `--processes N` run: join the others, train, and (process 0) write the weights. A failure
    ends the process at once, with its traceback (a spec the loop refuses: one line, exit 2): `jax.distributed`'s
    shutdown would wait for the others first."""
    try:
        cores.pin_launched(args.process_id)  # its own core, where the launcher names them
        return _work(args)
    except SpecError as err:  # what only training finds (labels the loss cannot take): a line, as a usage error
        preflight.one_line(f"{PROG} (process {args.process_id})", err)
        sys.stderr.flush()
        os._exit(2)
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)


def _work(args) -> int:
    from keras_side.determinism import seed_everything
    from keras_side.spec import resolve

    keras_defaults()  # from Keras's defaults, whatever a user's keras.json sets (floatx...), as compare's workers
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(args.coordinator, num_processes=args.processes, process_id=args.process_id,
                               initialization_timeout=JOIN_TIMEOUT_S)
    cfg = data_parallel_config(args.config)
    if args.walk_forward:  # every walk-forward model, the model axis sharded over every process's device
        from keras_side import models
        from native.jax import many

        with np.load(args.data) as z:
            windows = dict(z)
        pred, seconds, _ = many.forecasts(models.har, windows, cfg)
        cpus = _every_process_cores()
        if jax.process_index() == 0:
            save_npz(args.out, seconds=seconds, forecasts=pred, cpus=json.dumps(cpus))
        jax.distributed.shutdown()
        return 0
    data = HarData.load(Path(args.data))
    seed_everything(cfg.seed)
    model = ensure_built(resolve(args.build)(), data.x_train)  # built before the clock
    start = time.perf_counter()
    weights = train(lambda: model, data, cfg, on_step=_progress(args.progress) if args.progress else None)
    seconds = time.perf_counter() - start  # training (and its compiles) only: not the launch or the join
    cpus = _every_process_cores()
    if jax.process_index() == 0:
        save_trained(args.out, weights, seconds, cpus, seed=cfg.seed)
    jax.distributed.shutdown()
    return 0


def _every_process_cores() -> list[list[int]] | None:
    """The cores each process's threads may use now, one list per process, gathered from every process (collectives:
    each calls them); None where the system does not say (in every process alike). Padded with -1 to the longest
    list, as a gather takes one shape from every process."""
    from jax.experimental import multihost_utils

    mine = cores.cores_in_use()
    if mine is None:
        return None
    longest = int(np.max(multihost_utils.process_allgather(np.array([len(mine)], np.int32))))
    padded = np.full(longest, -1, np.int32)
    padded[:len(mine)] = mine
    return [[int(c) for c in row if c >= 0] for row in np.asarray(multihost_utils.process_allgather(padded))]


def _progress(path: str):
    """An `on_step` that writes how many steps have finished: what the launcher watches. It waits for the step
    before the one just dispatched, so one step is always in flight, as in the one-process loop it is timed against."""
    fd, done, previous = os.open(path, os.O_WRONLY | os.O_CREAT), [0], [None]

    def on_step(loss):
        if previous[0] is not None:
            jax.block_until_ready(previous[0])  # the step that computed it has run
            done[0] += 1
            os.pwrite(fd, b"%20d" % done[0], 0)
        previous[0] = loss
    return on_step


def _steps(path: Path) -> int:
    try:
        return int(path.read_bytes() or 0)
    except (OSError, ValueError):  # not written yet
        return 0


def _fit(args, cfg: TrainConfig, data: HarData) -> int:
    """`fit` under DataParallel over this process's devices (one: plain fit); the weights and seconds to --out.
    With --devices, exactly that many or an error: a run that sees one device would be plain fit, passing a
    data-parallel check that tested nothing."""
    from keras_side.determinism import seed_everything
    from keras_side.spec import resolve

    cores.pin_launched()  # every core the launcher names: this one process runs every device
    keras_defaults()  # from Keras's defaults, whatever a user's keras.json sets (floatx...), as compare's workers
    if args.devices is not None and len(jax.devices()) != args.devices:
        raise preflight.LaunchError(
            f"asked for fit over {args.devices} devices, and JAX sees {len(jax.devices())} "
            f"({jax.devices()[0].platform}); on CPU set XLA_FLAGS=--xla_force_host_platform_device_count"
            f"={args.devices} before JAX starts")

    seed_everything(cfg.seed)
    start = time.perf_counter()
    weights = fit_train(resolve(args.build), data, cfg)
    save_trained(args.out, weights, time.perf_counter() - start, [cores.cores_in_use()], seed=cfg.seed)
    return 0


def launch(processes: int, data: Path, out: Path, config: dict, build: str = "keras_side.models:har", *,
           walk_forward: bool = False, port: int | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    """Start `processes` Python processes on this host, one CPU device each, joined by jax.distributed; wait for all.
    The first that fails stops the others at once (they would wait for it in a collective until the timeout), and
    its result is returned (else process 0's, with every process's stderr). A run in which no process finishes a
    step for QUIET_LIMIT_S (a process hangs, the others wait for it) is stopped whole, exit 124, the last line
    of its stderr saying so; the walk-forward, which reports no steps, at WALK_FORWARD_LIMIT_S. A spec that a
    process refuses (exit 2, one line) is that line alone, exit 2."""
    port = port or preflight.free_port()
    env = {**os.environ, "KERAS_BACKEND": "jax", **(env or {})}
    quiet_limit = float(env.get("NATIVE_LOOPS_COLLECTIVE_TIMEOUT_S", QUIET_LIMIT_S))
    env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split()
                                if "xla_force_host_platform_device_count" not in f)  # one device per process
    common = ["--coordinator", f"127.0.0.1:{port}", "--processes", str(processes), "--data", str(data), "--out",
              str(out), "--config", json.dumps(config), "--build", build, *(["--walk-forward"] if walk_forward else [])]
    with tempfile.TemporaryDirectory(prefix="jax-processes-") as logs:
        logs, procs, quiet, stopped = Path(logs), [], None, set()
        steps = [logs / f"{i}.steps" for i in range(processes)]
        try:
            for i in range(processes):
                with open(logs / f"{i}.log", "w") as log:  # a file, not a pipe: nothing blocks on a full one
                    procs.append(subprocess.Popen(with_parent([sys.executable, "-m", "native.jax.sharded", *common,
                                                               "--process-id", str(i), "--progress", str(steps[i])]),
                                                  env=env, stdout=log, stderr=log))
            failed, seen, since = None, None, time.monotonic()
            started = since
            while failed is None and quiet is None and any(p.poll() is None for p in procs):
                failed = next((p for p in procs if p.poll() not in (None, 0)), None)
                now = [_steps(s) for s in steps]
                if now != seen:
                    seen, since = now, time.monotonic()
                limit = quiet_limit if any(now) else STARTUP_LIMIT_S
                if walk_forward and time.monotonic() - started > WALK_FORWARD_LIMIT_S:
                    quiet = (f"the walk-forward ran past {WALK_FORWARD_LIMIT_S} s: a process hangs, or waits in "
                             f"a collective for one that does; stopped all {processes}")
                elif time.monotonic() - since > limit and not walk_forward:
                    hung = [i for i, p in enumerate(procs) if is_stopped(p.pid)]  # where the system can tell
                    which = (f"process {', '.join(map(str, hung))} is stopped (SIGSTOP), and the others wait for it"
                             if hung else "a process hangs, or waits in a collective for one that does")
                    quiet = (f"no process finished a step for {limit:g} s (steps finished: "
                             f"{', '.join(f'process {i}: {n}' for i, n in enumerate(now))}): {which}; stopped all "
                             f"{processes}")
                time.sleep(0.1)  # polling for events (a process ending, a step finishing)
            failed = failed or next((p for p in procs if p.returncode not in (None, 0)), None)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    stopped.add(proc.pid)
                    proc.kill()
                proc.wait()
        chosen = failed or procs[0]
        # A spec every process refuses alike (exit 2): the first refusal's line, once. The others end with it, or are
        # aborted when process 0 takes the coordinator with it; what they printed then says nothing more.
        refused = next((i for i, p in enumerate(procs) if p.returncode == 2), None)
        if refused is not None:
            return subprocess.CompletedProcess(chosen.args, 2, "", (logs / f"{refused}.log").read_text())
        text = "".join(f"--- process {i} (exit {p.returncode})\n" + (logs / f"{i}.log").read_text()
                       for i, p in enumerate(procs))
        if quiet:
            return subprocess.CompletedProcess(chosen.args, 124, "", f"{text}\njax.distributed: {quiet}\n")
        if failed:  # which ended first is not known within a poll: a peer's collective fails as soon as it dies
            ended = [f"process {i}: {exit_reason(p.returncode)}" for i, p in enumerate(procs)
                     if p.returncode and p.pid not in stopped]
            text += f"\njax.distributed: {len(ended)} of {processes} failed ({', '.join(ended)}); stopped the rest\n"
        return subprocess.CompletedProcess(chosen.args, chosen.returncode, "", text)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=2, help="processes on this host (default: %(default)s)")
    parser.add_argument("--process-id", type=int, default=None, help="(set by the launcher) this process's index")
    parser.add_argument("--coordinator", default=None, help="(set by the launcher) host:port of process 0")
    parser.add_argument("--progress", default=None, help="(set by the launcher) where to count finished steps")
    parser.add_argument("--data", required=True, help="a HarData .npz (HarData.save)")
    parser.add_argument("--config", default="{}", help="TrainConfig fields as JSON")
    parser.add_argument("--build", default="keras_side.models:har", help="the model builder, module:function")
    parser.add_argument("--out", required=True, help="where process 0 writes the trained weights (.npz)")
    parser.add_argument("--walk-forward", action="store_true", help="--data is the walk-forward's windows (x, y, "
                        "rows, x_next): train every model, the model axis over the processes; --out gets forecasts")
    parser.add_argument("--fit", action="store_true", help="model.fit under keras.distribution.DataParallel over "
                        "this one process's devices instead (XLA_FLAGS=--xla_force_host_platform_device_count=N)")
    parser.add_argument("--devices", type=int, default=None, help="with --fit: the devices JAX must see")
    args = parser.parse_args(argv)
    if args.process_id is None or args.fit:  # what the user gave, before a process starts (each is given it checked)
        try:
            if args.fit and args.walk_forward:
                raise preflight.LaunchError("--fit trains one model with model.fit, and the walk-forward's models "
                                            "train with --processes; drop --fit or --walk-forward")
            cfg, data = preflight.launch_args(args, count=None if args.fit else args.processes,
                                              windows=args.walk_forward, fit=args.fit)
        except preflight.LaunchError as err:
            return preflight.one_line(parser.prog, err)
    if args.fit:
        try:
            return _fit(args, cfg, data)
        except (SpecError, preflight.LaunchError) as err:  # what only training finds: batches that do not split
            return preflight.one_line(parser.prog, err)  # over the devices, fewer devices than --devices...
    if args.process_id is not None:
        return _process(args)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))  # launch's cleanup stops the processes
    result = launch(args.processes, Path(args.data), Path(args.out), json.loads(args.config), args.build,
                    walk_forward=args.walk_forward)
    sys.stderr.write(result.stderr[-3000:] if result.returncode else "")
    return result.returncode


if __name__ == "__main__":
    raise SystemExit(main())
