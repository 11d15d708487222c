"""`python -m compare.exercises [N ...] [--steps MODULE] [--spec JSON]`: check your steps against `fit`.

Copy the broken steps into a module of your own and fix them there (`cp compare/exercises/steps.py my_steps.py`, then
`--steps my_steps`); without `--steps` the check runs the package's broken steps, which fail."""
import argparse
import importlib.util
import json
import sys

from compare.exercises import EXERCISES, check


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
    wanted = args.numbers or [str(n) for n in EXERCISES]
    unknown = [a for a in wanted if not a.isdigit() or int(a) not in EXERCISES]
    if unknown:
        parser.error(f"no exercise {unknown[0]!r}; choose among {', '.join(map(str, EXERCISES))}")
    try:
        found = importlib.util.find_spec(args.steps)
    except ModuleNotFoundError:  # a parent package that is not there
        found = None
    if found is None:
        parser.error(f"no module {args.steps!r} here; give --steps a module importable from this folder (my_steps "
                     "for ./my_steps.py)")
    try:
        spec = json.loads(args.spec) if args.spec else {}
    except json.JSONDecodeError:
        spec = None
    if not isinstance(spec, dict):
        parser.error(f"--spec {args.spec!r} is not a JSON object; give e.g. '{{\"optimizer\": \"adam\"}}'")
    failed = 0
    for number in map(int, wanted):
        exercise = EXERCISES[number]
        try:
            check(number, args.steps, spec=spec)
        except AssertionError as report:
            failed += 1
            print(f"exercise {number} ({exercise.title}, {exercise.engine}): not yet fit's step")
            if len(wanted) == 1:
                print(report)
        else:
            print(f"exercise {number} ({exercise.title}, {exercise.engine}): trains as fit does")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
