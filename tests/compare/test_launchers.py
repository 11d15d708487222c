"""Each data-parallel launcher's own command line (`native.torch.ddp` under torchrun, `native.jax.sharded`,
`native.tensorflow.mirrored`): its arguments checked before anything starts, a mistake only training finds one
line and exit 2, as `native-loops distributed` reports them."""
import dataclasses

import numpy as np
import pytest

from tests.tiers import FULL


LAUNCH_CASES = [
    (dict(config='{"epochs": 2'), "--config is not JSON (Expecting ',' delimiter); give TrainConfig fields as a JSON "
                                  "object"),
    (dict(config="[1, 2]"), "--config must be a JSON object of TrainConfig fields, got a list"),
    (dict(config='{"epochz": 2}'), "--config: 'epochz' is not a field of the training spec (did you mean 'epochs'?)"),
    (dict(config='{"epochs": "two"}'), "--config: epochs and batch_size must be whole numbers"),
    (dict(data="missing.npz"), "--data '{tmp}/missing.npz' is not a file; give a HarData file (HarData.save)"),
    (dict(data="windows.npz"), "--data '{tmp}/windows.npz' is not a HarData file (HarData.save) (KeyError: "),
    (dict(data="weighted.npz"), "--data '{tmp}/weighted.npz' holds sample weights, which the native data-parallel "
                                "loops do not take; save it without them, or train with --fit"),
    (dict(data="array.npy"), "--data '{tmp}/array.npy' is not a HarData file (HarData.save) (TypeError: "),
    (dict(windows=True), "--data '{tmp}/data.npz' is not the walk-forward's windows (x, y, rows, x_next) (KeyError: "
                         "'x, y, rows, x_next')"),
    (dict(build="nope:nothing"), "--build 'nope:nothing': give module:function, the module importable from here"),
    (dict(build="keras_side.models"), "--build 'keras_side.models': give module:function"),
    (dict(build="no_package.sub:f"), "--build 'no_package.sub:f': give module:function"),
    (dict(out="nodir/w.npz"), "--out '{tmp}/nodir/w.npz': its folder {tmp}/nodir does not exist"),
    (dict(out=""), "--out '{tmp}' is a folder; give the file to write the weights to"),  # after the training
    (dict(config='{"learning_rate": "0.1"}'), "--config: learning_rate must be a number, got '0.1'"),  # TypeError
    (dict(config='{"validate": true}'), "--config: the native data-parallel loops do not validate, so they take "
                                        "neither validate nor patience; drop them, or train with --fit"),
    (dict(count=0), "--processes must be between 1 and this machine's"),
    (dict(count=-1), "--processes must be between 1 and this machine's"),
    (dict(count=10_000), "--processes must be between 1 and this machine's"),
]


@pytest.mark.parametrize("change, message", LAUNCH_CASES, ids=[m.split()[0] + str(i) for i, (_, m) in
                                                               enumerate(LAUNCH_CASES)])
def test_a_launchers_arguments_are_checked_before_anything_starts(har, tmp_path, change, message):
    """Run by hand, the launchers gave a traceback (from every process) for each of these: bad JSON, a field that
    is not the spec's, a missing data file, a builder that cannot be imported, an --out in no folder (after the
    training), 0 or -1 processes (IndexError) or 10,000 (nothing for minutes)."""
    import argparse

    from native import preflight

    har.save(tmp_path / "data.npz")
    dataclasses.replace(har, w_train=np.ones(har.n_train, np.float32)).save(tmp_path / "weighted.npz")
    np.savez(tmp_path / "windows.npz", x=np.zeros(1))
    np.save(tmp_path / "array.npy", np.zeros(1))
    given = {"config": "{}", "data": "data.npz", "build": "keras_side.models:har", "out": "w.npz"} | change
    args = argparse.Namespace(**{k: v if k in ("config", "build") else str(tmp_path / v) for k, v in given.items()
                                 if k in ("config", "data", "build", "out")})
    with pytest.raises(preflight.LaunchError) as err:
        preflight.launch_args(args, count=change.get("count", 2), windows=change.get("windows", False))
    assert message.replace("{tmp}", str(tmp_path)) in str(err.value)
    cfg, data = preflight.launch_args(argparse.Namespace(config='{"epochs": 3}', data=str(tmp_path / "data.npz"),
                                                         build="keras_side.models:har", out=str(tmp_path / "w.npz")))
    assert cfg.epochs == 3 and cfg.batch_order == "numpy"  # DATA_PARALLEL's, unless --config says otherwise
    np.testing.assert_array_equal(data.x_train, har.x_train)  # what it checked, loaded once for the launcher
    _, weighted = preflight.launch_args(argparse.Namespace(config="{}", data=str(tmp_path / "weighted.npz"),
                                                           build="keras_side.models:har", out=str(tmp_path / "w.npz")),
                                        fit=True)  # --fit takes them
    assert weighted.w_train is not None


