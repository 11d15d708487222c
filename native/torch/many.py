"""Many Keras models at once in PyTorch: `torch.func.vmap` over `model.stateless_call`, stacked `nn.Parameter`s.

Two trainers. `train_seeds` trains a model once per seed, each from its own initial weights and with its own batch
order, with the spec's loss and Keras-exact optimizer (`native.torch.optim`): seed s ends where `loop.train` with
seed s ends (tested). The weights of every model are stacked on a leading axis; the loss is the sum of the
models' own losses, so each model gets exactly its own gradient, and the optimizers are elementwise, so each gets
its own update. That is why a clip over a whole gradient (`clipnorm`, `global_clipnorm`) is refused: it would
clip all the models together, and a weight constraint (`MaxNorm` would take the norm over every model's weights).
So is a model that draws random numbers while training (Dropout): torch's vmap
draws one stream for every model, not each model's own (JAX's trainer takes them).

    start = InitialWeights.of(build, data.x_train).draw(seeds)          # keras_side.initial
    trained = train_seeds(model, data, cfg, start, seed_orders(cfg, seeds, data.n_train))

`train_many`, the walk-forward's, trains the HAR on masked windows, the scheme of `native/jax/many.py`:

    params = train_many(model, x, y, rows, start, cfg)   # x (groups, N, features), rows (groups, models)

Model (g, m) trains on the first `rows[g, m]` rows of group g; each epoch shuffles the N positions once for every
model, and a model's loss on a batch is the mean over the batch's rows inside its window, with torch's own Adam
(one elementwise update of every model). Every model steps on every batch, so each trains exactly as it would
alone (tested); `compile=True` gives the same weights, faster (tested).
"""
from __future__ import annotations

import contextlib
import math

import numpy as np
import torch
from torch.optim.adam import adam as functional_adam

from keras_side.arrays import as_tuple, first, keras_inputs, output_arrays, take
from keras_side.checks import check_data
from keras_side.data import HarData, batch_slices
from keras_side.initial import InitialWeights
from keras_side.results import compile_apart
from keras_side.spec import SpecError, TrainConfig
from native import driver
from native.torch import compiled, loop, optim
from native.torch.losses import spec_loss


def _forward(model):
    """(groups, models, ...) params and (groups, batch, F) inputs -> (groups, models, batch, 1) predictions."""
    one = lambda p, xb: model.stateless_call(list(p), [], xb)[0]  # noqa: E731
    return torch.func.vmap(torch.func.vmap(one, in_dims=(0, None)))  # inner: the group's models share x


# The compiled walk-forward's steps per call of its graph: each call pays the compiled region's wrapper and guards
# once, whatever it holds, so more steps a call train faster; but the compile grows with the steps traced. Two meet
# the walk-forward's target with a compile the tests can afford (docs/dev-notes.md, "Many models at once").
STEPS_PER_CALL = 2


def train_many(model, x: np.ndarray, y: np.ndarray, rows: np.ndarray, params: list[np.ndarray],
               cfg: TrainConfig, *, compile: bool = False, epoch_seconds: list | None = None) -> list[np.ndarray]:
    """Train every model from `params`, its initial weights stacked (groups, models, ...)
    (`InitialWeights.draw_grid`); returns the weights stacked the same way. The epochs' permutations come from their
    own generator, seeded `cfg.seed`. Eager, each batch's loss (the windows' masks, the vmapped forward, the masked
    MSE) goes back through autograd and `torch.optim.Adam` (fused) steps. `compile=True` compiles whole steps
    instead (`_compiled_steps`): the gradient (`torch.func.grad`) and torch's Adam in its functional form in one
    graph, `STEPS_PER_CALL` steps a call, the same for every batch (all have the same shape, the last one padded).
    The same weights as eager (tested); faster than the compiled gradient with the stock `Adam.step` after it
    (docs/dev-notes.md, "Many models at once"), after a long compile (in the first epoch). `epoch_seconds` receives
    each epoch's wall time."""
    engine = WindowSteps(model, x, y, rows, params, cfg, compile=compile)
    _, seconds, _ = driver.run(engine, cfg)
    if epoch_seconds is not None:
        epoch_seconds.extend(seconds)
    return [p.detach().numpy() for p in engine.params]


