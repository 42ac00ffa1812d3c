"""The co-simulation beside the program: the coordinator and the ranks' port to it.

The replay's launcher runs the ``CoSimulation`` in a thread of its own process (``Coordinator``)
on a Unix socket in a private temporary directory; each real rank's process reaches it through
a ``RemotePort``. The engine's work thus runs beside the program, on another core, instead of in
its thread. With several ``--rank`` one co-simulation serves them all, since the virtual ranks
must see every real rank's arrivals.

A rank sends its events in program order and goes on. The coordinator takes the ranks' events
in the order they come (the engine's result does not depend on it), does for each only what
its answer needs, and answers each rank with the ends of its calls as they become known. Between
events it advances the virtual ranks in chunks of ``CHUNK_NODES`` nodes, so that an event waits
for at most one chunk, and sends each rank the answer rules of its next calls as soon as their
other members have arrived (``CoSimulation.take_rules``): the rank then names those ends itself,
with no round trip. A divergence or deadlock found by the co-simulation is sent to every rank as
an error.
"""

from __future__ import annotations

import os
import queue
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Client, Connection, Listener, wait
from pathlib import Path

import psutil

from prism.graph.sim.simulate import SimulationError
from prism.replay.channel import Channel
from prism.replay.cosim import (
    CoSimulation,
    Event,
    RankSummary,
    Resolved,
    open_cosimulation,
    summarize,
)
from prism.replay.graph_clock import OnResolved
from prism.replay.rank_program import DivergenceError

SOCKET_NAME = "cosim.sock"

CHUNK_NODES = 2000
"""Engine nodes advanced between looks for events: about 0.1 ms on a 2-core VM, so an event
waits little, while the look itself (a ``select``) stays a small part of the work."""
FIRST_CHUNK_NODES = 200
"""Nodes advanced right after a rank's events, before the rules are posted: the virtual peers
its call just released run first (they are on top of the engine's stack) and reach the rank's
next call within a few nodes, whose rule is then there before the program gets to it."""

SPIN_S = 0.002
"""With nothing to do for this long, the coordinator sleeps (``SLEEP_S`` at a time) instead of
looking for events: inside an iteration events come every few hundred µs. While it looks, it
yields its core to any other runnable thread: where the cores are all taken (a 2-core machine,
a replayed rank and a load process beside it), a coordinator that spun without yielding held
the program 11 ms an iteration of 8 calls; yielding, 1 ms."""
SLEEP_S = 0.001
"""Longest sleep: a rank's wake-up through the socket might cross the coordinator's going to
sleep, so no sleep is longer than this."""


SOCKET_PATH_BYTES = 107
"""Longest path of a Unix socket (``sun_path`` holds 108 bytes with its terminating NUL)."""
SHORT_TMP = Path("/tmp")


def socket_directory() -> Path:
    """A private directory (mode 0700) for the co-simulation's socket: in the temporary folder
    (``TMPDIR``), or in /tmp where that one's path is too long for a socket in it."""
    for base in (Path(tempfile.gettempdir()), SHORT_TMP):
        longest = len(os.fsencode(base / "prism-cosim-xxxxxxxx" / SOCKET_NAME))
        if longest <= SOCKET_PATH_BYTES and base.is_dir():
            return Path(tempfile.mkdtemp(prefix="prism-cosim-", dir=base))
    raise OSError(
        f"no folder for the co-simulation's socket: TMPDIR ({tempfile.gettempdir()}) is too long a path "
        f"for a Unix socket ({SOCKET_PATH_BYTES} bytes) and {SHORT_TMP} is not a folder; set TMPDIR to a shorter one"
    )


