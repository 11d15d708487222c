import json

import numpy as np
import pandas as pd
import pytest

from compare import cli, data
from compare import walk_forward as wf
from compare.tolerances import SHARDED_ATOL, WALK_FORWARD_MSE_RTOL
from keras_side.config import TrainConfig


@pytest.fixture(scope="module")
def windows(panel):
    return wf.build_windows(panel, ["indice", "oro"], data.DEFAULT_SPLIT, None)


def test_windows_expand_and_never_look_ahead(windows, panel):
    design = data.har_features(panel, "indice")
    first_test = int((design.index < pd.Timestamp(data.DEFAULT_SPLIT)).sum())
    rows = windows.mask.sum(axis=1)[windows.assets == "indice"]
    assert rows[0] == first_test and np.all(np.diff(rows) == wf.REFIT_EVERY)
    for m in range(windows.n_models):
        assert windows.dates_next[m][windows.next_mask[m]].min() == windows.refit_dates[m]
    # the last training row of each model is the day before its first forecast day
    m = 5
    last_train = design.index[int(windows.mask[m].sum()) - 1]
    assert last_train < windows.refit_dates[m]


def test_ols_walk_forward_equals_a_direct_lstsq_per_window(windows):
    got = wf.ols_forecasts(windows)
    for m in (0, 40, windows.n_models - 1):
        n = int(windows.mask[m].sum())
        design = np.column_stack([np.ones(n), windows.raw_x[m, :n]])
        coef, *_ = np.linalg.lstsq(design, windows.raw_y[m, :n], rcond=None)
        live = windows.next_mask[m]
        want = np.column_stack([np.ones(live.sum()), windows.raw_x_next[m, live]]) @ coef
        np.testing.assert_allclose(got[m, live], want, rtol=1e-9)


def test_sharded_equals_unsharded_and_both_engines_track_ols(windows, tmp_path):
    result = wf.run(windows, TrainConfig(), tmp_path, devices=2, fit_refits=0)
    one, two = result["forecasts"]["jax-vmap-1dev"], result["forecasts"]["jax-vmap-2dev"]
    np.testing.assert_allclose(one[windows.next_mask], two[windows.next_mask], atol=SHARDED_ATOL, rtol=0)
    assert result["timing"]["jax-vmap-2dev"]["devices"] == 2
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
    assert set(summary["oos_mse"]["ols"]) == {"bono"}
    timing = summary["walk_forward"]
    assert timing["jax-vmap-1dev"]["models_per_s"] > 0 and timing["torch-vmap"]["models_per_s"] > 0
    assert "extrapolated" in timing["keras-jax-fit-extrapolated"]["note"]
    assert (out / "forecasts.png").read_bytes()[:4] == b"\x89PNG"
    assert "bono" in capsys.readouterr().out


def test_walk_forward_rejects_an_unknown_asset(tmp_path, capsys):
    assert cli.main(["walk-forward", "--assets", "bitcoin", "--out", str(tmp_path / "run")]) == 2
    assert "unknown asset 'bitcoin'" in capsys.readouterr().err
