"""A program through prism's CLIs, as the tests of programs run it: captured at a layout and built,
then one rank replayed."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from typer.testing import CliRunner

from prism.capture.cli import app as capture_app
from prism.graph.build.cli import app as build_app
from prism.graph.io.validate import validate_graph
from prism.replay.cli import app as replay_app
from prism.schemas.replay import RankReport, ReplayReport

runner = CliRunner()


def captured_and_built(
    capture: Path, layout: Sequence[str], program: Sequence[str], *, warmup: int = 4
) -> tuple[Path, Path]:
    """``program`` (what follows ``--``) captured at ``layout`` with two profiled iterations into
    ``capture``, and its graph, ``capture`` + ``.parquet``, built at the capture's layout and valid."""
    graph = capture.with_name(f"{capture.name}.parquet")
    options = [*layout, "--warmup", str(warmup), "--iterations", "2", "-o", str(capture)]
    result = runner.invoke(capture_app, [*options, "--", *program])
    assert result.exit_code == 0, result.output
    result = runner.invoke(build_app, [str(capture), "-o", str(graph)])
    assert result.exit_code == 0, result.output
    assert validate_graph(graph).ok
    return capture, graph


def built_with(capture: Path, out: Path, *options: str) -> Path:
    """``capture`` built into ``out`` with build ``options`` (another layout, layer count, ...), valid."""
    result = runner.invoke(build_app, [str(capture), *options, "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert validate_graph(out).ok
    return out


def replayed(
    graph: Path, rank: int, program: Sequence[str] = (), *, out: Path | None = None, extra: Sequence[str] = ()
) -> RankReport:
    """The report of ``rank``'s replay against ``graph`` (of ``program``, or the one its capture
    ran), with ``extra`` options."""
    out = out or graph.with_name(f"{graph.stem}-replay{rank}")
    options = [str(graph), "--rank", str(rank), "--warmup", "5", "--iterations", "2", "-o", str(out), *extra]
    result = runner.invoke(replay_app, [*options, *(("--", *program) if program else ())])
    assert result.exit_code == 0, result.output
    (report,) = ReplayReport.from_dict(json.loads((out / "report.json").read_text())).ranks
    assert report.rank == rank and report.calls_per_iter >= 1
    return report
