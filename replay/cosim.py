"""The co-simulation of prism-replay: the graph's virtual ranks, advanced around the real ones.

The real ranks are *external* ranks of the simulation engine (``prism.graph.sim.engine``);
every other rank is virtual and advanced by the engine. Everything here is in graph time (ns
since the first iteration began); the real ranks' clocks (``prism.replay.graph_clock``) map it
to their wall time. The graph holds one iteration, so each iteration of the program is one
pass of the engine, started as ``simulate`` starts its passes (every rank at the end of its
previous pass).

A real rank reports, in program order (``CoSimulation.handle``):

- ``Start(t)`` / ``Done(t)``: it began / ended an iteration;
- ``Call(node, t, async_op)``: a call on a group with virtual members reached comm node
  ``node`` at ``t``. The program's time since its previous event is spread over the compute
  nodes before it, as the engine would have spent it; the node arrives, the virtual ranks
  advance until they block, and the node's end is *resolved* once known: at once, or after a
  later event of any real rank has let the virtual peers get there;
- ``RealCall(node, t0, async_op)`` then ``RealEnd(node, t1)``: a call whose members are all
  real ran on a real backend from ``t0`` to ``t1``.

The virtual ranks finish a pass and start the next once every real rank is past its last call
of it (they never wait for a real rank's compute); a real rank's events up to its ``Done`` are
still applied to the pass they belong to. Several real ranks may be a pass apart (one starts
iteration k+1 while another is still in k): events of a later pass wait in a queue until the
virtual ranks have begun it.
When every real rank waits in a synchronous call that no event can resolve any more, the run
is a deadlock, reported at once.

Most of the engine's work is advancing the virtual ranks after an event, and an answer needs
little of it. With ``defer_work`` set (the coordinator, ``prism.replay.coordinator``), ``handle``
does only what the event's answer needs: an asynchronous call none, a synchronous one the
advance until its node has an end (``Engine.advance(target=...)``); the rest, and the end of a
pass with the next one's set-up, is left to ``catch_up``, which the coordinator runs in bounded
chunks between events. Virtual ranks nearest the real ones run first. Since the engine's result
does not depend on the order in which ranks are advanced, results are the same either way.

Ahead of the real ranks: once every other member of a real rank's next collective or transfer
has arrived, its end depends on the real rank's arrival alone. ``take_rules`` hands out such
``AnswerRule``s, which the rank's clock applies the moment the program makes the call, with no
round trip; the co-simulation checks that its own end agrees when the call arrives.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from prism.graph.sim.engine import COLLECTIVE, COMPUTE, AnswerRule, Engine, Hedge
from prism.graph.sim.fold import Folding, fold_replicas
from prism.graph.sim.folded import load_folded
from prism.graph.sim.noise import virtual_lateness_ns
from prism.graph.sim.simulate import SimGraph, SimResult, SimulationError, simulate
from prism.replay.rank_program import DivergenceError, RankProgram
from prism.replay.spread import spread


@dataclass(slots=True)  # made at every call: slots, not frozen, make it cheap
class Start:
    t_ns: int


@dataclass(slots=True)
class Call:
    node: int
    """Global row of the comm node."""
    t_ns: int
    async_op: bool
    ruled: bool = False
    """The rank named the end itself, from the node's ``AnswerRule``: no answer is sent back."""


@dataclass(slots=True)
class RealCall:
    node: int
    start_ns: int
    async_op: bool
    """Its end comes as a ``RealEnd`` either way; a synchronous one holds the program until then."""


@dataclass(slots=True)
class RealEnd:
    node: int
    end_ns: int


@dataclass(slots=True)
class Done:
    t_ns: int


Event = Start | Call | RealCall | RealEnd | Done


@dataclass(kw_only=True)
class RankPass:
    """One real rank in one iteration, as the co-simulation saw it (graph ns)."""

    rank_start_ns: int = 0
    rank_end_ns: int = 0
    phase_ns: dict[str, int] = field(default_factory=dict)
    """Its time by phase of its nodes (compute spread in proportion to the graph)."""


@dataclass(frozen=True, kw_only=True)
class Resolved:
    """Comm node ``node`` of real rank ``rank`` ends at graph time ``end_ns``."""

    rank: int
    node: int
    end_ns: int


