"""The model zoo's catalogue: real models, each with the data it trains on and what its spec needs, and the
optimizer settings the zoo runs them with. `native-loops zoo` trains every model × optimizer on `fit` and on each
native loop from the same weights and batches, and measures how far apart they end.

    entry = ZOO["bn_mlp"]; model = entry.builder()(); entry.data   # "har", "sequence", "direction" or "panel"

Data kinds (made by `compare.data.panel.prepare_kind` from the same panel): "har" the three HAR means; "recent" the same
with a `sample_weight` per training day that halves every 252 days back from the last one; "sequence" the last 22
days of log RV, (n, 22, 1); "direction" the HAR means with the sign of the day's return as a 0/1 target;
"horizons" the HAR means with two targets, the day's log RV and the mean log RV of the 5 days from it; "panel"
every asset stacked with its integer id. Nothing here imports Keras (the referee reads it); the builders are in
`keras_side.models`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from keras_side.spec import resolve


@dataclass(frozen=True)
class Entry:
    build: str  # "module:function" of a zero-argument builder (each engine's worker rebuilds the model)
    data: str
    spec: dict = field(default_factory=dict)  # what the model needs of the TrainConfig (its loss)
    about: str = ""
    draws: bool = False  # draws random numbers while training (Dropout): each engine from its own generator

    def builder(self):
        return resolve(self.build)


ZOO = {
    "har": Entry("keras_side.models:har", "har", {"metrics": ("mae",)}, "Dense(1): the HAR regression"),
    "har_recent": Entry("keras_side.models:har", "recent", {"metrics": ("mae",)},
                        "the HAR as weighted least squares: sample_weight halving every 252 days back"),
    "mlp_l2": Entry("keras_side.models:mlp_l2", "har", about="3-8-1 MLP, L2 kernel and activity regularizers"),
    "bn_mlp": Entry("keras_side.models:bn_mlp", "har", about="Dense(8, no bias) → BatchNorm → relu → Dense(1)"),
    "dropout_mlp": Entry("keras_side.models:dropout_mlp", "har", about="3-16-1 MLP with Dropout(0.2)", draws=True),
    "lstm": Entry("keras_side.models:lstm", "sequence", about="LSTM(8) over the last 22 days of log RV"),
    "conv1d": Entry("keras_side.models:conv1d", "sequence", about="Conv1D(4, 5) → average pool over 22 days"),
    "two_horizons": Entry("keras_side.models:two_horizons", "horizons",
                          {"loss": ("mse", "mae"), "loss_weights": (1.0, 0.5)},
                          "two outputs (the day's log RV, the next 5 days' mean): MSE + 0.5 × MAE"),
    "classifier": Entry("keras_side.models:classifier", "direction",
                        {"loss": "binary_crossentropy", "from_logits": True, "metrics": ("binary_accuracy",)},
                        "3-8-1 logits of the return's sign, binary cross-entropy"),
    "panel": Entry("keras_side.models:panel", "panel", {"dense_gradients": True},
                   "every asset, an Embedding(6, 1) level per asset (dense gradients: see TrainConfig)"),
}

# Optimizer settings the zoo trains with: every Keras optimizer, each schedule, each kind of clipping.
OPTIMIZERS = {
    "adam": {},
    "adamw": {"optimizer": "adamw", "weight_decay": 0.01},
    "sgd": {"optimizer": "sgd", "learning_rate": 0.01, "momentum": 0.9, "nesterov": True,
            "schedule": "exponential", "decay_steps": 20, "decay_rate": 0.5},
    "rmsprop": {"optimizer": "rmsprop", "learning_rate": 0.001, "momentum": 0.5, "clipnorm": 0.5},
    "adagrad": {"optimizer": "adagrad", "learning_rate": 0.05, "clipvalue": 0.1},
    "adam-cosine": {"schedule": "cosine", "learning_rate": 0.001, "warmup_steps": 10, "warmup_target": 0.01,
                    "decay_steps": 30, "global_clipnorm": 1.0},
}
