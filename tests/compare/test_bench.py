"""The benchmark's output, never its timings: those are printed as ratios, not asserted."""
import json
import os
import re

import pytest

from compare import cli
from compare.data import panel as har_data
from keras_side import cores
from keras_side.spec import TrainConfig
from tests.tiers import FULL


def test_bench_json_has_every_path_with_positive_timings(tmp_path, capsys, panel, har):
    out = tmp_path / "bench.json"
    zoo_model = ["--models", "conv1d"] if FULL else []  # make test-full: a zoo model's table too
    assert cli.main(["bench", "--engines", "torch,jax", "--epochs", "2", "--repeats", "1", *zoo_model,
                     "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert set(report["paths"]) == {"keras-torch", "torch-native", "torch-native-fast", "torch-native-compile", "torch-native-engine",
                                    "torch-native-compile-engine", "keras-jax", "jax-native", "jax-native-fast",
                                    "jax-native-scan", "numpy-floor", "torch-raw", "jax-raw", "jax-raw-scan"}
    for row in report["paths"].values():
        assert row["median_ms"] > 0 and 0 < row["min_ms"] <= row["median_ms"] and row["ratio_vs_numpy"] > 0
    assert report["paths"]["jax-native-scan"]["compile_ms"] > 0 and report["paths"]["keras-jax"]["ratio_vs_fit"] == 1
    # the fused scan's first run, which trains nothing, in its compile time and apart: no other path has one
    scan = report["paths"]["jax-native-scan"]
    assert 0 < scan["first_run_ms"] < scan["compile_ms"]
    assert [p for p, row in report["paths"].items() if row["first_run_ms"]] == ["jax-native-scan"]
    assert report["paths"]["torch-native-compile"]["compile_ms"] > 0
    # each path's floor, the same step without Keras, and how many times it costs
    assert report["paths"]["jax-native-scan"]["floor"] == "jax-raw-scan"
    assert report["paths"]["torch-native"]["floor"] == "torch-raw"
    assert report["paths"]["keras-jax"]["floor"] == "jax-raw"
    assert all(row["times_floor"] > 0 for row in report["paths"].values() if row["floor"])
    assert report["paths"]["torch-raw"]["ratio_vs_fit"] > 0  # the floor against its engine's fit too
    assert set(report["torch_stages_us"]) == {"keras", "raw"}
    assert report["steps"] == 2 * -(-har.n_train // 128) and report["machine"]["versions"]["keras"] == "3.15.1"
    walk = report["walk_forward"]
    assert walk["jax-vmap-1dev"]["models"] == walk["jax-vmap-2dev"]["models"] > 500
    assert all(w["seconds"] > 0 and w["models_per_s"] > 0 for w in walk.values())
    assert walk["keras-jax-fit-extrapolated"]["measured_refits"] == 2 and walk["torch-vmap"]["seconds"] > 0
    # every path on one core: every thread of each worker pinned there for its timed request, and the floor (Linux)
    cpu = cores.timing_cpus()[-1] if hasattr(os, "sched_setaffinity") else None
    pinned = None if cpu is None else [cpu]
    assert report["cpus"] == {"torch": pinned, "jax": pinned, "numpy": pinned} and not report["incomplete"]
    printed = capsys.readouterr().out
    assert f"each path alone on CPU {cpu} (every thread of its worker" in printed or cpu is None
    assert "jax-native-scan vs fit" in printed
    assert "jax-native-scan: its program's first run, with no epoch in it, took" in printed
    assert re.search(r"jax-native-scan vs numpy \([\d.]+× with its first run\)", printed)
    # progress while it runs: a bar per engine counting its timed runs (paths × repeats), the floor, the walk-forward
    assert "torch: torch-raw" in printed and "numpy: numpy-floor" in printed
    assert "where the torch step's time goes" in printed
    assert "walk-forward: 582 models on jax and torch" in printed
    if FULL:  # --models: the zoo table, the same schema per model, the ratios to its engine's fit, its floors
        zoo = report["zoo"]["conv1d"]
        assert set(zoo["paths"]) == {"keras-torch", "torch-native", "torch-native-fast", "torch-native-compile",
                                     "torch-raw", "keras-jax", "jax-native", "jax-native-fast", "jax-native-scan",
                                     "jax-raw", "jax-raw-scan"}
        assert all(row["median_ms"] > 0 and row["ratio_vs_fit"] > 0 and row["ratio_vs_numpy"] is None
                   for row in zoo["paths"].values())
        assert zoo["paths"]["jax-native-scan"]["floor"] == "jax-raw-scan" and zoo["paths"]["jax-raw-scan"]["compile_ms"]
        sequences = har_data.prepare_kind(panel, "sequence")
        assert zoo["steps"] == 2 * -(-sequences.n_train // 128) and zoo["cpus"] == {"torch": pinned, "jax": pinned}
        assert "conv1d: torch-native vs fit (its floor, torch-raw: " in printed
        assert "conv1d: torch-native-compile vs fit" in printed and zoo["paths"]["torch-native-compile"]["compile_ms"]
        assert "the zoo: the same model through fit and by hand" in printed and "floor × fit" in printed
        # the zoo's model's bar names the last run done, each engine's last being a floor (either engine may go last)
        assert re.search("zoo conv1d: (jax jax-raw-scan|torch torch-raw)", printed)
    else:
        assert "zoo" not in report or not report["zoo"]


def test_an_unknown_model_is_one_line_before_anything_runs(capsys):
    assert cli.main(["bench", "--models", "resnet"]) == 2
    err = capsys.readouterr().err
    assert "unknown model(s) resnet" in err and err.count("\n") == 1


@pytest.mark.parametrize("args, message", [
    (["--json", "{tmp}/mine.json"], "--json '{tmp}/mine.json' already exists; choose a new file (nothing is "
                                    "overwritten)"),
    (["--json", "{tmp}/data.csv"], "the timings are written as JSON; give a file name ending in .json"),
    (["--models", "all,har"], "--models all names every model already; give it alone, or list the models"),
    (["--models", "resnet"], "unknown model(s) resnet; --models takes a comma-separated list of har, "),
])
def test_bad_options_are_one_line_before_anything_runs(tmp_path, capsys, args, message):
    """An existing file is never overwritten (a data file named by mistake would be lost after the whole run)."""
    (tmp_path / "mine.json").write_text("{}")
    (tmp_path / "data.csv").write_text("fecha\n")
    assert cli.main(["bench"] + [a.replace("{tmp}", str(tmp_path)) for a in args]) == 2
    err = capsys.readouterr().err
    assert message.replace("{tmp}", str(tmp_path)) in err and err.count("\n") == 1, err
    assert (tmp_path / "mine.json").read_text() == "{}" and (tmp_path / "data.csv").read_text() == "fecha\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.csv", "mine.json"]


def test_a_zoo_model_has_floors_only_where_they_are_its_step():
    from compare.speed import bench

    assert "jax-raw-scan" in bench.zoo_paths("jax", "lstm") and "torch-raw" in bench.zoo_paths("torch", "conv1d")
    # no raw version of mlp_l2; the HAR's zoo entry counts an MAE metric each step, which its floor does not
    assert not {"jax-raw", "torch-raw"} & {*bench.zoo_paths("jax", "mlp_l2"), *bench.zoo_paths("torch", "har")}
    # dropout_mlp's masks written by hand on JAX only (its seed state), not as torch's loop draws them
    assert "jax-raw-scan" in bench.zoo_paths("jax", "dropout_mlp") and "torch-raw" not in bench.zoo_paths(
        "torch", "dropout_mlp")
    assert bench.zoo_paths("tensorflow", "lstm") == ["keras-tensorflow", "tensorflow-native"]  # no floor: a KeyError


def test_an_engine_that_failed_in_a_shared_pool_is_incomplete_for_every_later_model(har, tmp_path):
    """The bench reuses one worker per engine for the HAR and each zoo model: an engine whose worker failed earlier
    is asked nothing and is named as incomplete for this model too, not left out without a word."""
    from compare.speed import bench

    class Pool:
        failed, asked = {"torch": "worker exited (code 1)"}, []

        def each(self, cmd, request_for, on_event, **_):
            self.asked.append(cmd)  # the real pool asks only its live workers: here, none
            return {}

        def started(self):
            self.asked.append("started")

    pool = Pool()
    result = bench.run(har, TrainConfig(epochs=1), ["torch", "jax"], tmp_path, 1, model="conv1d", pool=pool)
    assert result["incomplete"] == {"torch": "worker exited (code 1)"} and pool.asked == ["started", "compare.speed.tasks:bench"]
