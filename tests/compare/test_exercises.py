"""docs/exercises.md's exercises: each broken step is caught by `loop_parity` at the stage the page names, and each
answer trains as `fit` does."""
import re
import subprocess
import sys

import pytest

from compare.exercises import EXERCISES, check
from tests.conftest import REPO

STAGES = {1: "loss", 2: "loss", 3: "state", 4: "loss", 5: "update", 6: "loss"}  # what docs/exercises.md says


@pytest.mark.parametrize("number", list(EXERCISES))
def test_the_broken_step_is_caught_at_its_stage(number, grad_parity_pool):
    with pytest.raises(AssertionError) as report:
        check(number, "compare.exercises.steps", pool=grad_parity_pool)
    assert f"first stage that differs: {STAGES[number]}," in str(report.value)


@pytest.mark.parametrize("number", list(EXERCISES))
def test_the_answer_trains_as_fit_does(number, grad_parity_pool):
    check(number, "compare.exercises.answers", pool=grad_parity_pool)


def test_the_page_names_each_exercises_stage():
    page = (REPO / "docs" / "exercises.md").read_text()
    named = {int(n): stage for n, stage in re.findall(r"^## Exercise (\d+)\b.*?`loop_parity`\s+names:\s+(\w+)", page,
                                                       re.M | re.S)}
    assert named == STAGES


def test_an_unknown_exercise_is_one_line_and_exit_2():
    proc = subprocess.run([sys.executable, "-m", "compare.exercises", "9"], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "no exercise '9'" in proc.stderr
