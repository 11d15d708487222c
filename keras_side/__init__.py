"""The Keras side: backend set-up, determinism, portable `keras.ops` code, the model builders and `model.fit`.

By concept: the training spec (`spec`), the Keras objects it names (`optimizers`, `losses`, `metrics`), the checks
before training (`checks`), the prepared data (`data`), arrays as they travel (`arrays`), results (`results`), atomic
files (`files`), processes and signals (`process`). Every module but `determinism`, `fit`, `initial`, `internals`,
`models` and `ops` is safe to import before the backend is chosen: those import Keras.
"""
