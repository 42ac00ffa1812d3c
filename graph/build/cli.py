"""``prism-build-graph``: extrapolate a capture into the full-scale execution graph (Parquet), or
build one from Kineto traces recorded by anyone (``--from-traces``)."""

from __future__ import annotations

import dataclasses
import os
import signal
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from prism.graph.build.builder import BuildError, BuildOptions, BuildResult, build_graph
from prism.graph.build.from_traces import TraceBuild, build_from_traces
from prism.graph.build.profiler_overhead import Correction
from prism.graph.io.parquet import GraphFormatError
from prism.graph.io.parts import (
    NotAGraphError,
    graph_bytes,
    refuse_other_directory,
    remove_graph,
    replace_graph,
)
from prism.graph.io.validate import validate_graph
from prism.graph.sim.predict import predict, stage_table
from prism.graph.sim.simulate import SimulationError
from prism.graph.traces.kineto import NormalizeError
from prism.schemas import cli_help
from prism.schemas.cli_command import PrismCommand
from prism.schemas.cluster import load_cluster
from prism.schemas.iterations import DEFAULT_WARMUP, STEADY_CLEAN
from prism.schemas.summary import Summary, write_summary
from prism.schemas.terminal import Table
from prism.schemas.termination import TERMINATION_SIGNALS, stop_on_termination

app = typer.Typer(add_completion=False, help=__doc__)
console = Console(stderr=True)


def _summary(result: BuildResult, out: Path) -> Table:
    report = result.report
    table = Table(title=f"graph of {result.layout} — {out} ({graph_bytes(out) / 2**20:.1f} MiB)")
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_row("ranks", f"{report.ranks:,}")
    table.add_row("nodes", f"{report.nodes:,}")
    table.add_row("collective instances", f"{report.collectives:,}")
    table.add_row("p2p transfers", f"{report.p2p_pairs:,}")
    for kind, nbytes in sorted(report.bytes_by_group.items()):
        table.add_row(f"bytes on the wire per iteration, {kind}", f"{nbytes / 2**30:,.2f} GiB")
    scales = result.time_scales
    table.add_row(
        "profiler correction (unprofiled / profiled)",
        "\n".join(_correction(s) for s in scales.values()) if scales else "none",  # a role a line
    )
    if scales:
        table.add_row(
            "arrival noise (iteration cv, call jitter)", "\n".join(_noise(s) for s in scales.values())
        )
    return table


def _noise(scale: dict) -> str:
    """'25.8 % from 3 iterations, 114 µs (rank 0)': what the skew of the role's collectives grows with."""
    jitter = scale.get("call_jitter_ns")
    per_call = f", {jitter / 1e3:.0f} µs" if jitter is not None else ""
    return f"{100 * scale.get('noise_cv', 0.0):.1f} % from {scale['clean_iterations']} iterations{per_call} (rank {scale['rank']})"


def _unsteady_noise(scales: dict | None) -> str | None:
    """A warning when a role's noise, which every collective's skew grows with (and multiplies its
    error: by 2.4 for a group of 64), rests on fewer clean iterations than ``STEADY_CLEAN``."""
    few = [
        s
        for s in (scales or {}).values()
        if s.get("noise_cv", 0.0) > 0 and s["clean_iterations"] < STEADY_CLEAN
    ]
    if not few:
        return None
    ranks = ", ".join(str(s["rank"]) for s in few)
    fewest = min(s["clean_iterations"] for s in few)
    return (
        f"the arrival noise of rank(s) {ranks} rests on {fewest} clean iteration(s), an unsteady estimate that "
        f"the collectives' skew multiplies (capture with --warmup {DEFAULT_WARMUP} or more)"
    )


NOISY_CV = 0.10
"""Coefficient of variation of a captured rank's clean unprofiled iterations above which the build
warns that the machine was busy while they ran: a quiet 2-vCPU VM gives 2-5 %."""


def _noisy_capture(scales: dict | None) -> str | None:
    """A warning when a captured rank's clean unprofiled iterations, which every time of the graph
    is scaled to, varied by more than ``NOISY_CV``: their median may be a slow spell's."""
    noisy = [s for s in (scales or {}).values() if s.get("noise_cv", 0.0) > NOISY_CV]
    if not noisy:
        return None
    worst = max(noisy, key=lambda s: s["noise_cv"])
    return (
        f"the clean unprofiled iterations of captured rank {worst['rank']} varied by {100 * worst['noise_cv']:.0f} % "
        f"(coefficient of variation; {len(noisy)} rank(s) above {100 * NOISY_CV:.0f} %): the machine was busy while "
        "they ran, and the graph's times are scaled to them; capture again on a quiet machine"
    )


