"""`train(compile=True)`, the path `torch-native-compile`: one graph per batch shape, no graph break, no recompile,
and the weights the eager loop reaches (within `COMPILED_VS_EAGER_ATOL`)."""
import keras
import numpy as np
import pytest
import torch

from compare.referee.tolerances import COMPILED_VS_EAGER_ATOL
from keras_side import models
from keras_side.determinism import seed_everything
from keras_side.results import compile_apart, compile_in_steps
from keras_side.spec import SpecError, TrainConfig
from native.torch import compiled as torch_compiled
from native.torch import fast
from native.torch import loop
from native.torch import losses as torch_losses
from tests.native.loops import flat
from tests.native.torch.dropouts import functional_dropout, noisy_bn_dropout
from tests.tiers import rows


def test_compiled_loop_equals_the_eager_loop_and_reports_its_compile(har):
    cfg = TrainConfig(epochs=3)
    results = []
    for compile in (False, True):
        seed_everything(0)
        results.append(fast.train(models.har(), har, cfg, compile=compile))
    eager, compiled = results
    assert compiled.path == "torch-native-compile" and eager.compile_seconds is None
    assert compiled.compile_seconds > 0 and compiled.train_seconds > 0
    np.testing.assert_allclose(flat(compiled.weights), flat(eager.weights), atol=COMPILED_VS_EAGER_ATOL, rtol=0)
    np.testing.assert_allclose(compiled.train_loss, eager.train_loss, rtol=1e-5)
    assert not np.allclose(flat(compiled.weights), 0)


def test_a_one_epoch_compiled_run_sets_its_compile_apart_step_by_step(har):
    """With no second epoch to compare the first with, the compile is each batch shape's first step's excess over a
    typical step: the HAR's 18 batches are 17 full ones and a short last one, each shape compiled at its first."""
    seed_everything(0)
    result = fast.train(models.har(), har, TrainConfig(epochs=1, validate=False), compile=True)
    assert result.compile_seconds > 0 and result.train_seconds > 0
    # the arithmetic: (batch rows, seconds) per step; 128-row steps after the first are typical, 31 rows came once
    assert compile_in_steps([(128, 5.0), (128, 1.0), (128, 3.0), (128, 1.0), (31, 4.0)]) == (5 - 1) + (4 - 1)
    assert compile_in_steps([(128, 5.0), (31, 4.0)]) is None  # every step a shape's first: nothing to compare with
    assert compile_apart([10.0], [(128, 6.0), (128, 1.0), (128, 1.0)]) == (5.0, 5.0)
    assert compile_apart([10.0]) == (10.0, None) and compile_apart([10.0, 4.0, 5.0]) == (19.0 - 5.5, 5.5)


# make test: two outputs, masks drawn before the step, a stateful model. The penalties are compiled below (mlp_l2),
# the classifier's metric and the panel's two inputs traced in one graph below, `native-loops zoo` compiles them all.
@pytest.mark.parametrize("name, gradient", rows([("mlp_l2", True), ("har_recent", True), ("two_horizons", True),
                                                 ("classifier", True), ("panel", True), ("dropout_mlp", True),
                                                 ("bn_mlp", False)], fast=["two_horizons", "dropout_mlp", "bn_mlp"]))
def test_the_compiled_loop_takes_a_stateless_models_gradient_in_one_graph(panel, name, gradient, monkeypatch):
    """#15: a model with no state its call updates trains on its objective's gradient compiled in one graph
    (`compiled_gradient`: the regularizers' penalties, sample weights, two weighted outputs, a metric, two inputs
    one of them integers, a Dropout whose masks are drawn before the step); one with moving statistics (bn_mlp) on
    its compiled loss and autograd. Either way the weights the eager loop reaches, and three graphs for the run (the
    full batch, the short one, the update)."""
    from torch._dynamo.utils import counters

    from compare.data import panel as har_data
    from keras_side.zoo import ZOO

    data, entry = har_data.prepare_kind(panel, ZOO[name].data), ZOO[name]
    cfg = TrainConfig(epochs=2, validate=False).replace(**entry.spec)
    taken, compiled_gradient = [], torch_compiled.compiled_gradient
    monkeypatch.setattr(torch_compiled, "compiled_gradient", lambda *a: taken.append(1) or compiled_gradient(*a))
    results = []
    for compile in (False, True):
        seed_everything(0)
        results.append(fast.train(entry.builder()(), data, cfg, compile=compile))
    model = models.ensure_built(entry.builder()(), data.x_train)
    assert bool(taken) == gradient == torch_compiled.stateless(model, torch_compiled.Draws.of(model, data.x_train))
    assert counters["stats"]["unique_graphs"] == 3 and not counters["graph_break"]  # of the compiled run, the last
    np.testing.assert_allclose(flat(results[1].weights), flat(results[0].weights), atol=COMPILED_VS_EAGER_ATOL,
                               rtol=0)
    seed_everything(0)
    start = models.ensure_built(entry.builder()(), data.x_train).get_weights()
    assert np.max(np.abs(flat(results[1].weights) - flat(start))) > 1e-3  # it trained


