"""``prism-capture-paced``: capture every role again, each rank a replay of a graph, so that it
computes between the full job's waits as a real rank does; build the final graph from it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from prism.capture.cli import ConsoleHooks, capture_table, console, model_line, reported
from prism.capture.preflight import CaptureError
from prism.replay.paced_capture import paced_config, run_paced_capture
from prism.replay.runtime import ReplayDiverged, ReplayInputError
from prism.schemas import cli_help
from prism.schemas.cli_command import PrismCommand
from prism.schemas.iterations import DEFAULT_WARMUP
from prism.schemas.termination import stop_on_termination
from prism.schemas.workload import record_layout

app = typer.Typer(add_completion=False, help=__doc__)


@app.command(cls=PrismCommand)
def capture_paced(
    graph: Annotated[
        Path, typer.Argument(help=f"{cli_help.GRAPH_IN} The job (model, layout, device) is its.")
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="Capture directory to create.")] = Path(
        "capture-paced"
    ),
    warmup: Annotated[int, typer.Option(help=cli_help.WARMUP)] = DEFAULT_WARMUP,
    iterations: Annotated[int, typer.Option(help=cli_help.ITERATIONS)] = 2,
    threads: Annotated[int, typer.Option(help=cli_help.THREADS)] = 1,
    overwrite: Annotated[bool, typer.Option(help=cli_help.OVERWRITE)] = False,
    rank_timeout: Annotated[float, typer.Option(min=1.0, help=cli_help.RANK_TIMEOUT)] = 1800.0,
) -> None:
    """Capture each role's rank of GRAPH's job alone, its virtual peers timed by GRAPH."""
    hooks = ConsoleHooks()
    with reported(hooks, CaptureError, ReplayInputError, ReplayDiverged):
        config = paced_config(graph)
        console.print(
            f"[bold]prism-capture-paced[/] {record_layout(config)} paced by {graph}, model {model_line(config)}"
        )
        manifest = run_paced_capture(
            graph, out, warmup=warmup, iterations=iterations, threads=threads, overwrite=overwrite,
            rank_timeout_s=rank_timeout, on_event=hooks, hooks=hooks,
        )  # fmt: skip
    console.print(capture_table(manifest, out))


def main() -> None:
    stop_on_termination()
    app()


if __name__ == "__main__":
    main()
