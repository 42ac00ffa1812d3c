"""``prism-export``: a graph in the formats other tools read."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from prism.graph.export.trace import ExportError, rank_trace
from prism.graph.io.parquet import GraphFormatError
from prism.graph.sim.simulate import SimulationError
from prism.schemas import cli_help
from prism.schemas.cli_command import PrismCommand, PrismGroup
from prism.schemas.files import write_json_atomic
from prism.schemas.termination import stop_on_termination

app = typer.Typer(add_completion=False, cls=PrismGroup, no_args_is_help=True)
console = Console(stderr=True)


@app.callback()
def export() -> None:
    """A graph in the formats other tools read: `prism-export trace` (Chrome/Perfetto, HTA)."""


@app.command("trace", cls=PrismCommand)
def trace(
    graph: Annotated[Path, typer.Argument(help=cli_help.GRAPH_IN)],
    rank: Annotated[int, typer.Option("--rank", "-r", help="Global rank whose trace to write.")],
    out: Annotated[
        Path, typer.Option("--out", "-o", help="Chrome/Perfetto trace to write (.json, or .json.gz gzipped).")
    ],
    iterations: Annotated[
        int, typer.Option(min=2, help="Passes simulated; the trace shows the last (steady) one.")
    ] = 2,
) -> None:
    """Chrome/Perfetto trace of any rank as the simulation runs it (HTA loads it with real ranks')."""
    try:
        if out.is_dir():
            raise ExportError(f"{out} is a directory: name the trace file to write")
        if not graph.is_file():
            raise ExportError(f"{graph}: no such graph")
        with console.status(f"simulating {graph} for rank {rank}'s trace"):
            data = rank_trace(graph, rank, iterations=iterations)
        write_json_atomic(out, data, indent=None)
    except (ExportError, GraphFormatError, SimulationError, OSError) as e:
        console.print(
            f"[bold red]error:[/] {escape(str(e).splitlines()[0])}", highlight=False, soft_wrap=True
        )
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        console.print("[bold red]interrupted[/]: nothing was written")
        raise typer.Exit(130) from None
    nodes = sum(1 for e in data["traceEvents"] if e["ph"] == "X")
    console.print(f"wrote {out}: rank {rank}, {nodes} nodes of its steady iteration")


def main() -> None:
    stop_on_termination()
    app()


if __name__ == "__main__":
    main()
