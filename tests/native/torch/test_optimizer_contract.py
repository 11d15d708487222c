"""The Keras-exact torch optimizers keep torch's optimizer contract: `step(closure)` (as LBFGS-style code and
`torch.optim` users call it) evaluates the closure, steps from the gradients it computed, and returns its loss."""
import torch

from keras_side.spec import TrainConfig
from native.torch import optim


def test_step_with_a_closure_is_the_step_without_one():
    x, y = torch.randn(64, 3, generator=torch.Generator().manual_seed(0)), torch.randn(64, 1)
    for name in ("adam", "sgd", "rmsprop", "adagrad"):
        weights = [torch.nn.Parameter(torch.ones(3, 1)) for _ in range(2)]
        opts = [optim.exact_optimizer([w], TrainConfig(optimizer=name)) for w in weights]

        def loss_of(w):
            return torch.mean((x @ w - y) ** 2)

        for _ in range(3):
            opts[0].zero_grad()
            plain = loss_of(weights[0])
            plain.backward()
            opts[0].step()

            def closure():
                opts[1].zero_grad()
                loss = loss_of(weights[1])
                loss.backward()
                return loss

            returned = opts[1].step(closure)
            assert torch.equal(returned, plain.detach()), name
        assert torch.equal(weights[0], weights[1]) and not torch.equal(weights[0], torch.ones(3, 1)), name
