"""Training parity for any model and any loop, from your own tests: every path trains from the same start on the same
batches, every step's weights are compared, and the first divergence is traced to the stage where it begins.

    from compare.parity import assert_loop_matches_fit, assert_training_matches
    assert_training_matches("mypkg.models:build", x, y, spec={"optimizer": "sgd", "momentum": 0.9}, epochs=2)
    assert_loop_matches_fit("mypkg.models:build", "mypkg.loops:torch_step", x, y, engine="torch")

The start is the model's own seeded initializers, drawn on the first engine and set on every path of every engine
(non-trainable weights too: BatchNorm's statistics, a random layer's seed state). The batches are one NumPy
permutation per epoch, cut as `fit` cuts them. On a mismatch, the report goes to the first step where two paths
part beyond `atol + rtol·|expected|` and, from the weights the first of them held before that step, on that step's
batch, compares in order: each layer's output, the loss, each weight's gradient, each weight's update, and the
non-trainable state. It names the first stage that differs, the layer or weight, the worst element, both values
and the allowed difference, with the likely causes for that stage.
"""
from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from compare.referee import tolerances
from compare.engines import runner
from compare.parity.common import (OWN, ParityError, ask, callable_spec, check_engines, check_tolerances, examples,
                                   require_live, table, worst, Workers)
from keras_side.backend import installed_engines
from keras_side.data import batch_slices, numpy_orders
from keras_side.spec import SpecError, TrainConfig

PATHS = ("fit", "train-step", "native", "native-engine")  # the three levels of unpacking, and the stock optimizer
DEFAULT_PATHS = ("fit", "train-step", "native")
# The most values (weights × recorded steps × paths) one check may record: 240 MB of float32. More is a ParityError
# that asks for fewer steps, never a worker that runs out of memory.
MAX_VALUES = 60_000_000
STAGES = ("forward", "loss", "gradient", "update", "state")
CAUSES = {
    "forward": "the layer computes differently on this engine: engine-specific code in it (keras.config.backend(), "
               "an engine's own op), a random layer (each engine draws its own masks: compare paths within one "
               "engine), or another dtype",
    "loss": "another loss from the same weights: a reduction (a sum, a mean over another axis, the short last "
            "batch), model.losses (the regularizers) left out, the model called without training=True, a random "
            "layer's seed state not carried from step to step (JAX: the non_trainable the step was given), or another "
            "loss",
    "flag": "your step's loss is the objective in inference mode: the model called without training=True (or a "
            "layer with training=False, a BatchNorm left in inference mode), where fit calls it with training=True",
    "gradient": "equal loss, another gradient: gradients accumulated over steps (torch: optimizer.zero_grad() left "
                "out), a custom gradient, a stop_gradient, the gradient of another objective, or gradients changed "
                "(clipped, scaled) before they are returned",
    "update": "equal gradients, another update: an optimizer convention (Adam's epsilon inside or outside the bias "
              "correction, the momentum form, where the clip applies, a schedule's step count) or another "
              "hyperparameter; native.<engine>.optim has Keras's rule in each engine's optimizer API; a weight's "
              "constraint (kernel_constraint=...) left out, which Keras's optimizer applies after the update "
              "(native.<engine>.loop applies it too); or, against TensorFlow, an Embedding's sparse gradient, "
              "which Keras's optimizers take row by row there (spec dense_gradients=True)",
    "noise": "equal gradients, another update where the gradient is ~0 (|gradient| <= atol where each weight's "
             "update differs most): rounding below tolerance that the optimizer scales up (Adam divides by "
             "sqrt(v), so a zero gradient's noise takes full steps); a weight whose exact gradient is zero, like a "
             "bias before BatchNorm, is noise on every engine: drop it (use_bias=False) or compare within one engine",
    "unseen": "another update, from gradients that could not be compared here (both paths take fit's objective "
              "on one engine): an optimizer convention (Adam's epsilon, the momentum form, where the clip applies, a "
              "schedule's step count), a weight's constraint left out (Keras's optimizer applies it after the "
              "update), or the loss or gradient of one path",
    "state": "equal updates of the trainable weights, another non-trainable state: BatchNorm's moving statistics or "
             "a random layer's seed state not threaded through the step (JAX: keep the non_trainable that "
             "stateless_call returns), or the model called with training=False",
}


