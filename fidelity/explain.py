"""Where the time goes, measured three ways, so that prediction errors can be explained.

- ``decompose``: one rank's profiled iterations from its op table, split into compute (the
  durations of its ops), comm + wait (process-group calls, plus the gap after each call: a
  gloo collective returns a Work at once and ``dist.all_reduce`` waits for it *after* the
  ``prism:comm`` mark closes; a pipeline rank waits for its transfers in ``p2p_wait``, which
  holds no op) and glue (every other gap: Python between ops, profiler bookkeeping).
- ``sim_breakdown``: the same split of a simulated rank (``prism.graph.sim.metrics``).
- ``summarize_latencies``: of the real calls of a run where every rank was real
  (``prism.graph.comm.call_latency``), per op and size: how far apart the members arrived (skew)
  and how long a call took after the last one arrived (latency), next to what the comm model
  charges for it.
- ``concurrency_probe``: how fast two CPU-bound processes run side by side compared to one
  alone: on a shared 2-vCPU VM this is not 1.0, and it changes by the minute.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from prism.graph.build import op_table as ot
from prism.graph.comm.call_latency import CallLatency
from prism.graph.io.parquet import read_rank
from prism.graph.sim.metrics import RankBreakdown
from prism.peers.comm_model import CommModel
from prism.schemas import graph_format as gf
from prism.schemas.cluster import ClusterSpec
from prism.schemas.graph_format import NodeKind
from prism.schemas.iterations import clean_unprofiled
from prism.schemas.manifest import RankResult

PHASE_NAMES = {"fwd": "forward", "bwd": "backward", "optim": "optimizer"}
"""Block kinds a fidelity record names; every other kind (transfers, p2p waits, gradient-sync
copies, glue) is 'other'."""
COMMUNICATION, BUBBLE = "communication", "bubble"
"""The iteration's time in collective calls (waiting on their members included), and the rest
of its time in calls: point-to-point transfers, mostly waiting for the pipeline's neighbours."""
PHASES = (*PHASE_NAMES.values(), "other", COMMUNICATION, BUBBLE)
"""The parts of an iteration a fidelity record compares, which add up to the iteration."""


def own_phases_ms(own_ns: Mapping[str, float], iteration_ns: float, collective_ns: float) -> dict[str, float]:
    """A rank's iteration by phase (``PHASES``), ms: its own time (compute and Python, calls
    excluded) in forward, backward, optimizer and other blocks, each with the glue led into it as
    the graph's nodes hold it (``own_ns`` by block kind, ``RankResult.phase_ns``), its
    time in collectives (``collective_ns``), and ``BUBBLE``, the rest of the iteration."""
    out = dict.fromkeys(PHASES, 0.0)
    for kind, ns in own_ns.items():
        out[PHASE_NAMES.get(kind, "other")] += ns / 1e6
    out[COMMUNICATION] = collective_ns / 1e6
    out[BUBBLE] = iteration_ns / 1e6 - sum(out.values())
    return out


def measured_phases_ms(result: RankResult, warmup: int, skip: int = 0) -> dict[str, float] | None:
    """``own_phases_ms`` of a rank that ran (for real, or replayed), phase by phase the median over
    its clean unprofiled iterations (less the first ``skip``: a program's replay co-simulates from
    its steady iteration on) of that phase's time in each iteration: its own time by block kind,
    its time in collectives and ``BUBBLE``, the rest of that iteration (waits for point-to-point
    transfers; nothing on a rank without them). The rows add up to each iteration; their medians
    need not add up to the median iteration, which a part's right tail moves (docs/fidelity.md).
    None where it recorded neither."""
    if not result.phase_ns or not result.collective_ns:
        return None
    iterations = clean_unprofiled(result.iteration_ns, warmup)[skip:]
    phase_ns = clean_unprofiled(result.phase_ns, warmup)[skip:]
    collective_ns = clean_unprofiled(result.collective_ns, warmup)[skip:]
    if not phase_ns or not len(iterations) == len(phase_ns) == len(collective_ns):
        return None
    each = [own_phases_ms(p, t, c) for t, p, c in zip(iterations, phase_ns, collective_ns, strict=True)]
    return {phase: float(statistics.median(e[phase] for e in each)) for phase in PHASES}