class Coordinator:
    """Serves the co-simulation of ``graph`` to the real ranks ``ranks`` (a background thread)."""

    def __init__(self, graph: Path, ranks: tuple[int, ...], *, trace_ranks: tuple[int, ...] = ()) -> None:
        self._directory = socket_directory()
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
        wake_fds: list[int] = []
        try:
            rss_before, began = psutil.Process().memory_info().rss, time.perf_counter()
            cosim, predictions = open_cosimulation(self._graph, self._ranks, trace_ranks=self._trace_ranks)
            cosim.defer_work = True
            cosim.compile_ahead()
            channels = {
                r: Channel.create(self._directory / f"rank{r}.channel", len(p.comm_rows)) for r, p in cosim.programs.items()
            }  # fmt: skip
            wakes = {r: self._directory / f"rank{r}.wake" for r in channels}
            for path in wakes.values():
                os.mkfifo(path, 0o600)
            # Opened before the ranks connect: a rank's write end opens only once a reader has.
            wake_fds += [os.open(path, os.O_RDONLY | os.O_NONBLOCK) for path in wakes.values()]
            load = (time.perf_counter() - began, psutil.Process().memory_info().rss - rss_before)
            for _ in self._ranks:
                conn = self._listener.accept()
                _, rank = conn.recv()  # ("hello", rank)
                conns[conn] = rank
                conn.send(
                    ("channel", (str(channels[rank].path), channels[rank].comm_nodes, str(wakes[rank])))
                )
            by_rank = {rank: conn for conn, rank in conns.items()}
            origin: int | None = None  # wall time of graph time 0: the first rank's first iteration
            asked: list[Connection] = []  # summaries wait for every rank: the last pass needs them all
            last_event = time.perf_counter()

            def take_events() -> bool:
                got = False
                for rank, channel in channels.items():
                    events = channel.take()
                    if events:
                        got, resolved = True, []
                        for event in events:
                            resolved += cosim.handle(rank, event)
                        _deliver(resolved + cosim.catch_up(FIRST_CHUNK_NODES), by_rank)
                        _post_rules(cosim, channels)
                return got

            while conns:
                if take_events():
                    last_event = time.perf_counter()
                asleep = not cosim.owes_work and time.perf_counter() - last_event > SPIN_S
                if asleep:  # the ranks wake us through the socket (or the sleep runs out)
                    for channel in channels.values():
                        channel.sleeping(True)
                    if take_events():  # one came before the flag was up
                        asleep, last_event = False, time.perf_counter()
                ready = wait([*conns, *wake_fds], SLEEP_S if asleep else 0)
                for channel in channels.values() if asleep else ():
                    channel.sleeping(False)
                if any(isinstance(r, int) for r in ready):  # a rank woke us: its events are in its channel
                    for fd in wake_fds:
                        _drain(fd)
                    ready = [r for r in ready if not isinstance(r, int)]
                    last_event = time.perf_counter()
                    if not ready:
                        continue
                if not ready:
                    if cosim.owes_work:  # nothing to answer: on with the virtual ranks
                        _deliver(cosim.catch_up(CHUNK_NODES), by_rank)
                        _post_rules(cosim, channels)
                    else:
                        cosim.prepare()
                        os.sched_yield()  # spinning: any other runnable thread of this core first
                    continue
                last_event = time.perf_counter()
                for conn in ready:
                    try:
                        what, payload = conn.recv()
                    except (EOFError, OSError):
                        del conns[conn]
                        continue
                    if what == "origin":
                        origin = payload if origin is None else origin
                        conn.send(("origin", origin))
                    elif what == "summary":
                        asked.append(conn)
                        if len(asked) == len(self._ranks):
                            take_events()  # the ranks' last events came before their asking
                            cosim.catch_up()
                            for c in asked:
                                rank = conns[c]
                                c.send(("summary", summarize(cosim, rank, predictions[rank], load=load)))
        except (DivergenceError, SimulationError) as e:
            self._fail(str(e).splitlines()[0], conns)
        except Exception as e:  # noqa: BLE001 (any failure must reach the ranks, not hang them)
            self._fail(f"the co-simulation failed: {type(e).__name__}: {e}", conns)
        finally:
            for fd in wake_fds:
                os.close(fd)

    def _fail(self, message: str, conns: dict[Connection, int]) -> None:
        self.error = message
        # Ranks not connected yet (the graph failed to load) are refused at once instead of
        # waiting for a channel that will never come.
        self._listener.close()
        for conn in conns:
            try:
                conn.send(("error", message))
                conn.close()
            except OSError:
                pass


def _deliver(resolved: list[Resolved], by_rank: dict[int, Connection]) -> None:
    ends: dict[int, list[tuple[int, int]]] = {}
    for r in resolved:
        ends.setdefault(r.rank, []).append((r.node, r.end_ns))
    for rank, items in ends.items():
        by_rank[rank].send(("resolved", items))


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


def _post_rules(cosim: CoSimulation, channels: dict[int, Channel]) -> None:
    for rank, pass_, index, rule in cosim.take_rules():
        channels[rank].put_rule(pass_, index, rule)


class RemotePort:
    """A rank's port to the coordinator (``prism.replay.graph_clock.CoSimPort``): events and answer
    rules through the rank's ``Channel``, a byte down the rank's wake pipe where the coordinator
    sleeps (a write, where a message on the socket would pickle); resolutions, the origin, the
    summary and errors over the socket.

    ``on_error(message)`` is called from the port's receiving thread when the co-simulation
    stops on an error or goes away: the rank cannot go on."""

    def __init__(
        self, address: str, rank: int, *, on_error: Callable[[str], None], dilates: bool = False
    ) -> None:  # fmt: skip
        self.dilates = dilates
        """True where this is the only real rank: its stall can be taken out of its time alone."""
        self._conn = Client(address, family="AF_UNIX")
        self._conn.send(("hello", rank))
        _, (path, comm_nodes, wake) = self._conn.recv()  # ("channel", ...), once the graph is loaded
        self._channel = Channel.open(path, comm_nodes)
        self._wake_fd = os.open(wake, os.O_WRONLY | os.O_NONBLOCK)
        self._rank = rank
        self._send_lock = threading.Lock()
        self._on_error = on_error
        self._answers: queue.Queue[object] = queue.Queue()
        self._on_resolved: OnResolved | None = None
        self._closing = False

    def bind(self, rank: int, on_resolved: OnResolved) -> None:
        self._on_resolved = on_resolved
        threading.Thread(target=self._receive, name="prism-cosim-port", daemon=True).start()

    def send(self, events: list[Event]) -> None:
        self._channel.push(events)
        self._wake_if_asleep()

    def send_call(self, node: int, t_ns: int, async_op: bool, ruled: bool) -> None:
        if self._channel.push_call(node, t_ns, async_op, ruled):
            self._wake()

    def _wake_if_asleep(self) -> None:
        if self._channel.coordinator_sleeps:
            self._wake()

    def _wake(self) -> None:
        try:
            os.write(self._wake_fd, b"w")
        except BlockingIOError:  # the pipe is full of wakes the coordinator has yet to read
            pass

    def ruled_end(self, pass_: int, index: int, t_ns: int) -> int | None:
        return self._channel.ruled_end(pass_, index, t_ns)

    def origin(self, wall_ns: int) -> int:
        return self._ask("origin", wall_ns)

    def summary(self) -> RankSummary:
        """The co-simulation's summary of this rank (once every real rank is done); closes the port."""
        summary = self._ask("summary", None)
        self._closing = True
        self._conn.close()
        os.close(self._wake_fd)
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
                self._on_resolved([Resolved(rank=self._rank, node=node, end_ns=end) for node, end in payload])
            elif what in ("origin", "summary"):
                self._answers.put(payload)
            elif what == "error":
                self._on_error(payload)
                return
