"""The torchrun command line of every real run prism compares against."""

from __future__ import annotations

import sys
from pathlib import Path


def torchrun_command(nproc: int, log_dir: Path, *target: str, tee: bool = False) -> list[str]:
    """``python -m torch.distributed.run`` running ``target`` (a script, or ``-m module``, with its
    arguments) on ``nproc`` local ranks.

    ``log_dir`` goes in the caller's own folder: without it torchrun leaves a ``torchelastic_*``
    folder under /tmp at every run. ``--standalone`` picks a free rendezvous port, so two runs
    never meet. ``tee`` prefixes the ranks' output lines with their rank, so a failure can show the
    ranks' lines rather than torchrun's."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    if tee:
        command += ["--tee", "3"]
    return [*command, "--log-dir", str(log_dir), *target]
