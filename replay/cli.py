"""``prism-replay``: run real ranks of the graph's job against its virtual participants."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from prism.capture.cli import parse_ranks, print_error
from prism.capture.progress import RankProgress
from prism.graph.io.validate import GraphValidationError, validate_graph
from prism.graph.sim.whatif import WhatIfError, parse_delay
from prism.replay.runtime import ReplayDiverged, ReplayInputError, ReplayOptions, check_inputs, run_replay
from prism.schemas import cli_help
from prism.schemas.cli_command import PrismCommand
from prism.schemas.iterations import DEFAULT_WARMUP
from prism.schemas.replay import RankReport, ReplayReport
from prism.schemas.terminal import Table
from prism.schemas.termination import stop_on_termination

app = typer.Typer(add_completion=False, help=__doc__)
console = Console(stderr=True)


@app.command(cls=PrismCommand)
def replay(
    graph: Annotated[Path, typer.Argument(help=cli_help.GRAPH_IN)],
    rank: Annotated[
        list[int], typer.Option("--rank", "-r", help="Global rank to run for real (repeatable).")
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="Replay directory to create.")] = Path(
        "replay-out"
    ),
    warmup: Annotated[int, typer.Option(help=cli_help.WARMUP)] = DEFAULT_WARMUP,
    iterations: Annotated[int, typer.Option(help=cli_help.ITERATIONS)] = 2,
    device: Annotated[str | None, typer.Option(help="cpu or cuda [default: the graph's].")] = None,
    threads: Annotated[int, typer.Option(help=cli_help.THREADS)] = 1,
    trace_peers: Annotated[
        str, typer.Option(help="Virtual ranks to write Chrome traces of, e.g. 0,8,122.")
    ] = "",
    delay: Annotated[
        list[str],
        typer.Option(
            help="PHASE[,layer=L]:+DURATION[@RANK]: make the real rank a straggler, e.g. optim:+5ms (repeatable)."
        ),
    ] = [],  # noqa: B006
    separately: Annotated[
        bool,
        typer.Option(help="Run several --rank one after another, each the only real rank, not all at once."),
    ] = False,
    pin: Annotated[
        bool,
        typer.Option(
            help="On CPU, hold each real rank to cores of its own and the co-simulation to the rest, "
            "where a core is left for it."
        ),
    ] = False,
    host_work: Annotated[
        bool,
        typer.Option(
            help="On CPU, let each real rank do the host-side work of its virtual collectives (gloo's "
            "copies and reductions) where the graph's cluster spec measured it."
        ),
    ] = True,
    overwrite: Annotated[bool, typer.Option(help=cli_help.OVERWRITE)] = False,
    rank_timeout: Annotated[float, typer.Option(min=1.0, help=cli_help.RANK_TIMEOUT)] = 1800.0,
    validate: Annotated[
        bool, typer.Option(help="Check the whole graph first, as prism-validate-graph does.")
    ] = False,
    program: Annotated[
        list[str] | None,
        typer.Argument(
            help="-- train.py ARGS (or -- -m module ARGS): for a graph of your own program, the program "
            "to run [default: the one the graph was captured from]."
        ),
    ] = None,
) -> None:
    """Run RANK(s) of GRAPH's job for real, every other rank virtual, timed by the graph."""
    try:
        delays = tuple(parse_delay(d) for d in delay)
    except WhatIfError as e:
        console.print(f"[bold red]error:[/] {e}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    options = ReplayOptions(
        graph=graph, ranks=tuple(rank), out_dir=out, warmup=warmup, iterations=iterations, device=device,
        threads=threads, trace_peers=parse_ranks(trace_peers), delays=delays, separately=separately, overwrite=overwrite, timeout_s=rank_timeout,
        program=tuple(program or ()), pin=pin, host_work=host_work,
    )  # fmt: skip
    try:  # bad input is one line, before anything starts
        check_inputs(options)
        if validate:
            validate_graph(graph).raise_if_failed()
    except (ReplayInputError, GraphValidationError) as e:
        console.print(f"[bold red]error:[/] {str(e).splitlines()[0]}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    console.print(
        f"[bold]prism-replay[/] {graph}: rank(s) {', '.join(map(str, rank))} real, every other virtual"
    )
    progress = RankProgress(console, {r: f"rank {r} (real)" for r in rank})
    try:
        with progress:
            for r in rank:
                progress.starting(r)
            report = run_replay(options, progress)
    except (ReplayInputError, ReplayDiverged) as e:
        print_error(e, console)  # with a failed rank's last log lines: its log went with the temporary output
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        console.print("[bold red]interrupted[/]: nothing was written")
        raise typer.Exit(130) from None
    console.print(report_table(report))
    console.print(engine_table(report))
    for r in report.ranks:
        console.print(phase_table(r))
    console.print(f"wrote {out / 'report.json'}")


def _mib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:.3f}"


def _pct(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:+.{digits}f}%"


def report_table(report: ReplayReport) -> Table:
    table = Table(title=f"replay of {report.layout} ({report.device}): measured vs predicted")
    columns = (
        "rank",
        "role",
        "wall ms",
        "predicted",
        "error",
        "corrected ms",
        "error",
        "peak MiB",
        "predicted",
        "error",
    )
    for c in columns:
        table.add_column(c, justify="left" if c == "role" else "right")
    for r in report.ranks:
        wall = "-" if r.wall_iter_ms is None else f"{r.wall_iter_ms:.2f}"
        table.add_row(
            str(r.rank), r.role, wall, f"{r.predicted_iter_ms:.2f}", _pct(r.wall_err_pct),
            f"{r.measured_iter_ms:.2f}", _pct(r.iter_err_pct),
            _mib(r.measured_peak_bytes), _mib(r.predicted_peak_bytes), _pct(r.mem_err_pct, 3),
        )  # fmt: skip
    table.caption = (
        "wall: clean unprofiled iterations (median), as the program took them; corrected: the same "
        "with the co-simulation's stall taken out (a rank replayed alone); predicted: offline simulation"
    )
    return table


def engine_table(report: ReplayReport) -> Table:
    table = Table(title="the co-simulation per iteration")
    for c in ("rank", "calls", "engine ms", "stall ms", "replay MiB"):
        table.add_column(c, justify="right")
    for r in report.ranks:
        table.add_row(
            str(r.rank), str(r.calls_per_iter), f"{r.engine_ms_per_iter:.2f}", f"{r.stall_ms_per_iter:.2f}",
            _mib(r.replay_rss_bytes),
        )  # fmt: skip
    table.caption = (
        "engine: the co-simulation's time per pass; stall: time the co-simulation held the rank (its work in "
        "the rank's thread, answers found late; taken out of its time when it is the only real rank)"
    )
    return table


def phase_table(rank: RankReport) -> Table:
    table = Table(title=f"rank {rank.rank}: where the iteration goes (ms)")
    for c in ("phase", "measured", "predicted", "difference"):
        table.add_column(c, justify="left" if c == "phase" else "right")
    for p in rank.phases:
        table.add_row(
            p.phase, f"{p.measured_ms:.2f}", f"{p.predicted_ms:.2f}", f"{p.measured_ms - p.predicted_ms:+.2f}"
        )
    return table


def main() -> None:
    stop_on_termination()
    app()


if __name__ == "__main__":
    main()