BLOCK_PHASES = (*PHASE_NAMES.values(), "other")
"""The parts of an iteration a program's record compares by block (``block_phases_ms``)."""


def block_phases_ms(wall_ns: Mapping[str, float], iteration_ns: float) -> dict[str, float]:
    """An iteration by block (``BLOCK_PHASES``), ms: its wall time in forward, backward and
    optimizer blocks, each with the calls made inside it (``wall_ns`` by block kind), and
    'other', the rest (glue between blocks, transfers outside them). What a run without prism's
    process group can split of itself: a DDP bucket's all-reduce, issued from C++, is in the
    backward it overlaps."""
    out = dict.fromkeys(BLOCK_PHASES, 0.0)
    for kind, name in PHASE_NAMES.items():
        out[name] = wall_ns.get(kind, 0) / 1e6
    out["other"] = iteration_ns / 1e6 - sum(out.values())
    return out


def measured_blocks_ms(
    block_ns: Sequence[Mapping[str, int]], iteration_ns: Sequence[int], warmup: int, skip: int = 0
) -> dict[str, float] | None:
    """``block_phases_ms`` of a rank that ran (for real, or replayed) from its blocks' wall times
    (``RankResult.block_ns``, ``TimedRun.block_ns``) and its iterations' (``iteration_ns``), part
    by part the median over its clean unprofiled iterations (less the first ``skip``) of that
    part's time in each iteration. The rows add up to each iteration; their medians need not add
    up to the median iteration (``measured_phases_ms``). None where it recorded no blocks."""
    blocks = clean_unprofiled(list(block_ns), warmup)[skip:] if block_ns else []
    iterations = clean_unprofiled(list(iteration_ns), warmup)[skip:]
    if not blocks or len(blocks) != len(iterations):
        return None
    each = [block_phases_ms(b, t) for b, t in zip(blocks, iterations, strict=True)]
    return {part: float(statistics.median(e[part] for e in each)) for part in BLOCK_PHASES}


def graph_own_ns(graph_path: Path, rank: int, spans_ns: np.ndarray | None = None) -> dict[str, float]:
    """A graph rank's own time by block kind: its compute nodes' durations (or, with ``spans_ns``,
    a simulation's span of each of the rank's nodes: a compute's wake cost with it) and every
    node's gap."""
    nodes = read_rank(graph_path, rank, columns=[gf.PHASE, gf.KIND, gf.DUR_NS, gf.GAP_NS]).to_pandas()
    compute = nodes[gf.KIND].astype(str) == NodeKind.COMPUTE.value
    took = nodes[gf.DUR_NS].to_numpy() if spans_ns is None else spans_ns
    own = np.where(compute, took, 0) + nodes[gf.GAP_NS].to_numpy()
    # A transfer's phase has no direction here: 'other' either way.
    phases = nodes[gf.PHASE].astype(str).to_numpy()
    return {str(kind): float(ns) for kind, ns in pd.Series(own).groupby(phases).sum().items()}


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


def sim_breakdown(b: RankBreakdown) -> list[dict[str, float]]:
    """Per rank: compute / comm_wait (exposed comm + bubble) / glue (gaps) of a simulation's
    breakdown (``prism.graph.sim.metrics.breakdown``), in ms."""
    return [
        {
            "compute": float(b.compute_ns[r]) / 1e6,
            "comm_wait": float(b.exposed_comm_ns[r] + b.bubble_ns[r]) / 1e6,
            "glue": float(b.overhead_ns[r]) / 1e6,
        }
        for r in range(len(b.compute_ns))
    ]


def summarize_latencies(rows: list[CallLatency], spec: ClusterSpec) -> list[dict]:
    """Per (op, bytes, group size): calls, latency median/mean, skew median, and the model's time."""
    model = CommModel(spec)
    groups: dict[tuple, list[CallLatency]] = defaultdict(list)
    for row in rows:
        groups[(row.op, row.bytes, row.group_size)].append(row)
    out = []
    for (op, nbytes, size), items in sorted(groups.items()):
        latency = [i.latency_ns / 1e3 for i in items]
        out.append(
            {
                "op": op,
                "bytes": nbytes,
                "group_size": size,
                "calls": len(items),
                "latency_median_us": statistics.median(latency),
                "latency_mean_us": statistics.fmean(latency),
                "skew_median_us": statistics.median(i.skew_ns / 1e3 for i in items),
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
