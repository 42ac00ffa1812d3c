"""``prism-export``: a graph in the formats other tools read."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from prism.graph.export.chakra import write_chakra
from prism.graph.export.trace import ExportError, rank_trace
from prism.graph.sim.simulate import SimulationError
from prism.schemas import cli_help
from prism.schemas.cli_command import PrismCommand, PrismGroup
from prism.schemas.files import write_json_atomic
from prism.schemas.layout import parse_rank_list
from prism.schemas.termination import stop_on_termination

app = typer.Typer(add_completion=False, cls=PrismGroup, no_args_is_help=True)
console = Console(stderr=True)


@app.callback()
def export() -> None:
    """A graph in the formats other tools read: `trace` (Chrome/Perfetto, HTA), `chakra` (ASTRA-sim)."""


@contextmanager
def _reported(graph: Path) -> Iterator[None]:
    """Bad input (a damaged graph, a rank it does not have, an output in the way): one error line."""
    try:
        if not graph.exists():
            raise ExportError(f"{graph}: no such graph")
        yield
    except (ValueError, SimulationError, OSError) as e:  # ExportError, GraphFormatError, LayoutError too
        console.print(
            f"[bold red]error:[/] {escape(str(e).splitlines()[0])}", highlight=False, soft_wrap=True
        )
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        console.print("[bold red]interrupted[/]: nothing was written")
        raise typer.Exit(130) from None


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
    with _reported(graph):
        if out.is_dir():
            raise ExportError(f"{out} is a directory: name the trace file to write")
        with console.status(f"simulating {graph} for rank {rank}'s trace"):
            data = rank_trace(graph, rank, iterations=iterations)
        write_json_atomic(out, data, indent=None)
    nodes = sum(1 for e in data["traceEvents"] if e["ph"] == "X")
    console.print(f"wrote {out}: rank {rank}, {nodes} nodes of its steady iteration")


@app.command("chakra", cls=PrismCommand)
def chakra(
    graph: Annotated[Path, typer.Argument(help=cli_help.GRAPH_IN)],
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory to create for the traces.")],
    ranks: Annotated[
        str | None, typer.Option(help="Ranks to write, e.g. 0,7,8191 [default: every rank].")
    ] = None,
    prefix: Annotated[str, typer.Option(help="File names: PREFIX.RANK.et.")] = "prism",
) -> None:
    """Chakra execution traces (PREFIX.RANK.et per rank, comm_group.json) for ASTRA-sim."""
    with _reported(graph):
        chosen = None if ranks is None else _ranks(ranks)
        with console.status(f"writing Chakra traces of {graph}"):
            written = write_chakra(graph, out, chosen, prefix)
    console.print(f"wrote {out}: {len(written)} Chakra trace(s) and comm_group.json")


def _ranks(text: str) -> tuple[int, ...]:
    chosen = parse_rank_list(text)
    if not chosen:
        raise ExportError("--ranks names no rank")
    return chosen


def main() -> None:
    stop_on_termination()
    app()


if __name__ == "__main__":
    main()
