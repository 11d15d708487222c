"""jax: the native loop (`loop`), its optimizers (`optim`), `fit` with our own step (`train_step`), many
models at once (`many`), embedding in a host program (`host`)."""
