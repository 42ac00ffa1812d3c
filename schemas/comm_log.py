"""The comm log: every process-group call one rank made, as the ``prism`` backend saw it.

One JSON file per rank (``comm/rank{r}.comm.json`` in a capture directory)::

    {"schema": "prism.comm_log", "version": 1, "rank": 7, "world_size": 8192,
     "clock": "time.time_ns", "groups": [CommGroup...], "calls": [CommCall...]}

Timestamps are ``time.time_ns()`` so that they sit on the same wall clock as Kineto events.
"""

from __future__ import annotations

import bisect
import json
import os
import statistics
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from prism.schemas.checked import check_fields
from prism.schemas.files import write_json_atomic

SCHEMA = "prism.comm_log"
VERSION = 1


@dataclass(frozen=True, kw_only=True)
class CommGroup:
    """A process group the rank belonged to."""

    name: str
    """torch.distributed group name (unique per process): match calls on (name, gseq)."""
    label: str
    """Layout label such as 'tp.3', 'dp.0', 'pp.5', 'world'; 'g<name>' when not a layout group.
    Two groups over the same ranks share a label, so it is not a key."""
    ranks: tuple[int, ...]
    """Global ranks of the members, in group-rank order."""
    real_ranks: tuple[int, ...]
    """Members that were real processes; the others were virtual."""

    @property
    def delegated(self) -> bool:
        """True when every member is real, so calls ran on a real gloo/NCCL group."""
        return len(self.real_ranks) == len(self.ranks)


@dataclass(frozen=True, kw_only=True)
class CallSite:
    """A call as the program made it: what, on which group, how much, with whom, when. The
    fields a pending call (``prism.peers.clock.PendingCall``) and a logged one share."""

    op: str
    """Operation: all_reduce, all_gather, reduce_scatter, broadcast, barrier, all_to_all, reduce, gather, scatter, send, recv."""
    group: str
    """Name of the group (see CommGroup.name)."""
    label: str
    """Layout label of the group (see CommGroup.label)."""
    group_size: int
    """Number of members of the group."""
    gseq: int
    """Per-group sequence number: the n-th call this rank made on this group."""
    bytes: int
    """Bytes this rank contributes (send / input side); for recv the bytes received."""
    peer: int | None = None
    """Global rank of the other side (send / recv / broadcast root), else None."""
    async_op: bool = False
    """Whether the caller asked for an asynchronous Work."""
    enter_ns: int = 0
    """Wall time the call was made."""


@dataclass(frozen=True, kw_only=True)
class CommCall(CallSite):
    """One call on a process group, from this rank's point of view."""

    seq: int
    """Index of the call among all calls of this rank."""
    dtype: str
    """torch dtype of the payload, e.g. 'float32'."""
    shape: tuple[int, ...]
    """Shape of this rank's input tensor (recv: of the receive buffer)."""
    tag: int | None = None
    """p2p tag, else None."""
    reduce_op: str | None = None
    """Reduction (sum, max, ...) for reducing collectives, else None."""
    exit_ns: int = 0
    """Wall time the call returned to the program."""
    done_ns: int = 0
    """Wall time the operation completed (its Work became ready)."""
    wait_ns: int = 0
    """Wall time the program began to wait on the call's Work while it was still in flight: it
    was held from then until ``done_ns``. 0 when it never waited on it unfinished (and for calls
    on a real backend, whose waits the log does not see). A capture also notes a wait made
    outside Python (C++ blocking on the call's future, as DDP's reducer does at the end of
    ``backward()``), from how long the thread that took the future slept before the call
    completed (``prism.peers.virtual_work``)."""
    first_wait_ns: int = 0
    """Wall time the program first called ``wait()`` on the call's Work, finished or not (where an
    asynchronous call is waited for), or began a wait made outside Python that a capture noted
    (``wait_ns``); 0 when it never did, or waited from C++ on a call already complete (DDP's
    reducer), or the call ran on a real backend."""
    clock_ns: int = 0
    """Time the call spent in a completion clock that holds the program (a replay's or paced
    capture's co-simulation runs there) before returning: held, ending at ``exit_ns``. 0 under
    a clock that does not hold it (a free-running capture's)."""
    delegated: bool = False
    """True when the call ran on a real gloo/NCCL group; False when peers were virtual."""
    split_bytes: tuple[int, ...] | None = None
    """all_to_all: the bytes this rank sends each member, in group-rank order (its own chunk
    included; they sum to ``bytes``); None for every other op."""
    buffer: int = 0
    """send / recv: the address of the payload's storage (recv: the buffer received into), so
    that a build can tell a buffer kept across iterations from one allocated for the call; 0 for
    every other op and in logs written before it was recorded."""


