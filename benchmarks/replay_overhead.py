"""What replay costs beyond the program: per-call time of the timed process group, engine time, memory.

    .venv/bin/python benchmarks/replay_overhead.py [GRAPH ...] [--rank R] [--capture DIR] [--repeats 3]
                                                   [--pin off|on|both]

For each graph (default: the checked-in tiny graph), replays rank R (default 0) ``--repeats``
times (with ``--pin both``, pinned and unpinned in turn, ``prism.replay.cores``) and prints
medians over the repeats of (per clean iteration unless said):

- the program's time in the replay's clock per virtual call (``clock_ns`` of the comm log:
  matching the call to the graph, reading its answer rule, telling the co-simulation), median
  and 90th percentile over all its calls, and the share of calls answered ahead by a rule;
- the wall iteration, and the stall: the time the replay held the program beyond what the job
  would have (the clock's work where the program would have run on, answers that came after a
  call's modelled end), in ms and as a share of the wall iteration (with the worst replay's),
  and how much of it was answers that came late;
- the co-simulation's engine time per iteration (beside the program, in the launcher's process);
- the memory the graph and the engine add to the process they run in, the time to load them,
  and the rank process's peak RSS.

With ``--capture DIR`` (a capture of the same job), the same per-call time of the capture's
free-running virtual calls is printed beside it: the cost of timing calls by the graph.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from prism.replay.runtime import ReplayOptions, run_replay
from prism.schemas.comm_log import read_comm_log
from prism.schemas.iterations import clean_unprofiled
from prism.schemas.manifest import CaptureFiles, RankResult
from prism.schemas.replay import ReplayFiles, read_replay_stats

console = Console()
TINY = Path(__file__).parents[1] / "tests" / "data" / "tiny_graph.parquet"
WARMUP = 5


def call_us(comm_path: Path, field: str = "clock") -> np.ndarray:
    """Per virtual call, µs: the time in the replay's clock (``clock``) or the whole time in the
    call (``in``: what a capture's free-running calls cost)."""
    calls = [c for c in read_comm_log(comm_path).calls if not c.delegated]
    if field == "clock":
        return np.array([c.clock_ns / 1e3 for c in calls])
    return np.array([(c.exit_ns - c.enter_ns) / 1e3 for c in calls])


def replay_once(graph: Path, rank: int, out: Path, pin: bool = False) -> dict:
    report = run_replay(
        ReplayOptions(graph=graph, ranks=(rank,), out_dir=out, warmup=WARMUP, iterations=2, pin=pin)
    )
    files = ReplayFiles(out)
    stats = read_replay_stats(files.replay_stats(rank))
    result = RankResult.from_dict(json.loads(files.result(rank).read_text()))
    per_call = call_us(files.comm(rank))
    clean = clean_unprofiled(stats.iterations, WARMUP)
    wall = clean_unprofiled(result.iteration_ns, WARMUP)
    return {
        "call_median_us": float(np.median(per_call)),
        "call_p90_us": float(np.percentile(per_call, 90)),
        "ahead_pct": 100 * sum(it.ahead for it in clean) / max(sum(it.calls for it in clean), 1),
        "engine_ms": statistics.median(it.engine_ns for it in clean) / 1e6,
        "stall_ms": statistics.median(it.stall_ns for it in clean) / 1e6,
        "late_ms": statistics.median(it.late_ns for it in clean) / 1e6,
        "stall_pct": statistics.median(100 * it.stall_ns / w for it, w in zip(clean, wall, strict=True)),
        "iteration_ms": statistics.median(wall) / 1e6,
        "replay_mib": stats.replay_rss_bytes / 2**20,
        "peak_rss_mib": result.peak_rss_bytes / 2**20,
        "load_s": stats.graph_load_s,
        "pinned": report.cores is not None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("graphs", nargs="*", type=Path, default=[TINY])
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument(
        "--capture", type=Path, default=None, help="a capture of the same job, for comparison"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--pin", choices=("on", "off", "both"), default="off",
        help="hold the rank and the co-simulation to cores of their own (both: pinned and not, in turn)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    placements = {"on": (True,), "off": (False,), "both": (True, False)}[args.pin]
    table = Table(title=f"replay overhead, rank {args.rank} (medians over {args.repeats} replays)")
    columns = ("graph", "pinned", "clock µs/call median", "p90", "answered ahead %", "wall iteration ms", "stall ms",
               "stall %", "worst stall %", "of it late ms", "engine ms", "graph load s", "co-sim MiB",
               "rank peak RSS MiB")  # fmt: skip
    for c in columns:
        table.add_column(c, justify="left" if c == "graph" else "right")
    for graph in args.graphs:
        runs: dict[bool, list[dict]] = {pin: [] for pin in placements}
        for _ in range(args.repeats):
            for pin in placements:  # in turn, so that the machine's drift falls on both alike
                with tempfile.TemporaryDirectory(prefix="prism-overhead-") as tmp:
                    runs[pin].append(replay_once(graph, args.rank, Path(tmp) / "out", pin))
        for done in runs.values():
            med = {k: statistics.median(r[k] for r in done) for k in done[0]}
            pinned = "yes" if all(r["pinned"] for r in done) else "no"
            table.add_row(
                graph.name, pinned, f"{med['call_median_us']:.1f}", f"{med['call_p90_us']:.1f}",
                f"{med['ahead_pct']:.1f}", f"{med['iteration_ms']:.1f}", f"{med['stall_ms']:.2f}",
                f"{med['stall_pct']:.2f}", f"{max(r['stall_pct'] for r in done):.2f}", f"{med['late_ms']:.2f}",
                f"{med['engine_ms']:.1f}", f"{med['load_s']:.2f}", f"{med['replay_mib']:.0f}",
                f"{med['peak_rss_mib']:.0f}",
            )  # fmt: skip
    console.print(table)
    if args.capture is not None:
        captured = [call_us(CaptureFiles(args.capture).comm(r), "in") for r in _captured_ranks(args.capture)]
        every = np.concatenate(captured)
        console.print(
            f"capture (free-running virtual calls) {args.capture}: time in a call, µs median {np.median(every):.0f}, "
            f"p90 {np.percentile(every, 90):.0f}"
        )
    return 0


def _captured_ranks(capture: Path) -> list[int]:
    folder = CaptureFiles(capture).comm(0).parent
    return sorted(int(p.name.split(".")[0].removeprefix("rank")) for p in folder.glob("rank*.comm.json"))


if __name__ == "__main__":
    raise SystemExit(main())
