"""One replayed rank: ``python -m prism.replay.rank_main --job job.json --rank R --out DIR``.

Runs the original program (``prism.capture.rank_main.run_rank``) as rank R of the full world,
every peer virtual and timed by the co-simulation of the graph (``GraphClock``), then writes
the co-simulation's side (``ReplayRankStats``) and, with ``trace_peers``, Chrome traces of
chosen virtual ranks. A divergence from the graph, a wait that can never end or a graph the
engine cannot finish is reported as one ``error`` progress event and exit code 3.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import psutil

from prism.capture.progress import report
from prism.capture.rank_main import run_rank
from prism.graph.profiler_overhead import clean_unprofiled
from prism.graph.sim_engine import COMPUTE
from prism.graph.simulate import SimGraph, SimResult, SimulationError, load_sim_graph, simulate
from prism.graph.whatif import BlockDelay
from prism.replay.graph_clock import DivergenceError, GraphClock, IterationStats, RankProgram
from prism.replay.peer_trace import write_peer_trace
from prism.replay.straggler import install_delays
from prism.replay.wait_spans import add_emulated_waits
from prism.schemas.comm_log import read_comm_log
from prism.schemas.files import write_json_atomic
from prism.schemas.replay import ReplayFiles, ReplayIteration, ReplayJob, ReplayRankStats

EXIT_DIVERGED = 3

PREDICTION_PASSES = 3
"""Passes of the offline simulation the replay is compared with (as ``prism-build-graph``)."""


def predicted_phase_ns(graph: SimGraph, result: SimResult, program: RankProgram) -> dict[str, int]:
    """The offline simulation's time of one rank by phase: how far each node moves its program on."""
    lo, hi = graph.rank_ptr[program.rank], graph.rank_ptr[program.rank + 1]
    start, end = result.start_ns[lo:hi], result.end_ns[lo:hi].copy()
    is_async, is_comm = graph.is_async[lo:hi], graph.kind[lo:hi] != COMPUTE
    after = np.where(is_async, start, end)  # an async call returns when it is made
    before = np.r_[result.rank_start_ns[program.rank], after[:-1]]
    # As the clock counts: the time before a call goes to the node before it, the wait to the call.
    lead = np.where(is_comm, start - before, 0)
    phases: dict[str, int] = {}
    for k, phase in enumerate(program.phase):
        phases[phase] = phases.get(phase, 0) + int(after[k] - before[k] - lead[k])
        if lead[k]:
            prior = program.phase[k - 1] if k else phase
            phases[prior] = phases.get(prior, 0) + int(lead[k])
    return {phase: ns for phase, ns in phases.items() if ns}


def _iteration(stats: IterationStats) -> ReplayIteration:
    return ReplayIteration(
        calls=stats.calls,
        engine_ns=stats.engine_ns,
        stall_ns=stats.stall_ns,
        emulated_ns=stats.rank_end_ns - stats.rank_start_ns,
        phase_ns=dict(stats.phase_ns),
    )


def _clean_median(clock: GraphClock, warmup: int) -> tuple[int, ...]:
    """Every rank's co-simulated iteration time over the clean unprofiled iterations (median)."""
    clean = clean_unprofiled(clock.pass_iterations, warmup)
    return tuple(int(v) for v in np.median(np.stack(clean), axis=0)) if clean else ()


def replay_rank(job: ReplayJob, rank: int, out_dir: Path) -> ReplayRankStats:
    """Run ``rank`` against the graph; write its traces, result and co-simulation stats."""
    rss_before = psutil.Process().memory_info().rss
    began = time.perf_counter()
    graph = load_sim_graph(job.graph)
    clock = GraphClock.open(job.graph, rank, graph, trace_ranks=job.trace_peers)
    load_s = time.perf_counter() - began
    replay_rss = psutil.Process().memory_info().rss - rss_before
    install_delays((BlockDelay(**d) for d in job.delays), rank)
    run_rank(job.program, rank, out_dir, clock=clock)
    files = ReplayFiles(out_dir)
    trace = add_emulated_waits(files.kineto(rank), read_comm_log(files.comm(rank)))
    for peer in job.trace_peers:
        write_peer_trace(clock, RankProgram.read(job.graph, peer, graph), files.peer_trace(peer), trace)
    prediction = simulate(graph, iterations=PREDICTION_PASSES)
    stats = ReplayRankStats(
        rank=rank,
        iterations=tuple(_iteration(s) for s in clock.iterations),
        predicted_iteration_ns=int(prediction.iteration_ns[rank]),
        predicted_peak_bytes=int(prediction.peak_bytes[rank]),
        predicted_phase_ns=predicted_phase_ns(graph, prediction, clock.program),
        graph_load_s=load_s,
        replay_rss_bytes=int(replay_rss),
        virtual_iteration_ns=_clean_median(clock, job.program.warmup),
    )
    write_json_atomic(files.replay_stats(rank), stats.to_dict())
    return stats


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m prism.replay.rank_main", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--job", type=Path, required=True, help="job.json of the replay")
    parser.add_argument("--rank", type=int, required=True, help="global rank to run for real")
    parser.add_argument("--out", type=Path, required=True, help="replay directory to write into")
    args = parser.parse_args(argv)
    job = ReplayJob.from_dict(json.loads(args.job.read_text()))
    try:
        replay_rank(job, args.rank, args.out)
    except (DivergenceError, SimulationError, TimeoutError) as e:
        report(rank=args.rank, event="error", message=str(e).splitlines()[0])
        return EXIT_DIVERGED
    except RuntimeError as e:  # raised inside autograd or a collective: the cause is in the message
        if "prism" not in str(e):
            raise
        report(rank=args.rank, event="error", message=_prism_line(str(e)))
        return EXIT_DIVERGED
    return 0


def _prism_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if "prism" in line), text.splitlines()[0])


if __name__ == "__main__":
    sys.exit(main())
