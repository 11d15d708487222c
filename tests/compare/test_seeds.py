"""Seed noise (`native-loops seeds`, the seed_noise checks) and the hyperparameter sweep (`native-loops sweep`)."""
import json

import numpy as np
import pytest

from compare import cli
from compare.referee import seed_noise
from compare.referee.seed_noise import Runs, Spread


def spread(engine, seeds, default_loss, default_slopes, rng=None):
    many = None
    if seeds:
        rng = rng or np.random.default_rng(0)
        many = Runs(0.17 + 0.001 * rng.random(seeds), 0.4 + 0.05 * rng.normal(size=(seeds, 3)))
    return Spread(engine, many, Runs(np.array([default_loss]), np.array([default_slopes])))


def test_runs_inside_the_seed_spread_pass_and_the_tolerance_is_the_99th_percentile():
    spreads = {"torch": spread("torch", 50, 0.1703, [0.4, 0.4, 0.4]),
               "jax": spread("jax", 50, 0.1705, [0.42, 0.39, 0.41], np.random.default_rng(1))}
    (loss, slopes) = seed_noise.seed_noise(spreads)
    assert loss.name == "seed_noise/torch-jax" and slopes.name == "seed_noise/torch-jax/slopes"
    assert loss.passed and slopes.passed
    assert loss.value == pytest.approx(0.0002)
    pooled = np.concatenate([seed_noise.pair_gaps(s.seeds.test_loss[:, None]) for s in spreads.values()])
    assert loss.tolerance == pytest.approx(np.percentile(pooled, 99)) and len(pooled) == 2 * 50 * 49 // 2
    assert "band: 99th percentile of 2,450 seed pairs' gaps" in loss.note
    strict, _ = seed_noise.seed_noise(spreads, seed_noise.COMPARE_PERCENTILE)  # compare's: one exit code for all
    assert strict.tolerance == pytest.approx(np.percentile(pooled, 99.9)) and "99.9th" in strict.note


def test_engines_further_apart_than_any_two_seeds_are_the_finding():
    spreads = {"torch": spread("torch", 50, 0.1703, [0.4, 0.4, 0.4]),
               "tensorflow": spread("tensorflow", 0, 0.1703, [0.4, 0.4, 1.4])}
    loss, slopes = seed_noise.seed_noise(spreads)
    assert loss.passed and not slopes.passed  # no many-model trainer on tensorflow: torch's seeds are the yardstick
    assert "on torch" in slopes.note and seed_noise.FINDING in slopes.note and "100%" in slopes.note


def test_rank_is_the_share_below():
    assert seed_noise.rank(2.0, np.array([1.0, 2.0, 3.0, 4.0])) == pytest.approx(37.5)


