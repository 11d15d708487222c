"""Bad input through the CLI: one line on stderr naming problem and fix, exit 2, nothing written."""
import os
import re
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from compare import cli
from compare.data import synthetic


@pytest.fixture(scope="module")
def files(tmp_path_factory, panel):
    folder = tmp_path_factory.mktemp("inputs")
    good = panel.copy()

    def write(name, frame):
        frame.to_parquet(folder / name, index=False)
        return str(folder / name)

    bad_rv = good.copy()
    bad_rv.loc[[40, 41, 900], "rv_5min"] = [np.nan, 0.0, -1.0]
    infinite = good.copy()
    infinite.loc[30, "rv_5min"] = np.inf
    constant = good.copy()
    constant.loc[constant["activo"] == "oro", "rv_5min"] = 1e-4
    flat = good.copy()  # constant before the validation year only: the asset as a whole is not constant
    flat.loc[(flat["activo"] == "indice") & (flat["fecha"] < "2017-01-01"), "rv_5min"] = 1e-4
    no_date, no_asset = good.copy(), good.copy()
    no_date["fecha"] = no_date["fecha"].astype(object)
    no_date.loc[[9, 12], "fecha"] = None  # read as NaT, a date of its own, until they were refused
    no_asset.loc[5, "activo"] = None
    (folder / "garbage.parquet").write_bytes(b"this is not parquet")
    good.assign(fecha=good["fecha"].dt.strftime("%d/%m/%Y")).to_csv(folder / "day_first.csv", index=False)
    pd.concat([good, good[["rv_5min"]]], axis=1).to_csv(folder / "twice.csv", index=False)  # read as 'rv_5min.1'
    return {
        "good": write("good.parquet", good),
        "missing": str(folder / "nope.parquet"),
        "garbage": str(folder / "garbage.parquet"),
        "columns": write("columns.parquet", good.rename(columns={"activo": "asset"})),
        "bad_rv": write("bad_rv.parquet", bad_rv),
        "duplicates": write("dup.parquet", good.iloc[list(range(100)) + [7]]),
        "infinite": write("infinite.parquet", infinite),
        "constant": write("constant.parquet", constant),
        "flat": write("flat.parquet", flat),
        "no_date": write("no_date.parquet", no_date),
        "no_asset": write("no_asset.parquet", no_asset),
        "day_first": str(folder / "day_first.csv"),
        "twice": str(folder / "twice.csv"),
    }


CASES = [
    (["--data", "missing"], "does not exist"),
    (["--data", "garbage"], "cannot read"),
    (["--data", "columns"], "missing column(s) 'activo'"),
    (["--data", "good", "--asset", "bitcoin"], "unknown asset 'bitcoin'; the data has accion, bono, cripto"),
    (["--data", "bad_rv"], "'rv_5min' has 3 missing or invalid values (first on"),
    (["--data", "duplicates"], "1 duplicate (fecha, activo) rows"),
    (["--data", "infinite"], "'rv_5min' has 1 missing or invalid values (first on"),
    (["--data", "constant"], "'rv_5min' is constant for asset(s) 'oro'"),
    (["--data", "flat"], "asset 'indice': d1, s5, m22, y do not vary over the 2,263 training rows (2008-02-01 to"),
    (["--data", "good", "--split", "2025-12-20"], "only "),
    (["--data", "good", "--split", "1999-01-01"], "split date 1999-01-01 is outside the data"),
    (["--data", "good", "--split", "2009-03-01"], "training (before the validation year) rows (need at least 50)"),
    (["--data", "good", "--split", "someday"], "--split 'someday' is not a date"),
    (["--data", "no_date"], "column 'fecha' has 2 empty value(s) (the first in data row 10); every row needs its date"),
    (["--data", "no_asset"], "column 'activo' has 1 empty value(s) (the first in data row 6)"),
    (["--data", "day_first"], "column 'fecha' has dates like '02/01/2008', which read day first or month first"),
    (["--data", "twice"], "column 'rv_5min' appears more than once (pandas named the second 'rv_5min.1')"),
    # values pandas reads as a Timestamp but not as a calendar day: empty or NaT, with a time zone, year -1
    (["--split", ""], "--split '' is not a date; write it as YYYY-MM-DD"),
    (["--end", "nan"], "--end 'nan' is not a date"),
    (["--split", "2018-01-01T00:00+05:00"], "--split '2018-01-01T00:00+05:00' is not a date"),
    (["--split=-1"], "--split '-1' is not a date"),
]


