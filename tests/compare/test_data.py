import re

import numpy as np
import pandas as pd
import pytest

from compare.data import panel as data, synthetic
from compare.errors import HarDataError


def test_generator_is_deterministic_and_seeded(tmp_path):
    a, b, c = tmp_path / "a.parquet", tmp_path / "b.parquet", tmp_path / "c.parquet"
    synthetic.write_parquet(synthetic.simulate(7), a, seed=7)
    synthetic.write_parquet(synthetic.simulate(7), b, seed=7)
    synthetic.write_parquet(synthetic.simulate(8), c, seed=8)
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != c.read_bytes()


def test_panel_shape(panel):
    assert list(panel.columns) == list(data.COLUMNS)
    counts = panel.groupby("activo").size()
    assert sorted(counts.index) == sorted(synthetic.ASSETS)
    assert (counts.between(4400, 4700)).all()  # "about 4,500 sessions per asset"
    assert (panel["rv_5min"] > 0).all() and np.isfinite(panel["rv_5min"]).all()
    assert panel["fecha"].min() >= pd.Timestamp(synthetic.START)
    assert panel["fecha"].max() <= pd.Timestamp(synthetic.END)
    assert not (panel["fecha"].dt.month.eq(12) & panel["fecha"].dt.day.eq(25)).any()


def test_parquet_round_trip_through_loader(tmp_path, panel):
    path = tmp_path / "p.parquet"
    synthetic.write_parquet(panel, path, seed=0)
    loaded, source = data.load_panel(path)
    assert source == str(path)
    pd.testing.assert_frame_equal(loaded, data.validate(panel))


def test_csv_loader(tmp_path, panel):
    path = tmp_path / "p.csv"
    panel.to_csv(path, index=False)
    loaded, _ = data.load_panel(path)
    np.testing.assert_allclose(loaded["rv_5min"], data.validate(panel)["rv_5min"], rtol=1e-12)


def test_no_look_ahead(panel):
    """Changing day t's target changes no feature on day t or before."""
    asset = data.DEFAULT_ASSET
    before = data.har_features(panel, asset)
    day = before.index[1000]
    changed = panel.copy()
    row = (changed["activo"] == asset) & (changed["fecha"] == day)
    changed.loc[row, "rv_5min"] *= 50.0
    changed.loc[row, "rendimiento"] = -0.5
    after = data.har_features(changed, asset)
    features = ["d1", "s5", "m22", "lev"]
    pd.testing.assert_frame_equal(before.loc[:day, features], after.loc[:day, features])
    assert after.loc[day, "y"] != before.loc[day, "y"]
    assert after.index[1001] > day and after.loc[after.index[1001], "d1"] != before.loc[before.index[1001], "d1"]


def test_features_are_har_means(panel):
    one = panel[panel["activo"] == "oro"].set_index("fecha")
    log_rv = np.log(one["rv_5min"].to_numpy())
    design = data.har_features(panel, "oro")
    t = one.index.get_loc(design.index[100])
    row = design.iloc[100]
    np.testing.assert_allclose([row.d1, row.s5, row.m22, row.y],
                               [log_rv[t - 1], log_rv[t - 5:t].mean(), log_rv[t - 22:t].mean(), log_rv[t]])
    assert row.lev == min(one["rendimiento"].iloc[t - 1], 0.0)


def test_standardization_uses_training_rows_only(panel):
    base = data.prepare(panel)
    changed = panel.copy()
    test_rows = (changed["activo"] == "indice") & (changed["fecha"] >= "2020-01-01")
    changed.loc[test_rows, "rv_5min"] *= 3.0
    after = data.prepare(changed)
    for field in ("x_mean", "x_std", "y_mean", "y_std"):
        np.testing.assert_array_equal(getattr(base.scaling, field), getattr(after.scaling, field))
    assert not np.array_equal(base.y_test, after.y_test)
    np.testing.assert_allclose(base.x_train.mean(axis=0), 0, atol=1e-6)
    np.testing.assert_allclose(base.y_train.std(), 1, atol=1e-6)


def test_split_and_types(har):
    assert har.x_train.dtype == np.float32 and har.y_train.shape == (har.n_train, 1)
    assert har.features == data.HAR and har.validation == "last-year"
    assert 2200 < har.n_train < 2300 and 240 < har.n_val < 270 and 1900 < har.n_test < 2100