@pytest.mark.parametrize("args, says", [
    (["seeds", "--seeds", "1"], "--seeds must be between 15"),
    (["seeds", "--seeds", "14"], "--seeds must be between 15 and 5,000 (the tolerance is the 99th percentile"),
    (["seeds", "--engines", "mxnet"], "unknown engine(s) mxnet"),
    (["seeds", "--model", "resnet"], "unknown model 'resnet'"),
    (["seeds", "--engines", "tensorflow"], "add jax"),
    (["sweep", "--learning-rates", "0.01,-1"], "positive floats"),
    (["sweep", "--learning-rates", "fast"], "positive floats"),
    (["sweep", "--batch-sizes", "0"], "positive ints"),
    (["sweep", "--batch-sizes", "64,64"], "more than once"),
    (["sweep", "--seeds", "0"], "--seeds must be at least 1"),
    (["sweep", "--engines", "tensorflow"], "unknown engine(s) tensorflow"),
    (["sweep", "--batch-sizes", "100000"], "larger than the"),
    (["sweep", "--seeds", "5000"], "more than 5,000"),
    (["seeds", "--seeds", "2000"], "ask for fewer --seeds or --epochs"),  # batch orders past memory
    (["sweep", "--seeds", "900"], "ask for fewer --learning-rates, --seeds or --epochs"),
])
def test_bad_options_are_one_line_and_write_nothing(tmp_path, capsys, args, says):
    out = tmp_path / "run"
    assert cli.main([*args, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("native-loops: error: ") and says in err and err.count("\n") == 1, err
    assert not out.exists() and not list(tmp_path.iterdir())


def test_seeds_end_to_end(tmp_path, capsys):
    """A small run on every engine: each engine's seeds and default run in seeds.json, the checks with their
    numbers, the figure; the exit code says whether every check passed."""
    out = tmp_path / "run"
    code = cli.main(["seeds", "--seeds", "15", "--epochs", "3", "--out", str(out)])
    found = json.loads((out / "seeds.json").read_text())
    assert code == (0 if all(c["passed"] for c in found["checks"]) else 1)
    assert found["seeds"] == list(range(1, 16)) and found["seed"] == 0 and found["versions"]["keras"] == "3.15.1"
    # every option, given or by default: what reproduces the run with its seed (the data's asset, split, end too)
    assert found["options"] | {"out": None} == {
        "asset": "indice", "command": "seeds", "data": None, "end": None, "engines": "torch,jax,tensorflow",
        "epochs": 3, "model": "har", "out": None, "seed": 0, "seeds": 15, "split": "2018-01-01",
        "validation": "last-year"}
    assert found["engines"]["jax"]["seeds"] == found["engines"]["torch"]["seeds"] == 15
    assert "seeds" not in found["engines"]["tensorflow"]  # its default run only, judged against the others'
    assert len(found["checks"]) == 6 and all(c["tolerance"] > 0 for c in found["checks"])
    quantiles = found["engines"]["jax"]["quantiles"]["slope_d1"]
    assert quantiles["1"] <= quantiles["50"] <= quantiles["99"]
    assert sorted(p.name for p in out.iterdir()) == ["seeds.json", "seeds.png"]
    # fit's seconds are its steps; its trace and compile apart where it compiles (JAX, TensorFlow), not on torch
    assert {e: t["fit_compile_seconds"] is None for e, t in found["timings"].items()} == {
        "torch": True, "jax": False, "tensorflow": False}
    printed = capsys.readouterr().out
    assert "the spread over seeds" in printed and " compile)" in printed


def test_sweep_end_to_end(tmp_path):
    out = tmp_path / "run"
    assert cli.main(["sweep", "--learning-rates", "0.003,0.03,1e30", "--batch-sizes", "64,256", "--seeds", "2",
                     "--epochs", "3", "--engines", "jax", "--out", str(out)]) == 0
    found = json.loads((out / "sweep.json").read_text())
    assert all(row[2] is None for row in found["engines"]["jax"]["val_mse"])  # not finite: null in standard JSON
    grid = np.array(found["engines"]["jax"]["val_mse"], dtype=float)  # null as NaN
    assert grid.shape == (2, 3) and not np.isfinite(grid[:, 2]).any()  # a rate of 1e30 diverges: left out of the best
    grid = grid[:, :2]
    assert np.all(grid > found["ols_val_mse"] * 0.9)
    assert found["best"]["jax"]["val_mse"] == pytest.approx(grid.min())
    assert grid[1, 0] > grid[0, 1]  # 3 epochs: a small rate on big batches is the furthest from OLS
    assert sorted(p.name for p in out.iterdir()) == ["sweep.json", "sweep.png"]
    assert {k: found["options"][k] for k in ("learning_rates", "engines", "asset", "split")} == {
        "learning_rates": "0.003,0.03,1e30", "engines": "jax", "asset": "indice", "split": "2018-01-01"}


def test_a_sweep_whose_every_cell_diverged_says_so(tmp_path, capsys):
    """No best cell then (it was a traceback after the whole sweep), a line that says what to change, and the figure
    with its cells marked."""
    from compare.referee import figures, report
    from compare.speed import sweep

    grid = np.array([[np.nan, np.inf], [np.nan, np.nan]])
    assert sweep.best(grid, [1e3, 1e4], [64, 256]) is None
    assert sweep.best(np.array([[np.nan, 0.5], [0.4, np.inf]]), [1e3, 1e4], [64, 256]) == {
        "batch_size": 256, "learning_rate": 1e3, "val_mse": 0.4}
    report.print_sweep({"jax": {"val_mse": grid, "seconds": 1.0, "compile_seconds": 0.5}}, {"jax": None},
                       [1e3, 1e4], [64, 256], 0.14, 2)
    assert "jax: every cell diverged (no finite validation MSE); try smaller learning rates" in capsys.readouterr().out
    figures.sweep(tmp_path / "sweep.png", {"jax": grid}, [1e3, 1e4], [64, 256], 0.14, {"jax": None})
    assert (tmp_path / "sweep.png").stat().st_size > 0


def test_a_sweep_of_one_seed_on_an_engine_that_compiles_nothing_says_so_plainly(capsys):
    """It printed "mean of 1 seeds" and, for torch's eager loop, "0.00 s compiling"."""
    from compare.referee import report

    grid = np.array([[0.2, 0.3]])
    best = {"batch_size": 64, "learning_rate": 1e-3, "val_mse": 0.2}
    report.print_sweep({"torch": {"val_mse": grid, "seconds": 1.0, "compile_seconds": None},
                        "jax": {"val_mse": grid, "seconds": 1.0, "compile_seconds": 0.5}},
                       {"torch": best, "jax": best}, [1e-3, 1e-2], [64], 0.14, 1)
    out = " ".join(capsys.readouterr().out.split())
    assert "torch: validation MSE (log RV²), one seed; OLS" in out and "seeds" not in out
    assert "torch: best lr 0.001, batch size 64: 0.20000 (+42.86% against OLS); 1.00 s training jax:" in out
    assert "1.00 s training, 0.50 s compiling" in out


def test_the_seeds_figure_marks_olss_loss_and_slopes(monkeypatch, tmp_path):
    """Each panel has a dashed black line at OLS's value: its test MSE, or its slope of that feature."""
    from compare.data.reference import Ols
    from compare.referee import figures

    rng = np.random.default_rng(0)
    runs = Runs(rng.normal(0.17, 0.001, 50), rng.normal(0.3, 0.1, (50, 3)))
    spreads = {"torch": Spread("torch", runs, Runs(np.array([0.17]), np.array([[0.41, 0.26, 0.23]])))}
    ols = Ols(intercept=0.0, slopes=np.array([0.42, 0.257, 0.24]), std_errors=np.ones(3), features=("d1", "s5", "m22"),
              train_mse=0.17, test_mse=0.1693)
    saved = []
    monkeypatch.setattr(figures, "_save", lambda fig, path: saved.append(fig))
    figures.seeds(tmp_path / "seeds.png", spreads, ("d1", "s5", "m22"), "har", ols)
    dashed = [[line.get_xdata()[0] for line in ax.get_lines() if line.get_linestyle() == "--"]
              for ax in saved[0].axes]
    assert dashed == [[0.1693], [0.42], [0.257], [0.24]]
