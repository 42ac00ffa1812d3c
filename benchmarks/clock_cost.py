"""The replay clock's own cost per call, on its fast path, apart from the replay around it.

    .venv/bin/python benchmarks/clock_cost.py [--calls 2000] [--repeats 10]

A ``GraphClock`` answers each of ``--calls`` synchronous calls of an iteration from an answer rule
already in its shared-memory ``Channel`` (as 99 % of a replay's calls are), writing the call's row
for the co-simulation and naming the end to the call's ``VirtualCompletion`` (50 µs after the
call: the modelled wait), with nothing else in the process. Printed: the time in ``submit`` per
call, as the process group counts it into a replay's comm log (``clock_ns``), median over
``--repeats`` iterations, back to back and with a GPT-like block of compute (a 128x256 @ 256x512
matmul and a GELU) before each call, which leaves the interpreter's caches cold as a program
does. The difference to a replay's per-call time (``benchmarks/replay_overhead.py``) is what the
replay's process adds around the clock.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from prism.graph.sim.engine import AnswerRule
from prism.peers.clock import PendingCall
from prism.peers.recorder import CallRecord
from prism.peers.virtual_work import VirtualCompletion
from prism.replay.channel import Channel
from prism.replay.graph_clock import GraphClock
from prism.replay.rank_program import RankProgram

CALL = PendingCall(op="all_reduce", group="1", label="tp.0", group_size=2, gseq=0, bytes=4096, enter_ns=0)
RULE = AnswerRule(0, 0, 0, -1.0, 0.0, 50_000)  # every member arrived: the end is the arrival plus 50 µs


@dataclass
class _Program:
    """The part of a ``RankProgram`` the clock reads: ``calls`` all-reduces of the same key."""

    calls: int
    rank: int = 0
    first_row: int = 0

    def __post_init__(self) -> None:
        self.comm_rows = np.arange(self.calls, dtype=np.int64) * 3
        self.comm_keys = [RankProgram.call_key(CALL)] * self.calls

    def describe(self, k: int) -> str:
        return f"node {k}"


class _ChannelPort:
    """A replay's port to its co-simulation, without the co-simulation: the channel alone."""

    dilates = True

    def __init__(self, channel: Channel) -> None:
        self.channel = channel

    def bind(self, rank: int, on_resolved) -> None:
        pass

    def ruled_end(self, pass_: int, index: int, t_ns: int) -> int | None:
        return self.channel.ruled_end(pass_, index, t_ns)

    def origin(self, wall_ns: int) -> int:
        return wall_ns

    def send(self, events) -> None:
        self.channel.push(events)

    def send_call(self, node: int, t_ns: int, async_op: bool, ruled: bool) -> None:
        self.channel.push_call(node, t_ns, async_op, ruled)


def per_call_us(calls: int, repeats: int, compute: bool) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        channel = Channel.create(Path(tmp) / "channel", calls)
        clock = GraphClock(_Program(calls), _ChannelPort(channel))
        a, b = torch.randn(128, 256), torch.randn(256, 512)
        costs = []
        for _ in range(repeats + 2):  # two to warm up
            for i in range(calls):
                channel.put_rule(len(clock.iterations), i, RULE)
            clock.iteration_started(time.time_ns())
            spent = 0
            for _ in range(calls):
                if compute:
                    torch.nn.functional.gelu(a @ b)
                call = dataclasses.replace(CALL, enter_ns=time.time_ns())
                record = CallRecord(**_RECORD, enter_ns=call.enter_ns)
                completion = VirtualCompletion(record, torch.futures.Future(), None)
                began = time.time_ns()  # as the process group counts it
                clock.submit(call, completion.at)
                spent += time.time_ns() - began
            clock.iteration_done(time.time_ns())
            channel.take()  # what the coordinator would read
            costs.append(spent / calls / 1e3)
        return statistics.median(costs[2:])


_RECORD = {
    "seq": 0, "op": CALL.op, "group": CALL.group, "label": CALL.label, "group_size": 2, "gseq": 0, "bytes": 4096,
    "dtype": "float32", "shape": (1024,), "peer": None, "tag": None, "reduce_op": "sum", "async_op": False,
    "delegated": False, "exit_ns": 0, "done_ns": 0, "wait_ns": 0, "first_wait_ns": 0, "clock_ns": 0,
}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(1)
    table = Table(title="replay clock, ruled fast path, time per call (µs)")
    for column in ("between calls", "µs per call"):
        table.add_column(column, justify="right")
    for compute in (False, True, False, True):  # interleaved
        us = per_call_us(args.calls, args.repeats, compute)
        table.add_row("GPT-like compute" if compute else "nothing", f"{us:.2f}")
    Console().print(table)


if __name__ == "__main__":
    main()
