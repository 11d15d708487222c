"""Training parity through the `training_parity` and `loop_parity` fixtures: every path and engine step for step
(the zoo's models pass), users' own steps against `fit`, and one planted fault per stage, each traced to its stage
and weight by the report."""
import re

import numpy as np
import pytest

from compare.data import panel as har_data
from compare.engines import runner
from compare.parity import ParityError, assert_loop_matches_fit
from keras_side.arrays import first, take
from keras_side.backend import installed_engines
from keras_side.zoo import ZOO
from tests.compare import parity_loops, parity_models
from tests.tiers import rows

RNG = np.random.default_rng(0)
X, Y = RNG.normal(size=(64, 3)).astype(np.float32), RNG.normal(size=(64, 1)).astype(np.float32)
FAST = {"epochs": 2, "batch_size": 16}  # 8 steps, 4 per epoch
SGD = {"optimizer": "sgd", "learning_rate": 0.05}  # the step is the gradient: a gradient's scale shows (Adam's hides)
WIDE_EPSILON = {"epsilon": 1e-3}  # where the epsilon conventions part visibly (at 1e-7 they differ by ~1e-8 a step)


def failure(check, *args, **kwargs) -> dict:
    """The report of a check that must fail, as {line label: text}, with its table's rows."""
    with pytest.raises(AssertionError) as err:
        check(*args, **kwargs)
    lines = str(err.value).splitlines()
    head = {key: line for line in lines for key in ("first stage", "likely cause", "stages") if line.startswith(key)}
    table = lines[lines.index(next(ln for ln in lines if ln.startswith("stage "))) + 1:]
    rows = [r.split() for r in table if not r.startswith(("allowed", "also", "every other"))]
    return {**head, "parts": lines[1], "rows": rows, "odd": [ln for ln in lines if ln.startswith("every other")]}


def test_every_path_on_every_engine_steps_alike(training_parity):
    found = training_parity(parity_models.har, X, Y, **FAST)
    engines = installed_engines()
    assert set(found) == {f"{e}/{p}" for e in engines for p in ("fit", "train-step", "native")}
    kernel = found["torch/fit"]["har/har/kernel"]
    assert kernel.shape == (9, 3, 1)  # the start and 8 steps
    assert np.all(np.abs(np.diff(kernel, axis=0)).max(axis=(1, 2)) > 0)  # every step is recorded, not every epoch
    assert all(np.array_equal(t["har/har/kernel"][0], kernel[0]) for t in found.values())  # one start


# har_recent is the har with sample weights, which training parity does not take: har covers the model. make test:
# moving statistics, masks per engine, two outputs (the HAR is the test above's; the classifier's metric on integer
# labels and the panel's two inputs end where fit ends, every engine and path, in test_zoo.py's make test run).
ZOO_MODELS = rows([m for m in ZOO if m != "har_recent"],
                  fast=["bn_mlp", "dropout_mlp", "two_horizons"])


@pytest.mark.parametrize("name", ZOO_MODELS)
def test_the_zoos_models_train_alike(training_parity, panel, name):
    """The true negative: every zoo model, every path, three steps (the last one short). A model that draws random
    numbers (Dropout) is compared within each engine, which draws its own masks."""
    entry = ZOO[name]
    prepared = har_data.prepare_kind(panel, entry.data)
    rows = slice(0, 80)
    x, y = take(prepared.x_train, rows), take(prepared.y_train, rows)
    x, y = (list(x) if isinstance(x, tuple) else x), (list(y) if isinstance(y, tuple) else y)
    for engines in [[e] for e in installed_engines()] if entry.draws else [installed_engines()]:
        found = training_parity(entry.build, x, y, spec=entry.spec, epochs=1, batch_size=32, engines=engines)
        assert all(len(first(list(t.values()))) == 4 for t in found.values())


