"""One replayed rank: ``python -m prism.replay.rank_main --job job.json --rank R --out DIR``.

Runs the original program (the built-in GPT's ``prism.capture.rank_main.run_rank``, or the
user's program's ``prism.capture.program_main.run_program_rank`` from the graph's first steady
iteration on, ``ReplayJob.clock_from``) as rank R of the full world,
every peer virtual and timed by the co-simulation of the graph (``GraphClock``), then writes
the co-simulation's side (``ReplayRankStats``) and, with ``trace_peers``, Chrome traces of
chosen virtual ranks. A divergence from the graph, a wait that can never end or a graph the
engine cannot finish is reported as one ``error`` progress event and exit code 3.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

from prism.capture.launch import parse_rank_args
from prism.capture.program_main import run_program_rank
from prism.capture.progress import report
from prism.capture.rank_main import run_rank
from prism.graph.io.parquet import read_metadata
from prism.graph.sim.simulate import SimulationError
from prism.graph.sim.whatif import BlockDelay
from prism.replay.coordinator import RemotePort
from prism.replay.cosim import RankPass, RankSummary, open_cosimulation, summarize
from prism.replay.graph_clock import DivergenceError, GraphClock, IterationStats, LocalPort, RankProgram
from prism.replay.peer_trace import write_peer_trace
from prism.replay.straggler import install_delays
from prism.replay.wait_spans import add_emulated_waits
from prism.schemas.comm_log import read_comm_log
from prism.schemas.files import write_json_atomic
from prism.schemas.iterations import clean_unprofiled
from prism.schemas.layout import ParallelLayout
from prism.schemas.manifest import PROGRAM
from prism.schemas.replay import ReplayFiles, ReplayIteration, ReplayJob, ReplayRankStats

EXIT_DIVERGED = 3


def _iteration(stats: IterationStats, record: RankPass, engine_ns: int) -> ReplayIteration:
    return ReplayIteration(
        calls=stats.calls,
        ahead=stats.ahead,
        engine_ns=engine_ns,
        stall_ns=stats.stall_ns,
        late_ns=stats.late_ns,
        emulated_ns=record.rank_end_ns - record.rank_start_ns,
        phase_ns=dict(record.phase_ns),
    )


def _not_simulated(wall_ns: int) -> ReplayIteration:
    return ReplayIteration(calls=0, engine_ns=0, stall_ns=0, emulated_ns=int(wall_ns), phase_ns={})


def _clean_median(summary: RankSummary, warmup: int) -> tuple[int, ...]:
    """Every rank's co-simulated iteration time over the clean unprofiled iterations (median)."""
    clean = clean_unprofiled(summary.pass_iterations, warmup)
    return tuple(int(v) for v in np.median(np.stack(clean), axis=0)) if clean else ()


def _clock(job: ReplayJob, rank: int) -> tuple[GraphClock, Callable[[], RankSummary]]:
    """The rank's clock, talking to the co-simulation in the launcher (``Coordinator``), or
    running it in this thread where the job names no coordinator."""
    if job.coordinator is None:
        return _local_clock(job, rank)

    def stop(message: str) -> None:  # from the port's thread: the program cannot go on
        report(rank=rank, event="error", message=message)
        os._exit(EXIT_DIVERGED)

    alone = not job.program.real_ranks  # the only real rank: its stall is its own
    port = RemotePort(job.coordinator, rank, on_error=stop, dilates=alone)
    return GraphClock(RankProgram.read(job.graph, rank), port), port.summary


def _local_clock(job: ReplayJob, rank: int) -> tuple[GraphClock, Callable[[], RankSummary]]:
    cosim, predictions = open_cosimulation(job.graph, (rank,), trace_ranks=job.trace_peers)
    clock = GraphClock(cosim.programs[rank], LocalPort(cosim, ahead=True))
    return clock, lambda: summarize(cosim, rank, predictions[rank])


def replay_rank(job: ReplayJob, rank: int, out_dir: Path) -> ReplayRankStats:
    """Run ``rank`` against the graph; write its traces, result and co-simulation stats."""
    clock, summary_of_run = _clock(job, rank)
    install_delays((BlockDelay(**d) for d in job.delays), rank)
    is_program = job.program.workload == PROGRAM
    if is_program:  # its first iterations hold its set-up, whose calls the graph does not have
        result = run_program_rank(job.program, rank, out_dir, clock=clock, clock_from=job.clock_from)
    else:
        run_rank(job.program, rank, out_dir, clock=clock)
    summary = summary_of_run()
    files = ReplayFiles(out_dir)
    trace = add_emulated_waits(files.kineto(rank), read_comm_log(files.comm(rank)))
    if rank == min(job.program.real_ranks or (rank,)):  # one real rank writes the peers' traces
        layout = ParallelLayout.from_dict(read_metadata(job.graph).layout)
        for peer in job.trace_peers:
            program = RankProgram.read(job.graph, peer)
            write_peer_trace(
                summary.traced, clock.wall_offsets, program, layout, files.peer_trace(peer), trace
            )
    iterations = tuple(
        _iteration(s, p, e)
        for s, p, e in zip(clock.iterations, summary.passes, summary.engine_ns, strict=True)
    )
    if is_program:  # the set-up iterations, run but not co-simulated
        iterations = (*(_not_simulated(ns) for ns in result.iteration_ns[: job.clock_from]), *iterations)
    stats = ReplayRankStats(
        rank=rank,
        iterations=iterations,
        predicted_iteration_ns=summary.predicted_iteration_ns,
        predicted_peak_bytes=summary.predicted_peak_bytes,
        predicted_phase_ns=summary.predicted_phase_ns,
        graph_load_s=summary.load_s,
        replay_rss_bytes=summary.load_rss_bytes,
        virtual_iteration_ns=_clean_median(summary, job.program.warmup - job.clock_from),
        simulated_from=job.clock_from,
    )
    write_json_atomic(files.replay_stats(rank), stats.to_dict())
    return stats


def main(argv: list[str] | None = None) -> int:
    args = parse_rank_args("prism.replay.rank_main", __doc__, argv)
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
