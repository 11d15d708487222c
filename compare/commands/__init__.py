"""One module per subcommand of `native-loops`, each with `run(args) -> int` (its exit code), and `common`, what
they share: the data they load, the run's config and seed, the checks of their options, the run folder. Only
`models` and `train` import Keras in the CLI's process, after choosing its backend."""
