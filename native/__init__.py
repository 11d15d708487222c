"""Hand-written training loops, one module per engine, the same verbs in each: `train`, `grad_at`, `predict`.

Import a module only in a process whose Keras backend is that engine (`native.torch.loop` on torch...).
"""
