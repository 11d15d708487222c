"""torch: the first loop (`first_loop`), the reference loop (`loop`), its optimizers (`optim`), `fit` with our own
step (`train_step`); the fast paths (`fast`: `bypass`, `compiled`, `losses`) and DDP (`ddp`), which share the step's
pieces (`step`); many models at once (`many`), embedding in a host program (`host`)."""
