"""A trace's allocator events when the profiler missed some frees, and the per-iteration peak."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from prism.graph.traces.kineto import restore_unrecorded_frees
from prism.graph.traces.memory import freed_from, iteration_memory

BASE_NS = 1_700_000_000_000_000_000
CPU = (0, -1)


def events(rows: list[tuple[int, int, int]], device: tuple[int, int] = CPU) -> pd.DataFrame:
    """(ts_ns, bytes, addr) rows with the allocator's running total, as the profiler writes them."""
    nbytes = np.array([b for _, b, _ in rows], dtype=np.int64)
    return pd.DataFrame(
        {
            "tid": 7,
            "ts_ns": np.array([t for t, _, _ in rows], dtype=np.int64),
            "bytes": nbytes,
            "total": np.cumsum(nbytes),
            "device_type": device[0],
            "device_id": device[1],
            "addr": np.array([a for _, _, a in rows], dtype=np.int64),
        }
    )


def test_an_address_allocated_again_restores_the_missed_free_just_before_it() -> None:
    # Block 0xA is freed by a thread the profiler does not see: its address comes back at t=30.
    mem = restore_unrecorded_frees(events([(10, 100, 0xA), (20, 50, 0xB), (30, 30, 0xA), (40, -30, 0xA)]))
    assert mem["ts_ns"].tolist() == [10, 20, 30, 30, 40]
    assert mem["bytes"].tolist() == [100, 50, -100, 30, -30]
    assert mem["total"].tolist() == [100, 150, 50, 80, 50]
    assert mem["tid"].tolist() == [7, 7, -1, 7, 7]


def test_recorded_frees_untracked_events_and_other_devices_are_left_alone() -> None:
    cpu = events([(10, 100, 0xA), (20, -100, 0xA), (30, 100, 0xA), (35, 8, 0), (36, 8, 0)])
    gpu = events([(15, 64, 0xA)], device=(1, 0))  # the same address on another device
    both = pd.concat([cpu, gpu]).sort_values("ts_ns", kind="stable", ignore_index=True)
    pd.testing.assert_frame_equal(restore_unrecorded_frees(both), both)


def test_totals_are_lowered_per_device() -> None:
    cpu = events([(10, 100, 0xA), (30, 100, 0xA)])
    gpu = events([(20, 64, 0xC), (40, 64, 0xD)], device=(1, 0))
    mem = restore_unrecorded_frees(
        pd.concat([cpu, gpu]).sort_values("ts_ns", kind="stable", ignore_index=True)
    )
    on_gpu = mem[mem["device_type"] == 1]
    assert on_gpu["total"].tolist() == [64, 128]
    assert mem[mem["device_type"] == 0]["total"].tolist() == [100, 0, 100]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 4), st.integers(1, 1000)), max_size=40))
def test_restored_totals_are_the_running_sum_of_live_blocks(steps: list[tuple[bool, int, int]]) -> None:
    # A random program of allocations and frees over five addresses; some frees go unrecorded.
    live: dict[int, int] = {}
    rows = []
    for t, (alloc, slot, size) in enumerate(steps):
        addr = 0x1000 + slot
        if alloc:
            if addr in live:  # freed on an unprofiled thread first
                del live[addr]
            live[addr] = size
            rows.append((t, size, addr))
        elif addr in live:
            rows.append((t, -live.pop(addr), addr))
    mem = restore_unrecorded_frees(events(rows)) if rows else events(rows)
    assert (mem["total"].to_numpy() == np.cumsum(mem["bytes"].to_numpy())).all()
    assert (mem["total"].to_numpy() >= 0).all()
    if rows:
        assert mem["total"].iloc[-1] == sum(live.values())


def write_trace(
    path: Path, iterations: list[tuple[float, float]], memory: list[tuple[float, int, int]]
) -> Path:
    """A Kineto trace with ``prism:iter`` marks and ``[memory]`` events (µs after BASE_NS)."""
    out = [
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": f"prism:iter|iter={i}",
            "pid": 1,
            "tid": 7,
            "ts": ts,
            "dur": dur,
        }
        for i, (ts, dur) in enumerate(iterations)
    ]
    total = 0
    for ts, nbytes, addr in memory:
        total += nbytes
        args = {"Total Allocated": total, "Bytes": nbytes, "Addr": addr, "Device Type": 0, "Device Id": -1}
        out.append({"ph": "i", "name": "[memory]", "pid": 1, "tid": 7, "ts": ts, "args": args})
    path.write_bytes(gzip.compress(json.dumps({"baseTimeNanoseconds": BASE_NS, "traceEvents": out}).encode()))
    return path