@dataclass
class Run:
    """One path's recorded training: every weight at every step (step 0 is the start), and the loss and
    gradients of each step where the path hands them over (a user's step)."""

    engine: str
    path: str
    weights: list[np.ndarray]  # per model.weights entry: (steps + 1, *shape)
    loss: np.ndarray  # (steps,): NaN where the path does not say
    grads: list[np.ndarray] | None  # per trainable weight: (steps, *shape)

    @property
    def label(self) -> str:
        return f"{self.engine}/{self.path}"


def assert_training_matches(build_model, x, y, *, spec=None, steps: int | None = None, epochs: int | None = None,
                            batch_size: int | None = None, seed: int | None = None, engines=None,
                            paths=DEFAULT_PATHS, rtol: float = tolerances.TRAINING_RTOL,
                            atol: float = tolerances.TRAINING_ATOL, pool: Workers = None):
    """Assert that every path on every engine trains the model step for step alike: each path against its engine's
    first path (`fit`, by default), and each engine's first path against the first engine's.

    Args:
        build_model: importable zero-argument callable returning a `keras.Model`.
        x, y: inputs (an array, or a list of arrays) and targets (an array, or a list: one per output).
        spec: a `keras_side.spec.TrainConfig`, or a dict of its fields (default: Adam(0.01), MSE, batches of 128).
        steps, epochs: how long to train (at most one; default one epoch).
        batch_size, seed: override the spec's.
        engines: engines to compare (default: every installed one).
        paths: among "fit", "train-step" (fit with our own train_step), "native" (the engine's loop with the
            Keras-exact optimizer) and "native-engine" (the loop with the engine's stock optimizer, torch and JAX).
        pool: live workers to reuse, or a function that returns them, called once the arguments are checked (the
            pytest fixtures pass their session's); else a pool is started here.
    Returns:
        Every path's trajectory: {"engine/path": {weight path: array (steps + 1, *shape)}}, step 0 the start.
    Raises:
        AssertionError: the first divergence, traced to its stage (see the module's docstring).
        ParityError: the comparison could not run.
    """
    __tracebackhide__ = True
    wanted = check_engines(engines or installed_engines())
    paths = _check_paths(paths, wanted)
    return _check(callable_spec(build_model), None, x, y, {e: list(paths) for e in wanted}, spec, steps, epochs,
                  batch_size, seed, rtol, atol, pool)


def assert_loop_matches_fit(build_model, train_step, x, y, *, engine: str, spec=None, optimizer=None,
                            steps: int | None = None, epochs: int | None = None, batch_size: int | None = None,
                            seed: int | None = None, rtol: float = tolerances.TRAINING_RTOL,
                            atol: float = tolerances.TRAINING_ATOL, pool: Workers = None):
    """Assert that your own training step, on `engine`, trains the model step for step as `fit` does.

    `train_step` is importable ("module:function", or a function at module top level), on the engine's terms:
        torch:      step(model, optimizer, x, y) -> loss. The optimizer is the spec's, Keras-exact, as a
                    torch.optim.Optimizer (`native.torch.optim`); it clips inside `step()` where the spec clips, as
                    Keras's optimizer does, and its schedule is stepped after each call (your step is given no
                    scheduler). Nothing else is done for your step: it zeroes its own gradients. The gradients it
                    leaves in `.grad` are compared.
        jax:        make_step(model, optimizer) -> step(state, x, y) -> (state, loss) or (state, loss, grads), pure,
                    over `model.stateless_call`; state is (trainable, non_trainable, opt_state) and the optimizer the
                    spec's Keras-exact optax transform (`native.jax.optim`). The step is jitted here.
        tensorflow: make_step(model, optimizer) -> step(x, y) -> loss or (loss, grads), the optimizer the spec's
                    Keras optimizer, built; a plain function is wrapped in `tf.function`.
    x is one tensor, or a list for several inputs. Gradients, where the step gives them, are compared with `fit`'s
    before the update, so a failure can tell a gradient from an optimizer.

    `optimizer`: your own, importable, instead of the spec's Keras-exact one: `make(params)` returning a
    torch.optim.Optimizer, `make()` returning an optax transform (its state is what the step is given), or `make()`
    returning a Keras optimizer; the spec still says what `fit` uses. Other arguments are those of
    `assert_training_matches`.
    """
    __tracebackhide__ = True
    if not isinstance(engine, str):
        raise ParityError(f"engine must name the one engine your step is written for, got {engine!r}")
    check_engines([engine])
    own = {"step": callable_spec(train_step, "train_step"),
           "optimizer": None if optimizer is None else callable_spec(optimizer, "optimizer")}
    return _check(callable_spec(build_model), own, x, y, {engine: ["fit", OWN]}, spec, steps, epochs, batch_size,
                  seed, rtol, atol, pool)