class CoSimulation:
    """The engine's side of a replay: one pass per iteration, fed by the real ranks' events."""

    def __init__(
        self,
        graph: SimGraph | Folding,
        programs: dict[int, RankProgram],
        *,
        trace_ranks: tuple[int, ...] = (),
    ) -> None:
        self.programs = programs
        self.real = tuple(sorted(programs))
        # The engine runs the graph with identical virtual replicas folded (exact; at dp=64, two
        # replicas for one real rank instead of 64) and keeps only that: ``graph`` folded here, or
        # already folded with the real ranks' replicas kept (``load_folded``). Events and answers
        # name rows of the full graph.
        self.folding = graph if isinstance(graph, Folding) else fold_replicas(graph, keep=self.real)
        if self.folding.graph.lane_rank is not None:
            raise SimulationError(
                "the graph's ranks have several streams (CPU threads and GPU streams): prism-replay runs "
                "graphs of one stream a rank; prism-simulate predicts this one"
            )
        unkept = [r for r in self.real if self.folding.kept_ranks[self.folding.rank_of[r]] != r]
        if unkept:
            raise ValueError(f"rank {unkept[0]} is real but its replica was folded into another")
        self._g = self.folding.graph
        self._id = {r: int(self.folding.rank_of[r]) for r in self.real}  # rank of ``_g``
        self._shift = {r: self.folding.shift(r) for r in self.real}  # row of ``_g`` - full row
        self._program = {
            r: dataclasses.replace(p, first_row=p.first_row + self._shift[r]) for r, p in programs.items()
        }
        self._external = np.zeros(self._g.ranks, np.bool_)
        self._external[list(self._id.values())] = True
        self._hedge = self._real_collectives_hedge()
        self._order = nearest_first(self._g, self._external)
        self._engine: Engine | None = None
        # The previous pass's engine, and the one the next pass runs on: ``prepare`` clears the
        # first into the second while the coordinator waits, so that a pass starts without it.
        self._retired: Engine | None = None
        self._prior: tuple[int, Engine] | None = None  # the pass before, while real ranks finish it
        self._last_called: set[int] = set()  # real ranks past their last comm node of this pass
        self._spare: Engine | None = None
        self._pass = -1  # the pass the engine runs
        self._rank_pass = dict.fromkeys(self.real, -1)  # the pass each real rank is in
        self._done: set[int] = set()  # real ranks done with the oldest pass not all of them are
        self._queue: list[tuple[int, int, Event]] = []  # (pass, rank, event) of later passes
        self._sync: dict[int, int] = {}  # real rank -> the synchronous node it waits in
        self._real_sync: dict[int, int] = {}  # real rank -> its synchronous real call in flight
        self._blocked: set[int] = set()  # ranks waiting in a synchronous call (queued ones too)
        self._watch: dict[int, int] = {}  # node -> real rank that wants its end
        self._phase_acc = {r: np.zeros(len(p.phases), np.int64) for r, p in programs.items()}
        self._pass_start = self._pass_end = np.zeros(self._g.ranks, np.int64)
        self.passes: dict[int, list[RankPass]] = {r: [] for r in self.real}
        self.pass_iterations: list[np.ndarray] = []
        """Every rank's time in each finished pass, virtual ones included (ranks of the full graph)."""
        self.engine_ns: list[int] = []
        """Wall time the co-simulation computed in each pass."""
        self.defer_work = False
        self._owes_pass_end = False
        self._next_comm: dict[int, int] = {}  # real rank -> its next comm row (engine rows) this pass
        self._ruled: dict[int, AnswerRule] = {}  # engine row -> the rule handed out for it this pass
        self._named_by_rank: set[int] = set()  # engine rows whose end the rank named from the rule
        self.rules_given = 0
        self.trace_ranks = tuple(trace_ranks)
        self.traced: list[tuple[dict[int, np.ndarray], dict[int, np.ndarray]]] = []
        """(start, end) graph ns of every node of ``trace_ranks``, one entry per finished pass."""

    def compile_ahead(self) -> None:
        """Compile (or load from numba's cache) the code an iteration runs, on a scratch engine,
        so that the first iteration of the program does not wait for it."""
        g = self._g
        scratch = Engine(
            g, np.zeros(g.ranks, np.int64), external=self._external, hedge=self._hedge, order=self._order
        )
        scratch.advance(budget=1, target=0)
        for rank, program in self._program.items():
            rid, first = self._id[rank], program.first_row
            acc = np.zeros(len(program.phases), np.int64)
            spread(first, first + 1, 0, 0, 1, g.gap, scratch.busy, g.deps_ptr, g.deps, scratch.end, program.phase_code[:1], acc)  # fmt: skip
            node = program.next_comm(first)
            if node < program.end_row:
                scratch.pc[rid] = node
                scratch.arrive_external(rid, 1)
        AnswerRule(0, 0, 0, 0.0, 1.0, 0).end_ns(0)

    # -- events ----------------------------------------------------------------------------------
    def handle(self, rank: int, event: Event) -> list[Resolved]:
        """Take one event of real rank ``rank``; the comm nodes whose end became known."""
        resolved: list[Resolved] = []
        if self._owes_pass_end:  # the event belongs to the next pass: finish this one first
            began = time.perf_counter_ns()
            self._end_owed_pass(resolved)
            self.engine_ns[self._pass - 1] += time.perf_counter_ns() - began
        began, current = time.perf_counter_ns(), max(self._pass, 0)
        if isinstance(event, Start):
            self._rank_pass[rank] += 1
        owner = self._rank_pass[rank]
        if isinstance(event, Call) and not event.async_op:
            self._blocked.add(rank)
        if self._engine is None:  # the first event: pass 0, every rank at graph time 0
            self._begin_pass(np.zeros(self._g.ranks, np.int64))
        if isinstance(event, Call | RealCall | RealEnd):
            event = dataclasses.replace(event, node=event.node + self._shift[rank])
        if owner > self._pass:
            self._queue.append((owner, rank, event))
        else:
            self._apply(rank, event, resolved, owner)
        # To the pass the event belongs to: the Done that ends it also sets up the next one.
        self.engine_ns[current] += time.perf_counter_ns() - began
        self._check_deadlock()
        return resolved

    @property
    def owes_work(self) -> bool:
        """Whether ``catch_up`` has deferred work to do."""
        return self._owes_pass_end or (self._engine is not None and not self._engine.idle)

    def catch_up(self, budget: int = 0) -> list[Resolved]:
        """Do the work ``handle`` deferred (with ``budget``, about that many nodes of it); the comm
        nodes whose end it made known."""
        resolved: list[Resolved] = []
        if not self.owes_work:
            return resolved
        began, current = time.perf_counter_ns(), self._pass
        while self.owes_work:
            if not self._engine.idle:
                finished = self._engine.advance(budget=budget)
                self._collect(resolved)
                if not finished:
                    break
            if self._owes_pass_end:  # the next pass's first advance is owed then
                self._end_owed_pass(resolved)
            if budget:
                break
        self.engine_ns[current] += time.perf_counter_ns() - began
        return resolved

    def prepare(self) -> None:
        """Work for idle time: clear the previous pass's engine for the next pass."""
        if self._retired is not None and self._spare is None:
            self._retired.clear()
            self._spare, self._retired = self._retired, None

    def take_rules(self) -> list[tuple[int, int, int, AnswerRule]]:
        """``(rank, pass, index, rule)`` for each real rank whose next call's end became a function
        of its own arrival since the last take: ``index`` of the node among the rank's comm nodes,
        the rule's node a row of the full graph."""
        out: list[tuple[int, int, int, AnswerRule]] = []
        for rank, node in self._next_comm.items():
            if (
                node in self._ruled
                or node >= self._program[rank].end_row
                or self._rank_pass[rank] > self._pass
            ):
                continue
            rule = self._engine.answer_rule(node)
            if rule is not None:
                self._ruled[node] = rule
                self.rules_given += 1
                index = int(np.searchsorted(self._program[rank].comm_rows, node))
                out.append((rank, self._pass, index, rule._replace(node=node - self._shift[rank])))
        return out

    def _apply(self, rank: int, event: Event, resolved: list[Resolved], owner: int) -> None:
        """Apply ``event`` of ``rank``'s pass ``owner``: this one, or the one before (the rank's
        compute after its last call, and the ends of its real calls, may come after the virtual
        ranks went on to the next pass)."""
        engine, rid = self._engine_of(owner), self._id[rank]
        match event:
            case Start(t_ns=t):
                engine.clock[rid] = t
                self._pass_start[rid] = t  # its iteration starts here, not where the last one ended
                self.passes[rank].append(RankPass(rank_start_ns=t))
                self._phase_acc[rank][:] = 0
            case Call(node=node, t_ns=t, async_op=async_op, ruled=ruled):
                if ruled:
                    self._named_by_rank.add(node)
                self._move_to(rank, node, t)
                engine.arrive_external(rid, t)
                self._called(rank, node)
                if not self.defer_work:
                    engine.advance()
                elif not async_op and engine.end[node] < 0:  # the program waits: only its answer now
                    engine.advance(target=node)
                self._watch[node] = rank
                if async_op:
                    engine.finish_external(rid, t)
                else:
                    self._sync[rank] = node
            case RealCall(node=node, start_ns=t0, async_op=async_op):
                self._move_to(rank, node, t0)
                self._called(rank, node)
                engine.start[node] = t0
                engine.finish_external(rid, t0)
                if not async_op:
                    self._real_sync[rank] = node
            case RealEnd(node=node, end_ns=t1) if engine.start[node] >= 0:  # of this pass
                engine.end[node] = t1
                if self._real_sync.pop(rank, None) == node and engine.pc[rid] == node + 1:
                    engine.clock[rid] = t1  # the program waited in it
                    self._count(rank, node, t1 - int(engine.start[node]))
            case Done(t_ns=t):
                self._finish_rank(rank, t, owner)
        self._collect(resolved)
        if owner == self._pass and len(self._last_called) == len(self.real):
            # Every real rank is past its last call: the virtual ranks can finish this pass and
            # start the next (they never wait for a real rank's compute), ahead of the real ones.
            self._last_called.clear()
            if self.defer_work:
                self._owes_pass_end = True
            else:
                self._finish_pass(resolved)

    def _engine_of(self, pass_: int) -> Engine:
        return self._prior[1] if self._prior is not None and self._prior[0] == pass_ else self._engine

    def _called(self, rank: int, node: int) -> None:
        self._next_comm[rank] = nxt = self._program[rank].next_comm(node + 1)
        if nxt >= self._program[rank].end_row:
            self._last_called.add(rank)

    def _collect(self, resolved: list[Resolved]) -> None:
        end = self._engine.end
        for node in [n for n in self._watch if end[n] >= 0]:
            rank = self._watch.pop(node)
            if node not in self._named_by_rank:
                resolved.append(Resolved(rank=rank, node=node - self._shift[rank], end_ns=int(end[node])))
            elif (rule := self._ruled[node]).end_ns(int(self._engine.start[node])) != end[node]:
                raise SimulationError(
                    f"rank {rank}: node {node - self._program[rank].first_row} ended at {int(end[node])} ns, "
                    f"not where its answer rule put it ({rule.end_ns(int(self._engine.start[node]))} ns)"
                )
            if self._sync.get(rank) == node:  # the rank's program moves on when its call ends
                del self._sync[rank]
                self._blocked.discard(rank)
                self._count(rank, node, int(end[node]) - int(self._engine.start[node]))
                self._engine.finish_external(self._id[rank], int(end[node]))

    def _check_deadlock(self) -> None:
        if len(self._blocked) < len(self.real):
            return
        rank = min(self._sync) if self._sync else self.real[0]
        node = self._sync.get(rank)
        what = (
            self._program[rank].describe(node - self._program[rank].first_row)
            if node is not None
            else "a call"
        )
        raise DivergenceError(
            f"rank {rank}: {what} can never complete: its virtual peers wait for something "
            f"{'this rank has' if len(self.real) == 1 else 'the real ranks have'} not done yet (deadlock)"
        )

    def _real_collectives_hedge(self) -> Hedge:
        """The engine's ``Hedge`` for the collectives real ranks are members of.

        A collective's skew is the expected wait for the last of its members; the real ones
        arrive when they do, noise included, so only the virtual members' lateness is added
        (``prism.graph.sim.noise.virtual_lateness_ns``), out of the group's members (its size,
        whatever the fold left of it). Every real rank's replica is kept whole, so a slot of the
        folded graph has all its real members."""
        g = self._g
        rows, sizes = [], []
        for r in self.real:
            program = self._program[r]  # its rows of the folded graph
            at = np.flatnonzero(program.kind == COLLECTIVE)
            rows.append(program.first_row + at)
            sizes.append(program.group_size[at])
        rows, sizes = np.concatenate(rows), np.concatenate(sizes)
        slots, real_members = np.unique(g.slot[rows], return_counts=True)
        skew = np.zeros(len(rows), np.int64) if g.skew is None else g.skew[rows]
        mu, sd = virtual_lateness_ns(skew, sizes, real_members[np.searchsorted(slots, g.slot[rows])])
        folded_slot = g.slot[rows]
        hedged = np.zeros(len(g.slot_size), np.bool_)
        hedged[folded_slot] = True
        lateness, spread = np.full(len(hedged), -1.0), np.zeros(len(hedged))
        np.maximum.at(lateness, folded_slot, mu)  # members of one slot agree, up to their own skew
        np.maximum.at(spread, folded_slot, sd)
        return Hedge(hedged, lateness, spread)

    # -- passes ----------------------------------------------------------------------------------
    def _begin_pass(self, clock: np.ndarray) -> None:
        self._pass += 1
        self._pass_start = clock
        spare, self._spare = self._spare, None
        if spare is None:
            spare = Engine(self._g, clock, external=self._external, hedge=self._hedge, order=self._order)
        else:
            spare.restart(clock)
        self._engine = spare
        if not self.defer_work:  # else the virtual ranks' start is owed: the program's compute covers it
            self._engine.advance()
        self._ruled.clear()
        self._named_by_rank.clear()
        self._next_comm = {r: p.next_comm(p.first_row) for r, p in self._program.items()}
        self._last_called = {r for r, p in self._program.items() if self._next_comm[r] >= p.end_row}
        self.engine_ns.append(0)

    def _finish_rank(self, rank: int, t: int, owner: int) -> None:
        """The rank ended its iteration of pass ``owner`` at ``t`` (its clock checked that no call
        is left)."""
        program = self._program[rank]
        self._move_to(rank, program.end_row, t, self._engine_of(owner))
        if owner == self._pass:  # (a rank with no call at all)
            self._last_called.add(rank)
        record = self.passes[rank][-1]
        record.rank_end_ns = t
        record.phase_ns = {
            p: int(ns) for p, ns in zip(program.phases, self._phase_acc[rank], strict=True) if ns
        }
        if owner < len(self.pass_iterations):  # the pass was finished without the rank's tail
            self.pass_iterations[owner][rank] = t - record.rank_start_ns
        self._done.add(rank)
        if len(self._done) == len(self.real) and self._prior is not None and self._prior[0] == owner:
            self._done.clear()
            self._retired, self._prior = self._prior[1], None  # ``prepare`` clears it for a later pass

    def _end_owed_pass(self, resolved: list[Resolved]) -> None:
        self._owes_pass_end = False
        self._finish_pass(resolved)

    def _finish_pass(self, resolved: list[Resolved]) -> None:
        engine, g, folding = self._engine, self._g, self.folding
        engine.advance()
        self._collect(resolved)
        stuck = np.flatnonzero((engine.pc < g.rank_ptr[1:]) & ~self._external)  # real: at their Done
        if len(stuck):
            first = int(np.flatnonzero(np.isin(folding.rank_of, stuck))[0])
            raise SimulationError(f"the virtual ranks cannot finish the iteration (first: rank {first})")
        self._pass_end = np.maximum.reduceat(engine.end, g.rank_ptr[:-1])
        self.pass_iterations.append(folding.per_rank(self._pass_end - self._pass_start))
        if self.trace_ranks:  # a folded rank's times are its representative's
            ids = {r: int(folding.rank_of[r]) for r in self.trace_ranks}
            rows = {r: slice(int(g.rank_ptr[i]), int(g.rank_ptr[i + 1])) for r, i in ids.items()}
            self.traced.append(
                (
                    {r: engine.start[s].copy() for r, s in rows.items()},
                    {r: engine.end[s].copy() for r, s in rows.items()},
                )
            )
        if self._watch:
            raise SimulationError(f"{len(self._watch)} call(s) of the real ranks did not end with the pass")
        self._prior = (self._pass, engine)
        if len(self._done) == len(self.real):  # every real rank already ended it: nothing to keep
            self._done.clear()
            self._retired, self._prior = engine, None
        self._begin_pass(self._pass_end.copy())
        queued = [q for q in self._queue if q[0] == self._pass]
        self._queue = [q for q in self._queue if q[0] != self._pass]
        for _, rank, event in queued:  # each rank's events in its program order
            self._apply(rank, event, resolved, self._pass)

    # -- the real ranks' compute nodes -------------------------------------------------------------
    def _move_to(self, rank: int, stop: int, t: int, engine: Engine | None = None) -> None:
        """Finish the rank's compute nodes before row ``stop``: graph time ``t`` is reached at
        ``stop`` (the span split as ``prism.replay.spread`` says)."""
        engine = engine or self._engine
        g, program, rid = self._g, self._program[rank], self._id[rank]
        i, clock = int(engine.pc[rid]), int(engine.clock[rid])
        first, last = program.first_row, program.end_row
        if stop < i or program.next_comm(i) < stop:
            raise DivergenceError(f"rank {rank}: an event for node {stop - first} came at node {i - first}")
        span = max(t - clock, 0)
        if i >= stop:  # consecutive calls: the time between them counts to the node before
            self._count(rank, i - 1 if i > first else stop, span)
            return
        starts, ends = spread(
            i, stop, int(g.gap[stop]) if stop < last else 0, clock, t, g.gap, engine.busy, g.deps_ptr, g.deps,
            engine.end, program.phase_code[i - first : stop - first], self._phase_acc[rank],
        )  # fmt: skip
        engine.finish_external_run(rid, stop, starts, ends)

    def _count(self, rank: int, node: int, ns: int) -> None:
        program = self._program[rank]
        self._phase_acc[rank][program.phase_code[node - program.first_row]] += ns


