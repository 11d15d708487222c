"""`native-loops distributed`: two processes per engine (torch DDP, JAX sharded over jax.distributed; two
MirroredStrategy replicas on TensorFlow) against one, and `fit` under Keras's distribution on two devices (JAX,
TensorFlow) against plain `fit`, on a short run; bad options are one line, exit 2, nothing written."""
import json

import numpy as np
import pytest

from compare import cli
from compare.distributed import ZOO_EPOCHS
from compare.referee.tolerances import DATA_PARALLEL_ATOL, SHARDED_ATOL
from keras_side import cores
from keras_side.spec import TrainConfig
from tests.tiers import rows


# make test: JAX, whose launch, fit under Keras's distribution and sharded walk-forward make every kind of row the
# report has. Each launcher's own runs that end where one process ends (DDP, MirroredStrategy, fit under the
# strategy): tests/native/torch/test_ddp.py, tests/native/tensorflow/test_mirrored.py. make test-full runs all three
# engines here, and launches torch's DDP in the test of a process that dies, below.
ENGINES = rows(["torch", "jax", "tensorflow"], fast=["jax"])


def test_two_processes_end_where_one_ends_on_each_engine(tmp_path, capsys):
    code = cli.main(["distributed", "--processes", "2", "--epochs", "2", "--engines", ",".join(ENGINES), "--out",
                     str(tmp_path / "run")])
    report = json.loads((tmp_path / "run" / "distributed.json").read_text())
    assert code == 0, report
    fit = {f"keras-{e}" for e in ENGINES if e != "torch"}  # Keras 3.15.1 has no keras.distribution for torch
    assert set(report["engines"]) == {*ENGINES, *fit, "walk-forward"}
    assert report["processes"] == 2
    assert report["engines"]["keras-jax"]["training_rows"] == 2176  # 17 whole batches of 128: each splits over 2
    assert not report["incomplete"]
    for name, row in report["engines"].items():  # the walk-forward's forecasts: SHARDED_ATOL, the models' own
        assert row["passed"] and row["gap"] <= row["tolerance"] == (SHARDED_ATOL if name == "walk-forward" else
                                                                    DATA_PARALLEL_ATOL)
        assert set(row["samples_per_s"]) == {"one", "many"} and all(v > 0 for v in row["samples_per_s"].values())
    assert report["seed"] == 0 and "keras" in report["versions"]
    assert [p.name for p in (tmp_path / "run").iterdir()] == ["distributed.json"]  # no scratch left
    printed = capsys.readouterr().out
    assert "data_parallel/jax" in printed
    # pinned (Linux, 2 cores or more): process i of a launch on the i-th core, each recorded by itself after its
    # training (a run of 2 devices in one process: on both), every one-process run on the last
    usable = cores.timing_cpus() or []
    if len(usable) >= 2:
        pair = usable[-2:]
        assert report["cpus"] == pair and "pinned: a launch's process i on the i-th of CPUs" in printed
        for name, row in report["engines"].items():
            one_process = name in ("tensorflow", "keras-jax", "keras-tensorflow")
            assert row["cpus"] == {"one": [pair[-1:]], "many": [sorted(pair)] if one_process else [[c] for c in pair]}
        assert not [n for n in report["notes"] if "run could compute on CPUs" in n]  # no run off its cores
    else:
        assert report["cpus"] is None and "not pinned" in printed


