"""The fidelity run's tables (rich) and the facts of the machine it ran on."""

from __future__ import annotations

import datetime as dt
import os
import platform
from pathlib import Path

from prism.fidelity.compare import final_records, mean_abs
from prism.schemas.terminal import Table


def machine() -> dict:
    """The facts docs/fidelity.md quotes about the machine a table was measured on."""
    model = next(
        (line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")),
        platform.processor(),
    ) if Path("/proc/cpuinfo").exists() else platform.processor()  # fmt: skip
    return {
        "nproc": os.cpu_count(),
        "cpu_model": model,
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "platform": platform.platform(),
    }


def _mib(n: int) -> str:
    return f"{n / 2**20:.3f}"


def case_ids(records: list[dict]) -> dict[str, str]:
    """Short ids (C1, C2, ...) of the cases, in order of appearance."""
    labels = list(dict.fromkeys(r["case"] for r in records))
    return {label: f"C{i + 1}" for i, label in enumerate(labels)}


def legend_table(ids: dict[str, str]) -> Table:
    table = Table(title="cases")
    table.add_column("id")
    table.add_column("case")
    for label, short in ids.items():
        table.add_row(short, label)
    return table


SOURCE_TITLES = {
    "simulation": "simulation",
    "paced": "simulation of the paced capture's graph",
    "replay": "replay of each captured rank against the graph (its wall time)",
    "final": "simulation of the graph each case ends with (paced where captured paced, else the slice's)",
    "floor": "a second real run where the prediction stands (A/A: the error of a perfect prediction)",
}


def records_table(records: list[dict], ids: dict[str, str], source: str = "simulation") -> Table:
    what = SOURCE_TITLES[source]
    table = Table(title=f"fidelity: {what} vs every rank real")
    for column in (
        "case",
        "rank",
        "real ms (± SE)",
        "pred ms",
        "iter err",
        "paired err (± SE)",
        "real peak MiB",
        "pred peak MiB",
        "mem err",
    ):
        table.add_column(column, justify="left" if column == "case" else "right")
    corrected = any("pred_corrected_ms" in r for r in records)
    if corrected:
        table.add_column("corrected ms (err)", justify="right")
    for r in records:
        row = [
            ids[r["case"]], str(r["rank"]), f"{r['real_iter_ms']:.1f}{_sem(r)}", f"{r['pred_iter_ms']:.1f}",
            f"{r['iter_err_pct']:+.1f}%", _paired(r), _mib(r["real_peak_bytes"]), _mib(r["pred_peak_bytes"]),
            f"{r['mem_err_pct']:+.3f}%",
        ]  # fmt: skip
        if corrected:
            row.append(
                f"{r['pred_corrected_ms']:.1f} ({r['corrected_err_pct']:+.1f}%)"
                if "pred_corrected_ms" in r
                else ""
            )
        table.add_row(*row)
    sems = [r["real_sem_pct"] for r in records if r["real_sem_pct"] is not None]
    noise = f"; the real medians' own standard error: mean {sum(sems) / len(sems):.1f}%" if sems else ""
    drifts = [r["real_bracket_drift_pct"] for r in records if r.get("real_bracket_drift_pct") is not None]
    moved = (
        f"; real runs before/after the replay differ by {sum(drifts) / len(drifts):.1f}% (mean)"
        if drifts
        else ""
    )
    aa = [r for r in records if r.get("real_after_vs_before_pct") is not None]
    if aa:  # the noise floor measured beside the prediction (benchmarks/noise_floor.py measures it alone)
        moved += f"; after vs before, median against median (A/A): mean |error| {mean_abs(aa, 'real_after_vs_before_pct'):.1f}%"
    noisy = sum(r["within_noise"] for r in records)
    within = f"; {noisy} of {len(records)} errors within how far the real side itself moved" if noisy else ""
    table.caption = (
        f"mean |iteration error| {mean_abs(records, 'iter_err_pct'):.1f}% (of the medians), "
        f"{mean_abs(records, 'paired_err_pct'):.1f}% (paired: median of each repeat's error), "
        f"mean |memory error| {mean_abs(records, 'mem_err_pct'):.3f}%{noise}{moved}{within}"
    )
    return table


_OWN = (
    "forward/backward/optimizer/other: own time in those blocks, each with the glue led into it "
    "(calls excluded; clean unprofiled iterations); communication: in collective calls and waits on them; bubble: the rest of the "
    "iteration (point-to-point calls); error: (predicted - real) / real"
)
_BLOCKS = (
    "forward/backward/optimizer: wall time in those blocks, the calls made inside them included "
    "(a program's phase marks; clean unprofiled iterations; simulated: each node's time, a call's "
    "wait with it); other: the rest of the iteration; error: (predicted - real) / real"
)
_PHASE_TITLES = {
    ("simulation", "phase_err"): ("simulation: each rank's iteration by phase, real vs simulated", _OWN),
    ("replay", "phase_err"): ("replay: each replayed rank's wall iteration by phase, real vs replayed", _OWN),
    ("simulation", "block_err"): ("simulation: each rank's iteration by block, real vs simulated", _BLOCKS),
    ("replay", "block_err"): (
        "replay: each replayed rank's wall iteration by block, real vs replayed",
        _BLOCKS,
    ),
    ("floor", "phase_err"): ("A/A: each rank's iteration by phase, real vs its twin real run", _OWN),
    ("floor", "block_err"): ("A/A: each rank's iteration by block, real vs its twin real run", _BLOCKS),
    ("replay", "graph_phase_err"): (
        "replay: each replayed rank's time by phase, as replayed vs the graph's",
        "measured: the replayed rank's time between its calls and in them, by the phase of the graph's "
        "nodes there; error: (graph - replayed) / replayed",
    ),
}


def phase_table(
    records: list[dict], ids: dict[str, str], source: str = "replay", key: str = "phase_err"
) -> Table:
    """Each record's time by phase against its prediction (``key``: ``phase_err``, against the
    real run; ``graph_phase_err``, a replay against its graph), so that a total right by
    cancellation shows as such."""
    title, caption = _PHASE_TITLES[(source, key)]
    table = Table(title=title)
    for column in ("case", "rank", "phase", "measured ms", "predicted ms", "error"):
        table.add_column(column, justify="left" if column in ("case", "phase") else "right")
    for r in records:
        for phase, p in (r.get(key) or {}).items():
            error = "" if p["err_pct"] is None else f"{p['err_pct']:+.1f}%"
            table.add_row(
                ids[r["case"]],
                str(r["rank"]),
                phase,
                f"{p['measured_ms']:.2f}",
                f"{p['predicted_ms']:.2f}",
                error,
            )
    table.caption = caption
    return table


def summary_table(records: list[dict], ids: dict[str, str], worst: int = 3) -> Table:
    """Per source, the mean and max |iteration error| over every rank, the worst cases, and memory."""
    table = Table(title="summary: |error| over every rank of every case")
    for column in (
        "source",
        "ranks",
        "mean iter err",
        "max iter err",
        f"worst {worst}",
        "mean mem err",
        "max mem err",
    ):
        table.add_column(column, justify="left" if column in ("source", f"worst {worst}") else "right")
    records = records + final_records(records)
    for source in SOURCE_TITLES:
        rows = [r for r in records if r["source"] == source]
        if not rows:
            continue
        ranked = sorted(rows, key=lambda r: -abs(r["iter_err_pct"]))
        top = ", ".join(
            f"{ids[r['case']]} rank {r['rank']} {r['iter_err_pct']:+.1f}%" for r in ranked[:worst]
        )
        table.add_row(
            source, str(len(rows)), f"{mean_abs(rows, 'iter_err_pct'):.1f}%", f"{abs(ranked[0]['iter_err_pct']):.1f}%",
            top, f"{mean_abs(rows, 'mem_err_pct'):.3f}%", f"{max(abs(r['mem_err_pct']) for r in rows):.3f}%",
        )  # fmt: skip
    table.caption = (
        "replay: the replayed rank's wall time; final: the paced graph's simulation where a case "
        "was captured paced, else the slice's; memory: peak"
    )
    return table


def _sem(record: dict) -> str:
    sem = record["real_sem_pct"]
    return "" if sem is None else f" (±{sem:.1f}%)"


def _paired(record: dict) -> str:
    se = record["paired_se_pct"]
    return f"{record['paired_err_pct']:+.1f}%" + ("" if se is None else f" (±{se:.1f})")


def breakdown_table(rows: list[dict], ids: dict[str, str]) -> Table:
    table = Table(
        title="where an iteration goes (ms): real run / slice capture (profiled iterations) / simulation (unprofiled)"
    )
    table.add_column("case")
    table.add_column("rank", justify="right")
    for part in ("compute", "comm_wait", "glue"):
        table.add_column(part.replace("_", "+"), justify="right")
    for r in rows:
        cells = [f"{r[f'real_{p}_ms']:.1f} / {r[f'slice_{p}_ms']:.1f} / {r[f'pred_{p}_ms']:.1f}" for p in ("compute", "comm_wait", "glue")]  # fmt: skip
        table.add_row(ids[r["case"]], str(r["rank"]), *cells)
    return table


def profiler_table(rows: list[dict], records: list[dict], ids: dict[str, str]) -> Table:
    """Whole iterations with and without the profiler, real run and slice, beside the prediction."""
    table = Table(title="iteration (ms): unprofiled / profiled, and the prediction")
    columns = ("case", "rank", "real", "slice rank", "real ratio", "slice ratio", "prediction")
    for column in columns:
        table.add_column(column, justify="left" if column == "case" else "right")
    for r, rec in zip(rows, records, strict=True):
        table.add_row(
            ids[r["case"]], str(r["rank"]),
            f"{r['real_unprofiled_ms']:.1f} / {r['real_profiled_ms']:.1f}",
            f"{r['slice_unprofiled_ms']:.1f} / {r['slice_profiled_ms']:.1f}",
            f"{r['real_unprofiled_ms'] / r['real_profiled_ms']:.3f}",
            f"{r['slice_unprofiled_ms'] / r['slice_profiled_ms']:.3f}", f"{rec['pred_iter_ms']:.1f}",
        )  # fmt: skip
    table.caption = "ratio = unprofiled / profiled; the build scales the slice's compute by the slice ratio"
    return table


def memory_table(rows: list[dict], ids: dict[str, str]) -> Table:
    table = Table(title="memory the iteration allocates at its peak (static bytes left out), MiB")
    for column in ("case", "rank", "real", "slice", "simulation", "real drift / iteration"):
        table.add_column(column, justify="left" if column == "case" else "right")
    for r in rows:
        table.add_row(
            ids[r["case"]], str(r["rank"]), _mib(r["real_dynamic_bytes"]), _mib(r["slice_dynamic_bytes"]),
            _mib(r["pred_dynamic_bytes"]), _mib(r["real_drift_bytes_per_iter"]),
        )  # fmt: skip
    return table


def collectives_table(rows: list[dict], ids: dict[str, str]) -> Table:
    table = Table(title="real gloo calls (every rank real) vs the comm model; send = a send and its recv")
    for column in ("case", "op", "bytes", "calls", "latency µs median / mean", "skew µs median", "model µs"):
        table.add_column(column, justify="left" if column in ("case", "op") else "right")
    for r in rows:
        table.add_row(
            ids[r["case"]], r["op"], str(r["bytes"]), str(r["calls"]),
            f"{r['latency_median_us']:.0f} / {r['latency_mean_us']:.0f}", f"{r['skew_median_us']:.0f}",
            f"{r['model_us']:.0f}",
        )  # fmt: skip
    return table


def hook_table(rows: list[dict], ids: dict[str, str]) -> Table:
    """The real run's timing hook (its own cost at each optimizer step) and its phase marks."""
    table = Table(
        title="the real run's iteration-timing hook (its cost at each optimizer step) and phase marks "
        "(their cost in an iteration), medians"
    )
    for column in ("case", "rank", "hook µs", "hook % of iteration", "marks µs", "marks % of iteration"):
        table.add_column(column, justify="left" if column == "case" else "right")
    for r in rows:
        marks = r.get("marks_us")
        table.add_row(
            ids[r["case"]], str(r["rank"]), f"{r['hook_us']:.1f}", f"{r['hook_pct_of_iter']:.3f}%",
            "" if marks is None else f"{marks:.1f}", "" if marks is None else f"{r['marks_pct_of_iter']:.3f}%",
        )  # fmt: skip
    return table