def nearest_first(g: SimGraph, external: np.ndarray) -> np.ndarray:
    """The ranks of ``g`` by how many collectives or transfers away from an external rank they
    are (external ones first): the order in which a pass's virtual ranks are first advanced."""
    if not external.any():
        return np.arange(g.ranks)
    node_rank = np.searchsorted(g.rank_ptr, g.slot_nodes, side="right") - 1
    slot_of = np.repeat(np.arange(len(g.slot_size)), np.diff(g.slot_nodes_ptr))
    distance = np.where(external, 0, -1)
    frontier = external.copy()
    for d in range(1, g.ranks + 1):
        slots = np.unique(slot_of[frontier[node_rank]])
        reached = np.zeros(g.ranks, np.bool_)
        reached[node_rank[np.isin(slot_of, slots)]] = True
        frontier = reached & (distance < 0)
        if not frontier.any():
            break
        distance[frontier] = d
    distance[distance < 0] = g.ranks + 1  # never meets a real rank
    return np.argsort(distance, kind="stable")


@dataclass(frozen=True, kw_only=True)
class RankSummary:
    """What the co-simulation tells a real rank at the end of its replay (graph ns)."""

    passes: tuple[RankPass, ...]
    """The rank in each iteration."""
    engine_ns: tuple[int, ...]
    """Wall time the co-simulation computed in each pass (all real ranks together)."""
    pass_iterations: tuple[np.ndarray, ...]
    """Every rank's time in each pass, virtual ones included."""
    traced: tuple[tuple[dict[int, np.ndarray], dict[int, np.ndarray]], ...]
    """(start, end) of every node of the traced ranks in each pass."""
    predicted_iteration_ns: int
    """The offline simulation's steady iteration time of the rank (``PREDICTION_PASSES``)."""
    predicted_peak_bytes: int
    predicted_phase_ns: dict[str, int]
    load_s: float = 0.0
    """Time the co-simulation took to load and fold the graph."""
    load_rss_bytes: int = 0
    """Memory it added to the process it runs in (resident set after loading minus before)."""
    rules_given: int = 0
    """Answer rules it sent ahead over the whole replay (all real ranks)."""