@pytest.mark.parametrize("args, message", [
    (["--processes", "0"], "--processes must be between 1 and this machine's"),
    (["--processes", "1000"], "--processes must be between 1 and this machine's"),
    (["--engines", "mxnet"], "unknown engine(s) mxnet"),
    (["--model", "resnet"], "--model must be one of har, mlp_l2, bn_mlp, lstm, conv1d, two_horizons, classifier"),
    (["--model", "har_recent"], "got 'har_recent': its sample weights are not taken by the data-parallel loops"),
    (["--epochs", "100000"], "ask for at most"),
])
def test_bad_options_are_one_line(tmp_path, capsys, args, message):
    code = cli.main(["distributed", *args, "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("native-loops: error: ") and message in err and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


def test_a_short_asset_other_than_asset_is_left_out_of_the_walk_forward_check(panel, tmp_path, capsys, monkeypatch):
    """The JAX walk-forward check refits every asset it can; an asset too short for --split, not --asset, stopped
    the whole command, which `train` on the same panel does not."""
    from compare import distributed

    class Launched(Exception):
        pass

    def launched(prepared, cfg, engines, **kwargs):
        raise Launched(prepared.asset, kwargs["windows"])

    monkeypatch.setattr(distributed, "run", launched)
    panel[(panel["activo"] != "oro") | (panel["fecha"] >= "2018-03-01")].to_csv(tmp_path / "short.csv", index=False)
    with pytest.raises(Launched) as got:
        cli.main(["distributed", "--data", str(tmp_path / "short.csv"), "--asset", "indice", "--engines", "jax",
                  "--out", str(tmp_path / "run")])
    asset, windows = got.value.args
    assert asset == "indice" and windows["x"].shape[0] == panel["activo"].nunique() - 1
    assert "the walk-forward check leaves out asset 'oro': split date 2018-01-01" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["short.csv"]


# make test: JAX's launcher. torchrun's summary is read by the test of it below (every way its ranks end), and a rank
# that dies is torch's own test (tests/native/torch/test_ddp.py); make test-full launches torch here too.
DYING = rows(["torch", "jax"], fast=["jax"])


def test_a_process_that_dies_is_named_and_its_output_kept(tmp_path, monkeypatch):
    """The second process (rank) dies while building the model: the run exits 3, each engine's line names the
    process that failed and how (torchrun's root cause; the JAX launcher's own line), and the launch's output stays
    in the run folder under the name the line gives. The one-process run is the plain HAR."""
    from dataclasses import replace

    from compare import distributed as launch
    from keras_side import zoo

    monkeypatch.setitem(zoo.ZOO, "har", replace(zoo.ZOO["har"], build="tests.native.faults:dies_in_the_second_process"))
    monkeypatch.setattr(launch, "run", _without_one_process_faults(launch.run))
    code = cli.main(["distributed", "--engines", ",".join(DYING), "--epochs", "1", "--no-fit", "--out",
                     str(tmp_path / "run")])  # fit's launch is one process: the planted fault never fires there
    report = json.loads((tmp_path / "run" / "distributed.json").read_text())
    assert code == 3 and set(report["incomplete"]) == set(DYING), report
    if "torch" in DYING:
        torchrun = "2 processes failed (exit 1): torchrun saw rank 1 (exit code 3)"
        assert report["incomplete"]["torch"].startswith(torchrun)
    if "jax" in DYING:
        assert "jax.distributed: 1 of 2 failed (process 1: exit code 3)" in report["incomplete"]["jax"]
    logged = {"torch": "Root Cause (first observed failure)", "jax": "--- process 1 (exit 3)"}
    for engine in DYING:
        assert f"output: {engine}-2.log in the run folder" in report["incomplete"][engine]
        assert logged[engine] in (tmp_path / "run" / f"{engine}-2.log").read_text()


def test_a_fit_that_fails_in_the_worker_is_named_and_the_native_check_still_runs(tmp_path, monkeypatch):
    """Plain fit on one device, the baseline of fit under Keras's distribution, runs in the engine's worker. A model
    that fit refuses (already compiled) leaves `keras-jax` incomplete with the worker's reason, exit 3, the worker's
    log (its traceback) kept in the run folder, and the native check, on the same worker, still passes."""
    from dataclasses import replace

    from compare import distributed as launch
    from keras_side import zoo

    monkeypatch.setitem(zoo.ZOO, "har", replace(zoo.ZOO["har"], build="tests.native.faults:compiled_har"))
    monkeypatch.setattr(launch, "run", _without_one_process_faults(launch.run))
    code = cli.main(["distributed", "--engines", "jax", "--epochs", "1", "--out", str(tmp_path / "run")])
    report = json.loads((tmp_path / "run" / "distributed.json").read_text())
    assert code == 3 and list(report["incomplete"]) == ["keras-jax"], report
    reason = report["incomplete"]["keras-jax"]
    assert reason.startswith("fit on 1 device: ") and "already compiled" in reason, reason
    assert reason.endswith("output: engines/jax/worker.log in the run folder")
    assert "Traceback" in (tmp_path / "run" / "engines" / "jax" / "worker.log").read_text()
    assert list(report["engines"]) == ["jax"] and report["engines"]["jax"]["passed"]


def _without_one_process_faults(run):
    """The worker's one-process run builds in process 0 (never 'the second'), so the planted builder is harmless
    there; the walk-forward (HAR only) is left out to keep the test short."""
    def wrapped(*args, windows=None, **kwargs):
        return run(*args, windows=None, **kwargs)
    return wrapped


TORCHRUN_SUMMARY = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
native.torch.ddp FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-30_19:36:02
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : {other} (pid: 13457)
  error_file: <N/A>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-30_19:36:02
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : 3 (pid: 13458)
  error_file: <N/A>
============================================================
"""


@pytest.mark.parametrize("other, named", [
    (-15, "torchrun saw rank 1 (exit code 3) and stopped the others"),  # rank 0 stopped by torchrun: not a failure
    (1, "torchrun saw rank 1 (exit code 3), rank 0 (exit code 1) and stopped"),  # its collective broke: a tie
    (-9, "rank 1 (exit code 3), rank 0 (killed by signal 9 (SIGKILL))"),
    (-40, "rank 0 (killed by signal 40)"),  # a signal without a name is still one line
])
def test_a_torchrun_failure_lists_every_rank_that_failed(other, named):
    from subprocess import CompletedProcess

    from compare import distributed

    launched = CompletedProcess([], 1, "", "noise\n" + TORCHRUN_SUMMARY.format(other=other))
    line = distributed._failure(launched, "2 processes", "torch-2.log")
    assert named in line and line.endswith("; output: torch-2.log in the run folder") and "\n" not in line


def test_fit_checks_are_skipped_with_a_note_when_a_batch_cannot_split():
    """--processes 3 with batches of 128: Keras cannot shard them, so the fit checks are a note, not a failure; nor
    with --processes 1, where the check would compare plain fit with itself."""
    from compare import distributed
    from keras_side.spec import TrainConfig

    notes = []
    assert distributed.fit_engines(["torch", "jax", "tensorflow"], TrainConfig(), 2, notes) == ["jax", "tensorflow"]
    assert notes == []
    assert distributed.fit_engines(["jax", "tensorflow"], TrainConfig(), 3, notes) == []
    assert len(notes) == 1 and "a batch of 128 rows does not split over 3 devices" in notes[0]
    assert distributed.fit_engines(["jax", "tensorflow"], TrainConfig(), 1, notes) == []  # plain fit against itself
    assert len(notes) == 2 and "over 1 device it is plain fit" in notes[1]


def test_one_process_against_one_keeps_both_throughputs(tmp_path):
    """--processes 1: the worker's baseline and the launch are two runs, each with its own seconds (both were keyed
    "1", so the launch's overwrote the baseline's and the ratio was 1 whatever was measured)."""
    from compare import distributed
    from keras_side.results import save_trained

    save_trained(tmp_path / "torch-worker.npz", [np.zeros(3, np.float32)], 2.0)
    save_trained(tmp_path / "torch-1.npz", [np.zeros(3, np.float32)], 4.0)
    row = distributed._row("torch", "DDP", tmp_path, 1, samples=8)
    assert row["seconds"] == {"one": 2.0, "many": 4.0} and row["samples_per_s"] == {"one": 4.0, "many": 2.0}
    assert row["passed"] and row["gap"] == 0


def test_a_walk_forward_that_fails_in_the_worker_is_named(tmp_path):
    """The walk-forward's one-process run is the JAX worker's (the same trainer on its one device), asked for the
    launch's spec; when it fails, the row is incomplete with the worker's reason and where its traceback is (`run`
    then launches nothing: the row needs both runs)."""
    from compare import distributed

    class Failing:
        live, failed = ["jax"], {}

        def each(self, cmd, request_for, on_event=None, *, only, fail_engines):
            request = request_for("jax")
            assert cmd == "compare.speed.tasks:walk_forward" and only == ["jax"] and request["devices"] == [1] and not fail_engines
            assert request["repeats"] == 1  # timed as the launch over processes is: one run after the compile
            assert request["config"]["batch_order"] == "numpy" and request["config"]["epochs"] == 3
            return {"jax": "ValueError: boom"}

    windows = {k: np.zeros((1, 4, 3), np.float32) for k in ("x", "y", "rows", "x_next")}
    incomplete = {}
    cfg = TrainConfig(epochs=3)
    assert distributed._walk_forward_one(Failing(), windows, cfg, tmp_path, incomplete) is None
    assert incomplete == {"walk-forward": "1 process failed: ValueError: boom; output: engines/jax/worker.log in the "
                                          "run folder"}
    stopped = Failing()  # the worker died on an earlier request: nothing asked, no traceback, the reason given
    stopped.live, stopped.failed, incomplete = [], {"jax": "worker exited (code 1)"}, {}
    assert distributed._walk_forward_one(stopped, windows, cfg, tmp_path, incomplete) is None
    assert incomplete == {"walk-forward": "1 process: the JAX worker had stopped before it (worker exited (code 1))"}


@pytest.mark.parametrize("fit", [False, True])
def test_a_jax_launch_computes_on_one_thread_a_process_as_the_worker_does(tmp_path, monkeypatch, fit):
    """The throughput ratio is one process against N: a JAX launch gets the workers' one-thread XLA flags (with fit,
    beside its N host devices), as torch's and TensorFlow's launches get one thread from seed_everything."""
    from compare import distributed
    from compare.engines import runner

    seen = {}
    monkeypatch.setattr(distributed, "_run", lambda command, env, log: seen.update(command=command, env=env))
    distributed._launch("jax", 2, tmp_path / "d.npz", tmp_path / "o.npz", {}, "keras_side.models:har", fit=fit)
    flags = seen["env"]["XLA_FLAGS"].split()
    assert set(runner.XLA_ONE_THREAD.split()) <= set(flags)
    assert ("--xla_force_host_platform_device_count=2" in flags) is fit


@pytest.mark.parametrize("cpus", [[3, 5], None])
def test_a_launch_names_its_cores_or_none(tmp_path, monkeypatch, cpus):
    """Each launch names its processes' cores (`launch_cpus`) to `cores.pin_launched`; where nothing is pinned it names
    none, a variable of the caller's included, so that no run is pinned that the report says is not."""
    from compare import distributed

    seen = {}
    monkeypatch.setenv(cores.CPUS_VARIABLE, "7")
    monkeypatch.setattr(distributed, "launch_cpus", lambda processes: cpus)
    monkeypatch.setattr(distributed, "_run", lambda command, env, log: seen.update(env=env))
    for engine, fit in [("torch", False), ("jax", False), ("jax", True), ("tensorflow", False), ("tensorflow", True)]:
        distributed._launch(engine, 2, tmp_path / "d.npz", tmp_path / "o.npz", {}, "keras_side.models:har", fit=fit)
        assert seen["env"].get(cores.CPUS_VARIABLE) == ("3,5" if cpus else None), (engine, fit)


