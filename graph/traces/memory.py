"""Attribute the allocator's ``[memory]`` events of a trace to the units of the op table.

Kineto writes one instant event per allocation or free, with ``Bytes`` (negative on free) and
the allocator's running ``Total Allocated`` for that device. On CPU captures every one of them
carries the main thread's tid (backward runs on the caller's thread there); on CUDA a device
thread allocates during backward. Either way the units of a rank never overlap in time, so
events are attributed *by time*, whatever their tid: an event inside a unit's [start, end]
belongs to that unit, one between two units of an iteration to the gap before the next unit
(``gap_alloc_bytes`` / ``gap_free_bytes``: Python frees tensors between ops), and one after
the last unit of an iteration or outside every iteration to nothing. A unit's ``alloc_bytes``
is how far the total rises inside it at its highest, its ``free_bytes`` how far it falls from
there by its end: the simulation's running total (allocations before frees, node by node) then
peaks where the allocator did, also for an op that frees a temporary before allocating again.
So, within an iteration, ``alloc_total_at_start`` of unit i+1 equals that of unit i plus its
alloc - free plus unit i+1's gap_alloc - gap_free.

One device only: the accelerator when the trace has its events (Total Allocated is per
device), else the CPU. On CPU the profiler only knows blocks allocated while it records, so
totals count from the start of the profiled window: parameters and optimizer state made
before it are not in them.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from prism.graph.traces.kineto import find_marks, read_kineto

CPU_DEVICE_TYPE = 0


@dataclass(frozen=True)
class UnitMemory:
    """Per-unit memory columns, aligned with the units passed in."""

    alloc_bytes: np.ndarray
    free_bytes: np.ndarray
    gap_alloc_bytes: np.ndarray
    gap_free_bytes: np.ndarray
    total_at_start: np.ndarray
    device: tuple[int, int]
    """(Device Type, Device Id) of the events used; (0, -1) is the CPU."""


def pick_device(memory: pd.DataFrame) -> tuple[int, int]:
    """The accelerator with the most events, else the CPU."""
    acc = memory[memory["device_type"] != CPU_DEVICE_TYPE]
    if acc.empty:
        return (CPU_DEVICE_TYPE, -1)
    top = acc.groupby(["device_type", "device_id"]).size().idxmax()
    return (int(top[0]), int(top[1]))


def attribute_memory(
    memory: pd.DataFrame, start: np.ndarray, end: np.ndarray, window_start: np.ndarray
) -> UnitMemory:
    """Memory columns of units given by ``start``/``end`` (sorted, non-overlapping).

    ``window_start[i]`` is the start of unit i's iteration: gap events before it are dropped.
    """
    device = pick_device(memory)
    mem = memory[(memory["device_type"] == device[0]) & (memory["device_id"] == device[1])]
    t = mem["ts_ns"].to_numpy()
    b = mem["bytes"].to_numpy()
    n = len(start)
    u = np.searchsorted(start, t, side="right") - 1
    in_unit = (u >= 0) & (t <= end[np.maximum(u, 0)])
    nxt = u + 1
    in_gap = ~in_unit & (nxt < n) & (t >= window_start[np.minimum(nxt, n - 1)]) if n else in_unit
    alloc, free = np.maximum(b, 0), np.maximum(-b, 0)
    rise, fall = _rise_and_fall(u[in_unit], b[in_unit], n)
    return UnitMemory(
        alloc_bytes=rise,
        free_bytes=fall,
        gap_alloc_bytes=_sum_by(nxt[in_gap], alloc[in_gap], n),
        gap_free_bytes=_sum_by(nxt[in_gap], free[in_gap], n),
        total_at_start=total_before(mem, start),
        device=device,
    )


def freed_from(
    memory: pd.DataFrame,
    start: np.ndarray,
    end: np.ndarray,
    window_start: np.ndarray,
    allocated_in: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Per unit (as ``attribute_memory`` places events), the bytes it frees of blocks that the units
    where ``allocated_in`` is True allocated: (inside its span, in the gap before it). A free is
    matched to its block's allocation by address (the latest allocation of that address before
    it), in the same iteration or an earlier one: what a layer keeps that the program frees later."""
    n = len(start)
    if not n or memory.empty:
        return np.zeros(n, np.int64), np.zeros(n, np.int64)
    device = pick_device(memory)
    mem = memory[(memory["device_type"] == device[0]) & (memory["device_id"] == device[1])]
    t, b, addr = (mem[c].to_numpy() for c in ("ts_ns", "bytes", "addr"))
    u = np.searchsorted(start, t, side="right") - 1
    in_unit = (u >= 0) & (t <= end[np.maximum(u, 0)])
    nxt = np.minimum(u + 1, n - 1)
    in_gap = ~in_unit & (u + 1 < n) & (t >= window_start[nxt])
    owner = np.where(in_unit, u, np.where(in_gap, nxt, -1))  # an allocation's unit (its gap's included)
    order = np.lexsort((t, addr))  # by address, then time: a free follows its allocation
    prev = np.r_[-1, order[:-1]]
    same = np.r_[False, addr[order][1:] == addr[order][:-1]]
    frees = (b[order] < 0) & same & (addr[order] != 0)
    by, alloc_row = order[frees], prev[frees]
    matched = (b[alloc_row] == -b[by]) & (owner[alloc_row] >= 0)
    by, alloc_row = by[matched], alloc_row[matched]
    from_source = allocated_in[owner[alloc_row]]
    by = by[from_source]
    freed = -b[by].astype(np.int64)
    return (
        _sum_by(u[by][in_unit[by]], freed[in_unit[by]], n),
        _sum_by(nxt[by][in_gap[by]], freed[in_gap[by]], n),
    )