def _correction(scale: dict) -> str:
    """'×0.290 (rank 0; by phase ×0.095–0.420; 7.1 of a profiled 10.0 ms own iteration)': the role's
    factor, the range of its phases', and how much of the profiled iteration it takes out."""
    phases = scale.get("phase_factors") or {}
    by_phase = f"; by phase ×{min(phases.values()):.3f}–{max(phases.values()):.3f}" if phases else ""
    profiled, unprofiled = scale["profiled_ms"], scale["unprofiled_ms"]
    share = f"; {profiled - unprofiled:.1f} of a profiled {profiled:.1f} ms own iteration"
    return f"×{scale['factor']:.3f} (rank {scale['rank']}{by_phase}{share})"


@app.command(cls=PrismCommand)
def build(
    capture: Annotated[
        Path | None,
        typer.Argument(help="Capture directory written by prism-capture (or give --from-traces)."),
    ] = None,
    tp: Annotated[
        int | None, typer.Option(help=f"{cli_help.TP} Must equal the capture's [default: the capture's].")
    ] = None,
    pp: Annotated[int | None, typer.Option(help=f"{cli_help.PP} {cli_help.BUILD_DEFAULT}")] = None,
    dp: Annotated[int | None, typer.Option(help=f"{cli_help.DP} {cli_help.BUILD_DEFAULT}")] = None,
    dp_replicate: Annotated[
        int | None, typer.Option(help=f"{cli_help.DP_REPLICATE_TEXT} {cli_help.BUILD_DEFAULT}")
    ] = None,
    dp_shard: Annotated[
        int | None, typer.Option(help=f"{cli_help.DP_SHARD_TEXT} {cli_help.BUILD_DEFAULT}")
    ] = None,
    cp: Annotated[int | None, typer.Option(help=f"{cli_help.CP_TEXT} {cli_help.BUILD_DEFAULT}")] = None,
    ep: Annotated[int | None, typer.Option(help=f"{cli_help.EP_TEXT} {cli_help.BUILD_DEFAULT}")] = None,
    etp: Annotated[int | None, typer.Option(help=f"{cli_help.ETP_TEXT} {cli_help.BUILD_DEFAULT}")] = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="graph.parquet to write.")] = Path("graph.parquet"),
    microbatches: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Microbatches per iteration [default: the capture's]; a program's passes repeat its steady ones.",
        ),
    ] = None,
    layers: Annotated[
        int | None, typer.Option(min=1, help="Transformer layers [default: the capture's].")
    ] = None,
    cluster: Annotated[str, typer.Option(help=cli_help.CLUSTER)] = "h100-ib",
    ranks_per_row_group: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Ranks per Parquet row group [default: 32]; a graph of over 512 row groups is a directory of part files of 512 each.",
        ),
    ] = None,
    simulate: Annotated[
        bool, typer.Option(help="Simulate the graph and write summary.json beside it.")
    ] = True,
    profiler_correction: Annotated[
        Correction,
        typer.Option(
            help="Scale compute to the captured ranks' unprofiled iterations (needs a capture with --warmup >= 3): "
            "each phase by its own ratio (CPU captures; else as 'role'), one ratio per role, or none."
        ),
    ] = Correction.PHASE,
    from_traces: Annotated[
        Path | None,
        typer.Option(
            help="Build from a directory of Kineto traces recorded by anyone (torch.profiler with CUDA "
            "activities), one file per rank, instead of a capture: layout from their distributedInfo."
        ),
    ] = None,
    step: Annotated[
        int | None,
        typer.Option(
            help="With --from-traces: the ProfilerStep to build [default: the last every trace holds]."
        ),
    ] = None,
    whole_trace: Annotated[
        bool,
        typer.Option(
            help="With --from-traces: each trace's whole window is the step (traces recorded without "
            "torch.profiler's schedule have no ProfilerStep)."
        ),
    ] = False,
) -> None:
    """Build the full-scale graph of the captured job at the target layout, then validate it."""
    if (capture is None) == (from_traces is None):
        _fail("give a capture directory, or --from-traces DIR (not both)")
    degrees = {"tp": tp, "pp": pp, "dp": dp, "dp_replicate": dp_replicate, "dp_shard": dp_shard, "cp": cp, "ep": ep,
               "etp": etp}  # fmt: skip
    if from_traces is not None and any(v is not None for v in (*degrees.values(), microbatches, layers)):
        _fail(
            "--from-traces takes the layout from the traces: give no layout degrees, --microbatches or --layers"
        )
    if from_traces is None and (step is not None or whole_trace):
        _fail("--step and --whole-trace are for --from-traces")
    if step is not None and whole_trace:
        _fail("give --step or --whole-trace, not both")
    try:
        refuse_other_directory(out)  # before any work, not at the end when the graph is put there
        out.parent.mkdir(parents=True, exist_ok=True)
    except NotAGraphError as e:
        _fail(f"{e}; give another output")
    except OSError as e:
        _fail(f"cannot write {out}: {e.strerror or e}")
    # graph.parquet and its summary.json are built beside their places and put there together.
    summary_path = out.with_name("summary.json")
    staged, staged_summary = (p.with_name(f".{p.name}.{os.getpid()}.new") for p in (out, summary_path))
    placed = False
    try:
        with Progress(
            TextColumn("[bold]building"), BarColumn(), MofNCompleteColumn(), TextColumn("ranks"),
            TimeElapsedColumn(), console=console,
        ) as progress:  # fmt: skip
            task = progress.add_task("build", total=None)
            on_rank = lambda done, total: progress.update(task, completed=done, total=total)  # noqa: E731
            if from_traces is not None:
                result: BuildResult | TraceBuild = build_from_traces(
                    from_traces, staged, step=step, whole=whole_trace, on_rank=on_rank
                )
                report = validate_graph(staged)
                if not report.ok:
                    raise ValueError(f"the graph built from the traces is not valid: {report.problems[0]}")
                window = "whole windows" if whole_trace else f"ProfilerStep#{result.step}"
                title = f"graph of {result.layout} from the traces' {window}"
            else:
                options = BuildOptions(
                    capture_dir=capture, out=staged, **degrees, cluster=load_cluster(cluster),
                    microbatches=microbatches, layers=layers, ranks_per_row_group=ranks_per_row_group,
                    profiler_correction=profiler_correction, simulated_after=simulate,
                )  # fmt: skip
                result = build_graph(options, on_rank)
                title = f"predicted iteration of {result.layout} on {options.cluster.name}"
        summary = dataclasses.replace(predict(staged), graph=str(out)) if simulate else None
        if summary is not None:
            write_summary(summary, staged_summary)
        _put_in_place(staged, out, staged_summary if summary is not None else None, summary_path)
        placed = True
    except (BuildError, NormalizeError, GraphFormatError, SimulationError, ValueError, OSError) as e:
        _fail(str(e))
    except KeyboardInterrupt:
        what = (
            "written" if placed else f"not written (a {out.name} and summary there before are as they were)"
        )
        console.print(f"[bold red]interrupted[/]: {out} was {what}")
        raise typer.Exit(130) from None
    finally:
        remove_graph(staged)
        staged_summary.unlink(missing_ok=True)
    if isinstance(result, TraceBuild):
        console.print(_traces_table(result, out, summary))
    else:
        console.print(_summary(result, out))
        for warning in (_unsteady_noise(result.time_scales), _noisy_capture(result.time_scales)):
            if warning is not None:
                console.print(f"[yellow]warning:[/] {warning}", highlight=False, soft_wrap=True)
        for line in result.warnings:
            console.print(f"[yellow]warning:[/] {line}", highlight=False, soft_wrap=True)
    if summary is not None:
        console.print(stage_table(summary, title))
        console.print(f"wrote {summary_path}")


