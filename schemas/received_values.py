"""``values/rank{r}.pt``: what a rank received from its real peers in a capture's value pass.

A ``torch.save`` of ``{"schema": SCHEMA, "version": VERSION, "rank": r, "received": {peer:
[receive, ...]}}``: per peer (global rank), per receive from it in program order, the list of
received tensors, or None where the receive was too large to keep. Read with
``weights_only=True``: the file holds tensors, ints, strings and lists only.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch

from prism.schemas.layout import ParallelLayout

SCHEMA = "prism.received_values"
VERSION = 1

Received = dict[int, list[list[torch.Tensor] | None]]


def value_pass_rank(layout: ParallelLayout, stage: int) -> int:
    """The rank of ``stage`` in the pipeline a capture's value pass runs: rank 0's (tp 0, dp 0)."""
    return layout.in_pipeline(0, stage)


class ReceivedValuesError(ValueError):
    """A values file prism cannot read."""


def write_received_values(path: str | os.PathLike, rank: int, received: Received) -> None:
    """Write ``received`` for ``rank`` (atomically: a temporary file renamed into place)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"schema": SCHEMA, "version": VERSION, "rank": rank, "received": received}
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        torch.save(data, tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_received_values(path: str | os.PathLike) -> tuple[int, Received]:
    """(rank, received) from a values file; ReceivedValuesError if it is not one."""
    try:
        data = torch.load(path, weights_only=True)
    except Exception as e:  # noqa: BLE001 (torch raises many kinds for a damaged file)
        raise ReceivedValuesError(f"{path}: not a values file ({type(e).__name__}: {e})") from e
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ReceivedValuesError(f"{path}: not a {SCHEMA} file")
    if data.get("version") != VERSION:
        raise ReceivedValuesError(f"{path}: version {data.get('version')!r}, this prism reads {VERSION}")
    rank, received = data.get("rank"), data.get("received")
    if not isinstance(rank, int) or not isinstance(received, dict):
        raise ReceivedValuesError(f"{path}: 'rank' must be an int and 'received' a dict")
    for peer, receives in received.items():
        if not isinstance(peer, int) or not isinstance(receives, list):
            raise ReceivedValuesError(f"{path}: receives from {peer!r} must be a list under an int rank")
        for receive in receives:
            if receive is not None and not (
                isinstance(receive, list) and all(isinstance(t, torch.Tensor) for t in receive)
            ):
                raise ReceivedValuesError(f"{path}: a receive from rank {peer} is not a list of tensors")
    return rank, received