def _check_paths(paths, engines: list[str]) -> tuple[str, ...]:
    paths = (paths,) if isinstance(paths, str) else tuple(paths)
    unknown = [p for p in paths if p not in PATHS]
    if unknown or not paths or len(set(paths)) != len(paths):
        raise ParityError(f"paths must be distinct names among {', '.join(PATHS)}; got {', '.join(paths) or 'none'}")
    if "native-engine" in paths and "tensorflow" in engines:
        raise ParityError("tensorflow has no optimizers but Keras's, so no native-engine path: drop native-engine "
                          "or tensorflow from the engines")
    if len(paths) * len(engines) < 2:  # it passed, having compared nothing
        raise ParityError(f"one path on one engine ({engines[0]}/{paths[0]}) has nothing to compare with: give "
                          "another path (paths=('fit', 'native')) or another engine")
    return paths


def _config(spec, batch_size, seed) -> TrainConfig:
    """The spec, on the shared NumPy batch order, without validation (nothing to validate on)."""
    try:
        cfg = spec if isinstance(spec, TrainConfig) else TrainConfig.from_dict(spec or {})
        if cfg.patience is not None:
            raise ParityError("spec: patience (early stopping) watches a validation loss, which training parity has "
                              "no use for; drop it")
        cfg = cfg.replace(batch_order="numpy", validate=False, patience=None, metrics=(),
                          **({} if batch_size is None else {"batch_size": batch_size}),
                          **({} if seed is None else {"seed": seed}))
    except TypeError as err:
        raise ParityError(f"spec: {err}; give a TrainConfig or a dict of its fields") from None
    except SpecError as err:
        raise ParityError(f"spec: {err}") from None
    return cfg


