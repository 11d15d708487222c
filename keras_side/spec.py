"""The training spec: what `compile` and `fit` take, in one frozen config that every path obeys.

    cfg = TrainConfig(optimizer="sgd", momentum=0.9, nesterov=True, schedule="cosine", decay_steps=200,
                      clipnorm=1.0, loss="huber")
    keras_optimizer(cfg), keras_loss(cfg)    # what `fit` compiles with; the native loops build their own
    TrainConfig(loss=("mse", "mae"), loss_weights=(1.0, 0.5))   # a model with two outputs

The field names are Keras's own keyword arguments, so a spec reads like the `compile` call it stands for. A spec
that Keras would refuse, or that a path cannot honour, is a `SpecError` naming the field and the fix: never a
silent approximation. The dataclass imports no engine; the `keras_*` builders import Keras when called.
"""
from __future__ import annotations

import dataclasses
import difflib
import importlib
import json
import math
import numbers
import re
from dataclasses import dataclass
from typing import Literal

# "engine": each engine draws its own batch order from the seed (torch.Generator, jax.random, tf stateless ops,
# Keras's own shuffle in fit). "numpy": every path uses the same NumPy permutation per epoch, so only the
# arithmetic can differ (the referee's "same arithmetic" check and the zoo).
BatchOrder = Literal["engine", "numpy"]
# The native loops' optimizer. "exact": Keras's update rule written in the engine's own optimizer API (an optax
# GradientTransformation, a torch.optim.Optimizer), equal to `fit` step by step. "engine": the engine's stock
# optimizer (optax.adam, torch.optim.Adam...) given the same numbers, which differs by convention (see the README's
# optimizer table).
Flavour = Literal["exact", "engine"]

LOSSES = {  # Keras name -> Keras class; a "module:function" of keras.ops is accepted too
    "mse": "MeanSquaredError",
    "mae": "MeanAbsoluteError",
    "huber": "Huber",
    "binary_crossentropy": "BinaryCrossentropy",
    "sparse_categorical_crossentropy": "SparseCategoricalCrossentropy",
}
LOGIT_LOSSES = ("binary_crossentropy", "sparse_categorical_crossentropy")
METRICS = {  # Keras name -> Keras class: what compile(metrics=[...]) reports, per epoch, in History
    "mae": "MeanAbsoluteError",
    "mse": "MeanSquaredError",
    "rmse": "RootMeanSquaredError",
    "binary_accuracy": "BinaryAccuracy",
    "sparse_categorical_accuracy": "SparseCategoricalAccuracy",
}
OPTIMIZERS = {"adam": "Adam", "adamw": "AdamW", "sgd": "SGD", "rmsprop": "RMSprop", "adagrad": "Adagrad"}
SCHEDULES = ("exponential", "cosine", "piecewise")
# Options that belong to some optimizers or schedules only: set on another, Keras would ignore them without a word.
OPTIMIZER_OPTIONS = {"beta_1": ("adam", "adamw"), "beta_2": ("adam", "adamw"), "rho": ("rmsprop",),
                     "initial_accumulator_value": ("adagrad",), "epsilon": ("adam", "adamw", "rmsprop", "adagrad")}
SCHEDULE_OPTIONS = {"decay_steps": ("exponential", "cosine"), "decay_rate": ("exponential",),
                    "warmup_steps": ("cosine",), "warmup_target": ("cosine",), "alpha": ("cosine",),
                    "boundaries": ("piecewise",), "values": ("piecewise",)}
KERAS_ADAMW_DECAY = 0.004  # keras.optimizers.AdamW's default weight_decay (torch's is 0.01, optax's 1e-4)
FUNCTION = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


# NumPy's seeds (`np.random.seed`, which `keras.utils.set_random_seed` calls) are 0 to 2**32 - 1, and past that JAX's
# key wraps (seed 2**32 + 1 would draw seed 1's batch orders): one range for the spec (every loop, training parity)
# and the CLI.
SEEDS = 2**32


class SpecError(ValueError):
    """A training spec that cannot be honoured; the message names the field and the fix."""


