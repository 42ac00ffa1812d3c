"""The replay clock of one real rank: its calls matched to the graph, timed by the co-simulation.

For each call of the program inside an iteration, the clock

1. matches it to the rank's next communication node of the graph (op, group, bytes, peer) and
   stops the run with a ``DivergenceError`` naming both sides when they differ;
2. tells the co-simulation (``prism.replay.cosim``) through a port: over a connection to the
   coordinator, which runs it in the launcher's process, beside the program rather than in its
   way (``prism.replay.coordinator``), or in this thread (``LocalPort``: tests, scripted runs).
   A call with virtual members is a ``Call`` whose end the co-simulation names, possibly later
   (a recv posted before the send that unblocks its virtual sender); a call whose members are
   all real runs on its real backend and is only reported (``RealCall`` / ``RealEnd``);
3. completes the call at the wall time of the node's end: at once, where the co-simulation sent
   an answer rule for the node ahead of the call (its other members had all arrived), else
   when the co-simulation names it.

Graph time 0 is the start of the first iteration (of the first real rank to start, when
there are several: they share one wall <-> graph mapping, as they share the wall clock). Work
of the clock that holds the program (its own per-call work, the engine where it runs in this
thread, a completion named after it was due) is *stall*, reported per iteration; it stays in
the wall time, the measurement. With one real rank the clock also shifts its mapping by it,
so that the virtual ranks do not see it, and a corrected time without it is reported beside
the wall time. Several real ranks cannot be dilated one by one (their real calls keep them in
step on the wall).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from prism.graph.sim.engine import AnswerRule
from prism.graph.sim.simulate import SimGraph
from prism.peers.clock import Completion, PendingCall
from prism.replay.cosim import Call, CoSimulation, Done, Event, RealCall, RealEnd, Resolved, Start
from prism.replay.rank_program import DivergenceError, RankProgram

__all__ = ["DivergenceError", "GraphClock", "IterationStats", "LocalPort", "RankProgram"]

OnResolved = Callable[[list[Resolved]], None]


class CoSimPort(Protocol):
    """Where a rank's clock sends its events; the ends of its calls come back through ``bind``'s
    callback, or ahead of the calls as answer rules (``rule``)."""

    dilates: bool
    """Whether the clock may take stall out of its rank's time (only when it is the only real rank)."""

    def bind(self, rank: int, on_resolved: OnResolved) -> None: ...

    def ruled_end(self, pass_: int, index: int, t_ns: int) -> int | None:
        """The end of the rank's ``index``-th comm node in ``pass_`` for an arrival at graph time
        ``t_ns``, if the co-simulation has sent its answer rule."""
        ...

    def origin(self, wall_ns: int) -> int:
        """Wall time of graph time 0, given that this rank starts its first iteration at ``wall_ns``."""
        ...

    def send(self, events: list[Event]) -> None: ...

    def send_call(self, node: int, t_ns: int, async_op: bool, ruled: bool) -> None:
        """``send([Call(node, t_ns, async_op, ruled=ruled)])``, without making the event."""


class LocalPort:
    """The co-simulation in this process and thread, news delivered inside ``send``: exact and
    deterministic, for tests and scripted runs (a replay runs it in the coordinator).

    With ``ahead``, it works as the coordinator does — each event only as far as its answer needs,
    then the rest of the engine's work, then the answer rules of the rank's next calls — but all
    of it before ``send`` returns."""

    dilates = True

    def __init__(self, cosim: CoSimulation, *, ahead: bool = False) -> None:
        self.cosim = cosim
        cosim.defer_work = self.ahead = ahead
        self._rank, self._on_resolved = -1, None
        self._rules: dict[tuple[int, int], AnswerRule] = {}

    def bind(self, rank: int, on_resolved: OnResolved) -> None:
        self._rank, self._on_resolved = rank, on_resolved

    def ruled_end(self, pass_: int, index: int, t_ns: int) -> int | None:
        rule = self._rules.pop((pass_, index), None)
        return None if rule is None else rule.end_ns(t_ns)

    def origin(self, wall_ns: int) -> int:
        return wall_ns

    def send(self, events: list[Event]) -> None:
        resolved: list[Resolved] = []
        for event in events:
            resolved += self.cosim.handle(self._rank, event)
        if self.ahead:
            resolved += self.cosim.catch_up()
            for _, pass_, index, rule in self.cosim.take_rules():
                self._rules[pass_, index] = rule
        if resolved:
            self._on_resolved(resolved)

    def send_call(self, node: int, t_ns: int, async_op: bool, ruled: bool) -> None:
        self.send([Call(node, t_ns, async_op, ruled=ruled)])