class WindowSteps(driver.Engine):
    """Every walk-forward model's steps, for `driver.run`: each epoch's one permutation of the N positions, its
    batches gathered once, then `STEPS_PER_CALL` steps a call (as Keras's `steps_per_execution`: the driver's step is
    a call). No loss leaves the steps' graphs, so the epoch reports none."""

    def __init__(self, model, x, y, rows, params, cfg: TrainConfig, *, compile: bool):
        x, y = torch.as_tensor(x), torch.as_tensor(y)
        if x.shape[1] >= 2 ** 24:
            raise ValueError(f"{x.shape[1]} rows: the windows' masks compare row positions in float32, exact below "
                             "2**24")
        # positions and windows compared in float32 (exact integers here): on an AVX2 CPU inductor's vector code for
        # an int64 comparison made into a float mask is emulated, and the step's kernel far slower (docs/dev-notes.md)
        rows = torch.as_tensor(rows).to(torch.float32)
        self.model, self.cfg, self.compile = model, cfg, compile
        self.params = params = [torch.as_tensor(p).clone() for p in params]
        forward, self.shuffle = _forward(model), torch.Generator().manual_seed(cfg.seed)

        def batch_loss(params, xb, yb, positions):
            inside = (positions < rows[..., None]).to(xb.dtype)[..., None]  # (groups, models, batch, 1)
            error = inside * (forward(params, xb) - yb[:, None]) ** 2
            return (error.sum((2, 3)) / inside.sum((2, 3)).clamp(min=1)).sum()  # each model's own mean, summed

        self.steps = (_compiled_steps if compile else _eager_steps)(batch_loss, params, cfg)
        self.n_rows = x.shape[1]
        self.n_batches = math.ceil(self.n_rows / cfg.batch_size)
        x, self.y = torch.nn.functional.pad(x, (0, 0, 0, 1)), torch.nn.functional.pad(y, (0, 0, 0, 1))  # row n_rows
        self.x_by_feature = x.transpose(1, 2).contiguous()  # (groups, F, N + 1): see the gather below
        if compile:  # one eager call first: Keras makes its global slots (the scope, the name scopes) at a model's
            with torch.no_grad():  # first call; traced before they exist, the graph would guard on their absence,
                batch_loss(params, x[:, :1], self.y[:, :1], torch.zeros(1, dtype=torch.float32))  # and recompile

    def batches(self, epoch: int):
        """`(x, y, positions)` of `STEPS_PER_CALL` batches a call (an odd count's last call one: a graph of its own)."""
        size, n_batches = self.cfg.batch_size, self.n_batches
        order = torch.nn.functional.pad(torch.randperm(self.n_rows, generator=self.shuffle),
                                        (0, n_batches * size - self.n_rows), value=self.n_rows)
        positions = order.to(torch.float32).unflatten(0, (n_batches, size))  # (batches, batch)
        # one gather per group and epoch, batches then views; x feature-major, so a batch's rows of one feature
        # are contiguous and the kernel's gradient (a sum over the batch per model and feature) runs on whole
        # vectors: row-major, inductor vectorized it over the 3 features instead, a markedly slower compiled step
        xe = self.x_by_feature[:, :, order].transpose(1, 2).unflatten(1, (n_batches, size))  # (groups, batches, ...)
        ye = self.y[:, order].unflatten(1, (n_batches, size))
        for b in range(0, n_batches, STEPS_PER_CALL):
            chunk = slice(b, b + STEPS_PER_CALL)
            yield xe[:, chunk], ye[:, chunk], positions[chunk]

    def step(self, batch):
        self.steps(*batch)

    def rows(self, batch) -> int:
        return batch[2].numel()

    def epoch_loss(self, losses: list, rows: list[int]) -> None:
        return None  # computed inside the steps' graphs only

    def epoch_scope(self, epoch: int):
        # compiled: after the first epoch's graphs (fullgraph), only the guards that tell graphs apart
        return compiled.guards_skipped() if self.compile and epoch else contextlib.nullcontext()