def test_a_layer_whose_torch_forward_is_skewed_is_named(training_parity):
    report = failure(training_parity, parity_models.skewed_middle, X, Y, **FAST)
    assert report["first stage"] == ("first stage that differs: forward, at 'skew' (from the weights torch/fit held "
                                     "after step 1, on that step's batch)")
    assert report["parts"].startswith("jax/fit parts from torch/fit at step 2 of 8")
    assert [r[:2] for r in report["rows"]] == [["forward", "skew"], ["forward", "last"]]
    assert report["odd"] == ["every other engine parts from torch/fit: torch is the likely odd one out"]


def test_a_custom_gradient_that_differs_is_named(training_parity):
    report = failure(training_parity, parity_models.gradient_skewed, X, Y, spec=SGD, **FAST)
    assert report["stages"] == "stages: forward equal · loss equal · gradient DIFFERS"
    assert report["first stage"].startswith("first stage that differs: gradient, at 'sequential/odd_gradient/kernel'")
    # backward from there, the first layer's gradients differ too: they are listed after it
    assert [r[1] for r in report["rows"]][1:] == ["sequential/first/bias", "sequential/first/kernel"]


def test_adams_scale_invariance_hides_a_scaled_gradient(training_parity):
    """The same planted gradient under Adam: m/sqrt(v) does not change when every gradient is 1.01 times larger, so
    the weights stay within tolerance. What training parity can see depends on the optimizer."""
    training_parity(parity_models.gradient_skewed, X, Y, steps=4, batch_size=16)


def test_the_engines_stock_optimizer_is_named_as_an_update(training_parity):
    report = failure(training_parity, parity_models.har, X, Y, spec=WIDE_EPSILON, paths=["fit", "native-engine"],
                     engines=["torch", "jax"], **FAST)
    assert report["parts"].startswith("torch/native-engine parts from torch/fit at step 1 of 8")
    # the loop's own batch loss against fit's objective; the gradient both take of it is not seen apart
    assert report["stages"] == ("stages: forward not compared (one engine) · loss equal · gradient not compared (one "
                                "engine) · update DIFFERS")
    assert report["likely cause"].startswith("likely cause: another update, from gradients that could not be "
                                             "compared here")
    assert "a weight's constraint left out" in report["likely cause"]  # a user's step without it: an update too


def test_a_model_with_two_outputs_is_traced_too(training_parity, panel):
    """Two targets travel as a list to every stage of the trace (the probe's loss and gradient among them)."""
    prepared = har_data.prepare_kind(panel, "horizons")
    x, y = prepared.x_train[:64], [t[:64] for t in prepared.y_train]
    spec = {**ZOO["two_horizons"].spec, **WIDE_EPSILON}
    report = failure(training_parity, ZOO["two_horizons"].build, x, y, spec=spec, paths=["fit", "native-engine"],
                     engines=["jax"], **FAST)
    assert report["stages"].endswith("update DIFFERS") and report["parts"].startswith("jax/native-engine parts")


def test_rounding_noise_on_a_zero_gradient_is_told_from_a_convention(training_parity):
    """A Dense bias before BatchNorm has a gradient of zero in exact arithmetic: each engine's rounding noise, which
    Adam divides by its own size into full steps. The report says so rather than blaming the optimizer."""
    report = failure(training_parity, parity_models.batchnorm_with_bias, X, Y, **FAST)
    assert report["stages"].endswith("update DIFFERS") and {r[1] for r in report["rows"]} == {"sequential/first/bias"}
    assert "where the gradient is ~0" in report["likely cause"]


CLIPPED = {"optimizer": "sgd", "learning_rate": 0.05, "clipnorm": 0.1}  # clips every step: gradients here are ~1


@pytest.mark.parametrize("engine, step, build, spec", [
    ("torch", parity_loops.torch_step, parity_models.regularized, None),
    ("torch", parity_loops.torch_step, parity_models.regularized, CLIPPED),  # the optimizer clips inside step()
    ("jax", parity_loops.jax_step, parity_models.batchnorm_model, None),
    ("tensorflow", parity_loops.tensorflow_step, parity_models.regularized, None),
])
def test_your_own_step_that_is_fit_passes(loop_parity, engine, step, build, spec):
    found = loop_parity(build, step, X, Y, engine=engine, spec=spec, **FAST)
    assert set(found) == {f"{engine}/fit", f"{engine}/own"}