PREDICTION_PASSES = 3
"""Passes of the offline simulation the replay is compared with (as ``prism-build-graph``)."""


@dataclass(frozen=True, kw_only=True)
class RankPrediction:
    """What the offline simulation predicts for one rank (taken before the replay runs, so that
    the full graph need not be kept)."""

    iteration_ns: int
    peak_bytes: int
    phase_ns: dict[str, int]

    @classmethod
    def of(
        cls, graph: SimGraph, result: SimResult, program: RankProgram, rank: int | None = None
    ) -> RankPrediction:
        """From ``result = simulate(graph, iterations=PREDICTION_PASSES)``; ``rank``: the program's
        rank in ``graph`` (in a folded graph, not its own)."""
        rank = program.rank if rank is None else rank
        return cls(
            iteration_ns=int(result.iteration_ns[rank]),
            peak_bytes=int(result.peak_bytes[rank]),
            phase_ns=predicted_phase_ns(graph, result, program, rank),
        )


def open_cosimulation(
    path: str | Path, ranks: tuple[int, ...], *, trace_ranks: tuple[int, ...] = ()
) -> tuple[CoSimulation, dict[int, RankPrediction]]:
    """The co-simulation of the graph at ``path`` for real ranks ``ranks``, and the offline
    prediction each is compared with. The graph is read folded (``load_folded``: identical dp
    replicas once, each real rank's replica on its own), so that a replay's memory grows with
    the distinct replicas, not with the world."""
    folding = load_folded(path, keep=ranks)
    programs = {r: RankProgram.read(path, r) for r in ranks}
    graph = folding.graph
    result = simulate(graph, iterations=PREDICTION_PASSES)
    predictions = {
        r: RankPrediction.of(graph, result, p, int(folding.rank_of[r])) for r, p in programs.items()
    }
    return CoSimulation(folding, programs, trace_ranks=trace_ranks), predictions