def _fail(message: str) -> NoReturn:
    console.print(f"[bold red]error:[/] {message.splitlines()[0]}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


def _traces_table(result: TraceBuild, out: Path, summary: Summary | None) -> Table:
    """Each traced rank: its file, the step as recorded and as simulated."""
    table = Table(title=f"graph of {result.layout} from traces — {out} ({graph_bytes(out) / 2**20:.1f} MiB)")
    for column in ("rank", "trace", "streams", "recorded step ms", "simulated ms", "error"):
        table.add_column(column, justify="left" if column in ("trace", "streams") else "right")
    for rank, traced in result.traced.items():
        simulated = summary.ranks["iteration_ns"][rank] if summary is not None else None
        table.add_row(
            str(rank), traced.path.name, str(len(traced.lanes)), f"{traced.recorded_ns / 1e6:.3f}",
            "" if simulated is None else f"{simulated / 1e6:.3f}",
            "" if simulated is None else f"{100 * (simulated / traced.recorded_ns - 1):+.2f}%",
        )  # fmt: skip
    if result.filled_from:
        sources = sorted(set(result.filled_from.values()))
        table.caption = (
            f"{len(result.filled_from)} rank(s) without a trace took the rows of rank(s) {sources}"
        )
    return table


def _put_in_place(staged: Path, out: Path, staged_summary: Path | None, summary_path: Path) -> None:
    """Both files into place, no signal between them: a summary.json is always of the graph beside it
    (none with --no-simulate)."""
    stops = {signal.SIGINT, *TERMINATION_SIGNALS}
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, stops)
    try:
        replace_graph(staged, out)
        if staged_summary is not None:
            os.replace(staged_summary, summary_path)
        else:
            summary_path.unlink(missing_ok=True)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def main() -> None:
    stop_on_termination()
    app()


if __name__ == "__main__":
    main()
