"""The engines' side of the referee: `paths` (every training path by name, and the module whose verbs run it),
`worker` (one engine's process, `python -m compare.engines.worker`) and `runner` (the pool that starts the workers
and drives them over a JSON pipe)."""
