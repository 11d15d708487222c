"""`native-loops distributed`: each engine's data-parallel native loop in N processes against its one-process loop, on
the same global batches: the weights they end at, and the throughput of each.

    found = distributed.run(data, cfg, ["torch", "jax"], processes=2, folder=tmp)

torch: `native/torch/ddp.py` (DistributedDataParallel, launched by torchrun); JAX: `native/jax/sharded.py` (the
batch axis sharded over one device per process, joined by jax.distributed); TensorFlow:
`native/tensorflow/mirrored.py` (MirroredStrategy, N replicas on N logical CPUs of one process). The one-process run
is the engine's plain native loop (`native/<engine>/loop.py`) in a worker. A check `data_parallel/<engine>` passes
when every weight is within DATA_PARALLEL_ATOL of the one-process run's. Where Keras has a distribution API of its
own (JAX's `keras.distribution.DataParallel`, TensorFlow's strategies; none for torch in Keras 3.15.1), `fit` under
it over N devices against plain `fit` (in the worker of the one-process run) too: `data_parallel/keras-<engine>`, on
training rows cut to whole batches (Keras shards a batch evenly or, on JAX, not at all; TensorFlow weighs an uneven
one otherwise: docs/distributed.md). Throughput is training samples per second of training (the launch, the imports
and the join not counted; compiles counted, in both), measured in this run, never asserted. Every run asks for one
thread a process or device, as the pool's workers do (torch by `seed_everything`, JAX by its XLA flags, TensorFlow's
replicas one thread each by `mirrored.use_cpus`), and is pinned, since JAX's flags hold only Eigen and its runtime
takes a second core where it can (docs/dev-notes.md): process i of a launch on a core of its own, a process of N devices
on N cores, the one-process run on one of them (`launch_cpus`, `keras_side.cores`), so a ratio is one core against
one a process.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from compare.engines import runner
from compare.referee.tolerances import DATA_PARALLEL_ATOL, SHARDED_ATOL
from keras_side import cores
from keras_side.backend import engine_environment
from keras_side.data import HarData, whole_batches
from keras_side.process import exit_reason, with_parent
from keras_side.results import load_trained, trained_cpus, versions
from keras_side.spec import DATA_PARALLEL, TrainConfig, data_parallel_config
from native.torch.launch import torchrun_command

# The zoo's models that data parallelism can train as one process does (docs/distributed.md), on every engine: BatchNorm
# takes the global batch's moments (synchronized); a seeded Dropout's mask is the global batch's, each rank or replica
# applying its rows of it (JAX's sharded step; torch's `compiled.Draws`; TensorFlow's `mirrored.rows_of_global_batch`). Not
# har_recent: the data-parallel loops take no sample weights.
MODELS = ("har", "mlp_l2", "bn_mlp", "lstm", "conv1d", "two_horizons", "classifier", "panel", "dropout_mlp")
# A zoo model's default epochs (the HAR's is the spec's 40). Measured: every check of the LSTM and the Conv1D within
# DATA_PARALLEL_ATOL after 10 epochs (at most 8.6e-7), every other model's after 40. Past 10, the LSTM's fit under
# DataParallel (by 20 epochs) and the Conv1D on torch (by 30) amplify float rounding past the tolerance, as far as a
# one-process run started one ulp away drifts from itself (docs/distributed.md, "Long runs").
ZOO_EPOCHS = 10


STOP_WAIT_S = 30  # how long a stopped launcher may take to stop its own processes before they are killed
RUNTIMES = {"torch": "DDP, N procs", "jax": "jax.distributed, N procs", "tensorflow": "Mirrored, N replicas"}
FIT_RUNTIMES = {"jax": "fit in DataParallel", "tensorflow": "fit in Mirrored"}  # N devices of one process
ONE_PROCESS = ("tensorflow", "keras-jax", "keras-tensorflow")  # the checks whose N-device run is one process
RUN_NAMES = {"one": "one-process", "many": "N-process"}


def _launch(engine: str, processes: int, data: Path, out: Path, config: dict, build: str, *extra: str,
            fit: bool = False):
    """The engine's own launcher as a command, so that this process never imports Keras (its backend is fixed at
    the first import): torchrun for torch, `python -m native.jax.sharded --processes N` for JAX. With `fit`, `fit`
    under Keras's distribution over `processes` devices of one process (JAX: as many host devices). Pinned where it
    can be (`launch_cpus`): process i computes on the i-th core, a process that runs every device on all of them."""
    args = ["--data", str(data), "--out", str(out), "--config", json.dumps(config), "--build", build, *extra]
    env = engine_environment(engine) | {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    env.pop(cores.CPUS_VARIABLE, None)  # a variable of the caller's would pin a run that the report says is not
    cpus = launch_cpus(processes)
    if cpus:
        env[cores.CPUS_VARIABLE] = ",".join(map(str, cpus))
    if engine == "torch":
        command = torchrun_command(processes, *args)
    elif engine == "jax" and fit:
        command = [sys.executable, "-m", "native.jax.sharded", "--fit", "--devices", str(processes), *args]
        env["XLA_FLAGS"] = runner.xla_flags(f"--xla_force_host_platform_device_count={processes}")
    elif engine == "jax":
        command = [sys.executable, "-m", "native.jax.sharded", "--processes", str(processes), *args]
        env["XLA_FLAGS"] = runner.xla_flags()
    else:  # one process, `processes` replicas on as many logical CPUs
        command = [sys.executable, "-m", "native.tensorflow.mirrored", "--replicas", str(processes), *args,
                   *(["--fit"] if fit else [])]
    return _run(command, env, out.parent / f"{out.stem}.log")


def launch_cpus(processes: int) -> list[int] | None:
    """The cores of a run over `processes` processes or devices, one each: the last `processes` this process may use
    (`cores.timing_cpus`). The one-process run takes the last of them. None, and nothing pinned, where the system
    cannot pin or has fewer cores."""
    usable = cores.timing_cpus()
    return usable[-processes:] if usable and len(usable) >= processes else None


def _run(command: list[str], env: dict, log: Path) -> subprocess.CompletedProcess:
    """Run a launcher in a session of its own and wait for it; interrupted (Ctrl-C, SIGTERM), stop it and every
    process it started before going on: SIGTERM first (torchrun then stops its ranks, which it starts in sessions of
    their own), then SIGKILL to whatever is left in its group (the JAX launcher's processes)."""
    with open(log, "w") as output:  # a file, not a pipe: a chatty launcher never blocks on a full one
        proc = subprocess.Popen(with_parent(command), env=env, stdout=output, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            proc.wait()
        except BaseException:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
            raise
    return subprocess.CompletedProcess(command, proc.returncode, "", log.read_text())


def run(data: HarData, cfg: TrainConfig, engines: list[str], *, processes: int, folder: Path,
        build: str = "keras_side.models:har", windows: dict | None = None, fit: bool = True,
        on_event=lambda engine, event: None) -> dict:
    """Every engine once in one process and once in `processes`; with `windows` (the walk-forward's model inputs:
    x, y, rows, x_next), JAX's walk-forward too, its model axis over `processes` processes against the JAX worker's
    one device. The JSON of `distributed.json`."""
    cfg = cfg.replace(**DATA_PARALLEL)  # the same global batches everywhere
    data.save(folder / "data.npz")
    config = {k: v for k, v in cfg.to_dict().items()}
    found, incomplete, notes = {}, {}, []
    cpus = launch_cpus(processes)
    one_cpu = cpus[-1:] if cpus else None  # every one-process run's
    if cpus is None:
        why = f"has fewer than {processes} cores" if cores.timing_cpus() else "cannot pin a process to a core"
        notes.append(f"not pinned: this machine {why}, so a process may take more than one core and the throughput "
                     "ratios are not one core against one a process")
    elif len({cores.physical_core(c) for c in cpus}) < processes:
        notes.append(f"CPUs {', '.join(map(str, cpus))} are fewer physical cores than {processes} (SMT): processes "
                     "share a core's units, so the throughput ratios are not one core against one a process")
    fits = fit_engines(engines, cfg, processes, notes) if fit else []
    if fits:  # Keras's sharded fit takes whole batches only: both sides train on the rows that make them
        whole_batches(data, cfg.batch_size, processes).save(folder / "whole.npz")
    with runner.Pool(engines, folder, jobs=1) as pool:  # one request at a time: each timing has the machine
        pool.started()  # no worker's start-up shares a timed core
        request = {"data": str(folder / "data.npz"), "config": config, "build": build, "cpus": one_cpu}
        pool.each("native_weights", lambda e: {**request, "weights": str(folder / f"{e}-worker.npz")}, on_event)
        incomplete |= pool.failed
        # plain fit on one device, the baseline of fit under Keras's distribution, by the worker already running
        failed = pool.each("native_weights", lambda e: {**request, "data": str(folder / "whole.npz"), "fit": True,
                                                        "weights": str(folder / f"keras-{e}-worker.npz")},
                           on_event, only=[e for e in fits if e not in incomplete], fail_engines=False)
        incomplete |= {f"keras-{e}": f"fit on 1 device: {message}; output: engines/{e}/worker.log in the run folder"
                       for e, message in failed.items()}
        fits = [e for e in fits if e not in incomplete and f"keras-{e}" not in incomplete]  # each with its baseline
        samples = cfg.epochs * data.n_train
        for engine in [e for e in engines if e not in incomplete]:
            row = _native_check(engine, processes, folder, config, build, cfg, samples, incomplete, on_event)
            if row is not None:
                found[engine] = row
        if fits:
            found |= _fit_checks(cfg, fits, processes, folder, config, build, incomplete, on_event)
        _measure_rounding(pool, found, request, folder, on_event)
        one = _walk_forward_one(pool, windows, cfg, folder, incomplete, one_cpu) \
            if windows is not None and "jax" in engines and "jax" not in incomplete else None
    if one is not None:
        found["walk-forward"] = _walk_forward(one, windows, cfg, processes, folder, incomplete)
        if found["walk-forward"] is None:
            del found["walk-forward"]
    if cpus:
        notes += _off_their_cores(found, cpus)
    return {"processes": processes, "cpus": cpus, "engines": found, "incomplete": incomplete, "notes": notes,
            "build": build, "config": json.loads(json.dumps(config)), "seed": cfg.seed, "samples": samples,
            "versions": versions()}


def _native_check(engine: str, processes: int, folder: Path, config: dict, build: str, cfg: TrainConfig,
                  samples: int, incomplete: dict, on_event) -> dict | None:
    """The engine's native loop launched in `processes` processes against its one-process run (the worker's, in
    `<engine>-worker.npz`); None, and the reason in `incomplete`, when the launch fails."""
    def say(done: int) -> None:
        on_event(engine, {"event": "progress", "path": f"{processes} processes", "stage": "train", "epoch": done,
                          "epochs": cfg.epochs})

    say(0)
    start = time.perf_counter()
    launched = _launch(engine, processes, folder / "data.npz", folder / f"{engine}-{processes}.npz", config, build)
    wall = time.perf_counter() - start
    say(cfg.epochs if launched.returncode == 0 else 0)
    if launched.returncode != 0:
        incomplete[engine] = _failure(launched, f"{processes} processes", f"{engine}-{processes}.log")
        return None
    return _row(engine, RUNTIMES[engine], folder, processes, samples) | {"launch_seconds": wall}


def _measure_rounding(pool: runner.Pool, found: dict, request: dict, folder: Path, on_event) -> None:
    """For each check over its tolerance, what rounding alone does: the same one-process run again from one ulp away
    (the worker's `nudge`), its gap to the run (`drift`). A model that amplifies float rounding (a ReLU that flips for
    a sample, a recurrence) can carry a one-ulp difference past the tolerance within a long run: measured on
    `conv1d`, 3.6e-7 after 20 epochs and 1.5e-3 after 40, as far as torch's two processes end from one. Then the
    horizon cannot tell a bug from rounding, and the report says so and that fewer epochs can. The check still fails:
    past that horizon a real bug would end as far, so nothing here excuses a gap."""
    for name, row in found.items():
        engine = name.removeprefix("keras-")
        if row["passed"] or engine not in pool.live:
            continue
        nudged = folder / f"{name}-worker-nudged.npz"
        asked = {**request, "nudge": True, "weights": str(nudged)}
        if name != engine:  # fit's baseline: plain fit on the whole batches
            asked |= {"data": str(folder / "whole.npz"), "fit": True}
        if not pool.each("native_weights", lambda e: asked, on_event, only=[engine], fail_engines=False):
            row["drift"] = _gap(load_trained(folder / f"{name}-worker.npz")[0], load_trained(nudged)[0])


def fit_engines(engines: list[str], cfg: TrainConfig, processes: int, notes: list) -> list[str]:
    """The engines whose `fit` runs under a distribution of Keras's own; none, with a note, over one device (plain
    fit against itself) or when a batch does not split evenly over the devices (Keras shards every batch evenly)."""
    if processes == 1:
        notes.append("fit under Keras's distribution not checked: over 1 device it is plain fit, its own baseline")
        return []
    if cfg.batch_size % processes:
        notes.append(f"fit under Keras's distribution not checked: Keras shards every batch evenly, and a batch of "
                     f"{cfg.batch_size} rows does not split over {processes} devices")
        return []
    return [e for e in engines if e in FIT_RUNTIMES]


def _fit_checks(cfg: TrainConfig, engines: list[str], processes: int, folder: Path, config: dict, build: str,
                incomplete: dict, on_event) -> dict:
    """`fit` under Keras's distribution over `processes` devices against plain `fit` (the worker's, already in
    `keras-<engine>-worker.npz`), per engine, on the whole batches of `whole.npz`."""
    whole, found = HarData.load(folder / "whole.npz"), {}
    samples = cfg.epochs * whole.n_train
    for engine in engines:
        out = folder / f"keras-{engine}-{processes}.npz"
        on_event(engine, {"event": "progress", "path": f"fit, {processes} devices", "stage": "train", "epoch": 0,
                          "epochs": cfg.epochs})
        launched = _launch(engine, processes, folder / "whole.npz", out, config, build, fit=True)
        if launched.returncode != 0:
            incomplete[f"keras-{engine}"] = _failure(launched, f"fit on {processes} devices", f"{out.stem}.log")
            continue
        on_event(engine, {"event": "progress", "path": f"fit, {processes} devices", "stage": "train",
                          "epoch": cfg.epochs, "epochs": cfg.epochs})
        found[f"keras-{engine}"] = (_row(f"keras-{engine}", FIT_RUNTIMES[engine], folder, processes, samples)
                                    | {"training_rows": whole.n_train})
    return found


def _row(name: str, runtime: str, folder: Path, processes: int, samples: int) -> dict:
    """A check: the weights of the launch's `<name>-<processes>.npz` against the worker's one-process run,
    `<name>-worker.npz` (apart, so that a one-process launch does not overwrite it), within DATA_PARALLEL_ATOL, and
    the throughput of each, and the cores each process could compute on (its threads' affinity, one list per
    process)."""
    files = {"one": folder / f"{name}-worker.npz", "many": folder / f"{name}-{processes}.npz"}
    (one, one_seconds), (many, many_seconds) = (load_trained(f) for f in files.values())
    gap = _gap(one, many)
    return {"check": f"data_parallel/{name}", "runtime": runtime, "gap": gap, "tolerance": DATA_PARALLEL_ATOL,
            "passed": gap <= DATA_PARALLEL_ATOL, "seconds": {"one": one_seconds, "many": many_seconds},
            "samples_per_s": {"one": samples / one_seconds, "many": samples / many_seconds},
            "cpus": {run: trained_cpus(f) for run, f in files.items()}}


def _off_their_cores(found: dict, cpus: list[int]) -> list[str]:
    """A note for each check whose runs could compute elsewhere than on the cores they were given (a cpuset, an
    OpenMP runtime that binds its own threads): process i of a launch on the i-th of `cpus`, a process of every
    device on all of them, the one-process run on the last."""
    notes = []
    for name, row in found.items():
        given = {"one": [cpus[-1:]], "many": [sorted(cpus)] if name in ONE_PROCESS else [[c] for c in cpus]}
        notes += [f"{row['check']}: its {RUN_NAMES[run]} run could compute on CPUs {row['cpus'][run]} (one list per "
                  f"process), not {given[run]}: its throughput is not one core a process" for run in given
                  if row["cpus"][run] != given[run]]
    return notes


def _walk_config(cfg: TrainConfig) -> dict:
    """The walk-forward's fields of the spec (its trainer reads no others): what its launch is given."""
    return {"epochs": cfg.epochs, "seed": cfg.seed, "batch_size": cfg.batch_size, "learning_rate": cfg.learning_rate}


def _walk_forward_one(pool: runner.Pool, windows: dict, cfg: TrainConfig, folder: Path, incomplete: dict,
                      cpus: list[int] | None = None) -> tuple[np.ndarray, float, list[int] | None] | None:
    """Every walk-forward model trained at once by the JAX worker already running, on its one device (on `cpus`):
    the reference of the launch over processes, (forecasts, seconds, the cores it could compute on); None, and the
    reason in `incomplete`, when it fails. The launch's spec, as its launcher reads it."""
    if "jax" not in pool.live:  # its worker stopped on an earlier request
        reason = pool.failed.get("jax", "no reason given")
        incomplete["walk-forward"] = f"1 process: the JAX worker had stopped before it ({reason})"
        return None
    np.savez(folder / "windows.npz", **{k: windows[k] for k in ("x", "y", "rows", "x_next")})
    spec, answer = data_parallel_config(_walk_config(cfg)), {}
    failed = pool.each("compare.speed.tasks:walk_forward", lambda e: {"windows": str(folder / "windows.npz"), "config": spec.to_dict(),
                                                  "devices": [1], "fit_models": [], "repeats": 1,  # as the launch
                                                  "cpus": cpus},
                       lambda e, event: answer.update(event) if event["event"] == "done" else None, only=["jax"],
                       fail_engines=False)
    if failed:
        incomplete["walk-forward"] = (f"1 process failed: {failed['jax']}; output: engines/jax/worker.log in the run "
                                      "folder")
        return None
    timed = answer["timings"]["jax-vmap-1dev"]
    return np.load(pool.engine_folder("jax") / "walk-forward-jax-vmap-1dev.npy"), timed["seconds"], [timed["cpus"]]


def _walk_forward(one: tuple, windows: dict, cfg: TrainConfig, processes: int, folder: Path,
                  incomplete: dict) -> dict | None:
    """Every walk-forward model trained at once with the model axis split over `processes` JAX processes, against
    `one` (`_walk_forward_one`): the same forecasts, each model's own arithmetic, to a few ulps (`SHARDED_ATOL`:
    XLA's kernels may sum a dot otherwise for fewer models a device), and models per second of each."""
    out = folder / "walk-forward-many.npz"
    launched = _launch("jax", processes, folder / "windows.npz", out, _walk_config(cfg), "keras_side.models:har",
                       "--walk-forward")
    if launched.returncode != 0:
        incomplete["walk-forward"] = _failure(launched, f"{processes} processes", f"{out.stem}.log")
        return None
    with np.load(out) as z:
        forecasts, seconds = z["forecasts"], float(z["seconds"])
    many = (forecasts, seconds, trained_cpus(out))
    found = {"one": one, "many": many}
    models = int((windows["rows"] > 0).sum())
    gap = _gap([one[0]], [many[0]])
    return {"check": "data_parallel/walk-forward", "runtime": "jax.distributed, N procs",
            "gap": gap, "tolerance": SHARDED_ATOL, "passed": gap <= SHARDED_ATOL,
            "seconds": {run: s for run, (_, s, _) in found.items()},
            "samples_per_s": {run: models / s for run, (_, s, _) in found.items()}, "unit": "models/s",
            "cpus": {run: c for run, (_, _, c) in found.items()}}


def _failure(launched: subprocess.CompletedProcess, what: str, log: str) -> str:
    """One line for a launch that failed: which ranks (processes) failed and how, from torchrun's summary (its
    "first observed" failure is by timestamps in whole seconds, so a rank whose collective broke can tie with the
    rank that died: every failure is listed, not those torchrun stopped with SIGTERM) or the last line of the JAX
    and TensorFlow launchers (theirs say it), and the log the run folder keeps."""
    text = launched.stderr
    summary = text[text.find("Root Cause (first observed failure):"):] if "Root Cause (first" in text else ""
    summary += text[text.find("Failures:"):text.find("Root Cause (first")] if "Failures:" in text else ""
    ranks = re.findall(r"rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", summary, re.S)
    failed = dict.fromkeys(f"rank {r} ({exit_reason(int(c))})" for r, c in ranks if int(c) != -signal.SIGTERM)
    if failed:
        reason = f"torchrun saw {', '.join(failed)} and stopped the others"
        if "Timed out waiting" in text:
            reason += " (a collective timed out waiting for a rank that hangs)"
    else:
        lines = [ln for ln in text.splitlines() if ln.strip()]
        reason = lines[-1] if lines else "no output"
    return f"{what} failed (exit {launched.returncode}): {reason}; output: {log} in the run folder"


def _gap(want: list[np.ndarray], got: list[np.ndarray]) -> float:
    """The largest |got − want| over every array; infinite for a NaN, an infinity, a shape or a count that
    differs (the check must be able to fail on any of them)."""
    if len(want) != len(got) or any(np.shape(a) != np.shape(b) for a, b in zip(want, got)):
        return float("inf")
    gaps = [np.abs(np.asarray(b, np.float64) - np.asarray(a, np.float64)) for a, b in zip(want, got)]
    return float(max((np.max(np.where(np.isfinite(g), g, np.inf), initial=0.0) for g in gaps), default=0.0))


def passed(report: dict) -> bool:
    return bool(report["engines"]) and not report["incomplete"] and all(e["passed"] for e in report["engines"].values())
