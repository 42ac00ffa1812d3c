"""A graph of more row groups than one file holds is a directory of part files; one rank is read
from its part alone, and a directory that is not whole, or not one graph's, is refused."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from prism.graph.io.parquet import GraphFormatError, GraphReader, GraphWriter, read_metadata, read_rank
from prism.graph.io.parts import NotAGraphError, graph_bytes, remove_graph, replace_graph
from prism.schemas import graph_format as gf
from prism.schemas.graph_format import PartInfo
from tests.unit.test_graph_io import LAYOUT, graph_rows, metadata, rank_rows, table_of, write_graph

PART_NAMES = [
    "ranks-0000000-0000002.parquet",
    "ranks-0000003-0000005.parquet",
    "ranks-0000006-0000007.parquet",
]


def write_parts(path: Path, **meta: object) -> Path:
    """The 8-rank sample in row groups of 3 ranks, one row group a file: three parts."""
    return write_graph(path, ranks_per_row_group=3, row_groups_per_file=1, **meta)


def test_parts_hold_consecutive_ranks_with_their_place_in_the_graph(tmp_path: Path) -> None:
    path = write_parts(tmp_path / "graph.parquet")
    assert sorted(p.name for p in path.iterdir()) == PART_NAMES
    rows_before = 0
    for name in PART_NAMES:
        part = pq.ParquetFile(path / name)
        info = PartInfo.from_bytes(part.schema_arrow.metadata[gf.PART_KEY])
        ranks = sorted(set(part.read(columns=[gf.RANK]).column(gf.RANK).to_pylist()))
        assert info == PartInfo(first_rank=ranks[0], ranks=len(ranks), first_row=rows_before, parts=3)
        assert info.name == name
        rows_before += part.metadata.num_rows
    assert read_metadata(path) == metadata()


def test_the_usual_tools_read_the_directory_as_one_table(tmp_path: Path) -> None:
    path = write_parts(tmp_path / "graph.parquet")
    assert pq.read_table(path, schema=gf.SCHEMA).to_pylist() == table_of(graph_rows()).to_pylist()
    frame = pd.read_parquet(path, filters=[(gf.RANK, "==", 4)])
    assert frame[gf.INDEX].tolist() == [r[gf.INDEX] for r in rank_rows(4)]


def test_one_rank_is_read_from_its_part_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_parts(tmp_path / "graph.parquet")
    opened: list[str] = []
    original = pq.ParquetFile.__init__
    monkeypatch.setattr(pq.ParquetFile, "__init__", lambda self, source, **kw: opened.append(Path(source).name) or original(self, source, **kw))  # fmt: skip
    for rank in range(LAYOUT.world_size):
        opened.clear()
        with GraphReader(path) as reader:
            assert reader.world_size == LAYOUT.world_size  # from the names, no file opened
            assert opened == []
            assert reader.read_rank(rank).to_pylist() == table_of(rank_rows(rank)).to_pylist()
            assert reader.metadata == metadata()
        assert opened == [PART_NAMES[rank // 3]]


def test_a_directory_reads_as_the_same_graph_in_one_file(tmp_path: Path) -> None:
    one, parts = write_graph(tmp_path / "one.parquet"), write_parts(tmp_path / "parts.parquet")
    with GraphReader(one) as a, GraphReader(parts) as b:
        assert (a.num_parts, b.num_parts) == (1, 3)
        assert a.num_rows == b.num_rows and a.num_row_groups == b.num_row_groups == 3
        for column in (gf.RANK, gf.NAME, gf.DEPS):
            assert a.read_column(column).to_pylist() == b.read_column(column).to_pylist()
        for rank in [*range(LAYOUT.world_size), LAYOUT.world_size]:
            assert a.first_row(rank) == b.first_row(rank)
        assert [t.to_pylist() for t in a.iter_rank_chunks()] == [t.to_pylist() for t in b.iter_rank_chunks()]
        both = [1, 2, 3, 7]  # across parts
        assert pa.concat_tables(a.read_ranks(both)).equals(pa.concat_tables(b.read_ranks(both)))
    assert graph_bytes(parts) == sum(f.stat().st_size for f in parts.iterdir())


def test_parts_are_byte_identical_whatever_the_path(tmp_path: Path) -> None:
    a, b = write_parts(tmp_path / "a.parquet"), write_parts(tmp_path / "b")
    assert all((a / n).read_bytes() == (b / n).read_bytes() for n in PART_NAMES)


def test_an_error_while_writing_parts_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="graph incomplete"):
        write_parts(tmp_path / "g.parquet", rows=[r for r in graph_rows() if r[gf.RANK] < 5])
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (
            lambda d: (d / PART_NAMES[1]).unlink(),
            "does not follow rank 2 \\(a part file is missing or renamed\\)",
        ),
        (
            lambda d: (d / PART_NAMES[2]).unlink(),
            "of 8, one of 3 parts; the directory lists it as .* of 6, one of 2",
        ),
        (lambda d: (d / "notes.txt").write_text("x"), "'notes.txt' is not a part file"),
        (lambda d: [f.unlink() for f in d.iterdir()], "holds no part file"),
        (
            lambda d: (d / PART_NAMES[2]).rename(d / "ranks-0000006-0000009.parquet"),
            "holds ranks 6..7 of 8, one of 3 parts; the directory lists it as ranks 6..9 of 10",
        ),
    ],
)
def test_a_directory_that_is_not_whole_is_refused(tmp_path: Path, damage, message: str) -> None:  # noqa: ANN001
    path = write_parts(tmp_path / "graph.parquet")
    damage(path)
    with pytest.raises(GraphFormatError, match=message):
        read_rank(path, 7)


def test_parts_of_two_graphs_are_refused(tmp_path: Path) -> None:
    path, other = (
        write_parts(tmp_path / "graph.parquet"),
        write_parts(tmp_path / "other", capture_digest="1" * 64),
    )
    shutil.copy(other / PART_NAMES[1], path / PART_NAMES[1])
    with GraphReader(path) as reader:
        assert reader.read_rank(0).num_rows
        with pytest.raises(GraphFormatError, match="its metadata is not that of the graph's other parts"):
            reader.read_rank(4)


def test_one_part_alone_is_not_taken_for_the_graph(tmp_path: Path) -> None:
    path = write_parts(tmp_path / "graph.parquet")
    shutil.copy(path / PART_NAMES[0], tmp_path / "alone.parquet")
    with pytest.raises(GraphFormatError, match="one part of a graph of several; read its directory"):
        read_rank(tmp_path / "alone.parquet", 0)


@pytest.mark.parametrize(
    ("old_parts", "new_parts"), [(False, True), (True, False), (True, True), (False, False)]
)
def test_a_graph_replaces_another_of_either_form(tmp_path: Path, old_parts: bool, new_parts: bool) -> None:
    write = lambda path, **meta: (write_parts if new_parts else write_graph)(path, **meta)  # noqa: E731
    target = (write_parts if old_parts else write_graph)(tmp_path / "graph.parquet")
    new = write(tmp_path / "new.parquet", capture_digest="2" * 64)
    replace_graph(new, target)
    assert read_metadata(target).capture_digest == "2" * 64
    assert sorted(p.name for p in tmp_path.iterdir()) == ["graph.parquet"]
    # the writer replaces in the same way
    write(target, capture_digest="3" * 64)
    assert read_metadata(target).capture_digest == "3" * 64


def test_a_directory_that_is_not_a_graph_is_never_removed(tmp_path: Path) -> None:
    precious = tmp_path / "results"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep")
    with pytest.raises(NotAGraphError, match="not a prism graph; it is left as it is"):
        remove_graph(precious)
    with pytest.raises(NotAGraphError):
        replace_graph(write_parts(tmp_path / "g.parquet"), precious)
    with pytest.raises(NotAGraphError), GraphWriter(precious, metadata()) as writer:
        writer.write_ranks(table_of(graph_rows()))
    assert (precious / "notes.txt").read_text() == "keep"


def test_a_single_file_with_damaged_part_metadata_is_a_format_error(tmp_path: Path) -> None:
    path = tmp_path / "graph.parquet"
    schema = gf.SCHEMA.with_metadata({gf.METADATA_KEY: metadata().to_bytes(), gf.PART_KEY: b"{not json"})
    pq.write_table(table_of(graph_rows()).cast(schema), path, write_statistics=[gf.RANK])
    with pytest.raises(GraphFormatError, match="graph.parquet: "):
        read_rank(path, 0)
