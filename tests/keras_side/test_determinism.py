import json
import os
import subprocess
import sys

import numpy as np

from keras_side import fit, models
from keras_side.determinism import seed_everything
from keras_side.spec import TrainConfig
from tests.conftest import REPO
from tests.keras_side.conftest import ENGINE

FIVE_EPOCHS = TrainConfig(epochs=5, validate=False)


def fit_once(har, seed=None):
    if seed is not None:
        seed_everything(seed)
    return fit.train(models.har(), har, FIVE_EPOCHS).weights


def test_same_seed_gives_bit_identical_weights(har):
    first, second = fit_once(har, seed=0), fit_once(har, seed=0)
    for a, b in zip(first, second, strict=True):
        np.testing.assert_array_equal(a, b)


def test_without_reseeding_the_run_differs(har):
    first = fit_once(har, seed=0)
    second = fit_once(har)  # the random state has moved on: new initial weights and batch order
    assert any(not np.array_equal(a, b) for a, b in zip(first, second, strict=True))


# A fresh process (this one may have imported TensorFlow already): the draws after seed_everything, then after
# Keras's own set_random_seed, from Python, NumPy, keras.random's global generator and torch's.
SEED_PROBE = """
import json, random, sys
import keras, numpy as np
from keras_side.determinism import seed_everything

def draws():
    out = [random.random(), float(np.random.rand()), keras.ops.convert_to_numpy(keras.random.uniform((3,))).tolist()]
    if keras.config.backend() == "torch":
        import torch
        out.append(torch.rand(3).tolist())
    return out

keras.random.uniform((2,))  # the global generator has moved on, as it has in a process that ran something
seed_everything(11)
ours, imported = draws(), "tensorflow" in sys.modules
keras.utils.set_random_seed(11)
print(json.dumps({"ours": ours, "keras": draws(), "tensorflow": imported}))
"""


def test_seeding_is_kerass_set_random_seed_without_importing_tensorflow():
    """seed_everything leaves the random state Keras's set_random_seed leaves, and on torch and JAX it does not
    import TensorFlow (Keras's call does, to seed tf.random, whenever TensorFlow is installed)."""
    env = {**os.environ, "KERAS_BACKEND": ENGINE, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", SEED_PROBE], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = json.loads(proc.stdout.splitlines()[-1])
    assert found["ours"] == found["keras"]
    assert found["tensorflow"] == (ENGINE == "tensorflow")