def test_a_loss_without_model_losses_is_named(loop_parity):
    report = failure(loop_parity, parity_models.regularized, parity_loops.torch_step_without_model_losses, X, Y,
                     engine="torch", **FAST)
    assert report["first stage"].startswith("first stage that differs: loss, at \"torch/own's loss\"")
    assert "model.losses" in report["likely cause"]


def test_a_step_that_never_zeroes_its_gradients_is_named(loop_parity):
    """The fixture does not zero the gradients for the step (it did, so this fault passed): they accumulate, and the
    second step's gradient is the first that differs."""
    report = failure(loop_parity, parity_models.regularized, parity_loops.torch_step_without_zero_grad, X, Y,
                     engine="torch", **FAST)
    assert report["first stage"].startswith("first stage that differs: gradient"), report
    assert "zero_grad() left out" in report["likely cause"]


@pytest.mark.parametrize("build, layer", [(parity_models.dropout_model, "drop"), (parity_models.batchnorm_model, "bn")])
def test_a_step_in_inference_mode_is_named_with_the_first_layer_the_flag_changes(loop_parity, build, layer):
    """The forward is not compared on one engine, so the report does not claim equal outputs: it finds the step's
    loss equal to the objective in inference mode and names the first layer whose output the flag changes."""
    report = failure(loop_parity, build, parity_loops.torch_step_in_inference_mode, X, Y, engine="torch", **FAST)
    assert report["first stage"].startswith("first stage that differs: loss,"), report
    assert report["likely cause"].startswith("likely cause: your step's loss is the objective in inference mode")
    assert report["likely cause"].endswith(f"the first layer whose output the flag changes: {layer!r}")


def test_a_fault_inside_a_step_that_clips_is_named_at_its_update(loop_parity):
    """A step that clips its gradients itself hands the optimizer fit's gradients times one factor: that factor is
    no fault (the same step without the planted fault passes), so the report goes on to the update, and names the one
    kernel that moved against it (it blamed every weight's gradient)."""
    spec = {**SGD, "global_clipnorm": parity_loops.CLIP}
    loop_parity(parity_models.regularized, parity_loops.torch_step_clipping, X, Y, engine="torch", spec=spec, **FAST)
    report = failure(loop_parity, parity_models.regularized, parity_loops.torch_step_clipping_with_a_sign_fault, X, Y,
                     engine="torch", spec=spec, **FAST)
    assert report["first stage"].startswith("first stage that differs: update,"), report
    assert "gradient equal up to one factor" in report["stages"]
    assert {r[1] for r in report["rows"]} == {report["rows"][0][1]} and report["rows"][0][1].endswith("kernel")


def test_a_step_with_its_own_optimizer_that_leaves_out_the_clip_is_named_at_the_update(loop_parity):
    """With the user's own optimizer the fixture clips nothing for the step: a step that leaves out the clip `fit`'s
    spec asks for fails at the update, where the clip applies; the same step with `clip_grad_norm_` passes."""
    spec = {**SGD, "global_clipnorm": parity_loops.CLIP}
    report = failure(loop_parity, parity_models.regularized, parity_loops.torch_step, X, Y, engine="torch", spec=spec,
                     optimizer=parity_loops.torch_sgd, **FAST)
    assert report["first stage"].startswith("first stage that differs: update,"), report
    assert "where the clip applies" in report["likely cause"]
    loop_parity(parity_models.regularized, parity_loops.torch_step_clipping, X, Y, engine="torch", spec=spec,
                optimizer=parity_loops.torch_sgd, **FAST)


