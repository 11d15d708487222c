"""The model the checkpoint tests train, importable by the process they kill: every kind of state a checkpoint
must carry (weights, BatchNorm's moving statistics, a Dropout's seed state) in one small MLP."""
import keras
from keras import layers


def stateful_mlp(names=("hidden", "bn", "relu", "dropout", "out")):
    hidden, bn, relu, dropout, out = names
    return keras.Sequential([keras.Input((3,)), layers.Dense(8, use_bias=False, name=hidden),
                             layers.BatchNormalization(name=bn), layers.ReLU(name=relu),
                             layers.Dropout(0.2, seed=7, name=dropout), layers.Dense(1, name=out)])


def renamed_mlp():
    """`stateful_mlp` with names whose sorted order is another: as a process that built other layers first numbers
    its layers otherwise ("dense_9" then "dense_10", which sort the other way round)."""
    return stateful_mlp(("e_hidden", "d_bn", "c_relu", "b_dropout", "a_out"))
