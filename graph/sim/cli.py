"""``prism-simulate``: predict a built graph, optionally under what-ifs, without rebuilding it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import numpy as np
import typer
from rich.console import Console

from prism.graph.io.parquet import GraphFormatError
from prism.graph.io.validate import validate_graph
from prism.graph.sim.predict import predict, stage_table
from prism.graph.sim.simulate import SimulationError
from prism.graph.sim.whatif import WhatIf, parse_delay, parse_slow_rank
from prism.schemas import cli_help
from prism.schemas.cli_command import PrismCommand
from prism.schemas.cluster import load_cluster
from prism.schemas.summary import write_summary
from prism.schemas.termination import stop_on_termination

app = typer.Typer(add_completion=False, help=__doc__)
console = Console(stderr=True)


@app.command(cls=PrismCommand)
def simulate(
    graph: Annotated[Path, typer.Argument(help=cli_help.GRAPH_IN)],
    slow_rank: Annotated[
        list[str], typer.Option(help="RANK:+20% or RANK:x1.5 — slower compute on a rank (repeatable).")
    ] = [],  # noqa: B006
    delay: Annotated[
        list[str], typer.Option(help="PHASE[,layer=L]:+DURATION[@RANK] — e.g. bwd,layer=3:+1ms (repeatable).")
    ] = [],  # noqa: B006
    cluster: Annotated[str | None, typer.Option(help=f"Re-cost communication. {cli_help.CLUSTER}")] = None,
    moe_skew: Annotated[
        float | None,
        typer.Option(
            help="Zipf exponent S of the tokens' routing over each expert-parallel group: group rank j "
            "gets (j+1)^-S of every rank's tokens, normalised (0: evenly); its all-to-alls and expert "
            "work follow."
        ),
    ] = None,
    iterations: Annotated[
        int, typer.Option(min=1, help="Back-to-back iterations; the last is reported.")
    ] = 2,
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="summary.json to write [default: beside the graph].")
    ] = None,
    validate: Annotated[
        bool, typer.Option(help="Check the whole graph first, as prism-validate-graph does.")
    ] = False,
) -> None:
    """Simulate GRAPH; with what-ifs, show them beside the graph as built."""
    out = out or graph.with_name("summary.json")
    try:
        if out.is_dir():
            raise ValueError(f"--out {out} is a directory; give the summary.json file to write")
        if validate:
            validate_graph(graph).raise_if_failed()
        what_if = WhatIf(
            slow_ranks=tuple(parse_slow_rank(s) for s in slow_rank),
            delays=tuple(parse_delay(d) for d in delay),
            cluster=None if cluster is None else load_cluster(cluster),
            moe_skew=moe_skew,
        )
        summary = predict(graph, what_if, iterations=iterations)
        baseline = None if what_if.empty else predict(graph, iterations=iterations)
        write_summary(summary, out)
    except (GraphFormatError, SimulationError, ValueError, OSError) as e:
        console.print(f"[bold red]error:[/] {str(e).splitlines()[0]}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    if baseline is not None:
        console.print(stage_table(baseline, f"as built — {graph}"))
        before, after = (np.max(s.ranks["iteration_ns"]) / 1e6 for s in (baseline, summary))
        console.print(
            f"what-if {summary.what_if}: job iteration {before:.2f} ms -> {after:.2f} ms ({100 * (after / before - 1):+.2f}%)"
        )
    console.print(
        stage_table(summary, f"predicted — {graph}" + (" (what-if)" if baseline is not None else ""))
    )
    console.print(f"wrote {out}")


def main() -> None:
    stop_on_termination()
    app()


if __name__ == "__main__":
    main()