def test_a_run_off_its_cores_is_noted():
    """What each run recorded against what it was given: process i of a launch on the i-th core, a process of every
    device on all, the one-process run on the last; a run elsewhere (a cpuset, an OpenMP runtime rebinding its
    threads) is named, since its throughput is then not one core against one a process."""
    from compare import distributed

    given = {"check": "data_parallel/torch", "cpus": {"one": [[1]], "many": [[0], [1]]}}
    one_process = {"check": "data_parallel/keras-jax", "cpus": {"one": [[1]], "many": [[0, 1]]}}
    assert distributed._off_their_cores({"torch": given, "keras-jax": one_process}, [0, 1]) == []
    piled = {"check": "data_parallel/jax", "cpus": {"one": [[1]], "many": [[0], [0]]}}  # both ranks on core 0
    notes = distributed._off_their_cores({"jax": piled}, [0, 1])
    assert len(notes) == 1 and notes[0].startswith(
        "data_parallel/jax: its N-process run could compute on CPUs [[0], [0]] (one list per process), not [[0], [1]]")


class _Nudged:
    """A pool whose workers' runs from one ulp away end `drift` from their runs: what `_measure_rounding` asks."""

    def __init__(self, drift: float):
        self.drift, self.live, self.asked = drift, ["torch", "jax"], []

    def each(self, cmd, request_for, on_event=None, *, only, fail_engines):
        from keras_side.results import save_trained

        for engine in only:
            request = request_for(engine)
            self.asked.append((cmd, engine, request))
            save_trained(request["weights"], [np.full(3, self.drift, np.float32)], 1.0)
        return {}


