import json
import os

import numpy as np
import pandas as pd
import pytest

from compare import cli
from compare.data import panel as data
from compare.speed import walk_forward as wf
from compare.referee.tolerances import SHARDED_ATOL, WALK_FORWARD_MSE_RTOL
from keras_side import cores
from keras_side.spec import TrainConfig


@pytest.fixture(scope="module")
def windows(panel):
    return wf.build_windows(panel, ["indice", "oro"], data.DEFAULT_SPLIT, None)


def test_windows_expand_and_never_look_ahead(windows, panel):
    design = data.har_features(panel, "indice")
    first_test = int((design.index < pd.Timestamp(data.DEFAULT_SPLIT)).sum())
    i = list(windows.assets).index("indice")
    rows = windows.rows[i][windows.live[i]]
    assert rows[0] == first_test and np.all(np.diff(rows) == wf.REFIT_EVERY)
    for a, r in np.argwhere(windows.live):
        forecast_days = windows.dates_next[a, r][windows.next_mask[a, r]]
        assert forecast_days.min() == windows.refit_dates[a, r]
        assert windows.dates[a, windows.rows[a, r] - 1] < forecast_days.min()  # the last training day comes before


def test_model_inputs_are_scaled_with_the_first_training_window_only(windows):
    inputs = windows.model_inputs()
    first = windows.rows[0, 0]
    np.testing.assert_allclose(inputs["x"][0, :first].mean(0), 0, atol=1e-5)
    np.testing.assert_allclose(inputs["x"][0, :first].std(0), 1, atol=1e-5)
    later = windows.x.copy()
    later[:, first:] += 100.0  # whatever comes after the training period changes nothing in it
    changed = wf.Windows(windows.assets, later, windows.y, windows.dates, windows.length, windows.rows)
    np.testing.assert_array_equal(changed.model_inputs()["x"][:, :first], inputs["x"][:, :first])


def test_ols_walk_forward_equals_a_direct_lstsq_per_window(windows):
    got = wf.ols_forecasts(windows)
    for a, r in ((0, 0), (0, 40), (1, windows.live[1].sum() - 1)):
        n = windows.rows[a, r]
        design = np.column_stack([np.ones(n), windows.x[a, :n]])
        coef, *_ = np.linalg.lstsq(design, windows.y[a, :n], rcond=None)
        live = windows.next_mask[a, r]
        want = np.column_stack([np.ones(live.sum()), windows.x_next[a, r, live]]) @ coef
        np.testing.assert_allclose(got[a, r, live], want, rtol=1e-9)
        np.testing.assert_array_equal(windows.y_next[a, r, live], windows.y[a, n: n + live.sum()])


def test_sharded_equals_unsharded_and_both_engines_track_ols(windows, tmp_path):
    result = wf.run(windows, TrainConfig(), tmp_path, devices=2, fit_refits=0)
    one, two = result["forecasts"]["jax-vmap-1dev"], result["forecasts"]["jax-vmap-2dev"]
    np.testing.assert_allclose(one[windows.next_mask], two[windows.next_mask], atol=SHARDED_ATOL, rtol=0)
    assert np.isfinite(one[windows.next_mask]).all()
    assert result["timing"]["jax-vmap-2dev"]["devices"] == 2 and result["notes"] == []
    if hasattr(os, "sched_setaffinity"):  # pinned: one core each, a core a device for the sharded run (Linux)
        usable = cores.timing_cpus()
        assert [result["timing"][n]["cpus"] for n in ("jax-vmap-1dev", "jax-vmap-2dev", "torch-vmap")] == [
            usable[-1:], sorted(usable[-2:]), usable[-1:]]
    ols = wf.oos_mse(windows, wf.ols_forecasts(windows))
    for name in ("jax-vmap-1dev", "torch-vmap"):  # 40 epochs of Adam per window reach OLS's accuracy
        got = wf.oos_mse(windows, result["forecasts"][name])
        for asset in ols:
            assert abs(got[asset] / ols[asset] - 1) < WALK_FORWARD_MSE_RTOL, (name, asset)


