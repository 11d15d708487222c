"""The torch loop's checkpoint files, with torch's own tool: `torch.save` of the optimizer's and the scheduler's
`state_dict()` and of every model variable, read back with `torch.load(weights_only=True)` (tensors and plain
values only: nothing in the file can run code). The folder around it is `native.checkpoint`'s."""
from __future__ import annotations

from pathlib import Path

import torch


def write(folder: Path, state) -> None:
    """`state` (model, optimizer, scheduler or None) into the new folder `folder`."""
    model, optimizer, scheduler = state
    folder.mkdir()
    torch.save({"optimizer": optimizer.state_dict(), "places": places(model, optimizer),
                "scheduler": scheduler.state_dict() if scheduler else None,
                "variables": [v.value.detach().cpu().clone() for v in model.variables]}, folder / "state.pt")


@torch.no_grad()
def read(folder: Path, state):
    """`state` (model, optimizer, scheduler or None) as `write` left them in `folder`, in place; returns `state`."""
    model, optimizer, scheduler = state
    saved = torch.load(folder / "state.pt", weights_only=True)
    optimizer.load_state_dict(in_this_order(saved["optimizer"], saved["places"], places(model, optimizer)))
    if scheduler:
        scheduler.load_state_dict(saved["scheduler"])
    for variable, value in zip(model.variables, saved["variables"], strict=True):
        variable.assign(value)
    return state


def places(model, optimizer) -> list[int]:
    """Where each of the optimizer's parameters, group by group, is in `model.variables`. torch's `state_dict()`
    numbers them by their order in the optimizer, which is `model.parameters()`'s: Keras registers them by path,
    sorted, and a path holds auto-numbered layer names ("dense_9", "dense_10") that depend on what the process built
    before, so another process may order the same model's parameters otherwise. `model.variables` is the model's
    own order, the same in every process."""
    place = {id(v.value): i for i, v in enumerate(model.variables)}
    return [place[id(p)] for group in optimizer.param_groups for p in group["params"]]


def in_this_order(state: dict, saved: list[int], here: list[int]) -> dict:
    """The optimizer's `state_dict()` written where its parameters were at `saved` places, numbered for an optimizer
    whose parameters are at `here` (`places`): torch's `load_state_dict` pairs them by position."""
    number = dict(zip(saved, (i for group in state["param_groups"] for i in group["params"]), strict=True))
    order = iter(here)
    return {**state, "param_groups": [{**group, "params": [number[next(order)] for _ in group["params"]]}
                                      for group in state["param_groups"]]}