@dataclass(kw_only=True)
class IterationStats:
    """What the clock measured about one iteration of the program, in its own thread."""

    calls: int = 0
    """Calls of the iteration that the graph times (virtual members) or records (all real)."""
    ahead: int = 0
    """Calls of them answered at once by a rule the co-simulation had sent ahead."""
    clock_ns: int = 0
    """Time the program's thread spent in the clock (in this process: the engine's work too)."""
    stall_ns: int = 0
    """Time the clock held the program past a completion (one real rank: removed from its time)."""
    late_ns: int = 0
    """The part of ``stall_ns`` spent waiting for answers that came after the call's modelled end
    (calls without a rule); the rest is the clock's own work."""


class GraphClock:
    """The ``CommClock`` of one real rank of a replay."""

    holds = True  # the co-simulation runs in ``submit``
    keeps_time = True

    def __init__(self, program: RankProgram, port: CoSimPort, *, wall_ns=time.time_ns) -> None:
        self.program, self.rank, self.port = program, program.rank, port
        self._wall_ns = wall_ns
        self._first = program.first_row
        self._comm_rows = program.comm_rows.tolist()
        self._keys = program.comm_keys
        self._next = 0  # index into _comm_rows of the next call's node
        self._origin_ns: int | None = None  # wall time of graph time 0
        self._shift_ns = 0  # stall so far: wall = origin + shift + graph time
        self._lock = threading.RLock()
        self._deferred: dict[int, Completion] = {}
        self._waiting: tuple[int, int] | None = (
            None  # (node, wall began) of the sync call the program waits in
        )
        self._sending = False
        self._inbox: list[Resolved] = []  # resolved inside our own send: applied after its stall
        # Sent with the next event: ends of real calls, and the iteration's Start (nothing is
        # resolved by it, and the co-simulation's work at a pass boundary overlaps the program).
        self._outbox: list[Event] = []
        self._in_iteration = False
        self.iterations: list[IterationStats] = []
        self.wall_offsets: list[int] = []
        """``origin + shift`` at the end of each iteration: wall ns = graph ns + offset."""
        port.bind(self.rank, self._on_resolved)
        AnswerRule(0, 0, 0, 0.0, 1.0, 0).end_ns(0)  # compiled (or loaded) now, not at the first call

    @classmethod
    def open(
        cls,
        path: str | Path,
        rank: int,
        graph: SimGraph,
        *,
        wall_ns=time.time_ns,
        trace_ranks: tuple[int, ...] = (),
        ahead: bool = False,
    ) -> GraphClock:
        """The clock of the only real rank ``rank`` of the graph at ``path`` (loaded as ``graph``),
        the co-simulation in this thread (``LocalPort``, ``ahead`` as there)."""
        for r in (rank, *trace_ranks):
            if not 0 <= r < graph.ranks:
                raise ValueError(f"rank {r} is not in the graph (0..{graph.ranks - 1})")
        program = RankProgram.read(path, rank)
        cosim = CoSimulation(graph, {rank: program}, trace_ranks=trace_ranks)
        return cls(program, LocalPort(cosim, ahead=ahead), wall_ns=wall_ns)

    @property
    def cosim(self) -> CoSimulation:
        """The co-simulation, when it runs in this process."""
        return self.port.cosim

    # -- time mapping --------------------------------------------------------------------------
    def _to_graph(self, wall_ns: int) -> int:
        return wall_ns - self._origin_ns - self._shift_ns

    def _to_wall(self, graph_ns: int) -> int:
        return graph_ns + self._origin_ns + self._shift_ns

    # -- iterations ----------------------------------------------------------------------------
    def iteration_started(self, wall_ns: int) -> None:
        with self._lock:
            began = self._wall_ns()
            if self._origin_ns is None:  # first iteration
                self._origin_ns = self.port.origin(wall_ns)
            self.iterations.append(IterationStats())
            self._in_iteration = True
            self._outbox.append(Start(self._to_graph(wall_ns)))
            self._held(began)

    def iteration_done(self, wall_ns: int) -> None:
        with self._lock:
            began = self._wall_ns()
            if self._next < len(self._comm_rows):
                node = int(self._comm_rows[self._next]) - self._first
                raise DivergenceError(
                    f"rank {self.rank}: the iteration ended, but the graph expects {self.program.describe(node)} next"
                )
            self._send(Done(self._to_graph(wall_ns)))
            self._next = 0
            self._in_iteration = False
            self._held(began)
            self.wall_offsets.append(self._origin_ns + self._shift_ns)

    # -- calls ---------------------------------------------------------------------------------
    def submit(self, call: PendingCall, complete: Completion) -> None:
        """A call with virtual members: it completes at its node's co-simulated end."""
        if not self._in_iteration:
            complete(None)  # set-up or tear-down calls: outside the graph's iteration
            return
        with self._lock:
            began = self._wall_ns()
            node = self._match(call)
            t = self._to_graph(call.enter_ns)
            end = self.port.ruled_end(len(self.iterations) - 1, self._next - 1, t)
            if end is not None:
                self._answer(call, node, t, end, complete, began)
                return
            self._deferred[node] = complete
            if not call.async_op:
                self._waiting = (node, began)
            self._send(Call(node, t, call.async_op))
            if call.async_op:  # the program goes on at once: all the time in here held it
                self._held(began)
            else:
                self._apply(self._take_inbox())
                self.iterations[-1].clock_ns += self._wall_ns() - began

    def _answer(
        self, call: PendingCall, node: int, t: int, end: int, complete: Completion, began: int
    ) -> None:
        """A call whose end (graph time ``end``) the co-simulation ruled ahead: named here, the
        co-simulation told after."""
        if self._outbox:
            self._send(Call(node, t, call.async_op, ruled=True))
        else:  # most calls: one row straight into the channel
            self._through_port(self.port.send_call, node, t, call.async_op, True)
        stats = self.iterations[-1]
        stats.ahead += 1
        due = self._to_wall(end)
        complete(due)
        now = self._wall_ns()
        # The program waits until the end of a sync call anyway: held only past it; an async
        # call's program goes on at once: all of its time in here held it.
        self._hold(stats, now - began, now - max(due, began) if not call.async_op else None)
        if self._inbox:
            self._apply(self._take_inbox())

    def _hold(self, stats: IterationStats, spent: int, held: int | None = None) -> None:
        """``spent`` ns in the clock, ``held`` (default: all of it) of them beyond the job's own wait."""
        held = spent if held is None else held
        stats.clock_ns += spent
        if held > 0:
            stats.stall_ns += held
            self._shift_ns += held if self.port.dilates else 0

    def real_call(self, call: PendingCall) -> Callable[[int], None] | None:
        """A call whose members are all real: recorded; ``finished(done_ns)`` reports its end."""
        if not self._in_iteration:
            return None
        with self._lock:
            began = self._wall_ns()
            node = self._match(call)
            self._send(RealCall(node, self._to_graph(call.enter_ns), call.async_op))
            self._held(began)

        def finished(done_ns: int) -> None:
            with self._lock:
                self._outbox.append(RealEnd(node, self._to_graph(done_ns)))

        return finished

    def _match(self, call: PendingCall) -> int:
        self.iterations[-1].calls += 1
        if self._next >= len(self._comm_rows):
            raise DivergenceError(
                f"rank {self.rank}: the program made {call.describe()}, but the graph has no more calls "
                "in this iteration"
            )
        node = int(self._comm_rows[self._next])
        if self._keys[self._next] != RankProgram.call_key(call):
            raise DivergenceError(
                f"rank {self.rank}: the program made {call.describe()}, but the graph expects "
                f"{self.program.describe(node - self._first)} (node {node - self._first} of the rank)"
            )
        self._next += 1
        return node

    # -- talking to the co-simulation ------------------------------------------------------------
    def _send(self, event: Event) -> None:
        events, self._outbox = [*self._outbox, event], []
        self._through_port(self.port.send, events)

    def _through_port(self, send: Callable[..., None], *args: object) -> None:
        """``send(*args)`` to the port; what it resolves meanwhile waits in the inbox."""
        self._sending = True
        try:
            send(*args)
        finally:
            self._sending = False

    def _on_resolved(self, resolved: list[Resolved]) -> None:
        with self._lock:
            if self._sending:  # inside our own send: wait until its stall is known
                self._inbox += resolved
            else:
                self._apply(resolved)

    def _take_inbox(self) -> list[Resolved]:
        inbox, self._inbox = self._inbox, []
        return inbox

    def _held(self, began: int) -> None:
        """The program's thread was in the clock since ``began``: all of it held the program."""
        self._hold(self.iterations[-1], self._wall_ns() - began)
        self._apply(self._take_inbox())

    def _apply(self, resolved: list[Resolved]) -> None:
        """Complete the calls whose nodes' ends are known; a sync call named late is stall."""
        if not resolved:
            return
        now = self._wall_ns()
        if self._waiting is not None:
            node, began = self._waiting
            end = next((r.end_ns for r in resolved if r.node == node), None)
            if end is not None:
                self._waiting = None
                late = now - max(self._to_wall(end), began)
                if late > 0:
                    self._shift_ns += late if self.port.dilates else 0
                    self.iterations[-1].stall_ns += late
                    self.iterations[-1].late_ns += late
        for r in resolved:
            complete = self._deferred.pop(r.node, None)
            if complete is not None:
                complete(self._to_wall(r.end_ns))
