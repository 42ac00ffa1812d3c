"""A real rank's channel to the co-simulation: its events in, answer rules out, in shared memory.

One file per real rank in the coordinator's private directory, mapped by the rank's process and
the coordinator's (int64 words):

- a header: events written (``head``), events taken (``tail``), whether the coordinator sleeps;
- a ring of events, rows of ``(code, node, t, a, b)``, appended by the rank's clock (one
  producer: it writes under its lock) and taken by the coordinator (one consumer);
- the answer rules of the rank's calls (``prism.graph.sim.engine.AnswerRule``), one slot per
  communication node of the rank and pass parity, each with a stamp (pass + 1) written after it.

Neither side makes a system call or wakes a thread of the other for these: a write to a socket
costs the writing program 15-30 µs on a 2-core VM (the reader's wake-up and the GIL changing
hands with the rank's helper threads), more than a call's modelled time. A rank wakes the
coordinator through the socket only where it sleeps (no event for a while). Slots are read by
value and stamp; a slot of pass ``p`` is written again only for pass ``p + 2``, which cannot
begin before the rank has finished pass ``p + 1``. Stores are made in program order, which
x86-64 keeps visible in that order to the other process.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path

from prism.graph.sim.engine import AnswerRule, rule_end_ns
from prism.replay.cosim import Call, Done, Event, RealCall, RealEnd, Start

CAPACITY = 1 << 15
"""Events the ring holds; a rank that gets this far ahead of the coordinator waits for it."""

# Rows go through ``struct`` (one call each: the program's thread writes one at every call, and
# numpy's per-element cost would be a good part of a call's modelled time). Words the other side
# may read at any moment (the header, a rule's stamp) are stored through a memoryview of int64, in
# one store: ``struct.pack_into`` zeroes its target before it writes, which a reader can see.
_EVENT = struct.Struct("<qqqqq")  # code, node, t, a, b
_RULE = struct.Struct("<qqqqdd")  # stamp, floor, base, add, mu, sd
_HEAD, _TAIL, _SLEEPING = 0, 1, 2  # header words
_RING = 64  # bytes


def _encode(event: Event) -> tuple[int, int, int, int, int]:
    if type(event) is Call:  # most events
        return 1, event.node, event.t_ns, event.async_op, event.ruled
    match event:
        case Start(t_ns=t):
            return 0, -1, t, 0, 0
        case RealCall(node=node, start_ns=t, async_op=async_op):
            return 2, node, t, int(async_op), 0
        case RealEnd(node=node, end_ns=t):
            return 3, node, t, 0, 0
        case Done(t_ns=t):
            return 4, -1, t, 0, 0
    raise TypeError(f"not an event: {event!r}")


def _decode(code: int, node: int, t: int, a: int, b: int) -> Event:
    match code:
        case 0:
            return Start(t)
        case 1:
            return Call(node, t, bool(a), ruled=bool(b))
        case 2:
            return RealCall(node, t, bool(a))
        case 3:
            return RealEnd(node, t)
        case 4:
            return Done(t)
    raise ValueError(f"event code {code} in the channel")


class Channel:
    """One rank's shared file: ``Channel.create`` by the coordinator, ``Channel.open`` by the rank."""

    def __init__(self, path: Path, comm_nodes: int, *, create: bool) -> None:
        self.path, self.comm_nodes = path, comm_nodes
        self._rules_at = _RING + CAPACITY * _EVENT.size
        size = self._rules_at + 2 * comm_nodes * _RULE.size
        with open(path, "w+b" if create else "r+b") as f:
            if create:
                f.truncate(size)
            self._map = mmap.mmap(f.fileno(), size)
        self._words = memoryview(self._map).cast("q")

    @classmethod
    def create(cls, path: Path, comm_nodes: int) -> Channel:
        return cls(path, comm_nodes, create=True)

    @classmethod
    def open(cls, path: str | Path, comm_nodes: int) -> Channel:
        return cls(Path(path), comm_nodes, create=False)

    def _rule_at(self, pass_: int, index: int) -> int:
        return self._rules_at + ((pass_ % 2) * self.comm_nodes + index) * _RULE.size

    # -- the rank's side -----------------------------------------------------------------------
    def push(self, events: list[Event]) -> None:
        """Append events in program order (one writer at a time)."""
        for event in events:
            self._push_row(*_encode(event))

    def push_call(self, node: int, t_ns: int, async_op: bool, ruled: bool) -> bool:
        """``push([Call(node, t_ns, async_op, ruled=ruled)])`` without the event object: most rows.
        Returns whether the coordinator sleeps."""
        return self._push_row(1, node, t_ns, async_op, ruled)

    def _push_row(self, code: int, node: int, t: int, a: int, b: int) -> bool:
        # Named arguments, not ``*row``: packing a tuple doubled this row's cost to the program.
        words = self._words
        head = words[_HEAD]
        while head - words[_TAIL] >= CAPACITY:  # full: the coordinator is behind
            pass
        _EVENT.pack_into(self._map, _RING + (head % CAPACITY) * _EVENT.size, code, node, t, a, b)
        words[_HEAD] = head + 1  # after the row: the coordinator reads up to here
        return bool(words[_SLEEPING])

    @property
    def coordinator_sleeps(self) -> bool:
        return bool(self._words[_SLEEPING])

    def ruled_end(self, pass_: int, index: int, t_ns: int) -> int | None:
        """The end (``AnswerRule.end_ns``) that the rule of the rank's ``index``-th comm node in pass
        ``pass_`` names for an arrival at ``t_ns``; None if the rule is not there yet."""
        at = self._rule_at(pass_, index)
        if self._words[at // 8] != pass_ + 1:  # the stamp first: the rule's words were stored before it
            return None
        _, floor, base, add, mu, sd = _RULE.unpack_from(self._map, at)
        return rule_end_ns(t_ns, floor, base, mu, sd, add)

    # -- the coordinator's side ----------------------------------------------------------------
    def take(self) -> list[Event]:
        """The events appended since the last take."""
        head, tail = self._words[_HEAD], self._words[_TAIL]
        if head == tail:
            return []
        events = [
            _decode(*_EVENT.unpack_from(self._map, _RING + (k % CAPACITY) * _EVENT.size))
            for k in range(tail, head)
        ]
        self._words[_TAIL] = head
        return events

    def put_rule(self, pass_: int, index: int, rule: AnswerRule) -> None:
        at = self._rule_at(pass_, index)
        _RULE.pack_into(self._map, at, pass_ - 1, rule.floor, rule.base, rule.add, rule.mu, rule.sd)
        self._words[at // 8] = pass_ + 1  # last: the rank reads a slot only once it is stamped

    def sleeping(self, flag: bool) -> None:
        self._words[_SLEEPING] = int(flag)