@dataclass(frozen=True, kw_only=True)
class CommLog:
    """All calls of one rank."""

    rank: int
    """Global rank that made the calls."""
    world_size: int
    """Size of the default group."""
    groups: tuple[CommGroup, ...] = ()
    """Every group the rank created or joined."""
    calls: tuple[CommCall, ...] = field(default_factory=tuple)
    """Calls in the order they were made."""

    def to_dict(self) -> dict:
        return {
            "schema": SCHEMA,
            "version": VERSION,
            "rank": self.rank,
            "world_size": self.world_size,
            "clock": "time.time_ns",
            "groups": [asdict(g) for g in self.groups],
            "calls": [asdict(c) for c in self.calls],
        }

    @classmethod
    def from_dict(cls, data: dict) -> CommLog:
        if data.get("schema") != SCHEMA:
            raise ValueError(f"not a prism comm log (schema={data.get('schema')!r})")
        if data.get("version") != VERSION:
            raise ValueError(
                f"comm log version {data.get('version')!r} is not supported (expected {VERSION})"
            )
        groups = tuple(
            CommGroup(**{**g, "ranks": tuple(g["ranks"]), "real_ranks": tuple(g["real_ranks"])})
            for g in data["groups"]
        )
        calls = tuple(CommCall(**{**c, **_tuples(c, "shape", "split_bytes")}) for c in data["calls"])
        log = cls(rank=data["rank"], world_size=data["world_size"], groups=groups, calls=calls)
        check_fields(log)  # every reader gets values of the declared types (TypeError otherwise)
        return log


def _tuples(call: dict, *names: str) -> dict:
    """The list fields ``names`` of a call's JSON as tuples (None and absent ones left so)."""
    return {n: tuple(call[n]) if isinstance(call.get(n), list) else call.get(n) for n in names if n in call}


class Spans:
    """Wall-time spans, merged where they overlap: how much of any interval they cover."""

    def __init__(self, spans: Iterable[tuple[int, int]]) -> None:
        merged: list[list[int]] = []
        for start, end in sorted((s, e) for s, e in spans if e > s):
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        self.starts = [s for s, _ in merged]
        self.ends = [e for _, e in merged]
        self._before: list[int] = [0]  # covered time before each span's start
        for s, e in merged:
            self._before.append(self._before[-1] + e - s)

    def __bool__(self) -> bool:
        return bool(self.starts)

    def until(self, t_ns: int) -> int:
        """Covered time before wall time ``t_ns``."""
        i = bisect.bisect_right(self.starts, t_ns)  # spans that began by t
        if i == 0:
            return 0
        return self._before[i - 1] + min(t_ns, self.ends[i - 1]) - self.starts[i - 1]

    def within(self, start_ns: int, end_ns: int) -> int:
        """Covered time in [start_ns, end_ns)."""
        return max(0, self.until(end_ns) - self.until(start_ns))


P2P_OPS = frozenset({"send", "recv"})
"""Point-to-point operations; every other op is a collective."""


