"""graph.parquet writer and reader on a small synthetic graph (tp=2 pp=2 dp=2).

``graph_rows`` / ``write_graph`` build the valid sample that test_validate.py corrupts.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pyarrow as pa
import pyarrow.compute  # noqa: F401 - pa.compute below
import pyarrow.parquet as pq
import pytest

from prism.graph.io.parquet import (
    ROW_GROUPS_PER_FILE,
    GraphFormatError,
    GraphReader,
    GraphWriter,
    iter_rank_chunks,
    read_metadata,
    read_rank,
)
from prism.schemas import graph_format as gf
from prism.schemas.graph_format import GraphMetadata, NodeKind
from prism.schemas.layout import ParallelLayout

LAYOUT = ParallelLayout(tp=2, pp=2, dp=2)
DEFAULTS = {
    gf.STREAM: 0, gf.PHASE: "", gf.MB: -1, gf.LAYER: -1, gf.PART: "", gf.DUR_NS: 1000, gf.GAP_NS: 0, gf.SKEW_NS: 0,
    gf.COLL_ID: -1, gf.GROUP_KIND: "", gf.GROUP_INDEX: -1, gf.GROUP_SIZE: 0, gf.PEER: -1, gf.P2P_SEQ: -1,
    gf.BYTES: 0, gf.DTYPE: "", gf.IS_ASYNC: False, gf.ALLOC_BYTES: 0, gf.FREE_BYTES: 0, gf.DEPS: [],
    gf.SRC_RANK: 0, gf.SRC_OP: 0, gf.LANE_DEPS: [], gf.SPLIT_BYTES: [],
}  # fmt: skip


def metadata(layout: ParallelLayout = LAYOUT, **changes: object) -> GraphMetadata:
    values = dict(
        layout=layout.to_dict(), model={"tp": layout.tp, "pp": layout.pp, "dp": layout.dp, "layers": 4},
        cluster={"name": "test"}, capture_digest="0" * 64, build_options={"microbatches": 1},
        prism_version="0.1.0",
        extra={gf.STREAMS_KEY: ["main thread", "thread 2"], gf.STATIC_BYTES_KEY: [1 << 20] * layout.pp},  # a side thread
    )  # fmt: skip
    return GraphMetadata(**{**values, **changes})


def _comm(kind: NodeKind, name: str, group: str, index: int, size: int, nbytes: int, **more: object) -> dict:
    return {gf.KIND: kind.value, gf.NAME: name, gf.GROUP_KIND: group, gf.GROUP_INDEX: index,
            gf.GROUP_SIZE: size, gf.BYTES: nbytes, gf.DTYPE: "bfloat16", gf.DUR_NS: 5000, **more}  # fmt: skip


def rank_rows(rank: int, layout: ParallelLayout = LAYOUT) -> list[dict]:
    """fwd mm, TP all_reduce, pipeline recv/send, bwd waiting on the first of them, DP all_reduce, world all_reduce."""
    stage = layout.stage(rank)
    compute = {
        gf.KIND: NodeKind.COMPUTE.value,
        gf.NAME: "aten::mm",
        gf.PHASE: "fwd",
        gf.MB: 0,
        gf.LAYER: stage,
    }
    tp_group, dp_group = layout.group_index(rank, "tp"), layout.group_index(rank, "dp")
    pp_group = layout.group_index(rank, "pp")
    p2p = []  # a middle stage receives from the previous stage, then sends to the next
    if stage > 0:
        p2p.append(
            _comm(NodeKind.RECV, "recv", "pp", pp_group, 2, 4096, **{gf.PEER: layout.pipeline_prev(rank)})
        )
    if stage < layout.pp - 1:
        p2p.append(
            _comm(NodeKind.SEND, "send", "pp", pp_group, 2, 4096, **{gf.PEER: layout.pipeline_next(rank)})
        )
    main = [
        compute,
        _comm(NodeKind.COLLECTIVE, "all_reduce", "tp", tp_group, layout.tp, 65536, **{gf.COLL_ID: 100 + tp_group}),
        *({**node, gf.P2P_SEQ: 0, gf.IS_ASYNC: True} for node in p2p),
        {**compute, gf.NAME: "aten::mm_backward", gf.PHASE: "bwd", gf.DEPS: [2]},
        _comm(NodeKind.COLLECTIVE, "all_reduce", "dp", dp_group, layout.dp, 1 << 20, **{gf.COLL_ID: 200 + dp_group}),
        _comm(NodeKind.COLLECTIVE, "all_reduce", "world", 0, layout.world_size, 8, **{gf.COLL_ID: 300}),
    ]  # fmt: skip
    side = [{**compute, gf.STREAM: 1, gf.NAME: "optimizer.step", gf.PHASE: "opt"}]
    rows = [{**r, gf.INDEX: i} for i, r in enumerate(main)] + [{**r, gf.INDEX: i} for i, r in enumerate(side)]
    return [
        {**DEFAULTS, **r, gf.RANK: rank, gf.STAGE: stage, gf.SRC_RANK: layout.rank(tp=0, dp=0, pp=stage)}
        for r in rows
    ]


def graph_rows(layout: ParallelLayout = LAYOUT) -> list[dict]:
    return [row for rank in range(layout.world_size) for row in rank_rows(rank, layout)]


def table_of(rows: list[dict]) -> pa.Table:
    """Rows to a table of the graph schema (string columns dictionary-encoded)."""
    return pa.Table.from_pylist(
        rows, schema=pa.schema([f.with_type(_plain(f.type)) for f in gf.SCHEMA])
    ).cast(gf.SCHEMA)


def _plain(t: pa.DataType) -> pa.DataType:
    return pa.string() if pa.types.is_dictionary(t) else t


def write_graph(
    path: Path, rows: list[dict] | None = None, ranks_per_row_group: int = 3,
    row_groups_per_file: int = ROW_GROUPS_PER_FILE, **meta: object,
) -> Path:  # fmt: skip
    """Write rows through GraphWriter, one call per rank."""
    rows = graph_rows() if rows is None else rows
    md = metadata(**meta)
    with GraphWriter(path, md, ranks_per_row_group, row_groups_per_file=row_groups_per_file) as writer:
        for rank in sorted({r[gf.RANK] for r in rows}):
            writer.write_ranks(table_of([r for r in rows if r[gf.RANK] == rank]))
    return path


def write_raw(path: Path, rows: list[dict], meta: bytes | None = None) -> Path:
    """Write rows as given (no checks), with raw metadata bytes: for files GraphWriter refuses."""
    schema = gf.SCHEMA.with_metadata({gf.METADATA_KEY: meta if meta is not None else metadata().to_bytes()})
    pq.write_table(table_of(rows).cast(schema), path, write_statistics=[gf.RANK])
    return path


def test_round_trip_keeps_rows_and_metadata(tmp_path: Path) -> None:
    path = write_graph(tmp_path / "graph.parquet")
    back = pq.read_table(path)
    assert back.schema.equals(gf.SCHEMA)
    assert back.to_pylist() == table_of(graph_rows()).to_pylist()
    assert read_metadata(path) == metadata()


@pytest.mark.parametrize("per_group", [1, 3, 8, 32])
def test_one_row_group_per_ranks_per_row_group(tmp_path: Path, per_group: int) -> None:
    path = write_graph(tmp_path / "g.parquet", ranks_per_row_group=per_group)
    md = pq.read_metadata(path)
    assert md.num_row_groups == math.ceil(LAYOUT.world_size / per_group)
    for i in range(md.num_row_groups):
        stats = md.row_group(i).column(gf.SCHEMA.get_field_index(gf.RANK)).statistics
        assert (stats.min, stats.max) == (i * per_group, min((i + 1) * per_group, LAYOUT.world_size) - 1)
    assert [c.column_index for c in md.row_group(0).sorting_columns] == [0, 1, 2]


def test_whole_graph_in_one_call_gives_the_same_bytes_as_rank_by_rank(tmp_path: Path) -> None:
    by_rank = write_graph(tmp_path / "a.parquet")
    with GraphWriter(tmp_path / "b.parquet", metadata(), ranks_per_row_group=3) as writer:
        writer.write_ranks(table_of(graph_rows()))
    assert by_rank.read_bytes() == (tmp_path / "b.parquet").read_bytes()


def test_bytes_do_not_depend_on_the_input_dictionaries(tmp_path: Path) -> None:
    table = table_of(graph_rows())
    for i, field in enumerate(table.schema):
        if pa.types.is_dictionary(field.type):  # same values, reversed dictionary plus an unused entry
            values = table.column(i).cast(pa.string()).combine_chunks()
            vocab = pa.array(["unused", *reversed(pa.compute.unique(values).to_pylist())])
            indices = pa.compute.index_in(values, value_set=vocab).cast(pa.int32())
            table = table.set_column(i, field, pa.DictionaryArray.from_arrays(indices, vocab))
    with GraphWriter(tmp_path / "b.parquet", metadata(), ranks_per_row_group=3) as writer:
        writer.write_ranks(table)
    assert write_graph(tmp_path / "a.parquet").read_bytes() == (tmp_path / "b.parquet").read_bytes()


def test_writer_outside_a_with_block_says_so(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="context manager"):
        GraphWriter(tmp_path / "g.parquet", metadata()).write_ranks(table_of(graph_rows()))


def test_output_is_byte_identical_whatever_the_path(tmp_path: Path) -> None:
    (tmp_path / "x").mkdir()
    first = write_graph(tmp_path / "graph.parquet")
    second = write_graph(tmp_path / "x" / "other-name.parquet")
    assert first.read_bytes() == second.read_bytes()


def test_read_rank_returns_that_rank_from_one_row_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_graph(tmp_path / "g.parquet", ranks_per_row_group=3)
    reads: list[list[int]] = []
    original = pq.ParquetFile.read_row_group
    monkeypatch.setattr(pq.ParquetFile, "read_row_group", lambda self, group, **kw: reads.append(group) or original(self, group, **kw))  # fmt: skip
    for rank in range(LAYOUT.world_size):
        reads.clear()
        table = read_rank(path, rank)
        assert table.to_pylist() == table_of(rank_rows(rank)).to_pylist()
        assert reads == [rank // 3]
    assert read_rank(path, 5, columns=[gf.INDEX, gf.NAME]).column_names == [gf.INDEX, gf.NAME]


def test_read_rank_of_a_rank_not_in_the_file_is_empty(tmp_path: Path) -> None:
    path = write_graph(tmp_path / "g.parquet")
    assert read_rank(path, 99).num_rows == 0


def test_iter_rank_chunks_yields_row_groups_in_rank_order(tmp_path: Path) -> None:
    path = write_graph(tmp_path / "g.parquet", ranks_per_row_group=3)
    chunks = list(iter_rank_chunks(path, columns=[gf.RANK]))
    assert [sorted(set(c.column(gf.RANK).to_pylist())) for c in chunks] == [[0, 1, 2], [3, 4, 5], [6, 7]]


def test_first_row_and_one_column_index_the_whole_file(tmp_path: Path) -> None:
    rows = graph_rows()
    path = write_graph(tmp_path / "g.parquet", rows, ranks_per_row_group=3)
    ranks = [row[gf.RANK] for row in rows]
    with GraphReader(path) as reader:
        assert reader.num_rows == len(rows)
        assert reader.read_column(gf.RANK).to_pylist() == ranks
        for rank in range(LAYOUT.world_size):
            assert reader.first_row(rank) == ranks.index(rank)
        assert reader.first_row(LAYOUT.world_size) == len(rows)  # past the last rank


def test_plain_string_columns_are_accepted(tmp_path: Path) -> None:
    plain = pa.schema([f.with_type(_plain(f.type)) for f in gf.SCHEMA])
    with GraphWriter(tmp_path / "g.parquet", metadata()) as writer:
        writer.write_ranks(pa.Table.from_pylist(graph_rows(), schema=plain))
    assert (
        GraphReader(tmp_path / "g.parquet").read_rank(3).column(gf.NAME).type == gf.SCHEMA.field(gf.NAME).type
    )


def test_error_inside_the_block_leaves_nothing(tmp_path: Path) -> None:
    with (
        pytest.raises(RuntimeError, match="boom"),
        GraphWriter(tmp_path / "g.parquet", metadata(), 3) as writer,
    ):
        writer.write_ranks(table_of([r for r in graph_rows() if r[gf.RANK] < 4]))
        raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_incomplete_graph_is_refused_and_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="graph incomplete: ranks 0..3 written, the layout has 8"):
        write_graph(tmp_path / "g.parquet", [r for r in graph_rows() if r[gf.RANK] < 4])
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (lambda rows: rows[::-1], "rows not sorted by \\(rank, stream, index\\)"),
        (
            lambda rows: [rows[1], rows[0], *rows[2:]],
            "row 1 \\(rank 0, stream 0, index 0\\) follows \\(rank 0, stream 0, index 1\\)",
        ),
        (
            lambda rows: [r for r in rows if r[gf.RANK] != 2],
            "ranks must be consecutive: rank 3 follows rank 1",
        ),
        (lambda rows: [r for r in rows if r[gf.RANK] != 0], "expected rank 0 next, got 1"),
    ],
)
def test_bad_input_is_rejected(tmp_path: Path, rows, message: str) -> None:  # noqa: ANN001
    with pytest.raises(ValueError, match=message), GraphWriter(tmp_path / "g.parquet", metadata()) as writer:
        writer.write_ranks(table_of(rows(graph_rows())))
    assert list(tmp_path.iterdir()) == []


def test_ranks_must_continue_across_calls(tmp_path: Path) -> None:
    rows = graph_rows()
    with pytest.raises(ValueError, match="expected rank 2 next, got 3"), GraphWriter(tmp_path / "g.parquet", metadata()) as w:  # fmt: skip
        w.write_ranks(table_of([r for r in rows if r[gf.RANK] < 2]))
        w.write_ranks(table_of([r for r in rows if r[gf.RANK] == 3]))


def test_nulls_are_rejected(tmp_path: Path) -> None:
    plain = pa.schema([f.with_type(_plain(f.type)).with_nullable(True) for f in gf.SCHEMA])
    rows = [{**r, gf.DUR_NS: None} for r in graph_rows()]
    with (
        pytest.raises(ValueError, match="may not hold nulls.*dur_ns"),
        GraphWriter(tmp_path / "g", metadata()) as w,
    ):
        w.write_ranks(pa.Table.from_pylist(rows, schema=plain))


def test_missing_column_is_rejected(tmp_path: Path) -> None:
    with (
        pytest.raises(ValueError, match="missing \\['deps'\\]"),
        GraphWriter(tmp_path / "g.parquet", metadata()) as w,
    ):
        w.write_ranks(table_of(graph_rows()).drop_columns([gf.DEPS]))


def test_files_that_are_not_graphs_raise_one_clear_error(tmp_path: Path) -> None:
    (tmp_path / "text.parquet").write_text("hello")
    pq.write_table(pa.table({"a": [1]}), tmp_path / "other.parquet")
    wrong = json.loads(metadata().to_bytes()) | {"version": 99}
    write_raw(tmp_path / "v99.parquet", graph_rows(), json.dumps(wrong).encode())
    with pytest.raises(FileNotFoundError, match="no such file"):
        read_metadata(tmp_path / "missing.parquet")
    with pytest.raises(GraphFormatError, match="not a Parquet file"):
        read_metadata(tmp_path / "text.parquet")
    with pytest.raises(GraphFormatError, match="not a prism graph \\(no 'prism' metadata\\)"):
        read_metadata(tmp_path / "other.parquet")
    with pytest.raises(GraphFormatError, match="graph format version 99 is not supported"):
        read_rank(tmp_path / "v99.parquet", 0)
