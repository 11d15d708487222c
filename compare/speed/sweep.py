"""A hyperparameter grid of the HAR, every seed of every learning rate in one vmapped call per batch size.

    found = run(data, cfg, engines, folder, learning_rates=[1e-3, 1e-2], batch_sizes=[32, 128], seeds=8)

Each engine's many-model trainer (`native.<engine>.many.train_seeds`) trains the learning rates × seeds of one batch
size at once (a batch size is a shape: one call each); a cell's score is its validation MSE (log RV², the year
before the split) averaged over its seeds, and the best cell is set against OLS on the same validation rows.
Every rate trains the same seeds (the same initial weights and batch orders), so cells differ by their rate and
batch size alone.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from compare.engines import runner
from compare.errors import NativeLoopsError
from compare.referee.seed_noise import seeds_of
from keras_side.data import HarData
from keras_side.spec import TrainConfig
from keras_side.zoo import ZOO

ENGINES = runner.MANY_ENGINES


def run(data: HarData, cfg: TrainConfig, engines: list[str], folder: Path, *, learning_rates: list[float],
        batch_sizes: list[int], seeds: int, on_event=lambda engine, event: None) -> dict:
    """{engine: {"val_mse": (batch sizes, rates) mean over seeds, "val_mse_std", "seconds", "compile_seconds"}},
    compile_seconds None on an engine that compiles nothing (torch); an engine that failed raises."""
    data_file = folder / "data.npz"
    data.save(data_file)
    shape = (len(batch_sizes), len(learning_rates))
    found = {e: {"val_mse": np.zeros(shape), "val_mse_std": np.zeros(shape), "seconds": 0.0, "compile_seconds": None}
             for e in engines}
    with runner.Pool(engines, folder, jobs=1) as pool:
        for i, batch_size in enumerate(batch_sizes):
            name = f"sweep-b{batch_size}"
            request = {"data": str(data_file), "config": cfg.replace(batch_size=batch_size).to_dict(),
                       "build": ZOO["har"].build, "name": name, "fit": False, "seeds": seeds_of(cfg.seed, seeds),
                       "learning_rates": learning_rates}
            times = {}
            pool.each("seeds", lambda e: request,
                      lambda e, event: times.__setitem__(e, event) if event["event"] == "done" else on_event(e, event))
            for engine in pool.live:
                with np.load(pool.engine_folder(engine) / f"{name}.npz") as z:
                    val = z["val_loss"].reshape(len(learning_rates), seeds)  # rate-major, as asked
                found[engine]["val_mse"][i] = val.mean(axis=1)
                found[engine]["val_mse_std"][i] = val.std(axis=1)
                found[engine]["seconds"] += times[engine]["seconds"]
                if times[engine]["compile_seconds"] is not None:  # None: an engine that compiles nothing (torch)
                    found[engine]["compile_seconds"] = (found[engine]["compile_seconds"] or 0.0) + times[engine][
                        "compile_seconds"]
    if pool.failed:
        raise NativeLoopsError("sweep worker failed: " + "; ".join(f"{e}: {m}" for e, m in pool.failed.items()))
    return found


def best(val_mse: np.ndarray, learning_rates: list[float], batch_sizes: list[int]) -> dict | None:
    """The cell with the lowest mean validation MSE, of those that did not diverge (not finite); None when all did."""
    finite = np.isfinite(val_mse)
    if not finite.any():
        return None
    i, j = np.unravel_index(np.argmin(np.where(finite, val_mse, np.inf)), val_mse.shape)
    return {"batch_size": batch_sizes[i], "learning_rate": learning_rates[j], "val_mse": float(val_mse[i, j])}