@pytest.mark.parametrize("drift", [2e-3, 1e-7])
def test_a_gap_over_the_tolerance_is_told_against_what_rounding_alone_does(tmp_path, capsys, drift):
    """A check over its tolerance asks its worker for the same one-process run from one ulp away (fit's on the whole
    batches). Rounding carrying that run past the tolerance too (a chaotic model over a long run): the line says this
    horizon cannot tell a bug from rounding, and that fewer epochs can; within the tolerance: rounding does not
    explain the gap. Either way the check fails: a real bug would end as far."""
    from compare import distributed
    from compare.referee import report
    from keras_side.results import save_trained

    def row(name, gap):
        save_trained(tmp_path / f"{name}-worker.npz", [np.zeros(3, np.float32)], 1.0)
        return {"check": f"data_parallel/{name}", "runtime": "r", "gap": gap, "tolerance": DATA_PARALLEL_ATOL,
                "passed": gap <= DATA_PARALLEL_ATOL, "samples_per_s": {"one": 1.0, "many": 1.0}}

    found = {"torch": row("torch", 1.5e-3), "jax": row("jax", 3e-7), "keras-jax": row("keras-jax", 0.13)}
    pool = _Nudged(drift)
    distributed._measure_rounding(pool, found, {"data": "d.npz", "config": {}, "build": "b"}, tmp_path, None)
    assert [(cmd, engine) for cmd, engine, _ in pool.asked] == [("native_weights", "torch"), ("native_weights", "jax")]
    (_, _, native), (_, _, fit) = pool.asked  # the checks over the tolerance only, fit's as fit on the whole batches
    assert native["nudge"] and not native.get("fit") and native["data"] == "d.npz"
    assert native["weights"] == str(tmp_path / "torch-worker-nudged.npz")
    assert fit["nudge"] and fit["fit"] and fit["data"] == str(tmp_path / "whole.npz")
    assert "drift" not in found["jax"] and found["torch"]["drift"] == pytest.approx(drift)
    whole = {"processes": 2, "engines": found, "incomplete": {}, "samples": 1, "config": {"epochs": 40}}
    assert not distributed.passed(whole)
    report.print_distributed(whole)
    out = " ".join(capsys.readouterr().out.split())
    chaotic = "this horizon cannot tell a bug from rounding; fewer --epochs can"
    assert (f"data_parallel/torch: the one-process run from one ulp away ends {drift:.1e}" in out
            and (chaotic in out) is (drift > DATA_PARALLEL_ATOL)
            and ("does not explain the gap" in out) is (drift <= DATA_PARALLEL_ATOL))