def _eager_steps(batch_loss, params: list[torch.Tensor], cfg: TrainConfig):
    """`steps(xs, ys, positions)`, a step per batch (axis 1 of xs and ys, 0 of positions): autograd's backward, then
    `torch.optim.Adam` (fused: one kernel over every model's weights), updating `params` in place."""
    for p in params:
        p.requires_grad_()
    optimizer = torch.optim.Adam(params, lr=cfg.learning_rate, betas=(cfg.beta_1, cfg.beta_2), eps=cfg.epsilon,
                                 fused=True)

    def steps(xs, ys, positions):
        for j in range(len(positions)):
            optimizer.zero_grad(set_to_none=True)
            batch_loss(params, xs[:, j], ys[:, j], positions[j]).backward()
            optimizer.step()

    return steps


def _compiled_steps(batch_loss, params: list[torch.Tensor], cfg: TrainConfig):
    """`_eager_steps` in one graph a call: each step's gradient (`torch.func.grad`: the forward and the backward with
    no autograd engine between them) and torch's Adam in its functional form (`torch.optim.adam.adam`, what
    `torch.optim.Adam(foreach=False).step` runs), updating `params` and the moments in place. The stock `Adam.step`
    cannot join the gradient's graph: it breaks it on purpose (`_use_grad`, pytorch/pytorch#104053), and its call
    costs more than its kernel. Equal to the eager steps within `TRACED_VS_FUSED_ADAM_ATOL` (tested)."""
    exp_avgs, exp_avg_sqs = [torch.zeros_like(p) for p in params], [torch.zeros_like(p) for p in params]
    # Adam's step counts, in float64: traced, the update reads the count as a tensor and computes its bias
    # corrections in the count's dtype, where the fused kernel and `step` compute them in double. In float32 the
    # first steps' corrections are off in their fifth digit, and the weights end measurably further from the eager
    # ones (docs/dev-notes.md, "Measurements once quoted in the code")
    state_steps = [torch.zeros((), dtype=torch.float64) for _ in params]
    gradient = torch.func.grad(batch_loss)

    # the weights, moments and counts are the graph's inputs, which it updates in place
    def steps(params, exp_avgs, exp_avg_sqs, state_steps, xs, ys, positions):
        for j in range(len(positions)):  # unrolled: a graph per chunk length
            grads = gradient(params, xs[:, j], ys[:, j], positions[j])
            functional_adam(params, grads, exp_avgs, exp_avg_sqs, [], state_steps, foreach=False, amsgrad=False,
                            beta1=cfg.beta_1, beta2=cfg.beta_2, lr=cfg.learning_rate, weight_decay=0.0, eps=cfg.epsilon,
                            maximize=False)

    torch.compiler.reset()  # a fresh cache, as the torch loop's compile: never torch's recompile limit
    compiled = torch.compile(steps, fullgraph=True)
    return lambda xs, ys, positions: compiled(params, exp_avgs, exp_avg_sqs, state_steps, xs, ys, positions)


def forecasts(build, w: dict, cfg: TrainConfig, *, compile: bool = True) -> tuple[np.ndarray, float, float | None]:
    """Every walk-forward model of the windows `w` (x, y, rows, x_next), trained at once (`train_many`, compiled
    unless `compile=False`): (forecasts, training seconds, compile seconds: the first epoch's excess,
    `compile_apart`). Each model's initial weights come from the model's own initializers (`build`) and the seed
    alone, as on JAX (`native.jax.many.forecasts`)."""
    init = InitialWeights.of(build, w["x"][0])
    params = init.draw_grid(w["rows"].shape, cfg.seed)[0]
    epochs = []
    params = train_many(init.model, w["x"], w["y"], w["rows"], params, cfg, compile=compile, epoch_seconds=epochs)
    seconds, compile_seconds = compile_apart(epochs) if compile else (sum(epochs), None)
    return predict_many(init.model, params, w["x_next"])[..., 0], seconds, compile_seconds


@torch.no_grad()
def predict_many(model, params: list[np.ndarray], x: np.ndarray) -> np.ndarray:
    """params stacked (groups, models, ...), x (groups, models, H, F) -> (groups, models, H, 1)."""
    one = lambda p, xm: model.stateless_call(list(p), [], xm)[0]  # noqa: E731
    return torch.func.vmap(torch.func.vmap(one))([torch.as_tensor(p) for p in params], torch.as_tensor(x)).numpy()