def _rise_and_fall(unit: np.ndarray, nbytes: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Per unit (its events in time order): how far its running total rises at its highest above
    where the unit began, and how far it falls from there by the unit's end. A unit that
    allocates a temporary, frees it and allocates again peaks at the larger of the two, not at
    their sum, as a plain sum of its allocations would have it."""
    rise, fall = np.zeros(n, np.int64), np.zeros(n, np.int64)
    if not len(unit):
        return rise, fall
    starts = np.flatnonzero(np.r_[True, unit[1:] != unit[:-1]])
    running = np.cumsum(nbytes.astype(np.int64))
    before = np.r_[0, running[:-1]][starts]  # total before each unit's first event
    within = running - np.repeat(before, np.diff(np.r_[starts, len(unit)]))
    peak = np.maximum(np.maximum.reduceat(within, starts), 0)
    net = np.add.reduceat(nbytes.astype(np.int64), starts)
    rise[unit[starts]], fall[unit[starts]] = peak, peak - net
    return rise, fall


def _sum_by(index: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    # np.add.at rather than bincount: bincount sums in float64.
    out = np.zeros(n, dtype=np.int64)
    np.add.at(out, index, values)
    return out


def total_before(mem: pd.DataFrame, times: np.ndarray) -> np.ndarray:
    """Total Allocated just before each time (events at that very time not yet applied)."""
    t = mem["ts_ns"].to_numpy()
    total = mem["total"].to_numpy()
    if len(t) == 0:
        return np.zeros(len(times), dtype=np.int64)
    # Before the first event the total is that event's total minus its own bytes.
    running = np.concatenate(([total[0] - mem["bytes"].to_numpy()[0]], total))
    return running[np.searchsorted(t, times, side="left")].astype(np.int64)


@dataclass(frozen=True, kw_only=True)
class IterationMemory:
    """A rank's allocator totals over the profiled iterations of its trace."""

    peak_delta_bytes: int
    """Median over iterations (the lower middle one of an even count) of the highest Total
    Allocated minus its value at the start."""
    drift_bytes: int
    """Median growth of Total Allocated from one iteration start to the next (0 in a steady state)."""


def iteration_memory(kineto_path: Path, *, after_first: bool = False) -> IterationMemory:
    """Peak and drift of a trace's ``[memory]`` events, iteration by iteration (``prism:iter`` marks).

    ``after_first`` leaves out the first profiled iteration where there are more: the profiler
    records no free of a block allocated before it started, so that iteration's totals run high
    by what it frees of the iteration before (a program's gradients, dropped by ``zero_grad``)."""
    trace = read_kineto(kineto_path)
    its = find_marks(trace).iterations
    if after_first and len(its) > 1:
        its = its.iloc[1:]
    device = pick_device(trace.memory)
    mem = trace.memory[(trace.memory["device_type"] == device[0]) & (trace.memory["device_id"] == device[1])]
    ts, total = mem["ts_ns"].to_numpy(), mem["total"].to_numpy()
    base = total_before(mem, its["start_ns"].to_numpy())
    deltas = []
    for start, end, before in zip(its["start_ns"], its["end_ns"], base, strict=True):
        inside = total[(ts >= start) & (ts < end)]
        deltas.append(max(int(inside.max()) - int(before), 0) if len(inside) else 0)
    drift = np.diff(base) if len(base) > 1 else np.zeros(1)
    # The lower middle value, never a mean of two: a block whose free the profiler missed counts
    # until its address comes back (``restore_unrecorded_frees``), so an iteration's peak can
    # only run high, and a mean would carry half of that into every figure.
    return IterationMemory(
        peak_delta_bytes=int(statistics.median_low(deltas)), drift_bytes=int(np.median(drift))
    )
