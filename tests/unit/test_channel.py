"""A rank's shared-memory channel to the co-simulation: events once each, in order; rules by pass."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from prism.graph.sim.engine import AnswerRule
from prism.replay.channel import CAPACITY, Channel
from prism.replay.cosim import Call, Done, RealCall, RealEnd, Start

PRODUCER = """
import sys
from prism.replay.channel import Channel
from prism.replay.cosim import Call
channel = Channel.open(sys.argv[1], 4)
for i in range(int(sys.argv[2])):
    channel.push([Call(i, 10 * i, i % 2 == 0)])
"""


def test_every_kind_of_event_comes_through_as_it_was_sent(tmp_path: Path) -> None:
    coordinator = Channel.create(tmp_path / "c", 4)
    rank = Channel.open(tmp_path / "c", 4)
    events = [
        Start(5),
        Call(3, 7, False),
        Call(4, 8, True, ruled=True),
        RealCall(5, 9, True),
        RealEnd(5, 10),
        Done(11),
    ]
    rank.push(events)
    assert coordinator.take() == events
    assert coordinator.take() == []


def test_events_pushed_by_another_process_arrive_once_each_in_order(tmp_path: Path) -> None:
    # More events than the ring holds, taken while they are written: the consumer must never see
    # a half-written header (a reset head would hand it old events again).
    count = 3 * CAPACITY
    coordinator = Channel.create(tmp_path / "c", 4)
    producer = subprocess.Popen([sys.executable, "-c", PRODUCER, str(tmp_path / "c"), str(count)])
    got: list[int] = []
    while len(got) < count:
        got += [event.node for event in coordinator.take()]
        assert producer.poll() in (None, 0)
    producer.wait(timeout=60)
    assert got == list(range(count))


def test_a_rule_is_read_only_for_its_pass_and_node(tmp_path: Path) -> None:
    coordinator = Channel.create(tmp_path / "c", 4)
    rank = Channel.open(tmp_path / "c", 4)
    assert rank.ruled_end(0, 2, 10) is None
    hedged = AnswerRule(99, 1, 2, 0.5, 3.0, 4)
    coordinator.put_rule(3, 2, hedged)
    for t in (0, 1, 10, 10_000):  # the end the rule names, as the co-simulation would
        assert rank.ruled_end(3, 2, t) == hedged.end_ns(t)
    assert rank.ruled_end(5, 2, 10) is None  # the same slot, a later pass: not written yet
    assert rank.ruled_end(3, 1, 10) is None
    plain = AnswerRule(99, 100, 0, -1.0, 0.0, 7)  # no virtual member late: max(t, floor) + add
    coordinator.put_rule(5, 2, plain)
    assert (rank.ruled_end(5, 2, 10), rank.ruled_end(5, 2, 500)) == (107, 507)
