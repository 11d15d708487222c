"""The torchrun command of a data-parallel run (`native.torch.ddp`), built without importing torch: the referee,
which never imports an engine, launches it too."""
from __future__ import annotations

import sys
from pathlib import Path


def torchrun_command(processes: int, *args: str) -> list[str]:
    """torchrun from this interpreter's environment: `processes` ranks on this host (a free port: `--standalone`),
    each running `native.torch.ddp` with `args` (a rank ends when torchrun does: `ddp.main`)."""
    return [str(Path(sys.executable).parent / "torchrun"), "--standalone", "--nproc-per-node", str(processes),
            "-m", "native.torch.ddp", *args]