def resolve(args, files):
    return [files.get(a, a) for a in args]


@pytest.mark.parametrize("args, message", CASES, ids=[c[1].split()[0].strip("'") + str(i) for i, c in enumerate(CASES)])
def test_bad_input_compare(files, tmp_path, capsys, args, message):
    out = tmp_path / "run"
    code = cli.main(["compare", *resolve(args, files), "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("native-loops: error: ") and message in err and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


TRAINING_CASES = [
    (["compare", "--epochs", "0"], "--epochs must be at least 1, got 0"),
    (["train", "--path", "jax-native", "--epochs", "-2"], "--epochs must be at least 1, got -2"),
    (["bench", "--seed", "-1"], "--seed must be an integer from 0 to 2**32 - 1 (NumPy's and JAX's seeds), got -1"),
    (["walk-forward", "--epochs", "0"], "--epochs must be at least 1"),
    (["walk-forward", "--fit-refits", "-1"], "--fit-refits must be 0 or more, got -1"),
    (["walk-forward", "--devices", "0"], "--devices must be between 1 and "),
    (["walk-forward", "--assets", "bono", "--asset", "oro"], "--asset 'oro' is not among the walk-forward's assets"),
    (["compare", "--model", "resnet"], "unknown model 'resnet'; --model takes one of har, har_recent"),
    (["compare", "--quick", "--epochs", "0"], "--quick runs 5 epochs, so it cannot take --epochs"),
    (["bench", "--seed", str(2**32)], "--seed must be an integer from 0 to 2**32 - 1"),
    # the seeds a many-seed run trains after its own stay seeds too (JAX's key wraps: 2**32 + 1 drew seed 1's orders)
    (["sweep", "--seed", str(2**32 - 1), "--seeds", "2"], f"--seed {2**32 - 1}: the 2 seeds this run trains after it "
                                                         f"go past 2**32 - 1 (NumPy's and JAX's seeds); give --seed at "
                                                         f"most {2**32 - 3:,}"),
    (["seeds", "--seed", str(2**32 - 10), "--seeds", "20"], f"give --seed at most {2**32 - 21:,}"),
    (["compare", "--seed", str(2**32 - 100)], "the 500 seeds this run trains after it go past 2**32 - 1"),
    (["walk-forward", "--assets", "indice,indice"], "--assets names indice more than once"),
    (["compare", "--model", "bn_mlp", "--float64"], "--float64 checks the HAR's gradient formula"),
    # every epoch's batch order is drawn up front: a huge --epochs is refused before it fills the memory
    (["compare", "--epochs", "100000000"], "--epochs 100,000,000 over 2,263 training rows draws 226,300,000,000 rows"),
    (["train", "--path", "jax-native", "--epochs", "100000"], "ask for at most 22,094 epochs"),
    (["bench", "--epochs", "30000"], "more than the 50,000,000 held in memory"),
    (["walk-forward", "--epochs", "100000000"], "the walk-forward draws every epoch's key up front; ask for at most "
                                                "10,000,000 epochs"),
    # the panel model trains on every asset: a user's --asset (even the default's name) is refused, not ignored
    (["compare", "--model", "panel", "--asset", "indice"], "--model panel trains on every asset of the panel, so "
                                                           "--asset 'indice' would be ignored; leave --asset out"),
    (["seeds", "--model", "panel", "--asset", "oro"], "--model panel trains on every asset of the panel"),
    (["distributed", "--model", "panel", "--asset", "oro"], "--model panel trains on every asset of the panel"),
    (["zoo", "--models", "panel", "--asset", "oro"], "--models panel trains on every asset of the panel"),
    (["data", "--asset", "oro"], "data summarizes every asset, so --asset 'oro' would be ignored"),
    (["train", "--path", "jax-native", "--asset", ""], "unknown asset ''"),  # not the default asset in its place
    (["zoo", "--models", "har", "--epochs", "1000000000"], "ask for at most 22,094 epochs"),
    (["sweep", "--batch-sizes", "9" * 23], f"--batch-sizes {'9' * 23}: larger than the 2,263 training rows"),
    (["walk-forward", "--fit-refits", "10000"], "--fit-refits 10,000: there are 582 refits to time"),
    (["walk-forward", "--devices", "100000"], "of this machine's"),
    (["train", "--path", "jax-native", "--checkpoint", ""], "argument --checkpoint: '' names no path"),
    (["zoo", "--out", ""], "argument --out: '' names no path"),  # was read as no --out: a folder under runs/
    (["bench", "--json", " "], "argument --json: ' ' names no path"),  # was read as no --json: nothing written
    (["data", "--out", "panel.csv"], "the panel is written as parquet; give a file name ending in .parquet"),
    # argparse's own errors, in the same one line
    (["train", "--path", "jax-native", "--epochs", "abc"], "argument --epochs: invalid int value: 'abc'; see "
                                                           "`native-loops train --help`"),
    (["compare", "--bogus"], "unrecognized arguments: --bogus; see `native-loops compare --help`"),
    (["data", "--epochs", "3"], "unrecognized arguments: --epochs 3; see `native-loops data --help`"),
]


@pytest.mark.parametrize("args, message", TRAINING_CASES, ids=[" ".join(c[0]) for c in TRAINING_CASES])
def test_bad_training_options(tmp_path, capsys, args, message):
    out = ["--out", str(tmp_path / "run")] if args[0] in ("compare", "walk-forward") else []
    code = cli.main([*args, *out])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("native-loops: error: ") and message in err and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


def test_bad_input_data_command(files, tmp_path, capsys):
    code = cli.main(["data", "--data", files["good"], "--out", str(tmp_path / "x.parquet")])
    assert code == 2 and "cannot be combined with --data" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
    # the seed draws the synthetic panel: with a file of the user's it did nothing, without a word
    assert cli.main(["data", "--data", files["good"], "--seed", "5"]) == 2
    err = capsys.readouterr().err
    assert "--seed draws the synthetic panel, so it cannot be combined with --data" in err and err.count("\n") == 1
    assert cli.main(["data", "--seed", "-1"]) == 2 and "--seed must be an integer" in capsys.readouterr().err


def test_reports_are_standard_json_with_null_for_a_number_that_is_not_finite(tmp_path):
    """A diverged sweep's cells, a gap between NaN weights: Python's json wrote NaN and Infinity, which jq, a
    browser and JSON.parse refuse."""
    import json

    from compare.io import write_json

    write_json(tmp_path / "r.json", {"val_mse": [[0.5, float("nan")], [np.float64("inf"), -float("inf")]],
                                     "best": None, "gap": np.float64(0.25), "n": 3, "name": "NaN"})
    text = (tmp_path / "r.json").read_text()
    assert json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in the report")) == {
        "val_mse": [[0.5, None], [None, None]], "best": None, "gap": 0.25, "n": 3, "name": "NaN"}


def test_real_process_exit_code_and_no_traceback(files, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "compare.cli", "data", "--data", files["missing"]],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1


def _pipe_without_reader() -> int:
    read, write = os.pipe()
    os.close(read)
    return write


def _closed(*fds):
    def close():
        for fd in fds:
            os.close(fd)
    return close


@pytest.mark.parametrize("command, stdout, written", [
    ("data", None, None),  # closed (`>&-`): Python's sys.stdout is None; the run goes on and prints nowhere
    ("data", "no stdin", None),  # stdin closed too (`<&- >&-`): os.devnull must still land on 1, not 0
    ("data", "/dev/full", "No space left on device"),
    ("data", _pipe_without_reader, "Broken pipe"),  # its reader gone, as `| head -1` does
    ("--help", "/dev/full", "No space left on device"),  # argparse's print, still buffered when main returns
], ids=["closed", "closed-with-stdin", "full", "broken-pipe", "help-full"])
def test_a_stdout_that_cannot_be_written_is_one_line(tmp_path, command, stdout, written):
    if stdout == "/dev/full" and not os.path.exists(stdout):
        pytest.skip("no /dev/full on this system (macOS): the broken pipe is the same failure")
    out = tmp_path / "panel.parquet"
    fd = {None: None, "no stdin": None, "/dev/full": lambda: os.open("/dev/full", os.O_WRONLY)}.get(stdout, stdout)
    fd = fd() if fd else None
    close = _closed(1) if stdout is None else _closed(0, 1) if stdout == "no stdin" else None
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # buffered, as a user's shell has it
    args = ["data", "--out", str(out)] if command == "data" else [command]
    try:
        proc = subprocess.run([sys.executable, "-m", "compare.cli", *args], stdout=fd, stderr=subprocess.PIPE,
                              text=True, preexec_fn=close, env=env)
    finally:
        if fd is not None:
            os.close(fd)
    if written is None:
        assert proc.returncode == 0 and proc.stderr == "" and pd.read_parquet(out).shape[0] > 0, proc.stderr
    else:
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
        assert proc.stderr.startswith("native-loops: error: standard output cannot be written") and written in proc.stderr


def test_data_command_writes_and_summarizes(tmp_path, capsys):
    out = tmp_path / "panel.parquet"
    assert cli.main(["data", "--out", str(out), "--seed", "3"]) == 0
    text = capsys.readouterr().out
    for expected in ("synthetic(seed=3)", "OLS per asset", "true process", "leverage", *synthetic.ASSETS):
        assert expected in text
    assert [p.name for p in tmp_path.iterdir()] == ["panel.parquet"]


def test_time_zone_aware_dates_are_read_as_their_calendar_days(panel, tmp_path):
    """A parquet whose dates carry a time zone (as many exports do) is the same data set as the naive one."""
    from compare.data import panel as data

    aware = panel.copy()
    aware["fecha"] = aware["fecha"].dt.tz_localize("America/New_York")
    aware.to_parquet(tmp_path / "aware.parquet", index=False)
    loaded, _ = data.load_panel(tmp_path / "aware.parquet")
    want, got = data.prepare(panel), data.prepare(loaded)
    np.testing.assert_array_equal(got.x_train, want.x_train)
    np.testing.assert_array_equal(got.y_test, want.y_test)


def test_dates_with_several_offsets_are_read_as_their_calendar_days(panel, tmp_path):
    """A CSV exported across daylight-saving changes has two offsets (+01:00 in winter, +02:00 in summer), which
    pandas refuses to parse together; each row keeps its own calendar day, the same data set as the naive one."""
    from compare.data import panel as data

    mixed = panel.copy()
    summer = mixed["fecha"].dt.month.between(4, 10)
    mixed["fecha"] = mixed["fecha"].dt.strftime("%Y-%m-%dT00:00") + np.where(summer, "+02:00", "+01:00")
    mixed.to_csv(tmp_path / "mixed.csv", index=False)
    loaded, _ = data.load_panel(tmp_path / "mixed.csv")
    want, got = data.prepare(panel), data.prepare(loaded)
    np.testing.assert_array_equal(got.x_train, want.x_train)
    np.testing.assert_array_equal(got.y_test, want.y_test)


@pytest.mark.parametrize("make, message", [
    (lambda d: d.mkdir() or d, "is a folder; pass the parquet or CSV file itself"),
    (lambda d: (d.with_suffix(".csv").write_text("fecha;activo;rendimiento;rv_5min\n2020-01-02;x;0.1;0.2\n"),
                d.with_suffix(".csv"))[1], "the CSV looks separated by ';'"),
    (lambda d: (d.with_suffix(".csv").write_text("fecha,activo,rendimiento,rv_5min\n"), d.with_suffix(".csv"))[1],
     "the data has its columns but no rows"),
    (lambda d: type(d)("/dev/null"), "'/dev/null' is not a regular file"),  # it was "does not exist"
], ids=["folder", "semicolons", "header-only", "device"])
def test_data_files_that_are_not_a_panel_are_named(tmp_path, capsys, make, message):
    data = make(tmp_path / "panel")
    assert cli.main(["data", "--data", str(data)]) == 2
    assert message in capsys.readouterr().err


def test_a_panel_under_an_odd_name_is_written_read_and_named(tmp_path, capsys):
    """A byte that is not UTF-8 (Python carries it as a surrogate): pyarrow refused such a name, a traceback on
    writing and "damaged" on reading; brackets were read as rich markup ("[draft]" vanished, "[/x]" raised); an
    upper-case suffix is a parquet name too. A file system that refuses the byte (macOS) gets one line."""
    odd = os.fsdecode(b"\xff.parquet")
    try:
        os.close(os.open(tmp_path / odd, os.O_CREAT | os.O_WRONLY))
        os.unlink(tmp_path / odd)
    except OSError:  # a file system that takes UTF-8 names only
        assert cli.main(["data", "--out", str(tmp_path / odd)]) == 2
        assert capsys.readouterr().err.count("\n") == 1
        odd = None
    for name in filter(None, (odd, "[draft].parquet", "PANEL.PARQUET")):
        assert cli.main(["data", "--out", str(tmp_path / name)]) == 0
        assert cli.main(["data", "--data", str(tmp_path / name)]) == 0
        out = capsys.readouterr().out
        assert "27,414 rows" in out and (name == odd or f"wrote {tmp_path / name}" in " ".join(out.split()))
    assert len(list(tmp_path.iterdir())) == 3 - (odd is None)


@pytest.mark.parametrize("args, why", [
    (["walk-forward", "--asset", "indice"], "; the walk-forward refits every asset it is given (--assets, default "
                                            "all), so leave 'oro' out: --assets accion,bono,cripto,divisa,indice\n"),
    (["zoo", "--asset", "indice", "--models", "har,panel"], " (the panel model trains on every asset of the data, so "
                                                            "'oro' too: leave it out of the data, or train another "
                                                            "model)\n"),
    (["compare", "--model", "panel"], " (the panel model trains on every asset of the data"),
], ids=["walk-forward", "zoo-panel", "compare-panel"])
def test_a_short_asset_among_several_is_named(panel, tmp_path, capsys, args, why):
    """Every asset is split for the walk-forward and the panel model: the one that cannot be is named, and why a
    command given another --asset needs it (the message named only the asset, as if --asset were ignored)."""
    short = panel[(panel["activo"] != "oro") | (panel["fecha"] < "2008-03-01")]
    short.to_parquet(tmp_path / "short.parquet", index=False)
    assert cli.main([*args, "--data", str(tmp_path / "short.parquet"), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("native-loops: error: asset 'oro': split date 2018-01-01 is outside the data")
    assert why in err and err.count("\n") == 1 and not (tmp_path / "run").exists()


def test_bench_json_checks_leave_an_existing_report_alone(tmp_path, capsys):
    """Checking --json early makes and removes a probe beside it: an existing report is untouched, a folder is one
    line."""
    report = tmp_path / "bench.json"
    report.write_text('{"earlier": true}')
    assert cli.main(["bench", "--repeats", "0", "--json", str(report)]) == 2
    assert report.read_text() == '{"earlier": true}' and sorted(p.name for p in tmp_path.iterdir()) == ["bench.json"]
    assert cli.main(["bench", "--json", str(tmp_path)]) == 2
    assert "is a folder; name a file to write" in capsys.readouterr().err


def test_the_sigterm_handler_is_the_callers_again_after_main(tmp_path):
    import signal

    before = signal.getsignal(signal.SIGTERM)
    cli.main(["data", "--out", str(tmp_path / "panel.parquet")])
    assert signal.getsignal(signal.SIGTERM) is before


def test_an_asset_too_short_for_the_har_is_named_beside_the_others_summary(panel, tmp_path, capsys):
    """`data` summarizes every asset: one the HAR cannot fit has its rows and dates, no OLS, and a line saying why
    (the whole summary was refused over it); with no asset to fit, the one line of bad input."""
    short = panel[(panel["activo"] != "oro") | (panel["fecha"] < "2008-01-20")]
    short.to_parquet(tmp_path / "short.parquet", index=False)
    assert cli.main(["data", "--data", str(tmp_path / "short.parquet")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "no OLS: asset 'oro' has 13 days; the HAR needs more than 22" in out
    assert re.search(r"│ oro │ 13 │ 2008-01-02 │ 2008-01-18 │ - │ - │ - │ - │ - │", out)
    assert re.search(r"│ indice │ 4,569 │ 2008-01-02 │ 2025-12-30 │ 0\.\d{4} │", out)  # the others' OLS
    panel[panel["fecha"] < "2008-01-20"].to_parquet(tmp_path / "all-short.parquet", index=False)
    assert cli.main(["data", "--data", str(tmp_path / "all-short.parquet")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("native-loops: error: asset 'accion' has 13 days; the HAR needs more than 22")
    assert err.count("\n") == 1
