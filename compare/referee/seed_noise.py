"""Seed noise, measured: is the gap between two engines' default runs bigger than a change of seed?

    spreads = {e: Spread.load(folder, e, data) for e in engines}     # what the workers' `seeds` wrote
    checks = seed_noise(spreads)                                     # seed_noise/<a>-<b>[/slopes]

Each engine draws its own initial weights and batch order from the same seed, so the same model trained with the
same seed ends at different weights on each engine: the referee proves that the arithmetic agrees
(same_arithmetic, portable_weights), and this measures the rest. Each engine with a many-model trainer trains the
model once per seed (its own weights, from the model's own initializers, and its own batch order), and the gaps
between every pair of those seeds are the yardstick: two engines' default runs (`fit` at the run's seed) pass when
their gap is within the 99th percentile of the seed pairs' gaps. The gaps are the test loss's absolute difference
and, for the HAR, the Euclidean distance between the three slopes in original units.
A check at the 99th percentile fails by chance for about one seed in a hundred: a failure on one seed says look;
failures on several say the engines differ by more than randomness.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations
from pathlib import Path

import numpy as np

from compare.engines import runner
from compare.referee.checks import Check, within
from keras_side.data import HarData

# Seeds per engine in `compare`: ols_reached's band is their 99.9th percentile, which takes hundreds of seeds to be
# more than the largest of a few (torch and jax: 1,000 in all; about two seconds per engine, 125k pairs each).
COMPARE_SEEDS = 500
PERCENTILE = 99.0  # the share of seed pairs a gap between engines may exceed, at most 1 - 0.99
# ...in `compare`, whose one exit code stands on every check: a three-engine run has six of these, which at the 99th
# percentile would fail up to 6% of correct runs by chance; at the 99.9th, 0.6% (its 500 seeds per engine give
# 125k pairs each, plenty for that percentile).
COMPARE_PERCENTILE = 99.9
FINDING = "the engines differ by more than a change of seed: look at what else differs (see the report's figures)"


@dataclass(frozen=True)
class Runs:
    """Models of one engine: each one's test loss, and its HAR slopes (None for another model)."""

    test_loss: np.ndarray  # (models,)
    slopes: np.ndarray | None  # (models, 3), original units

    @classmethod
    def from_result(cls, result, data: HarData) -> Runs:
        """One HAR path's run of a compare (its test loss is the test MSE, in log RV²)."""
        slopes = data.scaling.to_original(*result.weights[:2])[1]
        return cls(np.array([result.test_loss]), slopes[None])

    @classmethod
    def load(cls, file: Path, data: HarData, har: bool) -> Runs:
        with np.load(file) as z:
            slopes = None
            if har:  # the kernel (models, 3, 1) and bias (models, 1), back to original units
                slopes = np.stack([data.scaling.to_original(k, b)[1] for k, b in zip(z["w_0"], z["w_1"])])
            return cls(z["test_loss"], slopes)

    def measures(self) -> dict[str, np.ndarray]:
        """What the gaps are measured on: {"test_loss": (models, 1), "slopes": (models, 3)}."""
        return {"test_loss": self.test_loss[:, None]} | ({} if self.slopes is None else {"slopes": self.slopes})


@dataclass(frozen=True)
class Spread:
    """One engine: its models trained with many seeds (None where it has no many-model trainer), and `fit`'s run at
    the run's seed."""

    engine: str
    seeds: Runs | None
    default: Runs

    @classmethod
    def load(cls, folder: Path, engine: str, data: HarData, har: bool) -> Spread:
        """What the worker's `seeds` wrote in its engine's folder: the seeds (where it trained them), `fit`'s run."""
        return cls(engine, _seeds_in(folder, data, har), Runs.load(folder / "seeds-fit.npz", data, har))

    @classmethod
    def of_compare(cls, folder: Path, fit_result, data: HarData) -> Spread:
        """A compare run's engine: the HAR once per seed where its worker trained it, its `fit` path's run."""
        return cls(fit_result.engine, _seeds_in(folder, data, har=True), Runs.from_result(fit_result, data))


def _seeds_in(folder: Path, data: HarData, har: bool) -> Runs | None:
    many = folder / "seeds.npz"
    return Runs.load(many, data, har) if many.exists() else None