def test_a_subclassed_model_is_called_as_fit_calls_it_in_the_compiled_gradient(har):
    """Its `call` takes no `training` and adds a loss; a layer's activity penalty counts on each of its two calls:
    compiled, the model goes through its `__call__` as eager and `fit` do, so every loss is in the gradient."""
    class Twice(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(3, activity_regularizer=keras.regularizers.L2(0.1))
            self.out = keras.layers.Dense(1)

        def call(self, x):
            self.add_loss(0.01 * keras.ops.mean(x ** 2))
            return self.out(self.dense(self.dense(x)))

    data = har
    results = []
    for compile in (False, True):
        seed_everything(0)
        model = Twice()
        model(data.x_train[:2])
        results.append(fast.train(model, data, TrainConfig(epochs=2, validate=False), compile=compile))
    assert torch_compiled.stateless(model)
    np.testing.assert_allclose(flat(results[1].weights), flat(results[0].weights), atol=COMPILED_VS_EAGER_ATOL,
                               rtol=0)


def test_a_step_that_cannot_be_one_graph_is_refused_with_its_reason(har):
    """Unseeded noise draws from Keras's global generator, whose state a `StatelessScope` would not keep: the step
    cannot be one graph, and the compiled loop says so instead of training on the same noise every step."""

    class Noisy(keras.layers.Layer):
        def call(self, x):
            return x + keras.random.normal(keras.ops.shape(x))

    model = keras.Sequential([keras.Input((3,)), Noisy(), keras.layers.Dense(1)])
    with pytest.raises(SpecError, match="which its step breaks .*; train it with compile=False"):
        fast.train(model, har, TrainConfig(epochs=1, validate=False), compile=True)


@pytest.mark.parametrize("name", rows(["har", "bn_mlp", "dropout_mlp", "classifier", "lstm", "conv1d", "panel"],
                                      fast=["bn_mlp", "classifier", "lstm", "panel"]))
def test_the_compiled_step_is_one_graph(panel, name):
    """#15: the batch loss `train(compile=True)` compiles traces in one graph, no graph break (bn_mlp had 8, the
    classifier 5, dropout_mlp 5 before its masks were drawn outside: `Draws`), so it compiles once per batch
    shape."""
    from compare.data import panel as har_data
    from keras_side.arrays import take
    from keras_side.zoo import ZOO

    data, entry = har_data.prepare_kind(panel, ZOO[name].data), ZOO[name]
    cfg = TrainConfig().replace(**entry.spec)
    model = models.ensure_built(entry.builder()(), data.x_train)
    torch_compiled.traceable(model)
    loss_fn = torch_losses.spec_loss(cfg, same_rank=True)
    x, y = (loop.tensors(take(a, slice(0, 128)), "cpu") for a in (data.x_train, data.y_train))
    torch.compiler.reset()
    draws = torch_compiled.Draws.of(model, data.x_train)
    masks = draws(len(x)) if draws else ()
    explained = torch._dynamo.explain(lambda xb, yb, masks: fast.total_loss(model, loss_fn, xb, yb,
                                                                                  training=True, masks=masks))(
        x, y, masks)
    assert explained.graph_break_count == 0 and explained.graph_count == 1, explained.break_reasons


# make test: a stateless model's masks (the stateful one's are drawn by the same `Draws`, make test-full)
@pytest.mark.parametrize("build, stateless", rows([(noisy_bn_dropout, False), (functional_dropout, True)],
                                                  fast=[functional_dropout]))
def test_the_compiled_loop_draws_the_masks_outside_its_one_graph(har, build, stateless):
    """A BatchNorm beside the Dropouts (the compiled loss and autograd: not `stateless`), and a Functional model's
    Dropout called twice (the compiled gradient): one graph a batch shape, the eager loop's weights (and moving
    statistics)."""
    from torch._dynamo.utils import counters

    cfg = TrainConfig(epochs=2, validate=False)
    results = []
    for compile in (False, True):
        seed_everything(0)
        model = build()
        results.append(fast.train(model, har, cfg, compile=compile))
    assert torch_compiled.stateless(model, torch_compiled.Draws.of(model, har.x_train)) == stateless
    assert counters["stats"]["unique_graphs"] == 3 and not counters["graph_break"]
    np.testing.assert_allclose(flat(results[1].weights), flat(results[0].weights), atol=COMPILED_VS_EAGER_ATOL,
                               rtol=0)


def test_skipping_guards_after_the_first_epoch_runs_the_same_graphs(har, monkeypatch):
    """#15: after the first epoch the compiled loop checks only the guards that tell its graphs apart
    (`guards_skipped`); the weights end where a run that checks every guard ends, to the bit."""
    cfg = TrainConfig(epochs=3, validate=False)
    runs, skipped, stance = [], [], torch_compiled.guards_skipped
    for skip in (True, False):
        monkeypatch.setattr(torch_compiled, "guards_skipped", lambda: skipped.append(1) or stance() if skip else
                            torch.compiler.set_stance("default"))
        seed_everything(0)
        runs.append(fast.train(models.har(), har, cfg, compile=True))
    assert len(skipped) == 2  # epochs 2 and 3 ran with their guards skipped
    assert all(np.array_equal(a, b) for a, b in zip(runs[0].weights, runs[1].weights))
    assert runs[0].train_loss == runs[1].train_loss


def test_the_compiled_update_equals_the_eager_one_and_never_recompiles():
    """#15: `optim.build(..., compile=True)` fuses the Keras-exact update; a schedule's new rate and each step's count
    come in as tensors, so 30 steps under a decaying rate compile once. Equal to the eager update within float32
    rounding (`COMPILED_VS_EAGER_ATOL`), not to the bit: the fused kernel may contract a multiply and an add."""
    from torch._dynamo.utils import counters

    from native.torch import optim

    cfg = TrainConfig(optimizer="adamw", weight_decay=0.01, schedule="exponential", decay_steps=5, decay_rate=0.5)
    grads = [torch.as_tensor(np.random.default_rng(s).normal(size=(3, 4)).astype(np.float32)) for s in range(30)]
    ends = []
    for compile in (False, True):
        torch.compiler.reset()
        counters.clear()
        w = torch.nn.Parameter(torch.ones(3, 4))
        optimizer, scheduler, _ = optim.build([w], cfg, compile=compile)
        for g in grads:
            w.grad = g.clone()
            optimizer.step()
            scheduler.step()
        ends.append(w.detach().clone())
        assert counters["stats"]["unique_graphs"] == (1 if compile else 0)
    np.testing.assert_allclose(ends[1], ends[0], atol=COMPILED_VS_EAGER_ATOL, rtol=0)
    assert not torch.equal(ends[0], torch.ones(3, 4))


@pytest.mark.parametrize("name", ["har", "mlp_l2"])
def test_a_compiled_run_compiles_three_graphs_and_never_again(panel, name, monkeypatch):
    """#15: the full batch, the short last batch, the optimizer's update: three graphs for the whole run, here
    with every guard checked (so a graph gone stale would recompile, and count). mlp_l2's activity regularizer once
    cost a recompile a step (dynamo guarded on the last step's loss tensor, left in the layer) until torch fell back to
    eager without a word; `fresh_losses` clears it outside the graph."""
    from torch._dynamo.utils import counters

    from compare.data import panel as har_data
    from keras_side.zoo import ZOO

    data, entry = har_data.prepare_kind(panel, ZOO[name].data), ZOO[name]
    assert data.n_train % 128  # a short last batch
    seed_everything(0)
    monkeypatch.setattr(torch_compiled, "guards_skipped", lambda: torch.compiler.set_stance("default"))  # every guard
    fast.train(entry.builder()(), data, TrainConfig(epochs=3, validate=False).replace(**entry.spec),
                     compile=True)
    assert counters["stats"]["unique_graphs"] == 3 and not counters["graph_break"]

