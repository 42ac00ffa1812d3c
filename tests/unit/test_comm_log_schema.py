"""Comm log files: lossless round trip, version checks, atomic writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prism.schemas.comm_log import (
    SCHEMA,
    VERSION,
    CollectiveTime,
    CommCall,
    CommGroup,
    CommLog,
    CommTime,
    HeldTime,
    read_comm_log,
    trace_offset_ns,
    write_comm_log,
)
from prism.schemas.files import write_json_atomic


def sample_log() -> CommLog:
    groups = (
        CommGroup(name="0", label="world", ranks=tuple(range(8)), real_ranks=(0, 4)),
        CommGroup(name="1", label="tp.0", ranks=(0, 1), real_ranks=(0, 1)),
    )
    calls = (
        CommCall(
            seq=0,
            op="all_reduce",
            group="1",
            label="tp.0",
            group_size=2,
            gseq=0,
            bytes=4096,
            dtype="float32",
            shape=(32, 32),
            reduce_op="sum",
            enter_ns=10,
            exit_ns=20,
            done_ns=30,
            delegated=True,
        ),
        CommCall(
            seq=1,
            op="send",
            group="0",
            label="world",
            group_size=8,
            gseq=0,
            bytes=512,
            dtype="bfloat16",
            shape=(4, 8, 8),
            peer=4,
            tag=7,
            async_op=True,
            enter_ns=40,
            exit_ns=41,
            done_ns=90,
        ),
        CommCall(
            seq=2,
            op="barrier",
            group="0",
            label="world",
            group_size=8,
            gseq=1,
            bytes=0,
            dtype="float32",
            shape=(),
        ),
        CommCall(
            seq=3,
            op="all_to_all",
            group="0",
            label="world",
            group_size=8,
            gseq=2,
            bytes=96,
            dtype="float32",
            shape=(24,),
            split_bytes=(0, 8, 16, 0, 0, 40, 32, 0),
        ),
    )
    return CommLog(rank=0, world_size=8, groups=groups, calls=calls)


def test_dict_round_trip() -> None:
    log = sample_log()
    data = log.to_dict()
    assert (data["schema"], data["version"], data["rank"], data["world_size"]) == (SCHEMA, VERSION, 0, 8)
    assert len(data["groups"]) == 2 and len(data["calls"]) == 4
    assert CommLog.from_dict(data) == log
    assert CommLog.from_dict(json.loads(json.dumps(data))) == log  # lists come back as tuples
    assert log.groups[1].delegated and not log.groups[0].delegated


def test_file_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "comm" / "rank0.comm.json"  # parent does not exist yet
    write_comm_log(sample_log(), path)
    assert read_comm_log(path) == sample_log()
    assert json.loads(path.read_text())["schema"] == SCHEMA
    assert sorted(p.name for p in path.parent.iterdir()) == ["rank0.comm.json"]


def test_empty_log_round_trip() -> None:
    log = CommLog(rank=3, world_size=4)
    assert CommLog.from_dict(json.loads(json.dumps(log.to_dict()))) == log


@pytest.mark.parametrize(
    ("patch", "pattern"),
    [
        ({"schema": "prism.manifest"}, "not a prism comm log"),
        ({"schema": None}, "not a prism comm log"),
        ({"version": VERSION + 1}, f"version {VERSION + 1} is not supported"),
        ({"version": str(VERSION)}, "is not supported"),
        ({"version": None}, "is not supported"),
    ],
)
def test_wrong_schema_or_version_rejected(patch: dict, pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        CommLog.from_dict({**sample_log().to_dict(), **patch})


def test_missing_schema_rejected() -> None:
    data = sample_log().to_dict()
    del data["schema"]
    with pytest.raises(ValueError, match="not a prism comm log"):
        CommLog.from_dict(data)


def test_failed_write_leaves_nothing_behind(tmp_path: Path) -> None:
    bad = CommLog(
        rank=0,
        world_size=1,
        calls=(
            CommCall(
                seq=0,
                op="barrier",
                group="0",
                label="world",
                group_size=1,
                gseq=0,
                bytes=0,
                dtype="float32",
                shape=(object(),),
            ),
        ),
    )
    path = tmp_path / "rank0.comm.json"
    with pytest.raises(TypeError):
        write_comm_log(bad, path)
    assert list(tmp_path.iterdir()) == []


def test_failed_write_keeps_the_previous_file(tmp_path: Path) -> None:
    path = tmp_path / "out.json"
    write_json_atomic(path, {"a": 1})
    with pytest.raises(TypeError):
        write_json_atomic(path, {"a": {1, 2}})
    assert json.loads(path.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_overwrite_replaces_content(tmp_path: Path) -> None:
    path = tmp_path / "rank0.comm.json"
    write_comm_log(CommLog(rank=0, world_size=1), path)
    write_comm_log(sample_log(), path)
    assert read_comm_log(path) == sample_log()
    assert [p.name for p in tmp_path.iterdir()] == ["rank0.comm.json"]


# -- held time ----------------------------------------------------------------------------------
def _call(
    seq: int, *, enter: int, exit: int, done: int, wait: int = 0, clock: int = 0, op: str = "all_reduce",
    first_wait: int = 0, delegated: bool = False,
) -> CommCall:  # fmt: skip
    return CommCall(
        seq=seq, op=op, group="1", label="tp.0", group_size=2, gseq=seq, bytes=8, dtype="float32",
        shape=(2,), enter_ns=enter, exit_ns=exit, done_ns=done, wait_ns=wait, clock_ns=clock,
        first_wait_ns=first_wait, delegated=delegated,
    )  # fmt: skip


def test_held_time_is_the_waits_and_the_clock_merged() -> None:
    calls = (
        _call(0, enter=100, exit=130, done=200, wait=150, clock=20),  # clock 110-130, waited 150-200
        _call(1, enter=160, exit=170, done=260, wait=180),  # waited 180-260: overlaps the first
        _call(2, enter=300, exit=310, done=305),  # completed before anyone waited: not held
        _call(3, enter=400, exit=410, done=500, wait=520),  # waited after it completed: not held
    )
    held = HeldTime(CommLog(rank=0, world_size=2, calls=calls))
    assert (held.starts, held.ends) == ([110, 150], [130, 260])
    assert held.until(0) == 0
    assert held.until(120) == 10
    assert held.until(140) == 20
    assert held.until(1_000) == 20 + 110
    assert held.within(125, 200) == 5 + 50
    assert held.within(200, 125) == 0
    assert not HeldTime(CommLog(rank=0, world_size=2, calls=calls[2:]))


def test_collective_time_is_comm_time_less_the_point_to_point_calls() -> None:
    calls = (
        _call(0, enter=100, exit=130, done=200, wait=150, clock=20),  # in it 100-130, held 150-200
        _call(1, op="recv", enter=210, exit=220, done=300, wait=220),  # a transfer: held 220-300
        _call(2, enter=310, exit=320, done=400, first_wait=350, delegated=True),  # real: waited 350-400
        _call(3, op="send", enter=330, exit=360, done=360),  # overlaps the wait above
    )
    log = CommLog(rank=0, world_size=2, calls=calls)
    collective, every = CollectiveTime(log), CommTime(log)
    assert (collective.starts, collective.ends) == ([100, 150, 310, 350], [130, 200, 320, 400])
    assert collective.within(0, 1_000) == 30 + 50 + 10 + 50
    assert every.within(0, 1_000) == 30 + 50 + 90 + 10 + 70  # + the recv, and the send outside the wait
    assert collective.within(120, 360) == 10 + 50 + 10 + 10


def test_logs_written_before_held_time_read_with_no_hold(tmp_path: Path) -> None:
    data = sample_log().to_dict()
    for call in data["calls"]:
        del call["wait_ns"], call["clock_ns"]
    write_json_atomic(tmp_path / "old.json", data)
    log = read_comm_log(tmp_path / "old.json")
    assert all(c.wait_ns == 0 and c.clock_ns == 0 for c in log.calls)
    assert not HeldTime(log)


def test_trace_offset_is_the_median_so_a_late_mark_does_not_move_it() -> None:
    # Marks 5 µs after the logged enter, one stamped 2 ms late by the profiler.
    enters = [1_000_000, 2_000_000, 3_000_000, 4_000_000, 5_000_000]
    late = {3_000_000: 2_000_000}
    pairs = [(7_000_000_000 + t + 5_000 + late.get(t, 0), t) for t in enters]
    assert trace_offset_ns(pairs) == 7_000_005_000
    assert trace_offset_ns([]) is None
