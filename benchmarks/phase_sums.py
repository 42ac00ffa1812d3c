"""Is a median iteration the sum of its parts' medians? Over the real runs of a kept fidelity run.

    .venv/bin/python benchmarks/phase_sums.py WORK_DIR [WORK_DIR ...]

For every real run (``WORK_DIR/<case>/repeat<i>/real``, a ``benchmarks/fidelity.py --work-dir``)
and rank, over its clean unprofiled iterations: the median iteration, against the sum of its
parts' medians and the sum of their means (the parts: the own time of each kind of block, and the
time in collectives, which add up to each iteration exactly in a run without point-to-point
transfers; pipeline runs, whose waits for their neighbours are in neither, are left out). The
graph holds each block at its captured rank's median and each collective at a calibrated mean;
a part with a heavy right tail (a gloo call that sits for milliseconds one time in ten) puts the
median of the whole above the sum of the parts' medians.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from rich.console import Console
from rich.table import Table

from prism.schemas.iterations import clean_unprofiled
from prism.schemas.manifest import read_manifest


def rank_sums(result, warmup: int) -> tuple[float, float, float] | None:
    """(median iteration, sum of the parts' medians, sum of their means), ms; None without parts."""
    iterations = clean_unprofiled(result.iteration_ns, warmup)
    phases = clean_unprofiled(result.phase_ns, warmup)
    collective = clean_unprofiled(result.collective_ns, warmup)
    if not iterations or not phases or not collective:
        return None
    parts = [[p.get(kind, 0) for p in phases] for kind in sorted({k for p in phases for k in p})]
    parts.append(list(collective))
    return (
        statistics.median(iterations) / 1e6,
        sum(statistics.median(v) for v in parts) / 1e6,
        sum(statistics.fmean(v) for v in parts) / 1e6,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("work_dirs", type=Path, nargs="+")
    args = parser.parse_args()
    table = Table(title="median iteration vs the sum of its parts (real runs, ms)")
    for column in ("case", "repeat", "rank", "median iteration", "sum of medians", "sum of means"):
        table.add_column(column, justify="left" if column == "case" else "right")
    above_medians, above_means = [], []
    for real in sorted(r for d in args.work_dirs for r in d.glob("*/repeat*/real")):
        if "pp1" not in real.parent.parent.name:
            continue
        manifest = read_manifest(real)
        for rank in manifest.ranks:
            sums = rank_sums(rank.result, manifest.job.warmup)
            if sums is None:
                continue
            median, of_medians, of_means = sums
            above_medians.append(100 * (median / of_medians - 1))
            above_means.append(100 * (median / of_means - 1))
            table.add_row(
                real.parent.parent.name, real.parent.name.removeprefix("repeat"), str(rank.rank), f"{median:.2f}",
                f"{of_medians:.2f} ({above_medians[-1]:+.1f} %)", f"{of_means:.2f} ({above_means[-1]:+.1f} %)",
            )  # fmt: skip
    console = Console(width=160)
    console.print(table)
    if above_medians:
        console.print(
            f"{len(above_medians)} rank runs: the median iteration is {statistics.fmean(above_medians):+.1f} % "
            f"(median {statistics.median(above_medians):+.1f} %) from the sum of its parts' medians, "
            f"{statistics.fmean(above_means):+.1f} % (median {statistics.median(above_means):+.1f} %) from the sum of their means"
        )


if __name__ == "__main__":
    main()