def test_the_documented_report_is_this_codes():
    """docs/parity.md reads a report line by line, and the README quotes it: both are what the code prints, in a
    worker of its own, as a reader's first check runs. Its weights' 7th digit is not the code's to keep: the same
    check printed torch Adam's bias update as -9.991999e-03 in one worker and -9.991998e-03 in another (float32's
    last bit), so the numbers are compared to `REPORT_DIGITS` significant digits."""
    from tests.conftest import REPO

    with pytest.raises(AssertionError) as err:
        assert_loop_matches_fit(parity_models.har, parity_loops.torch_step, X, Y, engine="torch",
                                optimizer=parity_loops.torch_adam, spec=WIDE_EPSILON, **FAST)
    printed = rounded(str(err.value))
    page = rounded((REPO / "docs" / "parity.md").read_text())
    assert f"```text\n{printed}\n```" in page
    readme = rounded((REPO / "README.md").read_text())
    quoted = [ln for ln in printed.splitlines() if ln.startswith(("torch/own parts", "first stage", "stages"))]
    assert "\n".join(quoted) in readme


REPORT_DIGITS = 5  # a float32 weight printed to 7 digits differs in its last one between workers; 5 are the code's


def rounded(text: str) -> str:
    """`text` with every number in scientific notation to `REPORT_DIGITS` significant digits."""
    return re.sub(r"-?\d\.\d+e[+-]\d+", lambda m: f"{float(m.group()):.{REPORT_DIGITS - 1}e}", text)


def test_rounded_keeps_the_digits_a_report_line_means():
    assert rounded("bias  -9.991999e-03  1.01e-05") == rounded("bias  -9.991998e-03  1.01e-05") == (
        "bias  -9.9920e-03  1.0100e-05")
    assert rounded("-9.991999e-03") != rounded("-9.990999e-03")


@pytest.mark.parametrize("engine, step, optimizer", [
    ("torch", parity_loops.torch_step, parity_loops.torch_adam),
    ("jax", parity_loops.jax_step, parity_loops.optax_adam),
])
def test_another_epsilon_convention_is_named_as_the_update(loop_parity, engine, step, optimizer):
    report = failure(loop_parity, parity_models.har, step, X, Y, engine=engine, optimizer=optimizer,
                     spec=WIDE_EPSILON, **FAST)
    assert report["stages"] == ("stages: forward not compared (one engine) · loss equal · gradient equal · "
                                "update DIFFERS")
    assert {r[1] for r in report["rows"]} == {"har/har/kernel", "har/har/bias"}


def test_batchnorm_state_that_is_not_threaded_is_named(loop_parity):
    report = failure(loop_parity, parity_models.batchnorm_model, parity_loops.jax_step_dropping_state, X, Y,
                     engine="jax", **FAST)
    assert report["stages"].endswith("gradient not observable (return the gradients from your step to compare them) "
                                     "· update equal · state DIFFERS")
    assert {r[1] for r in report["rows"]} == {"sequential/bn/moving_mean", "sequential/bn/moving_variance"}


