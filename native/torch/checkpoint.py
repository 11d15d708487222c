"""The torch loop's checkpoint files, with torch's own tool: `torch.save` of the optimizer's and the scheduler's
`state_dict()` and of every model variable, read back with `torch.load(weights_only=True)` (tensors and plain
values only: nothing in the file can run code). The folder around it is `native.checkpoint`'s."""
from __future__ import annotations

from pathlib import Path

import torch


def write(folder: Path, model, optimizer, scheduler) -> None:
    folder.mkdir()
    torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict() if scheduler else None,
                "variables": [v.value.detach().cpu().clone() for v in model.variables]}, folder / "state.pt")


@torch.no_grad()
def read(folder: Path, model, optimizer, scheduler) -> None:
    saved = torch.load(folder / "state.pt", weights_only=True)
    optimizer.load_state_dict(saved["optimizer"])
    if scheduler:
        scheduler.load_state_dict(saved["scheduler"])
    for variable, value in zip(model.variables, saved["variables"], strict=True):
        variable.assign(value)
