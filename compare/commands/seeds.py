"""`native-loops seeds`: is an engine's difference bigger than a change of seed? (docs/seeds.md)"""
from __future__ import annotations

import argparse
import shutil

from compare.commands.common import (check_models, load, model_data, options, out_folder, parse_engines, run_folder,
                                     train_config)
from compare.data import reference
from compare.engines import runner
from compare.errors import NativeLoopsError
from compare.io import write_json
from compare.referee import figures, report, seed_noise, zoo
from keras_side.results import versions


# --seeds: pairs of seeds are the yardstick and the tolerance their 99th percentile, which takes 100 pairs at least
# to be more than the largest gap of a handful (15 seeds: 105 pairs); every pair's gap is held (n²/2 of them).
MIN_SEEDS, MAX_SEEDS = 15, 5000


def run(args: argparse.Namespace) -> int:
    """Exit 0 when every engine pair's default runs are within the seeds' spread, 1 when one is not, 3 when an
    engine is missing or failed."""
    engines = parse_engines(args.engines)
    if not MIN_SEEDS <= args.seeds <= MAX_SEEDS:
        raise NativeLoopsError(f"--seeds must be between {MIN_SEEDS} and {MAX_SEEDS:,} (the tolerance is the 99th "
                               f"percentile of the gaps between pairs of seeds, which {MIN_SEEDS} seeds' "
                               f"{MIN_SEEDS * (MIN_SEEDS - 1) // 2} pairs are the fewest to measure), got {args.seeds}")
    if args.model not in zoo.ZOO:
        raise NativeLoopsError(f"unknown model {args.model!r}; --model takes one of {', '.join(zoo.MODELS)}")
    entry, har = zoo.ZOO[args.model], args.model == "har"
    cfg = train_config(args, seeds_after=args.seeds).replace(**({} if har else entry.spec))
    prices, source = load(args)
    prepared = model_data(args, prices, source, entry)
    check_models(cfg, prepared.n_train, args.seeds, "--seeds or --epochs")
    plan, notes = seed_plan(engines, entry.draws, args.seeds, cfg.seed)
    with run_folder(out_folder(args), ["seeds.json", "seeds.png"]) as tmp:
        with report.progress(engines) as on_event:
            failed, timings = seed_noise.run(prepared, cfg, plan, tmp, build=entry.build, on_event=on_event)
        spreads = {e: seed_noise.Spread.load(tmp / "engines" / e, e, prepared, har) for e in engines
                   if e not in failed}
        found = seed_noise.seed_noise(spreads)
        summary = seed_noise.summary(spreads, prepared.features if har else ())
        report.print_seeds(summary, timings, args.model)
        report.print_checks(found, failed)
        for note in notes:
            report.console().print(note)
        write_json(tmp / "seeds.json", {
            "config": cfg.to_dict(), "seed": cfg.seed, "seeds": seed_noise.seeds_of(cfg.seed, args.seeds),
            "versions": versions(), "source": source, "model": args.model, "engines": summary, "timings": timings,
            "checks": [c.__dict__ for c in found], "failed": failed, "notes": notes, "options": options(args)})
        ols = reference.ols_for(prices, args.asset, args.split, args.end, validation=args.validation) if har else None
        figures.seeds(tmp / "seeds.png", spreads, prepared.features if har else (), args.model, ols)
        shutil.rmtree(tmp / "engines")
        (tmp / "data.npz").unlink()
    if failed:
        return 3
    return 0 if all(c.passed for c in found) else 1


def seed_plan(engines: list[str], draws: bool, count: int, seed: int) -> tuple[dict[str, list[int]], list[str]]:
    """Which engines train the model once per seed (engine -> seeds; none: `fit` at the run's seed only), and
    notes on the others."""
    plan, notes = {}, []
    for engine in engines:
        many = engine in runner.MANY_ENGINES and not (draws and engine == "torch")
        plan[engine] = seed_noise.seeds_of(seed, count) if many else []
        if engine == "tensorflow":
            notes.append("tensorflow: no many-model trainer (tf.vectorized_map over a GradientTape step is not "
                         "built); its default run is judged against the other engines' seeds")
        elif not many:
            notes.append(f"{engine}: the model draws random numbers while training, and torch.func.vmap cannot "
                         "give each model its own; its default run is judged against the other engines' seeds")
    if not any(plan.values()):
        raise NativeLoopsError("no engine of --engines can train many seeds at once (jax and torch can; torch not "
                               "for a model that draws random numbers): add jax")
    return plan, notes
