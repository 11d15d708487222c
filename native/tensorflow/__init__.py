"""tensorflow: the native loop (`loop`) and `fit` with our own step (`train_step`); its optimizers are Keras's."""