def test_validation_is_the_year_before_the_split_left_out_of_training(panel):
    """Three splits by date: train before 2017-01-01, validation in 2017, test from 2018; with
    validation="test" training keeps 2017 and the validation rows are the test split (the lesson's curve)."""
    design = data.har_features(panel, "indice")
    train, val, test = data.split_three(design, "2018-01-01", None)
    assert train.index.max() < pd.Timestamp("2017-01-01") <= val.index.min()
    assert val.index.max() < pd.Timestamp("2018-01-01") <= test.index.min()
    everything, lesson_val, lesson_test = data.split_three(design, "2018-01-01", None, "test")
    assert len(everything) == len(train) + len(val) and lesson_val is lesson_test
    har, lesson = data.prepare(panel), data.prepare(panel, validation="test")
    np.testing.assert_array_equal(lesson.x_val, lesson.x_test)
    assert har.n_train + har.n_val == lesson.n_train and har.n_test == lesson.n_test


def test_the_validation_year_does_not_move_the_scaling(panel):
    """Standardization uses the rows a model trains on: changing the validation year changes no statistic."""
    changed = panel.copy()
    year = (changed["activo"] == "indice") & (changed["fecha"] >= "2017-01-01") & (changed["fecha"] < "2018-01-01")
    changed.loc[year, "rv_5min"] *= 3.0
    base, after = data.prepare(panel), data.prepare(changed)
    for field in ("x_mean", "x_std", "y_mean", "y_std"):
        np.testing.assert_array_equal(getattr(base.scaling, field), getattr(after.scaling, field))
    assert not np.array_equal(base.y_val, after.y_val)


def test_two_horizon_targets_are_the_day_and_the_next_five_days(panel):
    """Two targets for a two-output model: log RV_t and the mean of log RV over t..t+4, both scaled as y."""
    two = data.prepare_horizons(panel)
    assert two.outputs == 2 and [y.shape for y in two.y_train] == [(two.n_train, 1)] * 2
    one = panel[panel["activo"] == "indice"].set_index("fecha")
    log_rv = np.log(one["rv_5min"].to_numpy())
    t = one.index.get_loc(data.har_features(panel, "indice").index[0])
    day, week = (float(y[0, 0]) * two.scaling.y_std + two.scaling.y_mean for y in two.y_train)
    np.testing.assert_allclose([day, week], [log_rv[t], log_rv[t:t + data.HORIZON_DAYS].mean()], rtol=1e-5)
    # No target reaches into the next split: training and validation each end HORIZON_DAYS - 1 days earlier.
    har = data.prepare(panel)
    assert (two.n_train, two.n_val) == (har.n_train - data.HORIZON_DAYS + 1, har.n_val - data.HORIZON_DAYS + 1)


def test_a_data_set_round_trips_through_its_file(panel, tmp_path):
    """What a worker reloads is what the referee saved: several inputs, several targets, weights, the splits."""
    for prepared in (data.prepare_horizons(panel), data.prepare_panel(panel), data.prepare_recent(panel)):
        prepared.save(tmp_path / "d.npz")
        back = type(prepared).load(tmp_path / "d.npz")
        for name in ("x_train", "y_train", "x_val", "y_val", "x_test", "y_test", "w_train"):
            want, got = getattr(prepared, name), getattr(back, name)
            assert type(got) is type(want), name
            for a, b in zip(*(v if isinstance(v, tuple) else (v,) for v in (want, got)), strict=True):
                np.testing.assert_array_equal(a, b)
        assert back.validation == prepared.validation and back.outputs == prepared.outputs


def test_multi_input_layouts(panel):
    lev = data.prepare(panel, leverage=True)
    assert isinstance(lev.x_train, tuple) and [a.shape[1] for a in lev.x_train] == [3, 1]
    pooled = data.prepare_panel(panel)
    assert pooled.x_train[1].dtype == np.int32
    assert sorted(np.unique(pooled.x_train[1])) == list(range(6))