def _check(build, own, x, y, runs, spec, steps, epochs, batch_size, seed, rtol, atol, pool):
    __tracebackhide__ = True  # pytest shows the report, not this module's frames
    cfg = _config(spec, batch_size, seed)
    check_tolerances(rtol, atol)
    xs, ys, n = examples(x, y)
    per_epoch = math.ceil(n / cfg.batch_size)
    if steps is not None and epochs is not None:
        raise ParityError("give steps or epochs, not both")
    for name, value in (("steps", steps), ("epochs", epochs)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ParityError(f"{name} must be a whole number >= 1, got {value!r}")
    total = steps if steps is not None else (epochs or 1) * per_epoch
    cfg = cfg.replace(epochs=math.ceil(total / per_epoch))
    with tempfile.TemporaryDirectory(prefix="training-parity-") as tmp:
        tmp = Path(tmp)
        started = pool is None
        pool = pool() if callable(pool) else pool or runner.Pool(list(runs), tmp, compile_cache=True)
        try:
            require_live(pool, runs)
            np.savez(tmp / "inputs.npz", n_inputs=len(xs), n_targets=len(ys), **{f"x{i}": a for i, a in enumerate(xs)},
                     **{f"y{i}": a for i, a in enumerate(ys)})
            common = {"build": build, "inputs": str(tmp / "inputs.npz"), "config": cfg.to_dict()}
            engines = list(runs)
            ask(pool, engines[:1], lambda e: {**common, "draw": str(tmp / "init.npz")}, build, "compare.parity.steps:trajectory")
            with np.load(tmp / "init.npz") as z:
                names, trainable = [str(s) for s in z["names"]], [bool(t) for t in z["trainable"]]
                size = sum(z[f"w_{i}"].size for i in range(len(names)))
                drawing = [str(s) for s in z["drawing"]]
            if drawing and len(runs) > 1:
                raise ParityError(f"{build} draws random numbers while training (layer {drawing[0]!r}), and each "
                                  "engine draws from its own generator, so its training differs between engines by "
                                  "design, not by a fault; compare it within one engine (engines=['"
                                  f"{engines[0]}']), or across engines without the draws (assert_forward_match or "
                                  "assert_gradients_match, training=False)")
            if not any(trainable):
                raise ParityError(f"{build} has no trainable weights, so nothing trains; unfreeze a layer "
                                  "(trainable=True) or give another model")
            values = size * (total + 1) * sum(map(len, runs.values()))
            if values > MAX_VALUES:
                raise ParityError(f"{total} steps of {size:,} weights on {sum(map(len, runs.values()))} paths is "
                                  f"{values:,} values to record, more than {MAX_VALUES:,}: ask for fewer steps")
            ask(pool, engines, lambda e: {**common, "init": str(tmp / "init.npz"), "paths": runs[e], "steps": total,
                                          **(own or {}), "out": str(tmp / f"trajectory-{e}.npz")},
                build, "compare.parity.steps:trajectory", "the model, the spec, the data or the step")
            found = [run for e in engines for run in _load(tmp / f"trajectory-{e}.npz", e, runs[e], len(names))]
            parted = [(a, b, k) for a, b in _pairs(found) if (k := first_divergence(a, b, rtol, atol)) is not None]
            if parted:
                _refuse_diverged(build, min(parted, key=lambda p: p[2]))
                order = numpy_orders(cfg.seed, n, cfg.epochs)
                rows = [order[e][s] for e in range(cfg.epochs) for s in batch_slices(n, cfg.batch_size)]
                a, b, k = min(parted, key=lambda p: p[2])
                probes = _probes(pool, common, {a.engine, b.engine}, a, k, rows[k - 1], build, tmp)
                report = localize(a, b, k, names, trainable, probes, rtol, atol, total, per_epoch,
                                  clips=cfg.clipnorm is not None or cfg.global_clipnorm is not None)
                others = [f"also parting: {q.label} from {p.label} at step {s}" for p, q, s in parted
                          if (p, q) != (a, b)]
                others += _odd_one_out(found, parted)
                raise AssertionError("\n".join([f"training parity failed for {build}", report, *others]))
        finally:
            if started:
                pool.close()
    return {run.label: dict(zip(names, run.weights)) for run in found}


def _load(path: Path, engine: str, paths: list[str], count: int) -> list[Run]:
    with np.load(path) as z:
        runs = []
        for p in paths:
            grads = sorted((k for k in z.files if k.startswith(f"{p}/g_")), key=lambda k: int(k.rsplit("_", 1)[1]))
            runs.append(Run(engine, p, [z[f"{p}/w_{i}"] for i in range(count)], z[f"{p}/loss"],
                            [z[k] for k in grads] or None))
        return runs


def _pairs(runs: list[Run]) -> list[tuple[Run, Run]]:
    """Each path against its engine's first path, and each engine's first path against the first engine's."""
    heads = {}
    for run in runs:
        heads.setdefault(run.engine, run)
    first = runs[0]
    return ([(heads[r.engine], r) for r in runs if r is not heads[r.engine]]
            + [(first, head) for head in heads.values() if head is not first])


def _odd_one_out(runs: list[Run], parted) -> list[str]:
    """When every other engine parts from the first engine's path, the first engine is the likely odd one out (the
    report compares against it only because it comes first)."""
    first, heads = runs[0], {r.engine for r in runs} - {runs[0].engine}
    if len(heads) >= 2 and heads == {b.engine for a, b, _ in parted if a is first and b.path == first.path}:
        return [f"every other engine parts from {first.label}: {first.engine} is the likely odd one out"]
    return []


def first_divergence(a: Run, b: Run, rtol: float, atol: float) -> int | None:
    """The first step after which some weight of `b` is beyond `atol + rtol·|a|` of `a`'s (0: the start), or None."""
    parted = None
    for wa, wb in zip(a.weights, b.weights, strict=True):
        wa, wb = wa.astype(np.float64).reshape(len(wa), -1), wb.astype(np.float64).reshape(len(wb), -1)
        with np.errstate(invalid="ignore", over="ignore"):
            excess = np.where(np.isfinite(wa) & np.isfinite(wb), np.abs(wb - wa) - (atol + rtol * np.abs(wa)), np.inf)
        steps = np.flatnonzero(excess.max(axis=1, initial=-np.inf) > 0)
        if steps.size and (parted is None or steps[0] < parted):
            parted = int(steps[0])
    return parted


def _refuse_diverged(build: str, first: tuple[Run, Run, int]) -> None:
    """Where the first parting is two paths that both left the finite numbers at that step, there is no parity to
    judge (nor a stage to blame): the training diverged alike on both. One AssertionError that says so."""
    a, b, k = first
    if all(any(not np.isfinite(w[k]).all() for w in run.weights) for run in (a, b)):
        raise AssertionError(f"training parity failed for {build}: {a.label} and {b.label} both reach NaN or inf "
                             f"at step {k}, so there is nothing to compare: the training diverges (a smaller "
                             "learning rate, an epsilon > 0, a clip, or data without extreme values)")


def _probes(pool, common, engines, a: Run, k: int, rows, build, tmp: Path) -> dict[str, dict]:
    """Each engine's layer outputs, objective and gradient at the weights `a` held after step k − 1, on step k's
    batch."""
    np.savez(tmp / "probe-weights.npz", **{f"w_{i}": w[k - 1] for i, w in enumerate(a.weights)})
    request = {**common, "weights": str(tmp / "probe-weights.npz"), "rows": [int(r) for r in rows]}
    ask(pool, sorted(engines), lambda e: {**request, "out": str(tmp / f"probe-{e}.npz")}, build, "compare.parity.steps:probe",
        "probing the step where the paths part")
    found = {}
    for e in engines:
        with np.load(tmp / f"probe-{e}.npz") as z:
            layers = [str(s) for s in z["names"]]
            found[e] = {"layers": layers, "outputs": [z[f"o_{i}"] for i in range(len(layers))],
                        "loss": float(z["loss"]), "loss_inference": float(z["loss_inference"]),
                        "flagged": str(z["flagged"]), "grads": [z[k] for k in sorted(
                            (k for k in z.files if k.startswith("g_")), key=lambda k: int(k[2:]))]}
    return found


def localize(a: Run, b: Run, k: int, names, trainable, probes, rtol, atol, total: int, per_epoch: int,
             clips: bool = False) -> str:
    """The report of the first step where `b` parts from `a`: the first stage that differs, from `a`'s weights.
    `clips`: the spec clips by norm, so a step's gradients may be `fit`'s times one common factor (a clip of the
    step's own) before the optimizer, whose update is then `fit`'s: that factor alone is no difference."""
    if k == 0:
        return f"{b.label} and {a.label} start from different weights: the start was not set on every path"
    before = max((float(np.max(np.abs(wb[k - 1].astype(np.float64) - wa[k - 1]), initial=0.0))
                  for wa, wb in zip(a.weights, b.weights)), default=0.0)
    epoch, batch = divmod(k - 1, per_epoch)
    head = [f"{b.label} parts from {a.label} at step {k} of {total} (epoch {epoch + 1}, batch {batch + 1} of "
            f"{per_epoch}); after step {k - 1} every weight was within tolerance (largest |diff| {before:.2e})"]
    pa, pb = probes[a.engine], probes[b.engine]
    summary, found = [], None
    for stage in STAGES:
        rows, note = _stage(stage, a, b, k, names, trainable, pa, pb, rtol, atol, clips)
        summary.append(f"{stage} {'DIFFERS' if rows else note or 'equal'}")
        if rows:
            found = stage, rows
            break
    cols = ("stage", "name", b.label, a.label, "worst at", "|diff|", "allowed")
    if found is None:
        rows = [(f"weight after step {k}", n, *_cells(w)) for n, wa, wb in zip(names, a.weights, b.weights)
                if (w := worst(wb[k], wa[k], rtol, atol))]
        return "\n".join(head + [
            "no stage differs from the same weights: differences within tolerance grew until they crossed it (the "
            "model amplifies rounding, e.g. a ReLU or |x| crossing zero on one path only); train fewer steps or pass "
            "a larger atol",
            "stages: " + " · ".join(summary), table(cols, rows), _allowed(rtol, atol)])
    stage, rows = found
    why = CAUSES[stage]
    if stage == "loss" and _in_inference_mode(a, b, k, pa, rtol, atol):
        why = CAUSES["flag"] + (f"; the first layer whose output the flag changes: {pa['flagged']!r}"
                                if pa["flagged"] else "")
    elif stage == "update" and _near_zero(rows, names, trainable, pa["grads"], atol):
        why = CAUSES["noise"]
    elif stage == "update" and not summary[2].startswith("gradient equal"):
        why = CAUSES["unseen"]
    return "\n".join(head + [
        f"first stage that differs: {stage}, at {rows[0][1]!r} (from the weights {a.label} held after step {k - 1}, "
        "on that step's batch)",
        f"likely cause: {why}",
        "stages: " + " · ".join(summary), table(cols, rows), _allowed(rtol, atol)])


def _stage(stage, a: Run, b: Run, k, names, trainable, pa, pb, rtol, atol, clips: bool = False):
    """The failing rows of one stage (stage, name, b's value, a's value, worst at, |diff|, allowed), and a note
    when the stage could not be compared (or, for gradients, how they compared)."""
    across = a.engine != b.engine
    trained = [n for n, t in zip(names, trainable) if t]
    rows = []
    if stage == "forward":
        if not across:
            return [], "not compared (one engine)"
        if pa["layers"] != pb["layers"]:
            return [("forward", "layers", ", ".join(pb["layers"]), ", ".join(pa["layers"]), "", "inf", "0")], ""
        pairs = [(n, ob, oa) for n, oa, ob in zip(pa["layers"], pa["outputs"], pb["outputs"])]
    elif stage == "loss":
        pairs = [("objective", pb["loss"], pa["loss"])] if across else []
        for run, probe in ((b, pb), (a, pa)):  # a step's own loss against the objective fit computes there
            if np.isfinite(run.loss[k - 1]):
                pairs.append((f"{run.label}'s loss", run.loss[k - 1], probe["loss"]))
        if not pairs:
            return [], "not compared (one engine)"
    elif stage == "gradient":
        pairs = [(n, gb, ga) for n, ga, gb in zip(trained, pa["grads"], pb["grads"])] if across else []
        note = ""
        for run, probe in ((b, pb), (a, pa)):
            if run.grads is not None:
                got = [g[k - 1] for g in run.grads]
                scale = _clip_factor(got, probe["grads"]) if clips else 1.0
                if scale != 1.0:  # the step's own clip: each gradient fit's times one factor, which is no fault
                    note = f"equal up to one factor, {scale:.4g} (a clip in your step)"
                pairs += [(n, g, scale * want) for n, g, want in zip(trained, got, probe["grads"])]
        if not pairs:
            if OWN in (a.path, b.path) and b.engine == "torch":
                return [], "not observable (your step left no .grad when it called optimizer.step())"
            if OWN in (a.path, b.path):
                return [], "not observable (return the gradients from your step to compare them)"
            return [], "not compared (one engine)"
    elif stage == "update":
        pairs = [(n, wb[k] - wb[k - 1], wa[k] - wa[k - 1])
                 for n, wa, wb, t in zip(names, a.weights, b.weights, trainable) if t]
    else:
        pairs = [(n, wb[k], wa[k]) for n, wa, wb, t in zip(names, a.weights, b.weights, trainable) if not t]
        if not pairs:
            return [], "none"
    for name, got, want in pairs:
        w = worst(got, want, rtol, atol)
        if w:
            rows.append((stage, name, *_cells(w)))
    if stage == "gradient":  # backward runs from the last layer: the latest weight that differs is nearest the cause
        rows.reverse()
        return rows, note
    return rows, ""


def _clip_factor(got, want) -> float:
    """The one factor in (0, 1) by which `got` (a step's gradients) is `want` (fit's) where most of the weights
    agree, as a clip by the norm makes it; 1.0 where there is none. Each weight's own least-squares ratio; the
    median of them, so that a weight the step got wrong (a sign, a scale) does not move it."""
    ratios = [float(np.vdot(g, w) / np.vdot(w, w)) for g, w in zip(got, want) if np.vdot(w, w) > 0]
    factor = float(np.median(ratios)) if ratios else 1.0
    return factor if 0 < factor < 1 - tolerances.TRAINING_RTOL else 1.0


def _in_inference_mode(a: Run, b: Run, k: int, probe, rtol: float, atol: float) -> bool:
    """Whether the step's own loss (a user's step reports one) is the objective in inference mode rather than the
    training objective, where the two differ."""
    train, inference = probe["loss"], probe["loss_inference"]
    close = lambda u, v: abs(u - v) <= atol + rtol * abs(v)  # noqa: E731
    return not close(inference, train) and any(np.isfinite(run.loss[k - 1]) and close(run.loss[k - 1], inference)
                                               and not close(run.loss[k - 1], train) for run in (a, b))


def _near_zero(rows, names, trainable, grads, atol: float) -> bool:
    """Whether the gradient (at the shared weights) is within `atol` of zero at every failing update's worst
    element."""
    by_name = dict(zip([n for n, t in zip(names, trainable) if t], grads))
    return all(abs(float(by_name[name][index])) <= atol for _, name, _, _, index, _, _ in rows)


def _cells(w) -> tuple:
    index, value, expected, diff, allowed = w
    return f"{value:.6e}", f"{expected:.6e}", index, f"{diff:.2e}", f"{allowed:.2e}"


def _allowed(rtol: float, atol: float) -> str:
    return f"allowed |diff| = {atol:g} + {rtol:g}·|right-hand value|"