@pytest.mark.parametrize("call, message", [
    (lambda t, lp: t(parity_models.har, X, Y, paths=["fit", "native-eager"]), "paths must be distinct names among"),
    (lambda t, lp: t(parity_models.har, X, Y, steps=2, epochs=1), "give steps or epochs, not both"),
    (lambda t, lp: t(parity_models.har, X, Y, steps=0), "steps must be a whole number >= 1"),
    (lambda t, lp: t(parity_models.har, X, Y[:10]), "x and y must have the same number of rows"),
    (lambda t, lp: t(parity_models.har, list(X), Y), "same number of rows; got \\[3, 64\\]; a list is several inputs"),
    (lambda t, lp: t(parity_models.har, X[:0], Y[:0]), "x and y have no rows; give at least one example"),
    (lambda t, lp: t(parity_models.har, np.where(np.arange(64)[:, None] == 5, np.nan, X), Y),
     "x holds NaN or inf \\(first in row 5\\), which every engine would carry alike"),
    # a NaN tolerance let every difference through (a comparison with NaN is false), a negative one failed equal runs
    (lambda t, lp: t(parity_models.har, X, Y, rtol=float("nan")), "rtol must be a finite number >= 0, got nan"),
    (lambda t, lp: lp(parity_models.har, parity_loops.torch_step, X, Y, engine="torch", atol=-1.0),
     "atol must be a finite number >= 0, got -1.0"),
    (lambda t, lp: t(parity_models.a_layer, X, Y, **FAST), "the model builder returned Dense, not a keras.Model"),
    (lambda t, lp: t(parity_models.all_frozen, X, Y, **FAST), "all_frozen has no trainable weights, so nothing "
                                                              "trains"),
    # each engine draws its own masks: refused before training, rather than blamed on one engine after it
    (lambda t, lp: t(parity_models.dropout_model, X, Y, **FAST), "dropout_model draws random numbers while training "
                                                                 "\\(layer 'drop'\\), and each engine draws from "
                                                                 "its own generator"),
    (lambda t, lp: t(parity_models.har, X, Y, spec={"optimiser": "sgd"}),
     "spec: 'optimiser' is not a field of the training spec \\(did you mean 'optimizer'\\?\\); its fields: "),
    (lambda t, lp: t(parity_models.har, X, Y, spec={"optimizer": "lion"}), "spec: unknown optimizer 'lion'"),
    (lambda t, lp: t(parity_models.har, X, Y, paths=["fit", "native-engine"]), "tensorflow has no optimizers but"),
    (lambda t, lp: t(parity_models.har, X, Y, seed=1.5), "spec: seed must be a whole number from 0 to 2\\*\\*32 - 1 "
                                                         "\\(NumPy's and JAX's seeds\\), got 1.5"),
    (lambda t, lp: t(parity_models.har, X, Y, seed=2**32), "spec: seed must be a whole number from 0 to 2\\*\\*32 - 1"),
    # it passed, having compared nothing
    (lambda t, lp: t(parity_models.har, X, Y, engines="torch", paths="fit"), "one path on one engine \\(torch/fit\\) "
                                                                             "has nothing to compare with"),
    (lambda t, lp: lp(parity_models.har, parity_loops.torch_step, X, Y, engine=["torch"]), "engine must name the"),
    (lambda t, lp: lp(parity_models.har, "no_such_module:step", X, Y, engine="torch"), "train_step .*cannot be"),
    # was "gradient not observable (your step left no .grad when it called optimizer.step())", and a convention
    (lambda t, lp: lp(parity_models.har, parity_loops.torch_step_that_never_steps, X, Y, engine="torch", **FAST),
     "could not run .*torch_step_that_never_steps did not call optimizer.step\\(\\) in step 1: a torch step applies"),
    (lambda t, lp: lp(parity_models.har, parity_loops.tensorflow_step_of_three, X, Y, engine="tensorflow", **FAST),
     "tensorflow_step_of_three's step returned 3 values; a TensorFlow step returns the loss, or \\(loss, grads\\)"),
    (lambda t, lp: lp(parity_models.har, parity_loops.not_a_step, X, Y, engine="torch"),
     "could not run .*returned str; a torch step returns the batch loss"),
    (lambda t, lp: lp(parity_models.har, parity_loops.torch_step, X, Y, engine="jax"),
     "could not run .*jax: TypeError: compare.parity.timing:torch_step cannot be called as jax calls a step: "
     "make_step\\(model, optimizer\\)"),
])
def test_bad_arguments_are_one_clear_error(training_parity, loop_parity, call, message):
    with pytest.raises(ParityError, match=message):
        call(training_parity, loop_parity)


def test_a_clip_by_norm_on_tensorflows_embedding_slices_parts_unless_dense(training_parity):
    """docs/optimizers.md: TensorFlow's Embedding gradient is one slice per row, and a clip by norm takes the norm
    over the slices, before repeated ids are summed, whatever the optimizer (SGD here); `dense_gradients` sums them
    first, and the engines then step alike."""
    ids = RNG.integers(0, 3, size=(64, 7)).astype(np.int32)  # 3 ids in 7 places: every row repeats one
    spec = {"optimizer": "sgd", "learning_rate": 0.1, "clipnorm": 0.05}
    with pytest.raises(AssertionError, match="tensorflow/fit parts from torch/fit at step 1"):
        training_parity(parity_models.embedding_model, ids, Y, spec=spec, engines=["torch", "tensorflow"],
                        paths=["fit"], **FAST)
    training_parity(parity_models.embedding_model, ids, Y, spec=spec | {"dense_gradients": True},
                    engines=["torch", "tensorflow"], paths=["fit"], **FAST)


