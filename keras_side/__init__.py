"""The Keras side: backend set-up, determinism, portable `keras.ops` code, the model builders and `model.fit`.

Only `keras_side.config` and `keras_side.backend` are safe to import before the backend is chosen.
"""