def _held_spans(calls: Iterable[CommCall]) -> list[tuple[int, int]]:
    calls = tuple(calls)
    return [(c.wait_ns, c.done_ns) for c in calls if c.wait_ns and c.done_ns > c.wait_ns] + [
        (c.exit_ns - c.clock_ns, c.exit_ns) for c in calls if c.clock_ns > 0
    ]


def _call_spans(calls: Iterable[CommCall], *, posts: bool = True) -> list[tuple[int, int]]:
    """When the program was in these calls, waited on a real one's Work or was held in them;
    without ``posts``, not inside the post of a transfer posted asynchronously (its call)."""
    calls = tuple(calls)
    waits = [(c.first_wait_ns, c.done_ns) for c in calls if c.delegated and 0 < c.first_wait_ns < c.done_ns]
    inside = [(c.enter_ns, c.exit_ns) for c in calls if posts or not (c.async_op and c.op in P2P_OPS)]
    return inside + waits + _held_spans(calls)


class HeldTime(Spans):
    """When prism held the program: blocked in a virtual call's wait (``wait_ns`` to ``done_ns``)
    or inside its clock (``clock_ns`` before ``exit_ns``).

    A paced capture (``prism-capture-paced``) holds the program as the full-scale job would
    (its emulated waits) and runs the co-simulation in it; the build takes that time out of gaps
    and iteration times, which are to hold the program's own time only."""

    def __init__(self, log: CommLog) -> None:
        super().__init__(_held_spans(log.calls))


class CommTime(Spans):
    """When the program was in a process-group call (``enter_ns`` to ``exit_ns``), waited on a
    real call's Work (``first_wait_ns`` to ``done_ns`` of a delegated call), or was held by
    prism (``HeldTime``): what is left of a span is the program's own compute and glue."""

    def __init__(self, log: CommLog) -> None:
        super().__init__(_call_spans(log.calls))


class PricedTime(Spans):
    """``CommTime`` less the posts of transfers posted asynchronously: the time the comm model
    prices. A post (``isend``/``irecv`` returning a Work, ``enter_ns`` to ``exit_ns`` less any
    clock time in it) is host work the rank's own time holds, which the graph keeps as a node right
    after the call's (``prism.graph.build.profiler_overhead.host_kept``): the program's own."""

    def __init__(self, log: CommLog) -> None:
        super().__init__(_call_spans(log.calls, posts=False))


class CollectiveTime(Spans):
    """``CommTime`` of the collective calls alone: the time a rank spent communicating, where
    the rest of its calls (point-to-point: a pipeline's transfers) are mostly the wait for its
    neighbours' progress, the bubble."""

    def __init__(self, log: CommLog) -> None:
        super().__init__(_call_spans(c for c in log.calls if c.op not in P2P_OPS))


def trace_offset_ns(marks: Iterable[tuple[int, int]]) -> int | None:
    """A trace's clock minus the comm log's (``time.time_ns``), from (trace time of a call's
    ``prism:comm`` mark, the call's ``enter_ns``) pairs: their median difference, so that the
    few marks the profiler stamped late do not move the rest. None without pairs."""
    offsets = [trace_ns - enter_ns for trace_ns, enter_ns in marks]
    return round(statistics.median(offsets)) if offsets else None


def write_comm_log(log: CommLog, path: str | os.PathLike) -> None:
    write_json_atomic(path, log.to_dict())


class CommLogError(ValueError):
    """A file that is not a readable prism comm log; the message is one line."""


def read_comm_log(path: str | os.PathLike) -> CommLog:
    """The comm log at ``path``, or a CommLogError saying what is wrong with the file."""
    try:
        data = json.loads(Path(path).read_text())
        if not isinstance(data, dict):
            raise ValueError(f"a JSON {type(data).__name__}, not an object")
        log = CommLog.from_dict(data)
    except OSError as e:
        raise CommLogError(f"{path}: cannot read ({e.strerror or e})") from None
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise CommLogError(f"{path}: not a valid prism comm log ({type(e).__name__}: {e})") from None
    return log
