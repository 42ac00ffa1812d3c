"""The co-simulation clock of prism-replay: virtual peers timed by the full-scale graph.

The real rank is an *external* rank of the simulation engine (``prism.graph.sim_engine``);
every other rank is virtual and advanced by the engine. The graph holds one iteration, so each
iteration of the program is one pass of the engine, started as ``simulate`` starts its passes
(every rank at the end of its previous pass).

For each virtual call of the program, the clock

1. matches it to the rank's next communication node of the graph (op, group, bytes, peer) and
   stops the run with a ``DivergenceError`` naming both sides when they differ;
2. moves the rank over the compute nodes before it: the program's measured time since its
   previous call is spread over them in proportion to their predicted times (so that per-block
   times can be read back);
3. arrives at the node at the call's wall time, advances the virtual ranks until they block,
   and names the wall time at which the node ends, or later, once the program's own later
   calls have let the virtual peers get there (a recv posted before the send that unblocks
   its virtual sender).

Time dilation: work of the engine inside a call can hold the program past the moment its call
should have completed. That delay is *stall*: the clock shifts its wall <-> graph time mapping
by it, so the emulated job does not see it, and reports it per iteration (the program's own
iteration times are read with it subtracted).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq

from prism.graph.sim_engine import COLLECTIVE, COMPUTE, RECV, SEND, Engine
from prism.graph.simulate import SimGraph, SimulationError
from prism.replay.clock import Completion, PendingCall
from prism.schemas import graph_format as gf

_OPS = {COLLECTIVE: None, SEND: "send", RECV: "recv"}


class DivergenceError(RuntimeError):
    """The program made a call the graph does not expect at that point (one line)."""


@dataclass(frozen=True, kw_only=True)
class RankProgram:
    """What the graph says one rank does, node by node (the rank's rows, in program order)."""

    rank: int
    kind: np.ndarray
    name: np.ndarray
    """Op name (collectives: 'all_reduce', ...; transfers: 'send' / 'recv')."""
    label: np.ndarray
    """Group label of collectives ('tp.3'), '' otherwise."""
    bytes: np.ndarray
    peer: np.ndarray
    phase: np.ndarray
    """Annotation phase of the node's block (fwd, bwd, p2p_wait, grad_sync, optim, ...)."""
    phases: tuple[str, ...]
    """The distinct phases; ``phase_code`` indexes them."""
    phase_code: np.ndarray

    @classmethod
    def read(cls, path: str | Path, rank: int, graph: SimGraph) -> RankProgram:
        """The rank's rows of the graph file at ``path`` (other row groups are skipped), loaded as ``graph``."""
        kind = graph.kind[graph.rank_ptr[rank] : graph.rank_ptr[rank + 1]]
        columns = [gf.RANK, gf.NAME, gf.GROUP_KIND, gf.GROUP_INDEX, gf.BYTES, gf.PEER, gf.PHASE]
        table = pq.read_table(path, columns=columns, filters=[(gf.RANK, "=", rank)])
        group_kind = table[gf.GROUP_KIND].cast("string").to_numpy(zero_copy_only=False)
        group_index = table[gf.GROUP_INDEX].to_numpy()
        label = np.array(
            [f"{k}.{i}" if k and i >= 0 else (k or "") for k, i in zip(group_kind, group_index, strict=True)],
            dtype=object,
        )
        phase = pc.cast(table[gf.PHASE], "string").to_numpy(zero_copy_only=False)
        phases, codes = np.unique(phase, return_inverse=True)
        return cls(
            rank=rank,
            kind=kind,
            name=pc.cast(table[gf.NAME], "string").to_numpy(zero_copy_only=False),
            label=label,
            bytes=table[gf.BYTES].to_numpy(),
            peer=table[gf.PEER].to_numpy(),
            phase=phase,
            phases=tuple(phases),
            phase_code=codes,
        )

    def describe(self, i: int) -> str:
        """A node as the program would name the call."""
        if self.kind[i] == COLLECTIVE:
            return f"{self.name[i]} on {self.label[i]} ({self.bytes[i]} bytes)"
        if self.kind[i] in (SEND, RECV):
            return f"{self.name[i]} with peer {self.peer[i]} ({self.bytes[i]} bytes)"
        return f"compute {self.name[i]}"

    def matches(self, i: int, call: PendingCall) -> bool:
        kind = self.kind[i]
        if kind == COLLECTIVE:
            return self.name[i] == call.op and self.label[i] == call.label and self.bytes[i] == call.bytes
        return _OPS.get(kind) == call.op and self.peer[i] == call.peer and self.bytes[i] == call.bytes


@dataclass(kw_only=True)
class IterationStats:
    """What the clock measured about one iteration of the program."""

    calls: int = 0
    """Virtual calls of the iteration."""
    engine_ns: int = 0
    """Time the engine computed, inside calls and at the iteration's boundary."""
    stall_ns: int = 0
    """Part of it that held the program past a completion (removed from the emulated time)."""
    rank_start_ns: int = 0
    """Graph time at which the real rank started the iteration."""
    rank_end_ns: int = 0
    """Graph time at which it ended it."""
    phase_ns: dict[str, int] = field(default_factory=dict)
    """The real rank's time by phase of its nodes (compute spread in proportion to the graph)."""


@dataclass(frozen=True, kw_only=True)
class PassTimes:
    """Wall-clock start and end of the nodes of some ranks in one iteration of the co-simulation.

    Graph times are mapped to the wall with the iteration's final stall shift, so nodes early in
    an iteration that stalled may show up to that stall late."""

    start_ns: dict[int, np.ndarray]
    end_ns: dict[int, np.ndarray]


class GraphClock:
    """Co-simulates one real rank against the graph's virtual ranks (a ``CommClock``)."""

    def __init__(
        self,
        graph: SimGraph,
        program: RankProgram,
        *,
        wall_ns=time.time_ns,
        trace_ranks: tuple[int, ...] = (),
    ) -> None:
        self.graph, self.program, self.rank = graph, program, program.rank
        self._wall_ns = wall_ns
        self._external = np.zeros(graph.ranks, np.bool_)
        self._external[self.rank] = True
        self._first = int(graph.rank_ptr[self.rank])
        self._last = int(graph.rank_ptr[self.rank + 1])
        self._comm_rows = self._first + np.flatnonzero(program.kind != COMPUTE)
        self._engine: Engine | None = None
        self._origin_ns = 0  # wall time of graph time 0
        self._shift_ns = 0  # stall so far: wall = origin + shift + graph time
        self._deferred: list[tuple[int, Completion]] = []
        self._in_iteration = False
        self._pass_start = self._pass_end = np.zeros(graph.ranks, np.int64)  # every rank, this pass
        self._phase_acc = np.zeros(len(program.phases), np.int64)  # the real rank's ns by phase
        self.iterations: list[IterationStats] = []
        self.pass_iterations: list[np.ndarray] = []
        """Every rank's time in each iteration of the co-simulation (``pass_iteration_ns``)."""
        self.trace_ranks = tuple(trace_ranks)
        self.traced: list[PassTimes] = []
        """Start and end (wall ns) of every node of ``trace_ranks``, one entry per iteration."""

    @classmethod
    def open(
        cls,
        path: str | Path,
        rank: int,
        graph: SimGraph,
        *,
        wall_ns=time.time_ns,
        trace_ranks: tuple[int, ...] = (),
    ) -> GraphClock:
        """The clock of ``rank`` of the graph at ``path`` (already loaded as ``graph``)."""
        for r in (rank, *trace_ranks):
            if not 0 <= r < graph.ranks:
                raise ValueError(f"rank {r} is not in the graph (0..{graph.ranks - 1})")
        return cls(graph, RankProgram.read(path, rank, graph), wall_ns=wall_ns, trace_ranks=trace_ranks)

    # -- time mapping --------------------------------------------------------------------------
    def _to_graph(self, wall_ns: int) -> int:
        return wall_ns - self._origin_ns - self._shift_ns

    def _to_wall(self, graph_ns: int) -> int:
        return graph_ns + self._origin_ns + self._shift_ns

    # -- iterations ----------------------------------------------------------------------------
    def iteration_started(self, wall_ns: int) -> None:
        began = self._wall_ns()
        stats = IterationStats()
        if self._engine is None:  # first iteration: graph time 0 is now, for every rank
            self._origin_ns = wall_ns
            clock = np.zeros(self.graph.ranks, np.int64)
        else:  # every rank starts where it ended the previous pass
            clock = self._pass_end.copy()
            clock[self.rank] = self._to_graph(wall_ns)
        self._pass_start = clock
        self._engine = Engine(self.graph, clock, external=self._external)
        self._engine.advance()
        stats.rank_start_ns = int(clock[self.rank])
        self._in_iteration = True
        self._phase_acc = np.zeros(len(self.program.phases), np.int64)
        self.iterations.append(stats)
        self._stall(stats, began)

    def iteration_done(self, wall_ns: int) -> None:
        began = self._wall_ns()
        engine, stats = self._engine, self.iterations[-1]
        t = self._to_graph(wall_ns)
        rest = self._next_comm(int(engine.pc[self.rank]))
        if rest < self._last:
            raise DivergenceError(
                f"rank {self.rank}: the iteration ended, but the graph expects "
                f"{self.program.describe(rest - self._first)} next"
            )
        self._move_to(self._last, t)
        engine.advance()
        stuck = np.flatnonzero(engine.pc < self.graph.rank_ptr[1:])
        if len(stuck):
            raise SimulationError(f"the virtual ranks cannot finish the iteration (first: rank {stuck[0]})")
        stats.rank_end_ns = t
        stats.phase_ns = {
            p: int(ns) for p, ns in zip(self.program.phases, self._phase_acc, strict=True) if ns
        }
        self._in_iteration = False
        self._pass_end = np.maximum.reduceat(engine.end, self.graph.rank_ptr[:-1])
        if self.trace_ranks:
            self.traced.append(self._pass_times())
        self.pass_iterations.append(self._pass_end - self._pass_start)
        self._stall(stats, began)

    def _pass_times(self) -> PassTimes:
        ptr, engine = self.graph.rank_ptr, self._engine
        rows = {r: slice(int(ptr[r]), int(ptr[r + 1])) for r in self.trace_ranks}
        offset = self._origin_ns + self._shift_ns
        return PassTimes(
            start_ns={r: engine.start[s] + offset for r, s in rows.items()},
            end_ns={r: engine.end[s] + offset for r, s in rows.items()},
        )

    def pass_iteration_ns(self) -> np.ndarray:
        """Every rank's time in the last finished iteration (pass) of the co-simulation, virtual ones included."""
        return self.pass_iterations[-1]

    # -- calls ---------------------------------------------------------------------------------
    def submit(self, call: PendingCall, complete: Completion) -> None:
        if not self._in_iteration:
            complete(None)  # set-up or tear-down calls: outside the graph's iteration
            return
        began = self._wall_ns()
        engine, stats = self._engine, self.iterations[-1]
        stats.calls += 1
        node = self._next_comm(int(engine.pc[self.rank]))
        if node >= self._last:
            raise DivergenceError(
                f"rank {self.rank}: the program made {call.describe()}, but the graph has no more calls "
                "in this iteration"
            )
        if not self.program.matches(node - self._first, call):
            raise DivergenceError(
                f"rank {self.rank}: the program made {call.describe()}, but the graph expects "
                f"{self.program.describe(node - self._first)} (node {node - self._first} of the rank)"
            )
        t = self._to_graph(call.enter_ns)
        self._move_to(node, t)
        engine.arrive_external(self.rank, t)
        engine.advance()
        if call.async_op:
            engine.finish_external(self.rank, t)
        self._deferred.append((node, complete))
        self._settle(began, stats, sync=None if call.async_op else node)

    def _settle(self, began: int, stats: IterationStats, *, sync: int | None) -> None:
        """Name the completion of every call whose node has ended; charge the engine's time."""
        end = self._engine.end
        if sync is not None and end[sync] < 0:
            # One real rank: nobody else can move the virtual peers while it waits here.
            raise DivergenceError(
                f"rank {self.rank}: {self.program.describe(sync - self._first)} can never complete: "
                "its virtual peers wait for something this rank has not done yet (deadlock)"
            )
        ready = [(n, c) for n, c in self._deferred if end[n] >= 0]
        self._deferred = [(n, c) for n, c in self._deferred if end[n] < 0]
        now = self._wall_ns()
        due = {n: self._to_wall(int(end[n])) for n, _ in ready}
        # Engine time held the program: all of it after an async call (which returns at once),
        # what ran past the completion after a sync one (which waits for it anyway).
        late = now - (began if sync is None or sync not in due else max(due[sync], began))
        if late > 0:
            self._shift_ns += late
            stats.stall_ns += late
            due = {n: d + late for n, d in due.items()}
        if sync is not None:
            self._count(sync, int(end[sync]) - int(self._engine.start[sync]))
            self._engine.finish_external(self.rank, int(end[sync]))
        stats.engine_ns += now - began
        for n, complete in ready:
            complete(due[n])

    def _stall(self, stats: IterationStats, began: int) -> None:
        """Charge engine time since ``began`` at an iteration boundary: it all held the program."""
        spent = self._wall_ns() - began
        stats.engine_ns += spent
        self._shift_ns += spent
        stats.stall_ns += spent

    # -- the real rank's compute nodes -----------------------------------------------------------
    def _next_comm(self, i: int) -> int:
        """The first communication node of the rank at or after row ``i`` (``_last``: none)."""
        k = int(np.searchsorted(self._comm_rows, i))
        return int(self._comm_rows[k]) if k < len(self._comm_rows) else self._last

    def _move_to(self, stop: int, t: int) -> None:
        """Finish the rank's compute nodes before ``stop``: graph time ``t`` is reached at ``stop``.

        The measured span is split as the engine would have spent it (gaps, waits for earlier
        async calls, durations; the gap before the call ``stop`` counts to the node before it),
        scaled to the measured length: with the graph's own times, the offline split exactly.
        """
        engine, g = self._engine, self.graph
        i, clock = int(engine.pc[self.rank]), int(engine.clock[self.rank])
        span = max(t - clock, 0)
        if i >= stop:  # consecutive calls: the time between them counts to the node before
            self._count(i - 1 if i > self._first else stop, span)
            return
        predicted = self._predicted(i, stop, clock)
        if stop < self._last:
            predicted[-1] += g.gap[stop]
        total = predicted.sum()
        share = predicted / total if total > 0 else np.full(stop - i, 1.0 / (stop - i))
        ends = clock + np.round(np.cumsum(share) * span).astype(np.int64)
        starts = np.r_[clock, ends[:-1]]
        engine.finish_external_run(self.rank, stop, starts, ends)
        np.add.at(
            self._phase_acc, self.program.phase_code[i - self._first : stop - self._first], ends - starts
        )

    def _predicted(self, i: int, stop: int, clock: int) -> np.ndarray:
        """How far each node of ``i..stop`` moves the rank on, by the engine's rules (vectorized
        between the few nodes that wait for earlier async calls)."""
        engine, g = self._engine, self.graph
        gap, busy = g.gap[i:stop], engine.busy[i:stop]
        predicted = (gap + busy).astype(np.float64)
        waits = np.flatnonzero(g.deps_ptr[i + 1 : stop + 1] > g.deps_ptr[i:stop])
        c, pos = clock, 0
        for k in waits:
            c += int(predicted[pos:k].sum())
            deps = g.deps[g.deps_ptr[i + k] : g.deps_ptr[i + k + 1]]
            ready = max(c + int(gap[k]), int(engine.end[deps].max()))
            predicted[k] = ready + int(busy[k]) - c
            c += int(predicted[k])
            pos = k + 1
        return predicted

    def _count(self, node: int, ns: int) -> None:
        self._phase_acc[self.program.phase_code[node - self._first]] += ns