@dataclass(frozen=True)
class TrainConfig:
    """How every path trains: `fit`, `fit` with a custom `train_step`, and each native loop."""

    epochs: int = 40
    batch_size: int = 128
    seed: int = 0
    batch_order: BatchOrder = "engine"
    validate: bool = True  # compute the validation loss after every epoch
    # compile(loss=..., loss_weights=...): one loss, or one per output of a model with several outputs (a tuple,
    # in the outputs' order), whose weighted sum is the objective
    loss: str | tuple[str, ...] = "mse"
    loss_weights: tuple[float, ...] | None = None
    from_logits: bool = False  # for every loss that takes logits
    metrics: tuple[str, ...] = ()  # compile(metrics=...): reported per epoch on the training and validation data
    # fit(callbacks=[EarlyStopping(monitor="val_loss", patience=..., restore_best_weights=True)])
    patience: int | None = None
    # compile(optimizer=...): Adam's epsilon is stated because the engines' defaults differ (Keras 1e-7, torch and
    # optax 1e-8), and so is its meaning (see `Flavour`).
    optimizer: str = "adam"
    learning_rate: float = 0.01
    beta_1: float = 0.9
    beta_2: float = 0.999
    epsilon: float = 1e-7
    momentum: float = 0.0  # sgd, rmsprop
    nesterov: bool = False  # sgd
    rho: float = 0.9  # rmsprop
    weight_decay: float | None = None  # adamw (None: Keras's 0.004)
    initial_accumulator_value: float = 0.1  # adagrad
    # A learning-rate schedule of the optimizer's step: Keras's ExponentialDecay, CosineDecay (with warmup when
    # warmup_steps > 0, from learning_rate up to warmup_target) or PiecewiseConstantDecay (values are the rates).
    schedule: str | None = None
    decay_steps: int = 1000
    decay_rate: float = 0.5
    warmup_steps: int = 0
    warmup_target: float | None = None
    alpha: float = 0.0
    boundaries: tuple[int, ...] = ()
    values: tuple[float, ...] = ()
    # Gradient clipping, at most one, as Keras: per variable, over all variables, elementwise.
    clipnorm: float | None = None
    global_clipnorm: float | None = None
    clipvalue: float | None = None
    flavour: Flavour = "exact"
    # Sum each sparse gradient into a dense one before the optimizer: on TensorFlow an Embedding's gradient is a
    # tf.IndexedSlices with one slice per row of the batch, and Keras's optimizers square those slices before
    # repeated rows are summed (Adam's v gets the sum of squares, not the square of the sum), so Keras on
    # TensorFlow trains an Embedding differently from torch and JAX, whose gradients are dense. True gives every
    # engine the same update (docs/optimizers.md); torch's and JAX's gradients are dense already.
    dense_gradients: bool = False

    def __new__(cls, *args, **fields):
        """A name that is not a field is the SpecError of `from_dict`, naming the nearest field (`TrainConfig(lr=0.1)`
        asks "did you mean 'learning_rate'?", where the dataclass's TypeError says only "unexpected keyword argument
        'lr'")."""
        _known_fields(fields)
        return super().__new__(cls)

    def __post_init__(self):
        # Lists arrive from JSON (the worker protocol); the frozen spec keeps tuples.
        for name in ("epochs", "batch_size", "seed"):  # a NumPy integer (a seed from np.arange) is a whole number
            value = getattr(self, name)
            if isinstance(value, numbers.Integral) and not isinstance(value, bool):
                object.__setattr__(self, name, int(value))
        for problem in _type_problems(self):  # before anything compares or converts them
            raise SpecError(problem)
        object.__setattr__(self, "boundaries", tuple(int(b) for b in self.boundaries))
        object.__setattr__(self, "values", tuple(float(v) for v in self.values))
        object.__setattr__(self, "metrics", tuple(self.metrics))
        if isinstance(self.loss, (list, tuple)):  # one loss per output; a single one is just that loss
            object.__setattr__(self, "loss", tuple(self.loss) if len(self.loss) != 1 else self.loss[0])
        if self.loss_weights is not None:
            weights = self.loss_weights
            if not isinstance(weights, (list, tuple)) or not all(
                    isinstance(w, (int, float)) and not isinstance(w, bool) for w in weights):
                raise SpecError(f"loss_weights must be a tuple of numbers, one per output loss, got {weights!r}")
            object.__setattr__(self, "loss_weights", tuple(float(w) for w in weights))
        for problem in _problems(self):
            raise SpecError(problem)

    @classmethod
    def from_dict(cls, fields: dict) -> TrainConfig:
        """The spec a dict of its fields gives (a user's spec, a JSON request); a name that is not a field is a
        SpecError naming the nearest field."""
        _known_fields(fields)
        return cls(**fields)

    def replace(self, **changes) -> TrainConfig:
        _known_fields(changes)
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        """JSON-ready (what a worker request and a report carry); `TrainConfig(**d)` reads it back."""
        return dataclasses.asdict(self)

    @property
    def losses(self) -> tuple[str, ...]:
        """One loss name per output."""
        return self.loss if isinstance(self.loss, tuple) else (self.loss,)

    @property
    def outputs(self) -> int:
        """How many outputs the spec is for: one, or one per loss of a per-output loss."""
        return len(self.losses)

    @property
    def decay(self) -> float | None:
        """The weight decay the optimizer applies (AdamW's default when none is given)."""
        if self.optimizer == "adamw":
            return KERAS_ADAMW_DECAY if self.weight_decay is None else self.weight_decay
        return None