# make test: a row per launcher (JAX's: a batch that does not split).
MISTAKES = [
    # the HAR's training rows leave an odd last batch, which Keras's DataParallel cannot split over 2 devices
    ("jax", ["-m", "native.jax.sharded", "--fit", "--devices", "2"], "{}", "rows does not split"),
    # more devices than JAX sees: it was exit 1, a line with no "error:" (SystemExit)
    ("jax", ["-m", "native.jax.sharded", "--fit", "--devices", "3"], "{}",
     "asked for fit over 3 devices, and JAX sees 2"),
    # the second process stopped, never refusing: it was every process's log, the second's killed or aborted
    ("jax", ["-m", "native.jax.sharded", "--processes", "2", "--build", "tests.native.faults:har_in_the_first_"
             "process_only"], '{"loss": "sparse_categorical_crossentropy"}', "which sparse_categorical_crossentropy cannot "
                                                                        "take"),
    ("tensorflow", ["-m", "native.tensorflow.mirrored", "--replicas", "2"], '{"clipnorm": 1.0}',
     "Keras clips each replica's gradient before the all-reduce"),
    # a rank alone (a world of one), as torchrun starts it; a model of two outputs for the HAR's one target
    ("torch", ["-m", "native.torch.ddp", "--build", "keras_side.models:two_horizons"], "{}",
     "the model has 2 outputs but the data has 1 target(s)"),
]


@pytest.mark.parametrize("engine, command, config, message", MISTAKES if FULL else [MISTAKES[0], *MISTAKES[3:]])
def test_a_mistake_only_training_finds_is_one_line_and_exit_2(har, tmp_path, engine, command, config, message):
    """Each was a traceback (a SpecError's) from the launcher or the rank, after the launcher's own checks passed."""
    import subprocess
    import sys

    from compare.engines import runner
    from keras_side.backend import engine_environment
    from native import preflight

    har.save(tmp_path / "data.npz")
    env = engine_environment(engine) | {"TF_CPP_MIN_LOG_LEVEL": "3", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT":
                                        str(preflight.free_port()), "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
                                        "XLA_FLAGS": runner.xla_flags("--xla_force_host_platform_device_count=2")}
    proc = subprocess.run([sys.executable, *command, "--data", str(tmp_path / "data.npz"), "--config", config,
                           "--out", str(tmp_path / "w.npz")], capture_output=True, text=True, env=env)
    # (on a CPU with oneDNN's custom ops, TensorFlow's import logs a line that speaks of "round-off errors")
    said = [line for line in proc.stderr.splitlines() if ": error:" in line or "Traceback" in line]
    assert proc.returncode == 2 and len(said) == 1 and message in said[0], proc.stderr[-2000:]
    assert proc.stderr.splitlines()[-1] == said[0] and "--- process" not in proc.stderr  # no log of every process
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.npz"]


@pytest.mark.parametrize("engine, command, prog", [
    ("jax", ["-m", "native.jax.sharded", "--processes", "2"], "python -m native.jax.sharded"),
    ("tensorflow", ["-m", "native.tensorflow.mirrored", "--replicas", "2"], "python -m native.tensorflow.mirrored"),
    # a rank, as torchrun starts it: it says why before it joins the others
    ("torch", ["-m", "native.torch.ddp"], "torchrun ... -m native.torch.ddp"),
])
def test_each_launcher_says_what_is_wrong_in_one_line_and_exits_2(har, tmp_path, engine, command, prog):
    import subprocess
    import sys

    from keras_side.backend import engine_environment

    har.save(tmp_path / "data.npz")
    proc = subprocess.run([sys.executable, *command, "--data", str(tmp_path / "data.npz"), "--config",
                           '{"optimiser": "sgd"}', "--out", str(tmp_path / "w.npz")], capture_output=True, text=True,
                          env=engine_environment(engine) | {"TF_CPP_MIN_LOG_LEVEL": "3"})
    said = [line for line in proc.stderr.splitlines() if "error" in line.lower() or "Traceback" in line]
    assert proc.returncode == 2 and len(said) == 1, proc.stderr[-2000:]
    assert said[0].startswith(f"{prog}: error: --config: 'optimiser' is not a field of the training spec (did you "
                              "mean 'optimizer'?)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.npz"]
