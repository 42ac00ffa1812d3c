"""Several real ranks, one co-simulation: the coordinator and the ranks' port to it.

With several ``--rank``, the virtual ranks must see every real rank's arrivals, so one
``CoSimulation`` serves them all: the replay's launcher runs it in a thread (``Coordinator``)
on a Unix socket in a private temporary directory, and each rank process
reaches it through a ``RemotePort``. A rank sends its events in program order and goes on; the
coordinator takes the ranks' events in the order they come (the engine's result does not
depend on it), and answers each rank with the ends of its calls as they become known.
A divergence or deadlock found by the co-simulation is sent to every rank as an error.
"""

from __future__ import annotations

import queue
import shutil
import tempfile
import threading
from collections.abc import Callable
from multiprocessing.connection import Client, Connection, Listener, wait
from pathlib import Path

from prism.graph.sim.simulate import SimulationError, load_sim_graph, simulate
from prism.replay.cosim import (
    PREDICTION_PASSES,
    CoSimulation,
    Event,
    RankPrediction,
    RankSummary,
    Resolved,
    summarize,
)
from prism.replay.graph_clock import OnResolved
from prism.replay.rank_program import DivergenceError, RankProgram

SOCKET_NAME = "cosim.sock"


class Coordinator:
    """Serves the co-simulation of ``graph`` to the real ranks ``ranks`` (a background thread)."""

    def __init__(self, graph: Path, ranks: tuple[int, ...], *, trace_ranks: tuple[int, ...] = ()) -> None:
        # A private directory (mode 0700) of a short path: Unix socket paths hold 107 bytes.
        self._directory = Path(tempfile.mkdtemp(prefix="prism-cosim-"))
        self.address = str(self._directory / SOCKET_NAME)
        self._graph, self._ranks, self._trace_ranks = graph, ranks, trace_ranks
        self._listener = Listener(self.address, family="AF_UNIX")
        self._thread = threading.Thread(target=self._serve, name="prism-cosim", daemon=True)
        self.error: str | None = None
        """The first error of the co-simulation (one line), once it stopped on one."""

    def __enter__(self) -> Coordinator:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._listener.close()
        shutil.rmtree(self._directory, ignore_errors=True)

    def _serve(self) -> None:
        conns: dict[Connection, int] = {}
        try:
            graph = load_sim_graph(self._graph)
            programs = {r: RankProgram.read(self._graph, r) for r in self._ranks}
            cosim = CoSimulation(graph, programs, trace_ranks=self._trace_ranks)
            for _ in self._ranks:
                conn = self._listener.accept()
                _, rank = conn.recv()  # ("hello", rank)
                conns[conn] = rank
            by_rank = {rank: conn for conn, rank in conns.items()}
            origin: int | None = None  # wall time of graph time 0: the first rank's first iteration
            asked: list[Connection] = []  # summaries wait for every rank: the last pass needs them all
            while conns:
                for conn in wait(list(conns)):
                    try:
                        what, payload = conn.recv()
                    except (EOFError, OSError):
                        del conns[conn]
                        continue
                    if what == "events":
                        resolved: list[Resolved] = []
                        for event in payload:
                            resolved += cosim.handle(conns[conn], event)
                        _deliver(resolved, by_rank)
                    elif what == "origin":
                        origin = payload if origin is None else origin
                        conn.send(("origin", origin))
                    elif what == "summary":
                        asked.append(conn)
                        if len(asked) == len(self._ranks):
                            result = simulate(graph, iterations=PREDICTION_PASSES)
                            for c in asked:
                                rank = conns[c]
                                prediction = RankPrediction.of(graph, result, programs[rank])
                                c.send(("summary", summarize(cosim, rank, prediction)))
        except (DivergenceError, SimulationError) as e:
            self._fail(str(e).splitlines()[0], conns)
        except Exception as e:  # noqa: BLE001 (any failure must reach the ranks, not hang them)
            self._fail(f"the co-simulation failed: {type(e).__name__}: {e}", conns)

    def _fail(self, message: str, conns: dict[Connection, int]) -> None:
        self.error = message
        for conn in conns:
            try:
                conn.send(("error", message))
                conn.close()
            except OSError:
                pass


def _deliver(resolved: list[Resolved], by_rank: dict[int, Connection]) -> None:
    out: dict[int, list[Resolved]] = {}
    for r in resolved:
        out.setdefault(r.rank, []).append(r)
    for rank, items in out.items():
        by_rank[rank].send(("resolved", items))


class RemotePort:
    """A rank's port to the coordinator (``prism.replay.graph_clock.CoSimPort``).

    ``on_error(message)`` is called from the port's receiving thread when the co-simulation
    stops on an error or goes away: the rank cannot go on."""

    dilates = False

    def __init__(self, address: str, rank: int, *, on_error: Callable[[str], None]) -> None:
        self._conn = Client(address, family="AF_UNIX")
        self._conn.send(("hello", rank))
        self._send_lock = threading.Lock()
        self._on_error = on_error
        self._answers: queue.Queue[object] = queue.Queue()
        self._on_resolved: OnResolved | None = None
        self._closing = False

    def bind(self, rank: int, on_resolved: OnResolved) -> None:
        self._on_resolved = on_resolved
        threading.Thread(target=self._receive, name="prism-cosim-port", daemon=True).start()

    def send(self, events: list[Event]) -> None:
        with self._send_lock:
            self._conn.send(("events", events))

    def origin(self, wall_ns: int) -> int:
        return self._ask("origin", wall_ns)

    def summary(self) -> RankSummary:
        """The co-simulation's summary of this rank (once every real rank is done); closes the port."""
        summary = self._ask("summary", None)
        self._closing = True
        self._conn.close()
        return summary

    def _ask(self, what: str, payload: object, timeout_s: float = 1800.0) -> object:
        with self._send_lock:
            self._conn.send((what, payload))
        return self._answers.get(timeout=timeout_s)

    def _receive(self) -> None:
        while True:
            try:
                what, payload = self._conn.recv()
            except (EOFError, OSError):
                if not self._closing:
                    self._on_error("the co-simulation coordinator went away")
                return
            if what == "resolved":
                self._on_resolved(payload)
            elif what in ("origin", "summary"):
                self._answers.put(payload)
            elif what == "error":
                self._on_error(payload)
                return