def test_scaling_maps_back_to_original_units(har, ols_fit):
    """The standardized least-squares fit, mapped back, is the original-units OLS."""
    design = np.column_stack([np.ones(har.n_train), har.x_train.astype(np.float64)])
    coef, *_ = np.linalg.lstsq(design, har.y_train[:, 0].astype(np.float64), rcond=None)
    intercept, slopes = har.scaling.to_original(coef[1:], coef[:1])
    np.testing.assert_allclose(slopes, ols_fit.slopes, atol=1e-5)
    np.testing.assert_allclose(intercept, ols_fit.intercept, atol=1e-4)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda f: f.rename(columns={"rv_5min": "rv5min"}), "missing column(s) 'rv_5min' (found 'rv5min'"),
        (lambda f: f.assign(rv_5min=f["rv_5min"].where(f.index % 1000 != 5, -1.0)), "'rv_5min' has 28 missing or"),
        (lambda f: f.assign(rv_5min=f["rv_5min"].where(f.index != 3, np.nan)), "'rv_5min' has 1 missing"),
        (lambda f: pd.concat([f, f.iloc[[10]]]), "1 duplicate (fecha, activo) rows"),
        (lambda f: f.assign(fecha="not a date"), "column 'fecha' has values that are not dates"),
        (lambda f: f.assign(fecha=np.arange(len(f))), "column 'fecha' holds numbers (0, ...), not dates"),
        # the same day at another hour: a second row for that day, not a day of its own
        (lambda f: pd.concat([f, f.iloc[[10]].assign(fecha=f["fecha"].iloc[10] + pd.Timedelta(hours=15))]),
         "1 duplicate (fecha, activo) rows"),
        (lambda f: f.assign(rendimiento=f["rendimiento"] > 0), "column 'rendimiento' holds True/False, not numbers"),
        (lambda f: f.assign(rendimiento=(f["rendimiento"] > 0).astype(object).where(f.index != 4)),  # one missing
         "column 'rendimiento' holds True/False, not numbers"),
        (lambda f: f.assign(fecha=f.index % 2 == 0), "column 'fecha' holds True/False, not dates"),
        # pandas would read these month first, and a day over 12 day first: 2 January as 1 February, and so on
        (lambda f: f.assign(fecha=f["fecha"].dt.strftime("%d/%m/%Y")),
         "column 'fecha' has dates like '02/01/2008', which read day first or month first as well; write them as "
         "YYYY-MM-DD"),
        (lambda f: f.assign(fecha=f["fecha"].dt.strftime("%m.%d.%y")), "column 'fecha' has dates like '01.02.08'"),
        (lambda f: pd.concat([f, f[["rv_5min"]]], axis=1), "column(s) 'rv_5min' appear more than once"),
    ],
    ids=["misspelled", "non-positive", "nan", "duplicate", "bad-date", "numbers-as-dates", "same-day", "booleans",
         "booleans-and-missing", "boolean-dates", "day-first", "month-first", "repeated-column"],
)
def test_validate_rejects(panel, mutate, message):
    with pytest.raises(HarDataError) as err:
        data.validate(mutate(panel.copy()))
    assert message in str(err.value)


def test_an_input_that_does_not_vary_over_the_training_rows_is_named(panel):
    """Only non-negative returns before the validation year: the leverage input (the negative part) is zero there, so
    it cannot be scaled (it was NaN); the HAR without it is fine."""
    p = panel.copy()
    early = (p["activo"] == "indice") & (p["fecha"] < "2017-01-01")
    p.loc[early, "rendimiento"] = p.loc[early, "rendimiento"].abs()
    with pytest.raises(HarDataError, match="asset 'indice': lev does not vary over the 2,263 training rows"):
        data.prepare(p, leverage=True)
    assert np.isfinite(data.prepare(p).x_train).all()


def test_referee_modules_do_not_import_keras():
    """The referee process never picks a backend: only its workers do."""
    import subprocess
    import sys

    code = ("import sys, compare.cli, compare.referee.checks, compare.engines.runner, compare.referee.figures; "
            "print('keras' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("change, message", [
    (lambda h: {"y_train": h.y_train[:200]}, "train split has arrays of different lengths (x_train: 2263, y_train: "
                                             "200)"),  # a loop trained on the first 200 rows, without a word
    (lambda h: {"x_val": h.x_val[:10]}, "val split has arrays of different lengths"),
    (lambda h: {"w_train": np.ones(5)}, "w_train: 5"),
    (lambda h: {"x_train": h.x_train[:0], "y_train": h.y_train[:0]}, "HarData has no training rows"),
    (lambda h: {"x_test": np.where(np.arange(len(h.x_test))[:, None] == 4, np.nan, h.x_test)},
     "HarData's x_test holds NaN or inf (first in row 4)"),  # a loop returned NaN weights, without a word
    (lambda h: {"w_train": np.full(len(h.y_train), np.inf)}, "HarData's w_train holds NaN or inf (first in row 0)"),
])
def test_a_data_set_no_path_can_train_on_is_one_error(har, change, message):
    import dataclasses

    with pytest.raises(ValueError, match=re.escape(message)):
        dataclasses.replace(har, **change(har))


def test_a_tuple_of_one_array_is_that_array(har):
    """As Keras takes a list of one input or target: a loop read `(y,)` as several targets and failed (torch's
    "unsupported operand type(s) for -: 'tuple' and 'Tensor'")."""
    import dataclasses

    one = dataclasses.replace(har, x_train=(har.x_train,), y_train=(har.y_train,), y_test=(har.y_test,))
    assert one.x_train is har.x_train and one.y_train is har.y_train and one.y_test is har.y_test
    assert one.outputs == 1 and one.n_train == har.n_train


def test_save_npz_leaves_nothing_beside_a_path_it_cannot_write(tmp_path):
    """Whole or not at all: a failed rename (here onto a folder) removes the temporary file it wrote first."""
    from keras_side.files import save_npz

    (tmp_path / "taken").mkdir()
    with pytest.raises(OSError):
        save_npz(tmp_path / "taken", w=np.zeros(3))
    assert [p.name for p in tmp_path.iterdir()] == ["taken"]
