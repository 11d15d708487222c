"""tensorflow: the native loop (`loop`), the Keras-exact and engine-own optimizers (`optim`)."""
