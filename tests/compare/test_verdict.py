"""The referee's verdict on data nobody tuned it on (`synthetic.varied`: other persistence, levels, noise and
history lengths): `compare` passes where only the seed differs, and fails every planted fault, naming a check of the
planted path. `make test` runs one panel and one fault per kind of check that catches it; `make test-full` every
panel with every fault."""
import contextlib
import io
import json

import numpy as np
import pytest

from compare import cli
from compare.data import synthetic
from compare.engines import faults
from compare.referee import checks, tolerances
from tests.tiers import FULL_ONLY, rows

PANELS = range(10)  # each drawn from its own seed
ENGINES = "torch,jax"  # the engines with a many-model trainer: the band is measured, never the hard bound alone
# Gross faults: their test MSE is far from OLS's wherever the band decides (their slopes may not be: on a short
# history the seeds' slopes spread as far as a model that learnt nothing). The others ("lr-times-10": Adam(0.1) jitters
# around OLS as an unlucky seed does; "lr-over-10" after 40 epochs, as an unlucky start does) may end within seed
# noise: the same-arithmetic run names every fault, to the bit.
GROSS = ("ascent", "shuffled-target")
DECIDED = 3  # a panel whose 40-epoch seeds all end within ols_reached's hard bounds (1,501 training rows)


def compare_on(tmp_path, seed: int, *extra: str, engines: str = ENGINES) -> tuple[int, dict, str]:
    data = tmp_path / f"panel-{seed}.parquet"
    if not data.exists():
        frame, truth = synthetic.varied(seed)
        synthetic.write_parquet(frame, data, seed=seed, truth=truth)
    out = tmp_path / f"run-{seed}-{'-'.join(extra) or 'clean'}"
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        code = cli.main(["compare", "--data", str(data), "--engines", engines, "--out", str(out), *extra])
    return code, json.loads((out / "report.json").read_text()), text.getvalue()


@pytest.mark.parametrize("seed", rows(PANELS, fast=[DECIDED]))
def test_compare_passes_on_data_it_was_not_tuned_on(tmp_path, seed):
    """Exit 0; a measure the seeds cannot decide (a short history: 40 epochs leave every seed far from OLS) is one
    line naming --converge, never a failure."""
    code, report, text = compare_on(tmp_path, seed)
    assert code == 0, [c for c in report["checks"] if not c["passed"]]
    judged = [c for c in report["checks"] if c["name"].startswith("ols_reached/")]
    assert all("1,000 seeds" in c["note"] for c in judged)
    assert len(judged) + 4 * len(report["ols_band"]["undecided"]) == 8
    for line in report["ols_band"]["undecided"]:
        assert line.split(":")[0] in text and "--converge" in line
    if seed == DECIDED:
        assert len(judged) == 8


@pytest.mark.parametrize("seed", rows(PANELS, fast=[1]))  # 1: the shortest history, 486 rows
def test_a_converged_run_reaches_ols_tightly_on_any_panel(tmp_path, seed):
    code, report, _ = compare_on(tmp_path, seed, "--converge", engines="jax")
    judged = [c for c in report["checks"] if c["name"].startswith("ols_reached/")]
    assert code == 0, [c for c in report["checks"] if not c["passed"]]
    assert len(judged) == 4 and {c["tolerance"] for c in judged} == {tolerances.CONVERGED_MSE_RTOL,
                                                                       tolerances.CONVERGED_SLOPE_ATOL}
    assert report["config"]["schedule"] == "cosine" and report["ols_band"]["undecided"] == []
    # the constants confirmed on this panel: its 500 seeds, trained the same converged way, end within them
    reached = report["ols_band"]["reached"]
    assert reached[0] < tolerances.CONVERGED_MSE_RTOL and reached[1] < tolerances.CONVERGED_SLOPE_ATOL, reached
    assert all("on this data the 99.9th percentile of 500 seeds'" in c["note"] for c in judged)


# make test-full only: a whole compare run per fault, each panel. make test has a fault that fails a compare run and
# is named (test_compare_cli.py: an injected wrong gradient), and the referee's checks each fail on planted numbers.
FAULT_ROWS = [(fault, seed) for fault in faults.FAULTS for seed in PANELS]


@FULL_ONLY
@pytest.mark.parametrize("fault,seed", FAULT_ROWS)
def test_a_planted_fault_fails_the_run_and_names_its_path(tmp_path, fault, seed):
    code, report, text = compare_on(tmp_path, seed, "--plant", fault)
    failed = {c["name"] for c in report["checks"] if not c["passed"]}
    assert code == 1 and report["plant"] == {"path": "torch-native", "fault": fault} and "planted in" in text
    assert "same_arithmetic/torch-native" in failed  # its every run is planted, the same-arithmetic one too
    assert all(name.split("/")[1] == "torch-native" for name in failed), failed
    judged = {c["name"] for c in report["checks"]}
    if fault in GROSS and "ols_reached/torch-native" in judged:  # the test MSE: where its band decides
        assert "ols_reached/torch-native" in failed


def test_the_band_is_the_seeds_percentile_and_a_wide_band_cannot_decide(ols_fit):
    """Exchangeability: the band is the seeds' distances' 99.9th percentile; past the hard bounds it says so."""
    rng = np.random.default_rng(0)
    mse = ols_fit.test_mse * (1 + rng.exponential(0.01, 1000))
    slopes = ols_fit.slopes + rng.normal(0, 0.05, (1000, 3))
    band = checks.Band.of_seeds(mse, slopes, ols_fit, ["jax"])
    assert band.mse == pytest.approx(np.percentile(mse / ols_fit.test_mse - 1, tolerances.OLS_BAND_PERCENTILE))
    assert band.undecided() == [] and "1,000 seeds" in band.how
    wide = checks.Band.of_seeds(mse * 2, slopes, ols_fit, ["jax"])
    assert len(wide.undecided()) == 1 and "--converge" in wide.undecided()[0]


def test_a_converged_band_judges_only_what_this_datas_converged_seeds_reach(ols_fit):
    """--converge's constants hold where the seeds, trained the same converged way, end within them; a measure they
    do not reach on this data (it needs more steps) is one line, not judged; with no seeds, the note says so."""
    near = checks.Band(1e-3, 4e-3, "band: 99.9th percentile of 1,000 seeds' distances (jax)")
    assert checks.Band.converged(near).undecided() == [] and "1,000 seeds" in checks.Band.converged(near).how
    slow = checks.Band(tolerances.CONVERGED_MSE_RTOL * 3, 4e-3, near.how)
    undecided = checks.Band.converged(slow).undecided()
    assert len(undecided) == 1 and undecided[0].startswith("ols_reached (test MSE) not judged: the converged seeds")
    assert "not confirmed on this data" in checks.Band.converged().how and checks.Band.converged().undecided() == []