def pair_gaps(values: np.ndarray) -> np.ndarray:
    """The Euclidean distance between every pair of rows of (models, k)."""
    i, j = np.triu_indices(len(values), k=1)
    return np.linalg.norm(values[i] - values[j], axis=1)


def rank(value: float, among: np.ndarray) -> float:
    """The percentile of `value` among `among` (the share strictly below, plus half the ties, in %)."""
    return float(100 * (np.mean(among < value) + 0.5 * np.mean(among == value)))


def yardstick(spreads: list[Spread], measure: str) -> np.ndarray:
    """The gaps between seed pairs on each engine of `spreads` that trained seeds, pooled."""
    return np.concatenate([pair_gaps(s.seeds.measures()[measure]) for s in spreads if s.seeds is not None])


def seed_noise(spreads: dict[str, Spread], percentile: float = PERCENTILE) -> list[Check]:
    """For every pair of engines, each measure's gap between their default runs against the `percentile`th
    percentile of the seed pairs' gaps of the two engines (of every engine with seeds, when neither has any)."""
    measured = [s for s in spreads.values() if s.seeds is not None]
    checks = []
    for a, b in combinations(spreads.values(), 2):
        own = [s for s in (a, b) if s.seeds is not None] or measured
        if not own:
            continue
        for measure in a.default.measures():
            pairs = yardstick(own, measure)
            gap = float(np.linalg.norm(a.default.measures()[measure][0] - b.default.measures()[measure][0]))
            limit = float(np.percentile(pairs, percentile))
            name = f"seed_noise/{a.engine}-{b.engine}" + ("" if measure == "test_loss" else f"/{measure}")
            note = (f"band: {percentile:g}th percentile of {len(pairs):,} seed pairs' gaps on "
                    f"{' and '.join(s.engine for s in own)}; larger than {rank(gap, pairs):.0f}% of them")
            checks.append(within(name, gap, limit, note if gap <= limit else f"{note}; {FINDING}"))
    return checks


def summary(spreads: dict[str, Spread], features: tuple[str, ...] = ()) -> dict:
    """Per engine: each measure's distribution over seeds (quantiles) and where the default run falls in it."""
    found = {}
    for engine, s in spreads.items():
        entry = {"default": _values(s.default, features, 0)}
        if s.seeds is not None:
            entry["seeds"] = len(s.seeds.test_loss)
            entry["quantiles"] = {name: {q: float(np.percentile(v, q)) for q in (1, 5, 25, 50, 75, 95, 99)}
                                  for name, v in _columns(s.seeds, features).items()}
            entry["default_percentile"] = {name: rank(_columns(s.default, features)[name][0], v)
                                           for name, v in _columns(s.seeds, features).items()}
        found[engine] = entry
    return found


def _columns(runs: Runs, features: tuple[str, ...]) -> dict[str, np.ndarray]:
    columns = {"test_loss": runs.test_loss}
    if runs.slopes is not None:
        columns |= {f"slope_{f}": runs.slopes[:, i] for i, f in enumerate(features)}
    return columns


def _values(runs: Runs, features: tuple[str, ...], i: int) -> dict[str, float]:
    return {name: float(v[i]) for name, v in _columns(runs, features).items()}


def seeds_of(cfg_seed: int, count: int) -> list[int]:
    """The seeds of the many-model runs: the `count` after the run's own (whose default run is `fit`'s)."""
    return list(range(cfg_seed + 1, cfg_seed + 1 + count))


def run(data: HarData, cfg, seeds: dict[str, list[int]], folder: Path, *, build: str,
        on_event=lambda engine, event: None) -> tuple[dict[str, str], dict]:
    """Ask each engine's worker (`seeds`: engine -> its seeds, none for `fit` alone) to train the model once per
    seed with its many-model trainer, and `fit` at the run's seed. Returns (failed engines -> why, timings per
    engine)."""
    data_file = folder / "data.npz"
    data.save(data_file)
    timings = {}
    request = {"data": str(data_file), "config": cfg.to_dict(), "build": build, "name": "seeds", "fit": True}
    with runner.Pool(list(seeds), folder, jobs=1) as pool:  # one at a time: each engine's timing has the cores
        pool.each("seeds", lambda e: request | {"seeds": seeds[e]},
                  lambda e, event: timings.__setitem__(e, event) if event["event"] == "done" else on_event(e, event))
    return pool.failed, {e: {k: v for k, v in t.items() if k != "event"} for e, t in timings.items()}
