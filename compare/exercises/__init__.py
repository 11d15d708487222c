"""The lesson's exercises: training steps with one thing `fit` does left out, for you to find and fix.

    python -m compare.exercises            # every exercise: which ones your steps pass
    python -m compare.exercises 3          # one, with loop_parity's report when it fails
    python -m compare.exercises 3 --steps my_steps   # your copy of the steps, ./my_steps.py

Each broken step is in `compare/exercises/steps.py`: copy it into a module of your own, fix it there, run the check,
repeat (the package's copy stays broken: the tests check that `loop_parity` catches each). The check is `loop_parity`
(`compare.parity.assert_loop_matches_fit`): your step, on its engine, against `fit`, step by step, on the first rows
of the HAR (64; exercise 4's 60, whose last batch is short) in batches of 16. docs/exercises.md says what each
exercise is about, and gives the answers (`compare/exercises/answers.py`, which the tests check pass).
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Exercise:
    title: str
    engine: str
    build: str  # the model, "module:function"
    step: str  # the function in steps.py (or answers.py)
    spec: dict = field(default_factory=dict)
    optimizer: str | None = None  # your own optimizer, "module:function", where the exercise is about it
    rows: int = 64


EXERCISES = {
    1: Exercise("a model with penalties", "torch", "keras_side.models:mlp_l2", "torch_step_1"),
    2: Exercise("a model with Dropout", "torch", "keras_side.models:dropout_mlp", "torch_step_2"),
    3: Exercise("a pure step on BatchNorm", "jax", "keras_side.models:bn_mlp", "jax_step_3"),
    4: Exercise("one shape for every batch", "torch", "keras_side.models:bn_mlp", "torch_step_4", rows=60),
    5: Exercise("torch's own Adam", "torch", "keras_side.models:har", "torch_step_5", spec={"epsilon": 1e-3},
                optimizer="torch_adam_5"),
    6: Exercise("the loss of a batch", "torch", "keras_side.models:har", "torch_step_6", spec={"optimizer": "sgd"}),
    7: Exercise("a seeded Dropout on JAX", "jax", "keras_side.models:dropout_mlp", "jax_step_7"),
    8: Exercise("a constrained kernel", "torch", "compare.exercises:har_max_norm", "torch_step_8"),
}
BATCH_SIZE, EPOCHS = 16, 2


def har_max_norm():
    """Exercise 8's model: the HAR with its kernel held to a norm of at most 0.5 (`keras.constraints.MaxNorm`)."""
    import keras

    from keras_side.models import HAR_INPUTS

    return keras.Sequential([keras.Input((HAR_INPUTS,)),
                             keras.layers.Dense(1, kernel_constraint=keras.constraints.MaxNorm(0.5), name="har")],
                            name="har_max_norm")


def batch(rows: int):
    """The first `rows` training rows of the default HAR data, (x, y) as float32."""
    from compare.data import panel, synthetic

    data = panel.prepare(synthetic.simulate(0))
    return data.x_train[:rows], data.y_train[:rows]


def check(number: int, module: str = "compare.exercises.steps", pool=None, spec: dict | None = None) -> None:
    """Run exercise `number`'s step (from `module`) through `loop_parity`, with `spec`'s fields over the exercise's:
    returns when it trains as `fit` does, raises AssertionError with the report where it parts."""
    from compare.parity import assert_loop_matches_fit

    exercise = EXERCISES[number]
    x, y = batch(exercise.rows)
    optimizer = f"{module}:{exercise.optimizer}" if exercise.optimizer else None
    assert_loop_matches_fit(exercise.build, f"{module}:{exercise.step}", x, y, engine=exercise.engine,
                            spec={**exercise.spec, **(spec or {})}, optimizer=optimizer, epochs=EPOCHS,
                            batch_size=BATCH_SIZE, pool=pool)
