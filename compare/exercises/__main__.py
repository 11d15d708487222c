"""`python -m compare.exercises [N ...]`: check your steps in compare/exercises/steps.py against `fit`."""
import sys

from compare.exercises import EXERCISES, check


def main(argv: list[str]) -> int:
    wanted = argv or [str(n) for n in EXERCISES]
    unknown = [a for a in wanted if not a.isdigit() or int(a) not in EXERCISES]
    if unknown:
        print(f"exercises: no exercise {unknown[0]!r}; choose among {', '.join(map(str, EXERCISES))}", file=sys.stderr)
        return 2
    failed = 0
    for number in map(int, wanted):
        exercise = EXERCISES[number]
        try:
            check(number)
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
