"""What a gloo all-reduce costs while its members compute, against the same call with them idle.

    .venv/bin/python benchmarks/overlap_calls.py [--sizes 65536 524288 1048576 8388608] [--rounds 30]
                                                 [--span-ms 20] [--json FILE]

DDP issues its bucket all-reduces from backward and goes on computing; on a CPU test bed the
call's ring steps then run on gloo's threads beside both ranks' compute. Two processes (one
torch thread each, as the fidelity runs' ranks) time, round after round, each size two ways:
**idle**, the call issued and waited on at once (as ``prism-calibrate`` times it); and
**computing**, the call issued and the member then running matmuls for at least ``--span-ms``
and until the call has completed, polling it between them (a matmul is 10-20 µs, the poll's
resolution). A call's latency runs from the later member's issue to its completion as the
member saw it, mean over members. Also per size: the members' matmul rate while the call is in
flight against a span with no call (1.0: the call takes nothing from the compute). The method
is ``prism.graph.comm.bench.run_busy_benchmark``, which ``prism-calibrate --busy-rounds`` runs
for the spec's ``busy_call`` table (the ratio of the means).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from prism.graph.comm.bench import BUSY_CHUNK, run_busy_benchmark


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[65536, 524288, 1048576, 8388608])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--span-ms", type=float, default=20.0)
    parser.add_argument("--json", type=Path, help="also write the summary here")
    args = parser.parse_args()
    if any(n <= 0 or n % 4 for n in args.sizes):
        parser.error("--sizes are bytes of float32 tensors: positive multiples of 4")
    samples = run_busy_benchmark(
        sizes=tuple(args.sizes), rounds=args.rounds, warmup=args.warmup, span_s=args.span_ms / 1e3
    )
    table = Table(title="2-process gloo all-reduce: mean latency after the later issue (ms)")
    for name in ("bytes", "members idle", "members computing", "ratio", "compute rate in flight"):
        table.add_column(name, justify="right")
    for s in samples:
        table.add_row(
            f"{s.bytes:,}",
            f"{s.idle_s * 1e3:.2f}",
            f"{s.busy_s * 1e3:.2f}",
            f"{s.factor:.2f}",
            f"{s.compute_rate:.2f}",
        )
    Console(width=140).print(table)
    print(
        f"{args.rounds} rounds ({args.warmup} more untimed), each size idle, computing for at least {args.span_ms:g} ms "
        f"and computing with no call, in turn; a {BUSY_CHUNK}x{BUSY_CHUNK} matmul between polls"
    )
    if args.json:
        args.json.write_text(
            json.dumps([dataclasses.asdict(s) | {"factor": s.factor} for s in samples], indent=2)
        )


if __name__ == "__main__":
    main()
