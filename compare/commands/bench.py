"""`native-loops bench`: every path timed against `fit` and against its engine's floor (docs/speed.md)."""
from __future__ import annotations

import argparse
import contextlib
import tempfile
from pathlib import Path

from compare.commands.common import check_epochs, load, options, parse_engines, parse_names, prepare_har, train_config
from compare.data import panel
from compare.engines import runner
from compare.errors import NativeLoopsError
from compare.io import check_writable, exists, write_json
from compare.referee import report, zoo
from compare.speed import bench, walk_forward


def run(args: argparse.Namespace) -> int:
    engines = parse_engines(args.engines)
    if args.repeats < 1:
        raise NativeLoopsError(f"--repeats must be at least 1, got {args.repeats}")
    if args.json:  # before the benchmark, not after it
        check_writable(args.json)  # a folder, a missing folder, no permission
        if Path(args.json).suffix.lower() != ".json":
            raise NativeLoopsError(f"--json {args.json!r}: the timings are written as JSON; give a file name ending "
                                   "in .json")
        if exists(args.json, "--json"):
            raise NativeLoopsError(f"--json {args.json!r} already exists; choose a new file (nothing is overwritten)")
    models = [] if args.models is None else list(zoo.MODELS) if args.models == "all" else parse_names(
        args.models, zoo.MODELS + ("all",), "model")
    if "all" in models:
        raise NativeLoopsError("--models all names every model already; give it alone, or list the models")
    cfg = train_config(args)
    prices, source = load(args)
    prepared, _ = prepare_har(args, prices, source)
    check_epochs(cfg, prepared.n_train)
    zoo_data = {}
    for name in models:  # every model's data (and a bad --asset/--split for it) before anything trains
        entry = zoo.ZOO[name]
        zoo_data[name] = (panel.prepare_kind(prices, entry.data, asset=args.asset, split=args.split, end=args.end,
                                             validation=args.validation, source=source), cfg.replace(**entry.spec))
        check_epochs(zoo_data[name][1], zoo_data[name][0].n_train)
    wf_assets, left_out = walk_forward.refittable(prices, sorted(prices["activo"].unique()), args.split, args.end) \
        if "jax" in engines else ([], {})  # --asset's HAR does not need the others: the timing leaves them out
    for why in left_out.values():
        report.console().print(f"the walk-forward timing leaves out {why}")
    totals = {e: len(bench.bench_paths(e)) * args.repeats for e in engines} | {"numpy": args.repeats} | (
        {"walk-forward": 1} if "jax" in engines else {}) | {
        f"zoo {m}": sum(len(bench.zoo_paths(e, m)) for e in engines) * args.repeats for m in models}
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="native-loops-bench-"))
        tick = stack.enter_context(report.bench_progress(totals))
        # one worker per engine for the HAR and every zoo model: an engine starts in seconds, once
        pool = stack.enter_context(runner.Pool(engines, Path(tmp), jobs=1))
        timings = bench.run(prepared, cfg, engines, Path(tmp), args.repeats, on_timing=tick, pool=pool)
        if "jax" in engines:  # the many-models claim: every walk-forward refit of every asset at once
            windows = walk_forward.build_windows(prices, wf_assets, args.split, args.end)
            (Path(tmp) / "walk").mkdir()
            wf_engines = [e for e in ("jax", "torch") if e in engines]
            tick("walk-forward", f"every refit at once on {' and '.join(wf_engines)}", done=False)
            timings["walk_forward"] = walk_forward.run(windows, cfg, Path(tmp) / "walk", engines=wf_engines,
                                                       fit_refits=2)["timing"]
            tick("walk-forward", f"{windows.n_models} models on {' and '.join(wf_engines)}")
        for name, (data, model_cfg) in zoo_data.items():  # each model of the zoo: fit against the native loops
            (Path(tmp) / name).mkdir()
            timed = bench.run(data, model_cfg, engines, Path(tmp) / name, args.repeats,
                              on_timing=lambda engine, path, row=f"zoo {name}": tick(row, f"{engine} {path}"),
                              model=name, pool=pool)
            timings.setdefault("zoo", {})[name] = timed
            timings["incomplete"] |= {f"{name}/{e}": why for e, why in timed.pop("incomplete").items()}
    bench.print_bench(timings, bench.targets(timings))
    if args.json:
        write_json(args.json, timings | {"config": cfg.to_dict(), "seed": cfg.seed, "options": options(args)}
                   | ({"walk_forward_left_out": left_out} if left_out else {}))
        report.console().print(f"wrote {report.shown(args.json)}")
    return 3 if timings["incomplete"] else 0
