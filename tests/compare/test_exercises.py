"""docs/exercises.md's exercises: each broken step is caught by `loop_parity` at the stage the page names, and each
answer trains as `fit` does."""
import math
import os
import re
import subprocess
import sys

import pytest

from compare.exercises import EXERCISES, check
from tests.conftest import REPO

STAGES = {1: "loss", 2: "loss", 3: "state", 4: "loss", 5: "update", 6: "loss", 7: "loss", 8: "update"}  # the page's


# The page's report lines against this run's: the report prints |diff| and its allowance to 3 digits, and float32
# training on another CPU or release can round them across a last digit (1.93e-05 for 1.94e-05 is 0.5%).
REPORT_RTOL = 1e-2


def shown_report(number: int) -> list[str]:
    """The report lines docs/exercises.md shows for exercise `number` (its section's `text` block)."""
    page = (REPO / "docs" / "exercises.md").read_text()
    section = re.search(rf"^## Exercise {number}:.*?(?=^## )", page, re.M | re.S).group(0)
    return re.search(r"```text\n(.*?)```", section, re.S).group(1).splitlines()


def same_line(shown: str, line: str) -> bool:
    """The two lines' words are equal, numbers within REPORT_RTOL."""
    a, b = (re.sub(r"[()]", " ", text).split() for text in (shown, line))
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        try:
            if not math.isclose(float(x), float(y), rel_tol=REPORT_RTOL, abs_tol=1e-12):
                return False
        except ValueError:
            if x != y:
                return False
    return True


@pytest.mark.parametrize("number", list(EXERCISES))
def test_the_broken_step_is_caught_at_its_stage(number, grad_parity_pool):
    with pytest.raises(AssertionError) as report:
        check(number, "compare.exercises.steps", pool=grad_parity_pool)
    assert f"first stage that differs: {STAGES[number]}," in str(report.value)
    lines = str(report.value).splitlines()
    assert [s for s in shown_report(number) if not any(same_line(s, line) for line in lines)] == []


def test_a_report_line_that_changed_is_not_the_same():
    assert same_line("loss   x  1.750699e+01  ()", "loss x 1.7507e+01 ()")
    assert not same_line("loss x 17.5", "loss x 18.4")
    assert same_line("(largest |diff| 0.00e+00)", "(largest |diff| 0.0)") and same_line("1.93e-05", "1.94e-05")
    assert not same_line("at step 1 of 8", "at step 4 of 8") and not same_line("a b", "a b c")


@pytest.mark.parametrize("number", list(EXERCISES))
def test_the_answer_trains_as_fit_does(number, grad_parity_pool):
    check(number, "compare.exercises.answers", pool=grad_parity_pool)


def test_the_page_names_each_exercises_stage():
    page = (REPO / "docs" / "exercises.md").read_text()
    named = {int(n): stage for n, stage in re.findall(r"^## Exercise (\d+)\b.*?`loop_parity`\s+names:\s+(\w+)", page,
                                                       re.M | re.S)}
    assert named == STAGES


def test_a_sum_passes_under_adam(grad_parity_pool):
    """Exercise 6's second question: Adam divides a constant factor out, so the broken step trains as fit does."""
    check(6, "compare.exercises.steps", pool=grad_parity_pool, spec={"optimizer": "adam"})


@pytest.mark.parametrize("args, says", [
    (["9"], "no exercise '9'"), (["²"], "no exercise '²'"),
    (["1", "--steps", "no_such_steps"], "no module 'no_such_steps' here"),
    (["1", "--steps", "./my_steps.py"], "give --steps my_steps"),
    (["1", "--steps", "my-steps"], "is not a module name"),
    (["1", "--steps", "compare.exercises"], "has no torch_step_1; copy it"),
    (["6", "--spec", "adam"], "--spec 'adam' is not a JSON object"),
    (["6", "--spec", '{"epochs": 3}'], "sets epochs"),
    (["6", "--spec", '{"optimizer": 3}'], "unknown optimizer 3"), (["--stpes", "x"], "unrecognized arguments")])
def test_a_bad_command_is_one_line_and_exit_2(args, says):
    proc = subprocess.run([sys.executable, "-m", "compare.exercises", *args], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and says in proc.stderr, proc.stderr


def test_your_own_copy_of_the_steps_is_checked(tmp_path):
    """The page's workflow: a copy of the steps in the learner's folder, fixed there, checked with --steps."""
    fixed = (REPO / "compare" / "exercises" / "steps.py").read_text().replace(
        "loss = torch.mean((y_pred - y) ** 2)\n    optimizer.zero_grad()", "loss = torch.mean((y_pred - y) ** 2) + "
        "sum(model.losses)\n    optimizer.zero_grad()", 1)
    (tmp_path / "my_steps.py").write_text(fixed)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "compare.exercises", "1", "--steps", "my_steps"], cwd=tmp_path,
                          env=env, capture_output=True, text=True)
    assert proc.returncode == 0 and "exercise 1 (a model with penalties, torch): trains as fit does" in proc.stdout, (
        proc.stdout + proc.stderr)
