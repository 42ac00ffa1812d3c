"""Every command's tables read whole in a terminal of 80 columns: no header word or value cut."""

from __future__ import annotations

import ast
import gzip
import shutil
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from prism.graph.build import cli as build_cli
from prism.graph.io import validate_cli
from prism.graph.sim import cli as simulate_cli
from prism.schemas.terminal import Table

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "data" / "tiny_graph.parquet"
CUDA_CAPTURE = ROOT / "tests" / "data" / "cuda_captures" / "ddp_dp1_h200" / "capture"
PACKAGES = ("schemas", "peers", "capture", "graph", "replay", "fidelity")


def whole_at_80(text: str) -> None:
    assert "…" not in text, text
    assert max(len(line) for line in text.splitlines()) <= 80, text


def test_a_wide_table_keeps_every_header_word_and_value_whole_at_80_columns() -> None:
    headers = ["stage", "ranks", "iter ms (median)", "spread ms (max − min)", "compute", "overhead",
               "exposed comm", "bubble", "peak MiB (max)"]  # fmt: skip
    values = ["15", "131,072", "1110.95", "123.45", "86.0%", "13.4%", "0.6%", "0.0%", "12345.6"]
    table = Table(title="predicted — a/long/path/to/graph.parquet (what-if)")
    for header in headers:
        table.add_column(header, justify="right")
    table.add_row(*values)
    table.caption = "job iteration 12.45 ms; critical path 514 nodes over 1 ranks; simulated in 0.0 s"
    console = Console(width=80, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(table)
    text = console.export_text()
    whole_at_80(text)
    words = text.split()
    assert all(v in words for v in values) and words[-2:] == ["0.0", "s"]  # the caption whole
    assert all(w in words for h in headers for w in h.split())


def test_every_command_draws_its_tables_with_prisms_table() -> None:
    """rich's own Table cuts values with an ellipsis at 80 columns: no command may use it."""
    direct = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if (
                    isinstance(node, ast.ImportFrom)
                    and node.module == "rich.table"
                    and path.name != "terminal.py"
                ):
                    direct.append(str(path.relative_to(ROOT)))
    assert not direct


@pytest.fixture
def narrow(monkeypatch: pytest.MonkeyPatch) -> None:
    for module in (simulate_cli, validate_cli, build_cli):
        monkeypatch.setattr(module.console, "width", 80)
    monkeypatch.setenv("COLUMNS", "80")


@pytest.mark.parametrize(
    "command",
    [
        pytest.param(
            lambda tmp: (simulate_cli.app, [str(tmp / "g.parquet"), "--slow-rank", "3:+20%"]), id="simulate"
        ),
        pytest.param(lambda tmp: (validate_cli.app, [str(tmp / "g.parquet")]), id="validate"),
        pytest.param(
            lambda tmp: (
                build_cli.app,
                [str(tmp / "capture"), "--cluster", "h100-ib", "-o", str(tmp / "b.parquet")],
            ),
            id="build",
        ),
    ],
)
def test_a_commands_output_is_whole_at_80_columns(narrow: None, tmp_path: Path, command) -> None:
    shutil.copy(TINY, tmp_path / "g.parquet")
    shutil.copytree(CUDA_CAPTURE, tmp_path / "capture")  # its Execution Trace is kept gzipped
    packed = tmp_path / "capture" / "et" / "rank0.et.json.gz"
    packed.with_suffix("").write_bytes(gzip.decompress(packed.read_bytes()))
    app, args = command(tmp_path)
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    whole_at_80(result.output)
