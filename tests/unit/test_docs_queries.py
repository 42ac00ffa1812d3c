"""The DuckDB queries over graph.parquet that README.md and docs/graph-format.md show run as
written, on the checked-in tiny graph (its rank 3 standing for the docs' rank 123), and give what
prism's own reader gives."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pyarrow.compute as pc
import pytest

from prism.graph.io.parquet import read_rank

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "data" / "tiny_graph.parquet"


def _blocks(doc: str, language: str) -> list[str]:
    text = (ROOT / doc).read_text()
    return [b for b in re.findall(rf"```{language}\n(.*?)```", text, re.S) if "duckdb" in b.lower()]


@pytest.fixture
def in_graph_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    shutil.copy(TINY, tmp_path / "graph.parquet")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_readme_query_gives_what_the_reader_gives(in_graph_dir: Path) -> None:
    duckdb = pytest.importorskip("duckdb")
    (sql,) = _blocks("README.md", "sql")
    rows = duckdb.sql(sql.replace("rank = 123", "rank = 3")).fetchall()
    nodes = read_rank("graph.parquet", 3, columns=["name", "dur_ns"])
    by_name = nodes.group_by("name").aggregate([("dur_ns", "sum")]).to_pylist()
    assert sorted(rows) == sorted((r["name"], r["dur_ns_sum"]) for r in by_name)
    assert [total for _, total in rows] == sorted((total for _, total in rows), reverse=True)
    assert sum(total for _, total in rows) == pc.sum(nodes["dur_ns"]).as_py()


def test_the_graph_format_doc_queries_run(in_graph_dir: Path) -> None:
    pytest.importorskip("duckdb")
    (code,) = _blocks("docs/graph-format.md", "python")
    exec(compile(code.replace("rank = 123", "rank = 3"), "docs/graph-format.md", "exec"), {})
