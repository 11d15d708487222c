"""How long each parity check takes, and where the time goes: `python -m compare.parity.timing [--repeats N]`.

A benchmark, never a test's assertion: seconds measured in one run, on this machine, as loaded as it is. Each check
runs once cold (a session's first use: each worker builds and traces its first model) and `repeats` times warm, on
the HAR (64 rows; the training checks: one epoch of 4 steps), with one pool of workers for the whole run, as the
pytest fixtures share one per session. A phase is one request to the workers (several engines answer it at once);
inside a training request, each worker times each path it trains.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from compare.engines import runner
from compare.parity import common, point, training
from keras_side.backend import ENGINES, installed_engines

HAR = "keras_side.models:har"
RNG = np.random.default_rng(0)
X, Y = RNG.normal(size=(64, 3)).astype(np.float32), RNG.normal(size=(64, 1)).astype(np.float32)
TRAINING = {"epochs": 1, "batch_size": 16}


def torch_step(model, optimizer, x, y):
    """The step of a torch codebase, which `loop_parity` times: forward, MSE plus the model's own losses, backward,
    step (the tests' own loops use it too)."""
    import torch

    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x, training=True), y)
    if model.losses:
        loss = loss + sum(model.losses)
    loss.backward()
    optimizer.step()
    return loss


def checks(engines: list[str]) -> dict:
    """Each check on the HAR, as the fixtures run it: {name: check(pool)}."""
    found = {
        "grad_parity": lambda pool: point.assert_gradients_match(HAR, X, Y, engines=engines, pool=pool),
        "forward_parity": lambda pool: point.assert_forward_match(HAR, X, engines=engines, pool=pool),
        "training_parity": lambda pool: training.assert_training_matches(HAR, X, Y, engines=engines, pool=pool,
                                                                         **TRAINING),
    }
    if "torch" in engines:
        found["loop_parity (torch)"] = lambda pool: training.assert_loop_matches_fit(
            HAR, "compare.parity.timing:torch_step", X, Y, engine="torch", pool=pool, **TRAINING)
    return found


def _timed(check, pool) -> tuple[float, list]:
    with common.recording() as phases:
        start = time.perf_counter()
        check(pool)
        return time.perf_counter() - start, phases


def measure(engines: list[str] | None = None, repeats: int = 5) -> list[dict]:
    """Every check cold and warm: [{check, cold_s, warm_s, phases: {phase: warm s}, parts: {engine/path: warm s}}],
    warm figures the median of `repeats`."""
    engines = common.check_engines(engines or installed_engines())
    needed = sorted(set(engines) | {common.reference_engine(installed_engines())}, key=ENGINES.index)
    rows = []
    with tempfile.TemporaryDirectory(prefix="parity-timing-") as tmp, runner.Pool(needed, Path(tmp)) as pool:
        for name, check in checks(engines).items():
            cold, _ = _timed(check, pool)
            warm = [_timed(check, pool) for _ in range(repeats)]
            phases, parts = {}, {}
            for _, recorded in warm:
                for phase, asked, seconds, inside in recorded:
                    phases.setdefault(f"{phase} ({', '.join(asked)})", []).append(seconds)
                    for part, part_seconds in inside:
                        parts.setdefault(part, []).append(part_seconds)
            rows.append({"check": name, "cold_s": cold, "warm_s": statistics.median(s for s, _ in warm),
                         "phases": {p: statistics.median(v) for p, v in phases.items()},
                         "parts": {p: statistics.median(v) for p, v in parts.items()}})
    return rows


def table(rows: list[dict]) -> str:
    lines = [common.table(("check", "cold s", "warm s", "where the warm time goes (median s)"), [
        (r["check"], f"{r['cold_s']:.2f}", f"{r['warm_s']:.3f}",
         " · ".join(f"{p} {s:.3f}" for p, s in r["phases"].items())) for r in rows])]
    for r in rows:
        if r["parts"]:
            lines.append(f"{r['check']}, each path inside its worker: "
                         + " · ".join(f"{p} {s:.3f}" for p, s in sorted(r["parts"].items())))
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m compare.parity.timing", description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="warm runs of each check (default 5)")
    parser.add_argument("--engines", default=None, help="comma-separated engines (default: every installed one)")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    try:
        engines = common.check_engines(args.engines.split(",")) if args.engines else None
    except common.ParityError as err:
        parser.error(str(err))
    print(table(measure(engines, args.repeats)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