def one_iteration(start: float, *, missed_free: bool) -> list[tuple[float, int, int]]:
    """A collective's 512-byte buffer, freed (by some thread) before a temporary gets its address;
    then an activation of 1000 bytes up and down: 1000 bytes above the start at the highest."""
    buffer = [(start + 1, 512, 0xB)] + ([] if missed_free else [(start + 2, -512, 0xB)])
    temporary = [(start + 3, 256, 0xB), (start + 4, -256, 0xB)]
    return buffer + temporary + [(start + 5, 1000, 0xA), (start + 8, -1000, 0xA)]


def test_peak_per_iteration_without_the_frees_the_profiler_missed(tmp_path: Path) -> None:
    its = [(0, 10), (10, 10), (20, 10), (30, 10)]
    mem = [e for k, (s, _) in enumerate(its) for e in one_iteration(s, missed_free=k in (1, 3))]
    got = iteration_memory(write_trace(tmp_path / "t.json.gz", its, mem), after_first=True)
    # Without the restored frees iterations 1 and 3 would peak 512 bytes high, and each later
    # iteration start 512 bytes higher than the one before.
    assert got.peak_delta_bytes == 1000
    assert got.drift_bytes == 0


def test_an_even_count_of_iterations_takes_the_lower_middle_peak(tmp_path: Path) -> None:
    # In iteration 2 the buffer's free is missed and its address never comes back: that
    # iteration peaks 512 bytes high. Of the two iterations after the first, the lower counts.
    its = [(0, 10), (10, 10), (20, 10)]
    mem = [e for k, (s, _) in enumerate(its) for e in one_iteration(s, missed_free=k == 2)]
    mem = [e for e in mem if not 23 <= e[0] <= 24]
    got = iteration_memory(write_trace(tmp_path / "t.json.gz", its, mem), after_first=True)
    assert got.peak_delta_bytes == 1000


def test_a_device_whose_totals_count_every_thread_is_left_alone() -> None:
    # Its totals fell by 100 between two events (another thread's free, counted by the allocator):
    # the reuse of 0xA at t=30 is already accounted for.
    mem = events([(10, 100, 0xA), (20, 50, 0xB), (30, 100, 0xA)])
    mem.loc[2, "total"] = 150
    pd.testing.assert_frame_equal(restore_unrecorded_frees(mem), mem)


def test_frees_are_traced_to_the_units_that_allocated_their_blocks() -> None:
    # Units [0,10] [20,30] of iteration one (from 0), [100,110] [120,130] of iteration two (from 95).
    start, end = np.array([0, 20, 100, 120]), np.array([10, 30, 110, 130])
    window = np.array([0, 0, 95, 95])
    mem = events(
        [
            (3, -8, 0xD),  # a block allocated before the profiler started: no unit's
            (5, 64, 0xA),  # unit 0 keeps a block past its iteration
            (6, 32, 0xB),  # ... and one it frees in the next unit
            (15, 16, 0xC),  # the gap before unit 1 allocates (unit 1's)
            (25, -32, 0xB),
            (97, -64, 0xA),  # the next iteration frees unit 0's block in the gap before unit 2
            (105, 64, 0xA),  # unit 2 allocates the address again, unit 3 frees it
            (125, -64, 0xA),
            (126, -16, 0xC),
        ]
    )
    of_unit0 = np.array([True, False, True, False])
    inside, in_gap = freed_from(mem, start, end, window, of_unit0)
    assert inside.tolist() == [0, 32, 0, 64]
    assert in_gap.tolist() == [0, 0, 64, 0]
    # Unit 1's block (allocated in its gap) is freed inside unit 3.
    inside, in_gap = freed_from(mem, start, end, window, np.array([False, True, False, False]))
    assert inside.tolist() == [0, 0, 0, 16] and in_gap.tolist() == [0, 0, 0, 0]
