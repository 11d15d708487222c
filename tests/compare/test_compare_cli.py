"""`native-loops compare` end to end: the default run passes every check; failures and missing engines are
reported, not hidden."""
import contextlib
import io
import json
import os
import subprocess
import sys
from importlib import metadata

import numpy as np
import pytest

from compare import cli
from compare.engines import runner
from compare.errors import NativeLoopsError
from compare.referee import seed_noise
from keras_side.backend import JAX_CACHE_VARIABLE
from keras_side.results import load_trained
from keras_side.spec import TrainConfig
from tests.conftest import users_keras_home

PATHS = ["keras-torch", "torch-native", "keras-jax", "jax-native", "keras-tensorflow", "tensorflow-native"]


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    """One full default run (all engines, 40 epochs), shared by the tests that read it."""
    out = tmp_path_factory.mktemp("compare") / "run"
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        code = cli.main(["compare", "--out", str(out)])
    return code, out, json.loads((out / "report.json").read_text()), text.getvalue()


def test_default_run_passes_every_check(default_run):
    code, out, report, _ = default_run
    assert code == 0, [c for c in report["checks"] if not c["passed"]]
    assert report["incomplete"] == [] and all(c["passed"] for c in report["checks"])
    families = {c["name"].split("/")[0] for c in report["checks"]}
    assert families == {"ols_reached", "gradient_formula", "portable_weights", "deterministic", "same_arithmetic",
                        "seed_noise"}
    assert sum(c["name"].startswith("portable_weights/") for c in report["checks"]) == 6  # every ordered pair
    noise = {c["name"] for c in report["checks"] if c["name"].startswith("seed_noise/")}
    assert noise == {f"seed_noise/{a}-{b}{m}" for a, b in [("torch", "jax"), ("torch", "tensorflow"),
                                                          ("jax", "tensorflow")] for m in ("", "/slopes")}


def test_seed_noise_in_report_json(default_run):
    """The spread over seeds of the engines with a many-model trainer, and each engine's fit run in it."""
    _, _, report, _ = default_run
    spread = report["seed_noise"]
    assert set(spread) == {"torch", "jax", "tensorflow"} and "seeds" not in spread["tensorflow"]
    for engine in ("torch", "jax"):
        assert spread[engine]["seeds"] == seed_noise.COMPARE_SEEDS
        assert set(spread[engine]["quantiles"]) == {"test_loss", "slope_d1", "slope_s5", "slope_m22"}
        assert spread[engine]["default"]["test_loss"] == pytest.approx(report["paths"][f"keras-{engine}"]["test_mse"],
                                                                       rel=1e-5)


