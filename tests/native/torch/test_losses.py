"""The spec's Keras losses written in torch (`native.torch.losses`), checked against Keras's own to the bit."""
import numpy as np
import pytest
import torch

from keras_side.spec import TrainConfig
from native.torch import losses as torch_losses


@pytest.mark.parametrize("name, logits", [(n, False) for n in sorted(torch_losses.TORCH_LOSSES)] +
                         [(n, True) for n in sorted(torch_losses.TORCH_LOGIT_LOSSES)])
def test_losses_written_in_torch_are_keras_losses_to_the_bit(name, logits):
    """The loop's MSE, MAE and binary cross-entropy from logits in plain torch (for speed, and one graph under
    torch.compile) against the Keras Loss object `fit` compiles with."""
    from keras_side.losses import keras_loss

    rng = np.random.default_rng(0)
    y_true, y_pred = (torch.as_tensor(rng.normal(size=(257, 1)).astype(np.float32)) for _ in range(2))
    if logits:
        y_true = (y_true > 0).to(torch.float32)  # 0/1 labels
    cfg = TrainConfig(loss=name, from_logits=logits)
    want = keras_loss(cfg)(y_true, y_pred)
    assert torch.equal(torch_losses.spec_loss(cfg, same_rank=True)(y_true, y_pred), want)
    assert torch.equal(torch_losses.spec_loss(cfg, same_rank=False)(y_true[:, 0], y_pred), want)  # Keras shapes (n,)
    half = y_pred.to(torch.bfloat16)  # a mixed-precision model's outputs: Keras's loss casts them to float32 first
    assert torch.equal(torch_losses.spec_loss(cfg, same_rank=True)(y_true, half), keras_loss(cfg)(y_true, half))
    masked = y_pred.clone()
    masked._keras_mask = torch.as_tensor(rng.uniform(size=257) > 0.3)  # a mask on the outputs: Keras weighs it out
    assert torch.equal(torch_losses.spec_loss(cfg, same_rank=True)(y_true, masked), keras_loss(cfg)(y_true, masked))


@pytest.mark.parametrize("weights", [(1.0, 0.5), None])
def test_several_outputs_losses_in_torch_are_compiles_combination_to_the_bit(weights):
    """#15: two_horizons's MSE + 0.5 × MAE in torch against `OutputLosses` (Keras's losses as `compile` combines
    them, itself checked against fit's loss in the zoo), with and without sample weights."""
    from keras_side.losses import training_loss

    rng = np.random.default_rng(0)
    y_true, y_pred = ([torch.as_tensor(rng.normal(size=(129, 1)).astype(np.float32)) for _ in range(2)]
                      for _ in range(2))
    cfg = TrainConfig(loss=("mse", "mae"), loss_weights=weights)
    mine = torch_losses.spec_loss(cfg, same_rank=True)
    assert not isinstance(mine, type(training_loss(cfg)))  # the torch one
    for sample_weight in (None, torch.as_tensor(rng.uniform(size=129).astype(np.float32))):
        assert torch.equal(mine(y_true, y_pred, sample_weight), training_loss(cfg)(y_true, y_pred, sample_weight))