def seed_orders(cfg: TrainConfig, seeds, n: int) -> torch.Tensor:
    """(seeds, epochs, n): the batch orders `loop.train` draws with each seed."""
    return torch.stack([loop.batch_orders(cfg.replace(seed=int(s)), n) for s in seeds])


def check_separable(model, cfg: TrainConfig) -> None:
    """A `SpecError` for what would tie the stacked models together (see the module's docstring)."""
    for name in ("clipnorm", "global_clipnorm"):
        if getattr(cfg, name) is not None:
            raise SpecError(f"{name} clips a gradient by its norm, which over stacked models would clip them together; "
                            "train them one at a time, or use JAX's trainer (vmap clips each model alone)")
    constrained = next((v for v in model.trainable_variables if v.constraint is not None), None)
    if constrained is not None:
        raise SpecError(f"variable {constrained.path!r} has a constraint ({type(constrained.constraint).__name__}), "
                        "which over stacked weights would see every model's at once; train the models one at a time "
                        "(loop.train applies it), or use JAX's trainer (vmap constrains each model alone)")


def train_seeds(model, data: HarData, cfg: TrainConfig, start, orders, learning_rates=None) -> dict:
    """Train one model per row of `start` at once; model i from `start[i]` with the batch orders `orders[i]`.

    `start` is (trainable, non_trainable), each array stacked (models, ...); `orders` (models, epochs, n);
    `learning_rates` (models,), each model's constant rate instead of the spec's (one optimizer parameter group
    per rate; the models of a rate must be consecutive). Returns the trained `trainable` and `non_trainable`
    (stacked, NumPy), each model's validation loss after the last epoch `val_loss` (models,), `seconds` and
    `compile_seconds` (None: nothing compiles).
    """
    check_data(cfg, data, model)
    check_separable(model, cfg)
    engine = SeedSteps(model, data, cfg, start, orders, learning_rates)
    _, epoch_seconds, _ = driver.run(engine, cfg)  # each model's validation loss after the last epoch, below
    with torch.no_grad():
        n_models = len(engine.orders)
        val_loss, _ = _losses(model, engine.loss_fn, training=False)(
            engine.stacked(), engine.state, _broadcast(data.x_val, n_models), _broadcast(data.y_val, n_models), None)
    return {"trainable": [p.detach().numpy() for p in engine.stacked()],
            "non_trainable": [s.numpy() for s in engine.state], "val_loss": val_loss.numpy(),
            "seconds": sum(epoch_seconds), "compile_seconds": None}


