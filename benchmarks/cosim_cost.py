"""The co-simulation's own work per iteration, without a program, a coordinator or a wall clock.

    .venv/bin/python benchmarks/cosim_cost.py [GRAPH] [--rank R] [--slowdown X] [--iterations N] [--profile]

A scripted program (``prism.replay.scripted``) plays rank R's nodes against ``GraphClock`` on
a fake wall clock: it "computes" for the graph's durations times ``--slowdown`` and makes each
call of the graph at that moment; the engine runs in the calling thread (``LocalPort``), so the
time an iteration takes here is all co-simulation: matching, the engine's passes, completions.
Compare it with ``replay_overhead.py``'s engine column, the same work done beside a real program. Prints the median over iterations (the
first ``--warmup`` left out); with ``--profile``, the run is under cProfile (slower) and the
ten functions with the most own time follow.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import time
from pathlib import Path

from rich.console import Console

from prism.graph.sim.load import load_sim_graph
from prism.graph.sim.simulate import SimGraph
from prism.replay.graph_clock import GraphClock
from prism.replay.scripted import FakeWall, play

console = Console()
TINY = Path(__file__).parents[1] / "tests" / "data" / "tiny_graph.parquet"


def timed_play(
    clock: GraphClock, wall: FakeWall, g: SimGraph, iterations: int, slowdown: float
) -> list[float]:
    """Seconds of co-simulation per iteration of rank ``clock.rank``'s scripted program."""
    seconds = []
    for _ in range(iterations):
        began = time.perf_counter()
        play(clock, wall, g, iterations=1, slowdown=slowdown)
        seconds.append(time.perf_counter() - began)
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("graph", nargs="?", type=Path, default=TINY)
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--slowdown", type=float, default=1.0, help="the program's compute × this")
    parser.add_argument("--iterations", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument(
        "--profile", action="store_true", help="run under cProfile and print its top functions"
    )
    args = parser.parse_args(argv)
    if args.iterations <= args.warmup:
        parser.error("--iterations must be more than --warmup")
    try:
        graph = load_sim_graph(args.graph)
    except (OSError, ValueError) as e:
        parser.error(str(e).splitlines()[0])
    if not 0 <= args.rank < graph.ranks:
        parser.error(f"rank {args.rank} is not in the graph (0..{graph.ranks - 1})")
    wall = FakeWall()
    clock = GraphClock.open(args.graph, args.rank, graph, wall_ns=wall)
    profile = cProfile.Profile() if args.profile else None
    if profile:
        profile.enable()
    seconds = timed_play(clock, wall, graph, args.iterations, args.slowdown)
    if profile:
        profile.disable()
    steady = seconds[args.warmup :]
    console.print(
        f"{args.graph} rank {args.rank}, compute × {args.slowdown:g}: co-simulation "
        f"{statistics.median(steady) * 1e3:.1f} ms per iteration (median of {len(steady)}; "
        f"all: {', '.join(f'{s * 1e3:.1f}' for s in seconds)})"
    )
    if profile:
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(10)
        console.print(out.getvalue(), markup=False, highlight=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
