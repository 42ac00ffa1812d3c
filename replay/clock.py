"""The completion clock of virtual calls: when does a call whose peers are virtual complete?

A call on a group with virtual members cannot wait for its peers, so the ``prism`` backend asks
the active clock instead. Capture runs free (every virtual call completes at once); replay plugs
in a clock driven by the full-scale graph. A clock only names a wall time; the backend makes the
call's Work complete at that moment (see ``prism.replay.scheduler``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True, kw_only=True)
class PendingCall:
    """A virtual call that has been issued and waits for its completion time."""

    op: str
    """Operation name (see ``prism.replay.recorder.CommOp``), e.g. 'all_reduce'."""
    group: str
    """torch.distributed name of the group."""
    label: str
    """Layout label of the group, e.g. 'tp.3'."""
    group_size: int
    """Number of members of the group."""
    gseq: int
    """Per-group sequence number of the call on this rank."""
    bytes: int
    """Bytes this rank contributes (recv: bytes received)."""
    peer: int | None
    """Global rank of the other side (p2p, broadcast root), else None."""
    enter_ns: int
    """Wall time (``time.time_ns()``) the call was made."""


@runtime_checkable
class CommClock(Protocol):
    """Decides when virtual calls complete."""

    def completion_ns(self, call: PendingCall) -> int | None:
        """Wall time (``time.time_ns()``) at which ``call`` completes; None completes it at once."""
        ...


class FreeRunningClock:
    """Every virtual call completes as soon as it is made (capture: peers never hold us up)."""

    def completion_ns(self, call: PendingCall) -> int | None:
        return None

    def __repr__(self) -> str:
        return "FreeRunningClock()"
