"""`python -m compare.exercises [N ...] [--steps MODULE] [--spec JSON]`: check your steps against `fit`.

Copy the broken steps into a module of your own and fix them there (`cp compare/exercises/steps.py my_steps.py`, then
`--steps my_steps`); without `--steps` the check runs the package's broken steps, which fail."""
import argparse
import importlib
import json
import re
import sys

from compare.errors import NativeLoopsError
from compare.exercises import EXERCISES, check
from keras_side.spec import SpecError, TrainConfig

SET_BY_THE_CHECK = ("batch_size", "epochs", "batch_order", "validate", "patience", "metrics", "seed")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, not argparse's usage first
        sys.stderr.write(f"exercises: {message}; see `python -m compare.exercises --help`\n")
        sys.exit(2)


def main(argv: list[str]) -> int:
    parser = _Parser(prog="python -m compare.exercises", description=__doc__)
    parser.add_argument("numbers", nargs="*", metavar="N", help="the exercises to check (default: all)")
    parser.add_argument("--steps", default="compare.exercises.steps", metavar="MODULE",
                        help="the module your steps are in, importable from here (default: %(default)s)")
    parser.add_argument("--spec", default=None, metavar="JSON",
                        help='spec fields over the exercise\'s own, e.g. \'{"optimizer": "adam"}\' (exercise 6)')
    args = parser.parse_args(argv)
    unknown = [a for a in args.numbers if not re.fullmatch(r"[0-9]+", a) or int(a) not in EXERCISES]
    if unknown:
        parser.error(f"no exercise {unknown[0]!r}; choose among {', '.join(map(str, EXERCISES))}")
    wanted = list(dict.fromkeys(map(int, args.numbers))) or list(EXERCISES)
    steps_module(parser, args.steps, wanted)
    spec = spec_fields(parser, args.spec)
    failed = 0
    for number in wanted:
        exercise = EXERCISES[number]
        try:
            check(number, args.steps, spec=spec)
        except AssertionError as report:
            failed += 1
            print(f"exercise {number} ({exercise.title}, {exercise.engine}): not yet fit's step")
            if len(wanted) == 1:
                print(report)
        except (NativeLoopsError, SpecError) as err:  # the step raised, returned what a step does not, or the spec
            failed += 1
            print(f"exercise {number} ({exercise.title}, {exercise.engine}): not checked: {err}")
        else:
            print(f"exercise {number} ({exercise.title}, {exercise.engine}): trains as fit does")
    return 1 if failed else 0


def steps_module(parser: _Parser, name: str, wanted: list[int]) -> None:
    """The module `--steps` names, importable from here, with every step (and optimizer) the exercises ask for; a
    usage error otherwise."""
    if name.endswith(".py") or "/" in name or "\\" in name:
        module = re.sub(r"\.py$", "", name.replace("\\", "/").split("/")[-1])
        parser.error(f"--steps takes a module name, not a file: give --steps {module}, from the folder that holds "
                     f"{module}.py")
    if not all(part.isidentifier() for part in name.split(".")):
        parser.error(f"--steps {name!r} is not a module name (letters, digits and _ only); rename the file, e.g. "
                     "my_steps.py")
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as err:
        if err.name is None or not (name == err.name or name.startswith(err.name + ".")):
            raise  # a module it imports is missing: the module's own error
        parser.error(f"no module {name!r} here; give --steps a module importable from this folder (my_steps for "
                     "./my_steps.py)")
    except SyntaxError as err:
        parser.error(f"{err.filename}:{err.lineno}: {err.msg}; fix the module --steps names")
    needed = [n for number in wanted for n in (EXERCISES[number].step, EXERCISES[number].optimizer) if n]
    missing = [n for n in needed if not hasattr(module, n)]
    if missing:
        parser.error(f"module {name!r} has no {', '.join(missing)}; copy it from compare/exercises/steps.py")


def spec_fields(parser: _Parser, text: str | None) -> dict:
    """`--spec`'s fields, a JSON object of TrainConfig fields other than those the check sets itself."""
    if not text:
        return {}
    try:
        fields = json.loads(text)
    except json.JSONDecodeError:
        fields = None
    if not isinstance(fields, dict):
        parser.error(f"--spec {text!r} is not a JSON object; give e.g. '{{\"optimizer\": \"adam\"}}'")
    fixed = [f for f in fields if f in SET_BY_THE_CHECK]
    if fixed:
        parser.error(f"--spec sets {', '.join(fixed)}, which the exercises fix (64 rows in batches of 16, 2 epochs, "
                     "no validation); give other fields")
    try:
        TrainConfig.from_dict(fields)
    except (SpecError, TypeError, ValueError) as err:
        parser.error(f"--spec: {err}")
    return fields


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