def test_report_json_shape(default_run):
    _, out, report, _ = default_run
    assert set(report) >= {"config", "seed", "versions", "data", "ols", "paths", "checks", "incomplete"}
    assert report["versions"]["keras"] == "3.15.1" and report["seed"] == 0
    assert report["data"]["asset"] == "indice" and report["data"]["source"] == "synthetic(seed=0)"
    assert list(report["paths"]) == PATHS
    for path in report["paths"].values():
        assert set(path) >= {"engine", "intercept", "slopes", "test_mse", "val_curve", "train_seconds"}
        assert list(path["slopes"]) == ["d1", "s5", "m22"] and len(path["val_curve"]) == 40
    for name in ("curves.png", "slopes.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(out.parent.glob(".run.*"))  # the atomic temporary folder is gone


def test_terminal_shows_what_report_json_holds(default_run):
    _, _, report, text = default_run
    assert f"{report['ols']['test_mse']:.4f}" in text
    for name, path in report["paths"].items():
        assert name in text and f"{path['test_mse']:.4f}" in text and f"{path['slopes']['d1']:.4f}" in text
    for check in report["checks"]:
        assert check["name"] in text
    assert f"{len(report['checks'])} of {len(report['checks'])} checks passed" in text


def test_the_validation_curve_is_the_year_before_the_split(default_run):
    """The curves approach OLS's MSE on the validation year, which training left out; the test split stays for
    the table."""
    _, _, report, text = default_run
    assert report["data"]["validation"] == "last-year" and 200 < report["data"]["n_val"] < 300
    ols = report["ols"]
    assert abs(ols["val_mse"] - ols["test_mse"]) > 1e-3 and f"OLS {ols['val_mse']:.4f}" in text
    for path in report["paths"].values():
        assert abs(path["val_curve"][-1] / ols["val_mse"] - 1) < 0.01


def test_compare_trains_any_zoo_model_on_every_path(tmp_path, capsys):
    """`--model two_horizons`: every path trains the zoo's two-output model; the checks that hold for any model
    run (portable weights, determinism, the same arithmetic from one engine's seeded start), the HAR's own do not."""
    out = tmp_path / "run"
    code = cli.main(["compare", "--model", "two_horizons", "--engines", "torch,jax", "--quick", "--out", str(out)])
    report = json.loads((out / "report.json").read_text())
    text = capsys.readouterr().out
    assert code == 0, [c for c in report["checks"] if not c["passed"]]
    assert report["model"] == "two_horizons" and report["ols"] is None
    assert report["config"]["loss"] == ["mse", "mae"] and report["config"]["loss_weights"] == [1.0, 0.5]
    families = {c["name"].split("/")[0] for c in report["checks"]}
    assert families == {"portable_weights", "deterministic", "same_arithmetic"}
    assert sum(c["name"].startswith("same_arithmetic/") for c in report["checks"]) == 4
    for name, path in report["paths"].items():
        assert name in text and len(path["val_curve"]) == 5 and f"{path['val_curve'][-1]:.4f}" in text
        assert path["test_loss"] > 0 and f"{path['test_loss']:.4f}" in text and path["units"] == "as computed"
    assert (out / "curves.png").exists() and not (out / "slopes.png").exists()


def test_same_arithmetic_stays_within_an_engine_for_a_model_that_draws():
    """A Dropout model draws its masks from each engine's own generator: its paths are compared within an engine,
    and the check says so."""
    import numpy as np

    from compare.referee import checks

    weights = {"keras-torch": [np.zeros(3)], "torch-native": [np.zeros(3)], "keras-jax": [np.ones(3)],
               "jax-native": [np.ones(3)]}
    engine_of = {name: name.split("-")[0] if "native" in name else name.split("-")[1] for name in weights}
    assert not all(c.passed for c in checks.same_arithmetic(weights))
    grouped = checks.same_arithmetic(weights, engine_of)
    assert all(c.passed and c.value == 0 and "engine draws its own random numbers" in c.note for c in grouped)


def faulty_run(tmp_path, monkeypatch, mode: str, engines: str):
    """`compare --quick` on `engines` with workers that misbehave on purpose (`tests/compare/faulty_worker.py`, `mode`):
    its exit code and report."""
    monkeypatch.setattr(runner, "WORKER", ("-m", "tests.compare.faulty_worker", mode))
    code = cli.main(["compare", "--engines", engines, "--quick", "--out", str(tmp_path / "run")])
    return code, json.loads((tmp_path / "run" / "report.json").read_text())


def test_an_injected_wrong_gradient_fails_the_run(tmp_path, monkeypatch, capsys):
    code, report = faulty_run(tmp_path, monkeypatch, "wrong-gradients", "jax")
    failed = [c["name"] for c in report["checks"] if not c["passed"]]
    assert code == 1 and failed == ["gradient_formula/jax"]
    assert "✗" in capsys.readouterr().out


def test_a_missing_engine_is_reported_and_the_rest_checked(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "engine_installed", lambda engine: engine != "tensorflow")
    code, report = faulty_run(tmp_path, monkeypatch, "crash-on-torch", "torch,jax,tensorflow")
    reasons = {i["engine"]: i["reason"] for i in report["incomplete"]}
    assert code == 3
    assert "tensorflow is not installed" in reasons["tensorflow"]
    assert "simulated crash" in reasons["torch"]
    assert list(report["paths"]) == ["keras-jax", "jax-native"]
    assert report["checks"] and all(c["passed"] for c in report["checks"])


def test_a_line_printed_before_the_protocol_is_not_an_event(tmp_path, monkeypatch):
    """A library that prints to stdout while the worker imports it (before the worker takes stdout for its events)
    does not break the run."""
    code, report = faulty_run(tmp_path, monkeypatch, "chatty", "jax")
    assert code == 0 and report["incomplete"] == []


def test_a_worker_whose_training_fails_is_asked_nothing_after_it(tmp_path, monkeypatch, capsys):
    """The gradients follow each worker's own training (`Pool.each(..., then=...)`): not after a failed one. The
    failure is one line in the report; its traceback is in the worker's log, which the run folder keeps and names."""
    code, report = faulty_run(tmp_path, monkeypatch, "train-fails-on-torch", "torch,jax")
    assert code == 3 and {i["engine"]: i["reason"] for i in report["incomplete"]} == {
        "torch": "ZeroDivisionError: division by zero"}
    logs = {e: (tmp_path / "run" / "engines" / e / "worker.log").read_text() for e in ("torch", "jax")}
    assert "gradients asked" not in logs["torch"] and "gradients asked" in logs["jax"]
    assert "Traceback" in logs["torch"] and "ZeroDivisionError" in logs["torch"]
    out = " ".join(capsys.readouterr().out.split())
    assert f"torch: the worker's output (a traceback, if it raised): {tmp_path}/run/engines/torch/worker.log" in out
    assert any(c["name"] == "gradient_formula/jax" and c["passed"] for c in report["checks"])


def test_a_killed_worker_is_named_with_its_signal(tmp_path, monkeypatch):
    code, report = faulty_run(tmp_path, monkeypatch, "killed-on-jax", "jax")
    assert code == 3 and {i["engine"]: i["reason"] for i in report["incomplete"]} == {
        "jax": "worker killed by signal 9 (SIGKILL)"}


def test_a_silent_worker_is_stopped_and_the_rest_checked(tmp_path, monkeypatch):
    """A hung engine or build_model cannot hang the run: the silent worker is killed and reported. The quiet limit
    counts from the worker's "ready" (its engine imported), so a slow start on a busy machine is not a silence. The
    short limit here applies to the cross-predictions request only, where the planted hang is, and only to the engine
    that hangs: however busy the machine, the healthy engine is never judged by it, and the hung one, asleep, never
    answers within it."""
    each, stop_quiet = runner.Pool.each, runner.Pool._stop_quiet

    def short_limit_for_predictions(pool, cmd, *args, **kwargs):
        pool.quiet_limit = 8.0 if cmd == "cross_predict" else runner.QUIET_LIMIT_S
        return each(pool, cmd, *args, **kwargs)

    def only_the_hung_engine(pool, engines, heard):
        return stop_quiet(pool, engines & {"jax"}, heard)

    monkeypatch.setattr(runner.Pool, "each", short_limit_for_predictions)
    monkeypatch.setattr(runner.Pool, "_stop_quiet", only_the_hung_engine)
    code, report = faulty_run(tmp_path, monkeypatch, "hang-on-jax", "torch,jax")
    reasons = {i["engine"]: i["reason"] for i in report["incomplete"]}
    assert code == 3 and list(reasons) == ["jax"]
    assert "sent nothing for 8 s and was stopped" in reasons["jax"]
    checks = {c["name"]: c["passed"] for c in report["checks"]}
    assert checks["gradient_formula/torch"] and not any(name.endswith("/jax") for name in checks)


def test_unknown_engine_is_a_usage_error(tmp_path, capsys):
    assert cli.main(["compare", "--engines", "jax,mxnet", "--out", str(tmp_path / "run")]) == 2
    assert "unknown engine(s) mxnet" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.fixture(scope="module")
def float64_run_under_a_users_keras_json(tmp_path_factory):
    """`compare --quick --float64` on torch and JAX, with a KERAS_HOME whose keras.json sets floatx float16 and
    another epsilon: one run for the two tests below."""
    home = users_keras_home(tmp_path_factory.mktemp("keras_home"), backend="jax")
    out = tmp_path_factory.mktemp("float64") / "run"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KERAS_HOME", str(home))
        code = cli.main(["compare", "--engines", "jax,torch", "--quick", "--float64", "--out", str(out)])
    return code, json.loads((out / "report.json").read_text())


def test_float64_gradients_are_judged_per_engine(float64_run_under_a_users_keras_json):
    code, report = float64_run_under_a_users_keras_json
    f64 = {c["name"]: c for c in report["checks"] if c["name"].endswith("/float64")}
    assert code == 0 and set(f64) == {"gradient_formula/torch/float64", "gradient_formula/jax/float64"}
    assert f64["gradient_formula/jax/float64"]["value"] <= 1e-12 == f64["gradient_formula/jax/float64"]["tolerance"]
    torch = f64["gradient_formula/torch/float64"]
    assert 1e-9 < torch["value"] <= torch["tolerance"] and "keras-team/keras#23704" in torch["note"]


def test_one_engine_trains_no_seeds_that_no_check_would_read(tmp_path, capsys):
    """seed_noise sets one engine's fit against another's, and a --quick run judges no ols_reached band: with one
    engine and --quick no check would read seeds, so none are trained, and it says what seed_noise needs."""
    code = cli.main(["compare", "--engines", "jax", "--quick", "--out", str(tmp_path / "run")])
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert code == 0 and report["seed_noise"] == {"jax": {"default": report["seed_noise"]["jax"]["default"]}}
    assert not any(c["name"].startswith("seed_noise") for c in report["checks"])
    assert "seed_noise sets one engine's fit against another's: give --engines two or more" in capsys.readouterr().out


def test_a_users_keras_json_does_not_reach_the_referee(float64_run_under_a_users_keras_json):
    """A KERAS_HOME whose keras.json sets floatx float16 and another epsilon: the workers put Keras's defaults back,
    so every check still passes, float64's included (that policy is the check's own, set over the defaults)."""
    code, report = float64_run_under_a_users_keras_json
    assert code == 0 and report["checks"], [c for c in report["checks"] if not c["passed"]]


def test_the_workers_off_the_critical_path_run_at_a_lower_priority(tmp_path, monkeypatch):
    """#15: TensorFlow's worker is a run's critical path (`runner.CRITICAL`): the others are niced, so it keeps a core
    while they share the other; without TensorFlow every worker keeps the referee's priority."""
    monkeypatch.setattr(runner, "WORKER", ("-c", "import sys; sys.stdin.readline()"))  # waits for its exit request
    monkeypatch.delenv(runner.NICE_VARIABLE, raising=False)  # `make test` sets 0: the default here
    base = os.getpriority(os.PRIO_PROCESS, 0)
    behind = min(base + runner.BEHIND_NICE, 19)
    every = ["torch", "jax", "tensorflow"]
    for engines, want in ((every, {"torch": behind, "jax": behind, "tensorflow": base}),
                          (["torch", "jax"], {"torch": base, "jax": base})):
        with runner.Pool(engines, tmp_path / "-".join(engines)) as pool:
            assert {e: os.getpriority(os.PRIO_PROCESS, w.proc.pid) for e, w in pool.workers.items()} == want
    monkeypatch.setenv(runner.NICE_VARIABLE, "0")  # beside other busy jobs: no lower priority
    with runner.Pool(every, tmp_path / "zero") as pool:
        assert {os.getpriority(os.PRIO_PROCESS, w.proc.pid) for w in pool.workers.values()} == {base}
    monkeypatch.setenv(runner.NICE_VARIABLE, "-5")
    with pytest.raises(NativeLoopsError, match="NATIVE_LOOPS_NICE must be a niceness from 0 to 19, got '-5'"):
        runner.Pool(every, tmp_path / "bad")


@pytest.mark.parametrize("value", ["ten", "²", "٣"])  # str.isdigit takes the last two; int() refuses "²"
def test_a_bad_niceness_is_one_line_before_anything_runs(tmp_path, monkeypatch, capsys, value):
    monkeypatch.setenv(runner.NICE_VARIABLE, value)
    assert cli.main(["compare", "--out", str(tmp_path / "run")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == (f"native-loops: error: NATIVE_LOOPS_NICE must be a niceness from 0 to 19, got "
                                 f"{value!r}; unset it for 10\n")
    assert not (tmp_path / "run").exists()


def test_a_jax_worker_loads_what_an_earlier_one_compiled_and_ends_where_it_ended(tmp_path, monkeypatch, har):
    """#15: compare's workers share JAX's persistent compilation cache (`keras_side.backend.jax_cache_environment`).
    The first worker fills it, the second compiles nothing new (every program a hit) and trains to the same bits;
    a pool that times its compiles (the default) gets no cache, even one the user's environment names."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home-cache"))
    monkeypatch.delenv(JAX_CACHE_VARIABLE, raising=False)
    cache = tmp_path / "home-cache" / "native-loops" / "jax"
    har.save(tmp_path / "data.npz")
    request = {"data": str(tmp_path / "data.npz"), "config": TrainConfig(epochs=2).to_dict(),
               "build": "keras_side.models:har"}
    trained, entries, read = [], [], []
    for run in ("cold", "warm"):
        with runner.Pool(["jax"], tmp_path / run, compile_cache=True) as pool:
            assert pool.each("native_weights", lambda e: request | {"weights": str(tmp_path / f"{run}.npz")}) == {}
        trained.append(load_trained(tmp_path / f"{run}.npz")[0])
        entries.append(sorted(p.name for p in cache.glob("*-cache")))
        read.append({p.name: p.read_bytes() for p in cache.glob("*-atime")})  # JAX stamps an entry when it loads it
    assert entries[0] and entries[1] == entries[0]  # the warm worker wrote nothing new
    assert sorted(read[1]) == sorted(read[0]) and all(read[1][k] != read[0][k] for k in read[0])  # and loaded each
    assert "compilation cache" not in (tmp_path / "warm" / "engines" / "jax" / "worker.log").read_text()  # no error
    for cold, warm in zip(*trained, strict=True):
        np.testing.assert_array_equal(cold, warm)
    monkeypatch.setattr(runner, "WORKER", ("-c", f"import os, sys; sys.stdin.readline(); "
                                                 f"print(os.environ.get({JAX_CACHE_VARIABLE!r}), file=sys.stderr)"))
    monkeypatch.setenv(JAX_CACHE_VARIABLE, str(tmp_path / "users"))
    for compile_cache, seen in ((False, "None"), (True, str(tmp_path / "users"))):
        with runner.Pool(["jax"], tmp_path / f"env-{compile_cache}", compile_cache=compile_cache):
            pass
        assert (tmp_path / f"env-{compile_cache}" / "engines" / "jax" / "worker.log").read_text().strip() == seen


def test_a_cache_entry_cut_short_is_dropped_so_jax_writes_again(tmp_path, monkeypatch):
    """An entry whose process stopped before its access time was written (`backend.drop_cut_short`) makes JAX fail
    every later write (FileNotFoundError on its -atime, a warning, the cache no longer grows); the cache's
    environment drops it first and keeps the whole entries, and a JAX process then writes its own."""
    from keras_side import backend

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv(JAX_CACHE_VARIABLE, raising=False)
    cache = backend.own_cache("jax")
    cache.mkdir(parents=True)
    for name in ("whole-cache", "whole-atime", "cut-cache"):
        (cache / name).write_bytes(bytes(8))
    program = "import jax, jax.numpy as jnp; print(jax.jit(lambda x: jnp.sin(x) * 3.25)(jnp.ones(3)).sum())"

    def jax_process(env):
        proc = subprocess.run([sys.executable, "-c", program], env={**os.environ, **env}, capture_output=True,
                              text=True)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return proc.stderr

    with monkeypatch.context() as undropped:  # the control: as JAX leaves the folder
        undropped.setattr(backend, "drop_cut_short", lambda folder: None)
        failed = "Error writing persistent compilation cache" in jax_process(backend.jax_cache_environment())
    # The pinned JAX (0.10.2) fails its writes there; a JAX that writes anyway (0.12.0.1 does: make test-newest)
    # needs no drop, which then costs it nothing.
    jax_version = metadata.version("jax")
    assert failed or jax_version != "0.10.2", f"jax {jax_version} wrote beside a cut-short entry: the premise moved"
    if failed:
        assert not list(cache.glob("jit_*"))
    for entry in cache.glob("jit_*"):  # what a JAX that writes anyway wrote: the run below writes its own
        entry.unlink()
    env = backend.jax_cache_environment()
    assert sorted(p.name for p in cache.iterdir() if not p.name.startswith(".")) == ["whole-atime", "whole-cache"]
    assert "compilation cache" not in jax_process(env)
    assert len(list(cache.glob("jit_*-cache"))) == len(list(cache.glob("jit_*-atime"))) > 0


def test_the_tests_compile_into_the_checkout_not_the_users_cache(tmp_path):
    """A test's JAX workers share a compilation cache in this checkout (tests/conftest.py), never the user's
    ~/.cache/native-loops: what other runs left there never reaches a test, and a test run leaves nothing there."""
    from keras_side import backend
    from tests.conftest import REPO, TEST_CACHE

    assert TEST_CACHE.parent == REPO and backend.own_cache("jax").is_relative_to(TEST_CACHE)
    program = "import os; print(os.environ.get('XDG_CACHE_HOME'))"  # what a worker or a launcher inherits
    assert subprocess.run([sys.executable, "-c", program], capture_output=True, text=True).stdout.strip() == str(
        TEST_CACHE)