def test_paths_that_diverge_alike_are_said_to_diverge(training_parity):
    """NaN on every path at the same step is no parting to trace (the report blamed rounding noise on an update of
    NaN against NaN): one line that says the training diverges."""
    spec = {"optimizer": "adagrad", "epsilon": 0.0, "initial_accumulator_value": 0.0}
    with pytest.raises(AssertionError, match="both reach NaN or inf at step 1, so there is nothing to compare: the "
                                             "training diverges"):
        training_parity(parity_models.dead_relu, X, Y, spec=spec, **FAST)


def test_a_bfloat16_model_whose_engines_part_is_reported(training_parity):
    """bfloat16 rounds otherwise on each engine, so the engines part; the report reads the layers' bfloat16 outputs
    back (it raised ValueError from NumPy, which loads a bfloat16 array as raw bytes)."""
    with pytest.raises(AssertionError, match="training parity failed for tests.compare.parity_models:bfloat16_mlp"):
        training_parity(parity_models.bfloat16_mlp, X, Y, engines=["torch", "jax"], **FAST)  # two engines part


def test_a_loss_of_your_own_in_the_spec_trains_alike(training_parity):
    """A spec's 'module:function' loss, wrapped as `compile(loss=fn)` wraps it, on every path (it raised on each)."""
    own = training_parity(parity_models.har, X, Y, spec={"loss": "tests.compare.parity_models:log_cosh", **SGD},
                          **FAST)
    mse = training_parity(parity_models.har, X, Y, spec=SGD, **FAST)
    assert own.keys() == mse.keys() and len(own) >= len(installed_engines())
    for label, weights in own.items():  # the same start, then log-cosh's steps, not the MSE's
        for name, trajectory in weights.items():
            np.testing.assert_array_equal(trajectory[0], mse[label][name][0])
            assert np.abs(trajectory[1:] - mse[label][name][1:]).max() > 1e-3, (label, name)


@pytest.mark.parametrize("step, message", [
    (parity_loops.torch_step_that_hangs, "the torch worker sent nothing for 5 s and was stopped; look for a hang"),
    (parity_loops.torch_step_that_dies, "torch: worker exited \\(code 3\\)"),
])
def test_a_step_that_hangs_or_kills_its_worker_is_reported(tmp_path, step, message):
    """Its own pool: the session's would lose its torch worker. The quiet limit counts from the worker's last word,
    and a healthy check speaks at the start of every path and at least every second of training, so only the
    planted step's silence should reach it; and were a stalled machine to silence the worker before, the pool holds
    no other worker, so the outcome asserted is the same: this worker stopped and named."""
    with runner.Pool(["torch"], tmp_path) as pool:
        pool.quiet_limit = 5.0
        with pytest.raises(ParityError, match=message):
            assert_loop_matches_fit(parity_models.har, step, X, Y, engine="torch", pool=pool, **FAST)
        assert pool.workers["torch"].proc.poll() is not None  # stopped, not left running


def test_the_timing_benchmark_names_every_check_and_where_its_time_goes():
    """`python -m compare.parity.timing` prints seconds; a test can only check what it measures, never how fast."""
    from compare.parity import timing

    rows = timing.measure(["torch"], repeats=1)
    assert [r["check"] for r in rows] == ["grad_parity", "forward_parity", "training_parity", "loop_parity (torch)"]
    assert all(r["cold_s"] > 0 and r["warm_s"] > 0 for r in rows)
    assert set(rows[0]["phases"]) == {"describe (jax)", "grads (torch)", "grads float64 (jax)"}
    assert set(rows[2]["parts"]) == {"torch/fit", "torch/train-step", "torch/native"}
    assert timing.table(rows).startswith("check")
