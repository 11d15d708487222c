import numpy as np
import torch

from compare.tolerances import VMAP_VS_ALONE_ATOL
from keras_side import models
from keras_side.config import TrainConfig
from native import torch_many


def test_valid_first_is_a_stable_partition():
    perm = torch.tensor([5, 0, 3, 1, 4, 2])
    mask = torch.tensor([[1, 1, 0, 1, 0, 0], [0, 0, 0, 0, 0, 1]], dtype=torch.float32)
    assert torch_many.valid_first(perm, mask).tolist() == [[0, 3, 1, 5, 4, 2], [5, 0, 3, 1, 4, 2]]


def test_a_model_that_never_runs_out_of_rows_trains_as_if_alone():
    """Stacked weights, the sum of per-model losses and elementwise Adam: the full-window model's trajectory
    is its own, whatever the other models do."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 300, 3)).astype(np.float32)
    y = (x @ rng.normal(size=(3, 1))).astype(np.float32)
    mask = np.ones((3, 300), np.float32)
    mask[1, 150:] = mask[2, 40:] = 0
    cfg, model = TrainConfig(epochs=3), models.har()
    together = torch_many.train_many(model, x, y, mask, cfg)
    # Alone: the same generator draws (init for 3 models, then the shared permutations), only model 0 kept.
    full = torch_many.train_many(model, x[[0, 0, 0]], y[[0, 0, 0]], mask[[0, 0, 0]], cfg)
    for t, a in zip(together, full, strict=True):
        np.testing.assert_allclose(t[0], a[0], atol=VMAP_VS_ALONE_ATOL, rtol=0)
    pred = torch_many.predict_many(model, together, x[:, :5])
    np.testing.assert_allclose(pred[0], x[0, :5] @ together[0][0] + together[1][0], atol=1e-5, rtol=0)