# What data parallelism trains with: the shared NumPy batch order (every process cuts the same global batches) and
# no validation curve.
DATA_PARALLEL = {"batch_order": "numpy", "validate": False}


ALIASES = {"lr": "learning_rate"}  # other libraries' names for a field, which difflib would not find


def _known_fields(names) -> None:
    known = [f.name for f in dataclasses.fields(TrainConfig)]
    for name in names:
        if name not in known:
            near = [ALIASES[name]] if name in ALIASES else difflib.get_close_matches(str(name), known, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise SpecError(f"{name!r} is not a field of the training spec{hint}; its fields: {', '.join(known)}")


def data_parallel_config(fields: str | dict) -> TrainConfig:
    """The spec a data-parallel launcher trains, from its `--config` of TrainConfig fields (the JSON, or the dict it
    holds): DATA_PARALLEL's, unless the fields say otherwise."""
    return TrainConfig.from_dict({**DATA_PARALLEL, **(json.loads(fields) if isinstance(fields, str) else fields)})


def _type_problems(c: TrainConfig):
    """A field of the wrong kind (a JSON `"0.1"` for a number, `"mae"` for a tuple of metrics), named as the other
    problems are: else each would be a TypeError from a comparison further on (or a metric list of 'm', 'a', 'e')."""
    for f in dataclasses.fields(c):
        value, kind = getattr(c, f.name), f.type.removesuffix(" | None")
        if value is None and f.type.endswith(" | None"):
            continue
        number = isinstance(value, numbers.Real) and not isinstance(value, bool)
        if kind == "float" and not number:
            yield f"{f.name} must be a number, got {value!r}"
        elif kind == "int" and f.name not in ("epochs", "batch_size", "seed") and not (
                number and isinstance(value, numbers.Integral)):  # those three: `_problems` says more
            yield f"{f.name} must be a whole number, got {value!r}"
        elif kind in ("tuple[int, ...]", "tuple[float, ...]", "tuple[str, ...]") and (
                not _sequence(value) or not all(_of_kind(v, kind) for v in value)):
            item = {"tuple[int, ...]": "whole numbers", "tuple[float, ...]": "numbers", "tuple[str, ...]": "names"}
            yield f"{f.name} must be a tuple of {item[kind]} (a JSON list), got {value!r}"


def _sequence(value) -> bool:
    """A list, a tuple or a 1-D NumPy array (`np.linspace(...)` for a schedule's boundaries)."""
    return isinstance(value, (list, tuple)) or (hasattr(value, "ndim") and hasattr(value, "tolist") and
                                                value.ndim == 1)


def _of_kind(v, kind: str) -> bool:
    if kind == "tuple[str, ...]":
        return isinstance(v, str)
    number = isinstance(v, numbers.Real) and not isinstance(v, bool)  # 10.7 is no boundary: `int` cuts it to 10
    return number and (kind == "tuple[float, ...]" or isinstance(v, numbers.Integral) or float(v).is_integer())


def _problems(c: TrainConfig):
    """Every reason the spec cannot be honoured, as user-facing lines (the first one is raised)."""
    whole = all(isinstance(v, int) and not isinstance(v, bool) for v in (c.epochs, c.batch_size))
    if not whole or c.epochs < 1 or c.batch_size < 1:
        yield f"epochs and batch_size must be whole numbers >= 1, got {c.epochs!r} and {c.batch_size!r}"
    # a bad seed is one of the spec's problems here, not NumPy's ValueError later
    if not isinstance(c.seed, int) or isinstance(c.seed, bool) or not 0 <= c.seed < SEEDS:
        yield f"seed must be a whole number from 0 to 2**32 - 1 (NumPy's and JAX's seeds), got {c.seed!r}"
    if c.batch_order not in ("engine", "numpy"):
        yield f"batch_order must be 'engine' or 'numpy', got {c.batch_order!r}"
    if c.flavour not in ("exact", "engine"):
        yield f"flavour must be 'exact' or 'engine', got {c.flavour!r}"
    for loss in c.losses:
        if not isinstance(loss, str) or (loss not in LOSSES and not FUNCTION.match(loss)):
            yield (f"unknown loss {loss!r}; choose one of {', '.join(LOSSES)} or give a 'module:function' "
                   "written with keras.ops (a tuple of these: one per output)")
    if isinstance(c.loss, tuple) and not c.loss:
        yield "loss is an empty tuple; give one loss per output"
    if c.loss_weights is not None:
        if c.outputs == 1:
            yield (f"loss_weights weighs the losses of a model with several outputs; give loss as a tuple, one per "
                   f"output, and one weight for each (got loss={c.loss!r})")
        elif len(c.loss_weights) != c.outputs:
            yield (f"loss_weights has {len(c.loss_weights)} weight(s) for {c.outputs} output losses; give one "
                   "weight per loss")
        elif not all(math.isfinite(w) and w >= 0 for w in c.loss_weights) or not any(c.loss_weights):
            yield f"loss_weights must be numbers >= 0, at least one of them > 0; got {c.loss_weights}"
    for name in ("validate", "from_logits", "nesterov", "dense_gradients"):
        if not isinstance(getattr(c, name), bool):
            yield f"{name} must be True or False, got {getattr(c, name)!r}"
    if c.metrics and c.outputs > 1:
        yield ("metrics on a model with several outputs (one list per output in Keras) are not supported here; drop "
               "metrics (the loss of each output is still reported by fit)")
    unknown = [m for m in c.metrics if m not in METRICS]
    if unknown or len(set(c.metrics)) != len(c.metrics):
        yield f"metrics must be distinct names among {', '.join(METRICS)}; got {', '.join(c.metrics)}"
    if c.patience is not None and (c.patience < 1 or not c.validate):
        yield (f"early stopping needs patience >= 1 and validate=True (it watches the validation loss), "
               f"got {c.patience}")
    if c.from_logits and not set(c.losses) & set(LOGIT_LOSSES):
        yield f"from_logits applies to {' and '.join(LOGIT_LOSSES)}, not to loss {c.loss!r}; drop it"
    if c.optimizer not in OPTIMIZERS:
        yield f"unknown optimizer {c.optimizer!r}; choose one of {', '.join(OPTIMIZERS)}"
    if not (math.isfinite(c.learning_rate) and c.learning_rate > 0):
        yield f"learning_rate must be a positive number, got {c.learning_rate}"
    if not 0 <= c.momentum < 1:
        yield f"momentum must be in [0, 1), got {c.momentum}"
    if c.momentum and c.optimizer not in ("sgd", "rmsprop"):
        yield f"momentum is an option of sgd and rmsprop, not of {c.optimizer}; drop it"
    if c.nesterov and not (c.optimizer == "sgd" and c.momentum > 0):
        yield "nesterov needs optimizer='sgd' with momentum > 0"
    if c.weight_decay is not None and (c.optimizer != "adamw" or c.weight_decay < 0):
        yield f"weight_decay (>= 0) is supported with optimizer='adamw' only, got {c.weight_decay} for {c.optimizer}"
    if c.epsilon < 0 or c.initial_accumulator_value < 0:
        yield f"epsilon and initial_accumulator_value must be >= 0, got {c.epsilon} and {c.initial_accumulator_value}"
    for name in ("beta_1", "beta_2", "rho"):
        if not 0 <= getattr(c, name) < 1:
            yield f"{name} must be in [0, 1), got {getattr(c, name)}"
    clips = [n for n in ("clipnorm", "global_clipnorm", "clipvalue") if getattr(c, n) is not None]
    if len(clips) > 1:
        yield f"set at most one of clipnorm, global_clipnorm and clipvalue (as Keras), got {', '.join(clips)}"
    if any(not (math.isfinite(getattr(c, n)) and getattr(c, n) > 0) for n in clips):
        yield f"{clips[0]} must be a positive number, got {getattr(c, clips[0])}"
    yield from _unused_options(c)
    yield from _schedule_problems(c)


def _unused_options(c: TrainConfig):
    """An option changed from its default on an optimizer or schedule that does not use it."""
    defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    for name, owners in OPTIMIZER_OPTIONS.items():
        if getattr(c, name) != defaults[name] and c.optimizer not in owners:
            yield f"{name} is an option of {', '.join(owners)}, not of optimizer {c.optimizer!r}; drop it"
    for name, owners in SCHEDULE_OPTIONS.items():
        if getattr(c, name) != defaults[name] and c.schedule not in owners:
            yield (f"{name} is an option of the {' and '.join(owners)} schedule, not of schedule={c.schedule!r}; "
                   "drop it")


def _schedule_problems(c: TrainConfig):
    if c.schedule is None:
        return
    if c.schedule not in SCHEDULES:
        yield f"unknown schedule {c.schedule!r}; choose one of {', '.join(SCHEDULES)}"
    elif c.schedule == "piecewise":
        if len(c.values) != len(c.boundaries) + 1 or not c.boundaries:
            yield "a piecewise schedule needs boundaries and one more value than boundaries (the rates)"
        elif list(c.boundaries) != sorted(set(c.boundaries)) or min(c.values) <= 0:
            yield "piecewise boundaries must increase and its values (rates) must be > 0"
    elif c.decay_steps < 1:
        yield f"decay_steps must be >= 1, got {c.decay_steps}"
    elif c.schedule == "exponential" and not c.decay_rate > 0:
        yield f"decay_rate must be > 0, got {c.decay_rate}"
    elif c.schedule == "cosine" and not 0 <= c.alpha <= 1:
        yield f"alpha (the cosine's floor, a share of the rate) must be in [0, 1], got {c.alpha}"
    elif c.schedule == "cosine" and (c.warmup_steps < 0 or (c.warmup_steps > 0) != (c.warmup_target is not None)
                                     or (c.warmup_target is not None and not c.warmup_target > 0)):
        yield ("a cosine warmup needs both warmup_steps > 0 and warmup_target > 0 (the rate reached after the "
               "warmup)")


def resolve(spec: str):
    """The object named by 'module:function'; a `SpecError` if there is no such module (an import inside the module
    that fails is the module's own error, raised as it is) or the module has no such name."""
    module, name = spec.split(":")
    try:
        imported = importlib.import_module(module)
    except ModuleNotFoundError as err:
        if err.name is None or not (module == err.name or module.startswith(err.name + ".")):
            raise
        raise SpecError(f"{spec!r}: no module named {err.name!r} here; give module:function, the module importable "
                        "from here (on PYTHONPATH)") from None
    try:
        return getattr(imported, name)
    except AttributeError:  # one line, not the AttributeError with a traceback from every launched process
        raise SpecError(f"{spec!r}: module {module!r} has no {name!r}; give module:function") from None




































