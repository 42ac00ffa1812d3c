"""Where the time goes, measured three ways, so that prediction errors can be explained.

- ``decompose``: one rank's profiled iterations from its op table, split into compute (the
  durations of its ops), comm + wait (process-group calls, plus the gap after each call: a
  gloo collective returns a Work at once and ``dist.all_reduce`` waits for it *after* the
  ``prism:comm`` mark closes; a pipeline rank waits for its transfers in ``p2p_wait``, which
  holds no op) and glue (every other gap: Python between ops, profiler bookkeeping).
- ``sim_breakdown``: the same split of a simulated rank (``prism.graph.sim_metrics``).
- ``collective_latencies``: from the comm logs of a run where every rank was real, for each
  collective instance: how far apart the members arrived (skew) and how long it took after
  the last one arrived (latency), next to what the comm model charges for it.
- ``concurrency_probe``: how fast two CPU-bound processes run side by side compared to one
  alone: on a shared 2-vCPU VM this is not 1.0, and it changes by the minute.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pandas as pd

from prism.graph import op_table as ot
from prism.graph.comm import CommModel
from prism.graph.profiler_overhead import clean_unprofiled
from prism.graph.sim_metrics import breakdown
from prism.graph.simulate import SimGraph, SimResult
from prism.schemas.cluster import ClusterSpec
from prism.schemas.comm_log import read_comm_log
from prism.schemas.manifest import CaptureFiles, read_manifest


def decompose(ops: pd.DataFrame) -> dict[str, float]:
    """Median over the profiled iterations of compute / comm_wait / glue, in ms."""
    ends = {it["iteration"]: it["end_ns"] for it in ops.attrs["iterations"]}
    parts = []
    for iteration, units in ops.sort_values(ot.SEQ).groupby(ot.ITERATION):
        comm = units[ot.IS_COMM].to_numpy()
        after_comm = np.r_[False, comm[:-1]]
        dur, gap = units[ot.DUR_NS].to_numpy(), units[ot.GAP_NS].to_numpy()
        tail = ends[iteration] - (units[ot.START_NS].to_numpy()[-1] + dur[-1])
        parts.append(
            {
                "compute": dur[~comm].sum(),
                "comm_wait": dur[comm].sum() + gap[after_comm].sum(),
                "glue": gap[~after_comm].sum() + max(tail, 0),
            }
        )
    return {key: float(statistics.median(p[key] for p in parts)) / 1e6 for key in parts[0]}


def sim_breakdown(graph: SimGraph, result: SimResult) -> list[dict[str, float]]:
    """Per rank: compute / comm_wait (exposed comm + bubble) / glue (gaps) of the simulation, in ms."""
    b = breakdown(graph, result)
    return [
        {
            "compute": float(b.compute_ns[r]) / 1e6,
            "comm_wait": float(b.exposed_comm_ns[r] + b.bubble_ns[r]) / 1e6,
            "glue": float(b.overhead_ns[r]) / 1e6,
        }
        for r in range(graph.ranks)
    ]


def clean_call_mask(calls: int, iterations: int, warmup: int) -> np.ndarray:
    """Which of a rank's ``calls`` (in order) were made in its clean unprofiled iterations.

    Set-up calls come first, then the same number of calls in each of ``iterations``; a log
    that does not split so (set-up calls as many as an iteration's, or none per iteration)
    keeps every call rather than guess."""
    per = calls // iterations if iterations > 0 else 0
    setup = calls - per * iterations
    if per == 0 or setup >= per:
        return np.ones(calls, np.bool_)
    iteration = np.r_[np.full(setup, -1), np.repeat(np.arange(iterations), per)]
    return np.isin(iteration, clean_unprofiled(list(range(iterations)), warmup))


def _instances(capture_dir: Path, ranks: list[int], clean_only: bool) -> dict[tuple, list[tuple[int, int]]]:
    """(enter_ns, done_ns) of every member of every delegated call, keyed by instance.

    A collective is keyed by (group label, gseq, op, bytes, size); a transfer by
    (source, destination, n-th transfer between them, 'send', bytes, 2), so that a send and
    its recv share a key. gloo's send/recv Works have no future: their done_ns is when the
    program's wait() returned, which the pipeline calls right after posting. ``clean_only``:
    calls of the clean unprofiled iterations only, the ones the comm model prices.
    """
    job = read_manifest(capture_dir).job
    calls: dict[tuple, list[tuple[int, int]]] = defaultdict(list)
    for rank in ranks:
        p2p_count: dict[tuple[int, int], int] = defaultdict(int)
        log = read_comm_log(CaptureFiles(capture_dir).comm(rank)).calls
        keep = clean_call_mask(len(log), job.warmup + job.iterations, job.warmup)
        for c, kept in zip(log, keep, strict=True):
            if not c.delegated or c.done_ns <= 0:
                continue
            if c.op in ("send", "recv"):
                pair = (rank, c.peer) if c.op == "send" else (c.peer, rank)
                key = (*pair, p2p_count[pair], "send", c.bytes, 2)
                p2p_count[pair] += 1
            else:
                key = (c.label, c.gseq, c.op, c.bytes, c.group_size)
            if kept or not clean_only:
                calls[key].append((c.enter_ns, c.done_ns))
    return calls


def collective_latencies(capture_dir: Path, ranks: list[int], clean_only: bool = True) -> list[dict]:
    """One row per complete delegated collective or transfer: op, bytes, size, skew_ns, latency_ns.

    By default only the calls of the clean unprofiled iterations: the first is cold, and under
    the profiler a call takes longer (the 23:02 fidelity run's tp all-reduces: 1.46 ms mean
    after the last arrival in clean iterations, 1.79 ms in profiled ones)."""
    rows = []
    for (*_, op, nbytes, size), members in _instances(capture_dir, ranks, clean_only).items():
        if len(members) != size:
            continue
        enter = [m[0] for m in members]
        rows.append(
            {
                "op": op,
                "bytes": nbytes,
                "group_size": size,
                "skew_ns": max(enter) - min(enter),
                "latency_ns": max(m[1] for m in members) - max(enter),
            }
        )
    return rows


def summarize_latencies(rows: list[dict], spec: ClusterSpec) -> list[dict]:
    """Per (op, bytes, group size): calls, latency median/mean, skew median, and the model's time."""
    model = CommModel(spec)
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for row in rows:
        groups[(row["op"], row["bytes"], row["group_size"])].append(row)
    out = []
    for (op, nbytes, size), items in sorted(groups.items()):
        latency = [i["latency_ns"] / 1e3 for i in items]
        out.append(
            {
                "op": op,
                "bytes": nbytes,
                "group_size": size,
                "calls": len(items),
                "latency_median_us": statistics.median(latency),
                "latency_mean_us": statistics.fmean(latency),
                "skew_median_us": statistics.median(i["skew_ns"] / 1e3 for i in items),
                "model_us": model.duration_ns(op, nbytes, size, 1) / 1e3,
            }
        )
    return out


_SPIN = "import time\nt=time.perf_counter()+{s}\nn=0\nwhile time.perf_counter()<t: n+=1\nprint(n)"


def _spin(processes: int, seconds: float) -> float:
    """Loop iterations per second of each of ``processes`` pure-Python spinners run together (mean)."""
    code = _SPIN.format(s=seconds)
    procs = [
        subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        for _ in range(processes)
    ]
    counts = [int(p.communicate()[0]) for p in procs]
    return statistics.fmean(counts) / seconds


def concurrency_probe(processes: int = 2, seconds: float = 0.5, rounds: int = 3) -> float:
    """Speed of each of ``processes`` CPU-bound processes run together, relative to one alone.

    1.0 means they do not slow each other down; 0.5 means two share one core's worth of work.
    Median of ``rounds`` (alone, together) pairs: on a shared VM one pair can be far off.
    """
    return statistics.median(_spin(processes, seconds) / _spin(1, seconds) for _ in range(rounds))
