"""torch: the native loop (`loop`), the Keras-exact and engine-own optimizers (`optim`), many models at once (`many`), embedding in a host program (`host`)."""