def summarize(
    cosim: CoSimulation, rank: int, prediction: RankPrediction, *, load: tuple[float, int] = (0.0, 0)
) -> RankSummary:
    """The end-of-replay summary of real rank ``rank``; ``load``: seconds and bytes the
    co-simulation's set-up took."""
    return RankSummary(
        passes=tuple(cosim.passes[rank]),
        engine_ns=tuple(cosim.engine_ns[: len(cosim.passes[rank])]),
        pass_iterations=tuple(cosim.pass_iterations),
        traced=tuple(cosim.traced),
        predicted_iteration_ns=prediction.iteration_ns,
        predicted_peak_bytes=prediction.peak_bytes,
        predicted_phase_ns=prediction.phase_ns,
        load_s=load[0],
        load_rss_bytes=load[1],
        rules_given=cosim.rules_given,
    )


def predicted_phase_ns(
    graph: SimGraph, result: SimResult, program: RankProgram, rank: int | None = None
) -> dict[str, int]:
    """The offline simulation's time of one rank by phase: how far each node moves its program
    on. ``rank``: the program's rank in ``graph`` (default: its own)."""
    rank = program.rank if rank is None else rank
    lo, hi = graph.rank_ptr[rank], graph.rank_ptr[rank + 1]
    start, end = result.start_ns[lo:hi], result.end_ns[lo:hi].copy()
    is_async, is_comm = graph.is_async[lo:hi], graph.kind[lo:hi] != COMPUTE
    after = np.where(is_async, start, end)  # an async call returns when it is made
    before = np.r_[result.rank_start_ns[rank], after[:-1]]
    # As the clock counts: the time before a call goes to the node before it, the wait to the call.
    lead = np.where(is_comm, start - before, 0)
    phases: dict[str, int] = {}
    for k, phase in enumerate(program.phase):
        phases[phase] = phases.get(phase, 0) + int(after[k] - before[k] - lead[k])
        if lead[k]:
            prior = program.phase[k - 1] if k else phase
            phases[prior] = phases.get(prior, 0) + int(lead[k])
    return {phase: ns for phase, ns in phases.items() if ns}