class SeedSteps(driver.Engine):
    """Every model's step at once, for `driver.run`: model i's batches cut from its own orders, the models' losses
    summed, so that each gets its own gradient, then the spec's Keras-exact optimizer (`optim.build`), one parameter
    group per learning rate."""

    def __init__(self, model, data: HarData, cfg: TrainConfig, start, orders, learning_rates=None):
        self.model, self.data, self.cfg = model, data, cfg
        self.orders = torch.as_tensor(orders)
        n_models = len(self.orders)
        rates = [cfg.learning_rate] * n_models if learning_rates is None else [float(r) for r in learning_rates]
        blocks = _blocks(rates)
        self.groups = [[torch.nn.Parameter(torch.as_tensor(np.asarray(w[b])).clone()) for w in start[0]]
                       for _, b in blocks]
        self.optimizer, self.scheduler, _ = optim.build(self.groups[0], cfg.replace(learning_rate=blocks[0][0]))
        for (rate, _), params in zip(blocks[1:], self.groups[1:]):
            self.optimizer.add_param_group({"params": params, "lr": rate})
        self.state = [torch.as_tensor(np.asarray(w)).clone() for w in start[1]]
        self.x, self.y = loop.tensors(data.x_train, None), loop.tensors(data.y_train, None)
        self.weights = None if data.w_train is None else torch.as_tensor(data.w_train)
        self.loss_fn = spec_loss(cfg, same_rank=all(t.ndim == 2 for t in as_tuple(data.y_train)))  # (n, 1) each
        self.losses = _losses(model, self.loss_fn, training=True)

    def stacked(self) -> list[torch.Tensor]:
        """Every model's weights, in order: the one group's own tensors, or the rates' groups joined (a copy)."""
        return self.groups[0] if len(self.groups) == 1 else [torch.cat(vs) for vs in zip(*self.groups)]

    def batches(self, epoch: int):
        order = self.orders[:, epoch]  # (models, n): each model its own gather, each batch then a view
        x, y = take(self.x, order), take(self.y, order)
        w = None if self.weights is None else self.weights[order]
        for rows in batch_slices(self.data.n_train, self.cfg.batch_size):
            yield take(x, (slice(None), rows)), take(y, (slice(None), rows)), None if w is None else w[:, rows]

    def step(self, batch):
        try:
            loss, state = self.losses(self.stacked(), self.state, *batch)
        except RuntimeError as err:  # Keras's torch Dropout reads its seed with .item(), which vmap refuses
            if "vmap" not in str(err):
                raise
            raise SpecError("torch.func.vmap cannot run this model's training call (a layer that draws random "
                            "numbers, such as Dropout, reads its seed with .item()); use JAX's trainer, where "
                            "each model draws its own") from None
        self.state = [s.detach() for s in state]
        self.optimizer.zero_grad(set_to_none=True)
        loss.sum().backward()
        self.optimizer.step()
        if self.scheduler:
            self.scheduler.step()
        return loss.detach()

    def rows(self, batch) -> int:
        return first(batch[1]).shape[1]  # (models, rows, ...)

    def epoch_loss(self, losses: list, rows: list[int]):
        """Each model's epoch loss, the mean over its rows: (models,)."""
        return (torch.stack(losses).double().T @ torch.tensor(rows, dtype=torch.float64) / sum(rows)).numpy()


@torch.no_grad()
def predict_seeds(model, trainable, non_trainable, x):
    """Every model's inference-mode predictions on the same x: (models, n, ...); several outputs a tuple of such
    arrays, one each (`output_arrays`: heads of different widths cannot be stacked)."""
    def one(trainable, non_trainable):
        inputs = keras_inputs(loop.tensors(x, None))
        pred, _ = model.stateless_call(list(trainable), list(non_trainable), inputs, training=False)
        return tuple(pred) if isinstance(pred, (list, tuple)) else pred

    as_tensors = lambda ws: [torch.as_tensor(np.asarray(w)) for w in ws]  # noqa: E731
    return output_arrays(torch.func.vmap(one)(as_tensors(trainable), as_tensors(non_trainable)))


def _losses(model, loss_fn, training: bool):
    """`(params, state, x, y, w) -> (each model's loss, its new state)`, vmapped over the models: the spec's loss
    plus the model's own losses, as `fast.total_loss` computes it for one model."""
    def one(trainable, non_trainable, xb, yb, wb):
        pred, non_trainable, extra = model.stateless_call(list(trainable), list(non_trainable), keras_inputs(xb),
                                                          training=training, return_losses=True)
        loss = loss_fn(keras_inputs(yb), pred, wb)
        return (loss + sum(extra) if extra else loss), non_trainable

    def losses(trainable, non_trainable, xb, yb, wb):
        return torch.func.vmap(one, in_dims=(0, 0, 0, 0, None if wb is None else 0))(
            trainable, non_trainable, xb, yb, wb)

    return losses


def _blocks(rates: list[float]) -> list[tuple[float, slice]]:
    """Consecutive runs of the same rate: [(rate, slice of its models)]."""
    blocks, begin = [], 0
    for i in range(1, len(rates) + 1):
        if i == len(rates) or rates[i] != rates[begin]:
            blocks.append((rates[begin], slice(begin, i)))
            begin = i
    if len({r for r, _ in blocks}) < len(blocks):
        raise ValueError("the models of each learning rate must be consecutive")
    return blocks


def _broadcast(x, n_models: int):
    """The same rows for every model: a leading model axis, expanded (a view, no copy)."""
    x = loop.tensors(x, None)
    grow = lambda a: a.expand(n_models, *a.shape)  # noqa: E731
    return tuple(grow(a) for a in x) if isinstance(x, tuple) else grow(x)