def test_walk_forward_command(tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.main(["walk-forward", "--assets", "bono", "--epochs", "2", "--devices", "1", "--fit-refits", "1",
                     "--out", str(out)]) == 0
    summary = json.loads((out / "walk_forward.json").read_text())
    assert summary["models"] == 97 and set(summary["oos_mse"]) == {"ols", "jax-vmap-1dev", "torch-vmap"}
    assert {k: summary["options"][k] for k in ("assets", "devices", "fit_refits", "split", "end", "seed")} == {
        "assets": "bono", "devices": 1, "fit_refits": 1, "split": "2018-01-01", "end": None, "seed": 0}
    assert set(summary["oos_mse"]["ols"]) == {"bono"}
    timing = summary["walk_forward"]
    assert timing["jax-vmap-1dev"]["models_per_s"] > 0 and timing["torch-vmap"]["models_per_s"] > 0
    assert "extrapolated" in timing["keras-jax-fit-extrapolated"]["note"]
    assert (out / "forecasts.png").read_bytes()[:4] == b"\x89PNG"
    assert sorted(p.name for p in out.iterdir()) == ["forecasts.png", "walk_forward.json"]  # no windows.npz, engines/
    assert "bono" in capsys.readouterr().out


def test_walk_forward_rejects_an_unknown_asset(tmp_path, capsys):
    assert cli.main(["walk-forward", "--assets", "bitcoin", "--out", str(tmp_path / "run")]) == 2
    assert "unknown asset(s) bitcoin; --assets takes" in capsys.readouterr().err


def test_an_asset_with_fewer_refits_is_padded_and_left_out(panel):
    short = panel[(panel["activo"] != "oro") | (panel["fecha"] < pd.Timestamp("2024-06-01"))]
    w = wf.build_windows(short, ["indice", "oro"], data.DEFAULT_SPLIT, None)
    assert w.live[0].all() and not w.live[1].all() and w.live[1].sum() < w.live[0].sum()
    assert w.n_models == w.live.sum() and not w.next_mask[1][~w.live[1]].any()
    assert w.dates_next[1][w.next_mask[1]].max() < np.datetime64("2024-06-01")
    ols = wf.ols_forecasts(w)
    assert np.isfinite(ols[w.next_mask]).all() and all(np.isfinite(v) for v in wf.oos_mse(w, ols).values())


def test_refittable_names_each_asset_that_cannot_be_refit_and_why(panel):
    short = panel[(panel["activo"] != "oro") | (panel["fecha"] >= pd.Timestamp("2018-03-01"))]
    ready, unready = wf.refittable(short, ["bono", "indice", "oro"], data.DEFAULT_SPLIT, None)
    assert ready == ["bono", "indice"] and list(unready) == ["oro"]
    assert unready["oro"].startswith("asset 'oro': split date 2018-01-01 is outside the data (2018-04-")
    assert wf.build_windows(short, ready, data.DEFAULT_SPLIT, None).n_models > 0


def test_a_sharded_run_without_its_devices_is_skipped_and_said(panel, tmp_path, monkeypatch):
    monkeypatch.setattr(wf, "host_devices_flag", lambda count: "--xla_force_host_platform_device_count=1")
    w = wf.build_windows(panel, ["bono"], data.DEFAULT_SPLIT, None)
    result = wf.run(w, TrainConfig(epochs=1), tmp_path, engines=("jax",), devices=2, fit_refits=0)
    assert set(result["timing"]) == {"jax-vmap-1dev"}
    assert result["notes"] == ["fewer than 2 JAX devices here: the run sharded over 2 was skipped"]


def test_a_workers_host_devices_join_its_one_thread_flags(tmp_path, monkeypatch):
    """The walk-forward asks its JAX worker for host devices through XLA_FLAGS, which replaced the flags that keep
    every worker on one thread (JAX's many-model timings ran on XLA's default threads, torch's on one). Now they
    join, and in either order XLA reads both: the bare `intra_op_parallelism_threads=1` the one-thread flags held
    until this round is no XLA flag, and XLA read no flag after it (a device count put there left one device)."""
    import subprocess
    import sys

    from compare.engines import runner

    seen = {}

    class Popen:
        def __init__(self, command, env, **kwargs):
            seen.update(env)
            self.pid = None

    monkeypatch.setattr(runner.subprocess, "Popen", Popen)
    runner.Worker("jax", tmp_path, {"XLA_FLAGS": wf.host_devices_flag(2)})
    assert set(seen["XLA_FLAGS"].split()) == {*runner.XLA_ONE_THREAD.split(), wf.host_devices_flag(2)}
    monkeypatch.undo()  # subprocess.Popen itself again
    for flags in (seen["XLA_FLAGS"], f"{runner.XLA_ONE_THREAD} {wf.host_devices_flag(2)}"):  # either order
        count = subprocess.run([sys.executable, "-c", "import jax; print(len(jax.devices('cpu')))"],
                               env=seen | {"XLA_FLAGS": flags}, capture_output=True, text=True)
        assert count.stdout.split()[-1:] == ["2"], (flags, count.stderr[-2000:])
