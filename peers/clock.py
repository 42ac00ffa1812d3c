"""The completion clock of virtual calls: when does a call whose peers are virtual complete?

A call on a group with virtual members cannot wait for its peers, so the ``prism`` backend asks
the active clock instead. Capture runs free (every virtual call completes at once) or holds each
call for its price (``HoldingClock``); replay plugs in a clock driven by the full-scale graph
(``prism.replay.graph_clock``). A clock only names a
wall time, possibly later than the call (a virtual sender that first waits for something the
real rank does afterwards); the backend makes the call's Work complete at that moment (see
``prism.peers.scheduler``) and fails it if no time is named within the group's timeout.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from prism.peers.comm_model import CommModel
from prism.schemas.cluster import ClusterSpec
from prism.schemas.comm_log import P2P_OPS, CallSite
from prism.schemas.manifest import RankJob


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

    keeps_time: bool
    """Whether the times it names are to be kept to the µs (the program spins through the last
    stretch before one, as a replay must) or only slept to (a capture's holds)."""

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
    keeps_time = True

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


class HoldingClock(ImmediateClock):
    """Every virtual collective completes after its price under a spec of this machine: a capture
    whose program waits in its calls as the real job's does.

    On CPU the real job's thread blocks in every collective (gloo's wait), and compute after a
    wait runs slower than compute straight after compute (caches and the idle core cool; on a VM
    the core may be handed away). A slice whose calls completed at once would time that compute
    warm, and its graph predict it short (the fixed tp=2 case C1: forward 26-30 %). Held, the program
    sleeps in each call for the comm model's price of it (all members arriving together), as it
    would in the real call. The hold shapes only the conditions of the compute: the graph prices
    calls with the comm model, never with a captured call's time. The price assumes the group's
    members fill nodes in turn (the fewest nodes it can span: the call has no member list); a
    send or receive is held for a transfer within a node (a pipeline's wait for its neighbour is
    the graph's to time, not the capture's).
    """

    keeps_time = False  # a hold is slept: a spin would keep the core warm, as no real call does

    def __init__(self, spec: ClusterSpec) -> None:
        self.spec = spec
        self._model = CommModel(spec)
        self._holds: dict[tuple[str, int, int], int] = {}  # a program repeats its calls: price each once

    def hold_ns(self, call: PendingCall) -> int:
        """How long ``call`` holds the program."""
        key = (call.op, call.bytes, call.group_size)
        hold = self._holds.get(key)
        if hold is None:  # (the model prices a transfer alike on any group: two ends, here one node)
            nodes = 1 if call.op in P2P_OPS else math.ceil(call.group_size / self.spec.gpus_per_node)
            hold = self._holds[key] = self._model.duration_ns(call.op, call.bytes, call.group_size, nodes)
        return hold

    def completion_ns(self, call: PendingCall) -> int | None:
        hold = self.hold_ns(call)
        return time.time_ns() + hold if hold > 0 else None

    def __repr__(self) -> str:
        return f"HoldingClock({self.spec.name!r})"


def capture_clock(job: RankJob) -> ImmediateClock:
    """The clock of a capture's rank process: holding its CPU calls where its job names a spec
    (``RankJob.hold_calls``), else free-running. On CUDA the host does not wait in a call, so
    calls complete at once there."""
    if job.hold_calls is not None and job.device == "cpu":
        return HoldingClock(job.hold_calls)
    return FreeRunningClock()
