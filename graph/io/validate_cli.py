"""``prism-validate-graph``: check that a graph.parquet is a complete, consistent full-scale graph."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from prism.graph.io.parquet import GraphFormatError
from prism.graph.io.validate import ValidationReport, validate_graph
from prism.schemas.cli_command import PrismCommand
from prism.schemas.terminal import Table
from prism.schemas.termination import stop_on_termination

SHOWN_PROBLEMS = 20
app = typer.Typer(add_completion=False, help=__doc__)
console = Console(stderr=True)


def _error(message: str) -> None:
    # Text, not markup: problem lines hold brackets and quotes that rich would interpret.
    console.print(Text.assemble(("error:", "bold red"), " ", message), soft_wrap=True, highlight=False)


def _size(nbytes: int) -> str:
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{nbytes} B"


def _summary(report: ValidationReport) -> Table:
    table = Table(title=f"graph {report.path}")
    table.add_column("what")
    table.add_column("count", justify="right")
    for label, value in (
        ("ranks", report.ranks),
        ("nodes", report.nodes),
        ("collective instances", report.collectives),
        ("p2p pairs", report.p2p_pairs),
    ):
        table.add_row(label, f"{value:,}")
    for kind, nbytes in report.bytes_by_group.items():
        # The graph holds one iteration, so its payload is the payload per iteration.
        table.add_row(f"bytes / iteration, {kind}", _size(nbytes))
    return table


@app.command(cls=PrismCommand)
def validate(
    graph: Annotated[Path, typer.Argument(help="graph.parquet to check.", show_default=False)],
) -> None:
    """Check ranks, sort order, collectives, send/recv pairs, deps and metadata; exit 2 if invalid."""
    if not graph.exists():
        _error(f"{graph}: no such file")
        raise typer.Exit(2)
    progress = Progress(
        TextColumn("[bold]validating"), BarColumn(), MofNCompleteColumn(), TextColumn("row groups"),
        TimeElapsedColumn(), console=console, transient=True,
    )  # fmt: skip
    try:
        with progress:
            task = progress.add_task("validate", total=None)
            report = validate_graph(
                graph, progress=lambda done, total: progress.update(task, completed=done, total=total)
            )
    except GraphFormatError as e:
        _error(str(e))
        raise typer.Exit(2) from None
    Console().print(_summary(report))
    if report.ok:
        console.print(
            f"[bold green]valid[/]: {report.ranks:,} ranks, {report.nodes:,} nodes", highlight=False
        )
        return
    for line in report.problems[:SHOWN_PROBLEMS]:
        _error(line)
    if report.problem_count > SHOWN_PROBLEMS:
        console.print(f"... and {report.problem_count - SHOWN_PROBLEMS} more problems", highlight=False)
    raise typer.Exit(2)


def main() -> None:
    stop_on_termination()
    app()


if __name__ == "__main__":
    main()
