"""Fidelity judged by family: records pooled by what they emulate, each pool's bias against its
interval and its median error against the floor's.

One record's error cannot show a few percent on a noisy machine; a method's error repeats across
the cases of a family and noise does not. A *family* is what a record emulates: the built-in
GPT's ranks by kind (data, tensor parallel, a pipeline's first or last stage, several at once)
or one program at one layout (``examples/ddp.py dp=2``, ``torchtitan llama3 cp=2``; one built
from a capture at fewer layers is a family of its own). For each
family and source (simulation, replay, ...) a row gives the mean signed iteration error with
its 95 % interval, the median |error|, and the median |error| of the family's real runs against
real runs (the ``floor`` records of ``benchmarks/noise_floor.py``), and says whether the row
meets the targets below.
"""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

MAX_BIAS_PCT = 1.0
"""|mean signed error| a family may keep."""
MAX_INTERVAL_PCT = 1.5
"""Half-width of the bias's 95 % interval that resolves it."""
ABOVE_FLOOR_PCT = 1.0
"""How far the median |error| may sit above the floor's median."""
MIN_RECORDS = 40
"""Records a family and source needs before its bias is judged."""
FLOOR = "floor"
Z95 = statistics.NormalDist().inv_cdf(0.975)

_LAYOUT = re.compile(r"\(([^()]*)\)\s*$")
BUILT_AT = re.compile(r" built at \d+ layers from ")
"""How a program case's label says its graph was built at another layer count than captured
(``prism.fidelity.program_case.ProgramCase.label``)."""


def _degrees(text: str) -> dict[str, int]:
    return {k: int(v) for k, v in (item.split("=", 1) for item in text.split() if "=" in item) if v.isdigit()}


def family_of(record: dict) -> str:
    """What ``record`` emulates (see the module's docstring)."""
    case, rank = record["case"], int(record["rank"])
    if case.startswith("tp="):  # a built-in GPT case: its layout leads the case
        degrees = {axis: _degrees(case).get(axis, 1) for axis in ("tp", "pp", "dp")}
        parallel = [axis for axis, size in degrees.items() if size > 1]
        if len(parallel) > 1:
            return "GPT mixed"
        if parallel == ["pp"]:
            return "GPT pp first stage" if rank == 0 else "GPT pp last stage"
        return f"GPT {parallel[0] if parallel else 'single'}"
    layout = _LAYOUT.search(case)
    degrees = _degrees(layout.group(1)) if layout else {}
    where = " ".join(f"{axis}={size}" for axis, size in degrees.items() if size > 1) or "one rank"
    words = case.split()
    if BUILT_AT.search(case):  # a program captured at fewer layers, built at its own count
        where = f"{where} built from fewer layers"
    if words[:2] == ["-m", "torchtitan.train"]:
        model = words[words.index("--module") + 1] if "--module" in words[:-1] else "?"
        return f"torchtitan {model} {where}"
    return f"{words[0]} {where}"


@dataclass(frozen=True, kw_only=True)
class FamilyRow:
    """One family and source, judged."""

    family: str
    source: str
    records: int
    bias_pct: float
    """Mean signed iteration error."""
    interval_pct: float
    """Half-width of the bias's 95 % interval (normal: the targets' pools hold 40 records or more)."""
    median_abs_pct: float
    floor_median_pct: float | None
    """Median |error| of the family's real runs against real runs; None where none was measured."""
    max_memory_pct: float

    @property
    def verdict(self) -> str:
        """'meets', or what the row misses by."""
        if self.records < MIN_RECORDS:
            return f"{self.records} of {MIN_RECORDS} records"
        misses = []
        if abs(self.bias_pct) > MAX_BIAS_PCT:
            misses.append(f"bias {self.bias_pct:+.1f}%")
        if self.interval_pct > MAX_INTERVAL_PCT:
            misses.append(f"interval ±{self.interval_pct:.1f}%")
        if self.floor_median_pct is None:
            misses.append("no floor")
        elif self.median_abs_pct > self.floor_median_pct + ABOVE_FLOOR_PCT:
            misses.append(f"median {self.median_abs_pct - self.floor_median_pct:+.1f} over floor")
        if self.max_memory_pct > 0:
            misses.append(f"memory {self.max_memory_pct:.2g}%")
        return "meets" if not misses else ", ".join(misses)

    @property
    def biased(self) -> bool:
        """The bias is beyond its interval: the method, not noise, keeps its sign."""
        return abs(self.bias_pct) > self.interval_pct


def family_rows(records: Iterable[dict]) -> list[FamilyRow]:
    """Every family and source of ``records`` (``floor`` records give the floors), sorted."""
    pooled: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for record in records:
        pooled[(family_of(record), record["source"])].append(record)
    floors = {
        family: statistics.median(abs(r["iter_err_pct"]) for r in pool)
        for (family, source), pool in pooled.items()
        if source == FLOOR
    }
    rows = []
    for (family, source), pool in sorted(pooled.items()):
        if source == FLOOR:
            continue
        errors = [float(r["iter_err_pct"]) for r in pool]
        spread = statistics.stdev(errors) if len(errors) > 1 else float("inf")
        rows.append(
            FamilyRow(
                family=family,
                source=source,
                records=len(errors),
                bias_pct=statistics.fmean(errors),
                interval_pct=Z95 * spread / len(errors) ** 0.5,
                median_abs_pct=statistics.median(abs(e) for e in errors),
                floor_median_pct=floors.get(family),
                max_memory_pct=max(abs(float(r.get("mem_err_pct") or 0.0)) for r in pool),
            )
        )
    return rows
