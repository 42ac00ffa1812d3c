"""The completion clock of virtual calls: when does a call whose peers are virtual complete?

A call on a group with virtual members cannot wait for its peers, so the ``prism`` backend asks
the active clock instead. Capture runs free (every virtual call completes at once); replay plugs
in a clock driven by the full-scale graph (``prism.replay.graph_clock``). A clock only names a
wall time, possibly later than the call (a virtual sender that first waits for something the
real rank does afterwards); the backend makes the call's Work complete at that moment (see
``prism.peers.scheduler``) and fails it if no time is named within the group's timeout.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from prism.schemas.comm_log import CallSite


@dataclass(frozen=True, kw_only=True)
class PendingCall(CallSite):
    """A virtual call that has been issued and waits for its completion time."""

    def describe(self) -> str:
        peer = "" if self.peer is None else f" peer {self.peer}"
        return f"{self.op} on {self.label} (call {self.gseq} of the group{peer}, {self.bytes} bytes)"


Completion = Callable[[int | None], None]
"""``complete(wall_ns)``: the call completes at ``wall_ns`` (``time.time_ns()``); None: at once."""


@runtime_checkable
class CommClock(Protocol):
    """Decides when virtual calls complete; told where the program's iterations begin and end."""

    holds: bool
    """Whether ``submit`` does work of the emulation the program would not do (a co-simulation):
    its time is then held time (``CommCall.clock_ns``); else it counts as the call's own cost."""

    def submit(self, call: PendingCall, complete: Completion) -> None:
        """Call ``complete`` once the completion time of ``call`` is known: now, or later."""
        ...

    def real_call(self, call: PendingCall) -> Callable[[int], None] | None:
        """A call whose members are all real is made (it runs on a real backend): returns a
        ``finished(done_ns)`` to be told when it completes, or None if the clock need not know."""
        ...

    def iteration_started(self, wall_ns: int) -> None:
        """The program starts a training iteration (calls outside iterations complete at once)."""
        ...

    def iteration_done(self, wall_ns: int) -> None:
        """The program finished the iteration it started."""
        ...


class ImmediateClock:
    """A clock that knows every completion time when the call is made: ``completion_ns``."""

    holds = False

    def completion_ns(self, call: PendingCall) -> int | None:
        """Wall time at which ``call`` completes; None completes it at once."""
        return None

    def submit(self, call: PendingCall, complete: Completion) -> None:
        complete(self.completion_ns(call))

    def real_call(self, call: PendingCall) -> None:
        return None

    def iteration_started(self, wall_ns: int) -> None:
        pass

    def iteration_done(self, wall_ns: int) -> None:
        pass


class FreeRunningClock(ImmediateClock):
    """Every virtual call completes as soon as it is made (capture: peers never hold us up)."""

    def __repr__(self) -> str:
        return "FreeRunningClock()"