def test_the_worker_trains_from_one_ulp_away_when_asked(har, tmp_path):
    """The yardstick's run: the same seeded start but one weight one ulp away, so it ends a hair from the plain run
    (the HAR is convex: nowhere near the tolerance), and the plain run is where it was."""
    from compare.engines import runner
    from keras_side.results import load_trained, trained_record, versions

    har.save(tmp_path / "data.npz")
    request = {"data": str(tmp_path / "data.npz"), "config": {"epochs": 1, "batch_order": "numpy", "validate": False},
               "build": "keras_side.models:har"}
    with runner.Pool(["jax"], tmp_path, jobs=1) as pool:
        for name, nudge, fit in (("plain", False, False), ("again", False, False), ("nudged", True, False),
                                 ("fit", False, True), ("fit-nudged", True, True)):
            assert not pool.each("native_weights", lambda e: {**request, "nudge": nudge, "fit": fit,
                                                                "weights": str(tmp_path / f"{name}.npz")})
    runs = {n: load_trained(tmp_path / f"{n}.npz")[0] for n in ("plain", "again", "nudged", "fit", "fit-nudged")}
    assert trained_record(tmp_path / "plain.npz") == {"seed": 0, "versions": versions()}
    assert all(np.array_equal(a, b) for a, b in zip(runs["plain"], runs["again"]))
    for a, b in (("plain", "nudged"), ("fit", "fit-nudged")):
        gap = max(float(np.max(np.abs(x - y))) for x, y in zip(runs[a], runs[b]))
        assert 0 < gap < DATA_PARALLEL_ATOL, (a, gap)


@pytest.mark.parametrize("args, epochs", [([], 40), (["--model", "lstm"], ZOO_EPOCHS),
                                          (["--model", "lstm", "--epochs", "40"], 40),
                                          (["--model", "conv1d", "--epochs", "5"], 5)])
def test_a_zoo_models_default_epochs_stop_before_rounding_decides(tmp_path, monkeypatch, args, epochs):
    """The HAR trains the spec's 40 epochs; another zoo model ZOO_EPOCHS unless --epochs says otherwise: over 40 the
    LSTM and the Conv1D amplify rounding past the tolerance (docs/distributed.md)."""
    from compare import distributed as launch

    asked = []

    def run(data, cfg, engines, **kwargs):  # the configuration only: no training
        asked.append(cfg.epochs)
        return {"processes": 2, "engines": {}, "incomplete": {"jax": "not run"}, "notes": [], "samples": 0,
                "config": cfg.to_dict()}

    monkeypatch.setattr(launch, "run", run)
    assert cli.main(["distributed", "--engines", "jax", *args, "--out", str(tmp_path / "run")]) == 3
    assert asked == [epochs]
