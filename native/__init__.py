"""Hand-written training loops, one folder per engine, the same verbs in each: `train`, `grad_at`, `predict`.

Per engine, for the reader: `first_loop` (the Keras guide's loop on the HAR) and `loop` (the reference loop, what
`fit` does for any model). Behind them, opt-in and tested equal to the reference loop: the fast paths, the
data-parallel launchers (`torch.ddp`, `jax.sharded`, `tensorflow.mirrored`) and torch's many-model trainers, whose
epochs are `driver`'s, one engine-free epoch loop (JAX's fused scans run theirs inside one compiled program). Import
an engine's module only in a process whose Keras backend is that engine (`native.torch.loop` on torch...); `driver`,
`checkpoint` and `preflight` are engine-free.
"""
